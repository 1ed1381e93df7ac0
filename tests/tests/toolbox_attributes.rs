//! `#[retry_on_conflict]` and `#[transition]` at run time, on every store: the memory
//! store, Redis on 127.0.0.1:6379, PostgreSQL on 127.0.0.1:5432 (database `test`, user
//! postgres), MariaDB/MySQL on 127.0.0.1:3306 (database `test`, user root) and a SQLite
//! file. `IDEM_TEST_PG_URL` and `IDEM_TEST_MYSQL_URL` override the SQL URLs. Each test
//! picks its store with `Idem::scope` and a namespace of its own.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/redis_harness.rs"]
mod harness;
#[path = "support/sql.rs"]
mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use idem_runtime::toolbox::{Moved, Optimistic, StateMachine};
use idem_runtime::{Error, Idem, IsConflict, Store, idempotent, retry_on_conflict, transition};
use tokio::sync::Barrier;

#[derive(Debug)]
enum AppError {
    Idem(Error),
    CarrierDown,
}

impl From<Error> for AppError {
    fn from(e: Error) -> Self {
        AppError::Idem(e)
    }
}

impl IsConflict for AppError {
    fn is_conflict(&self) -> bool {
        matches!(self, AppError::Idem(e) if e.is_conflict())
    }
}

static BALANCE: Optimistic = Optimistic::new("attributes::balance");

/// Adds 1 to `account` with load → compare-and-set; a lost race re-runs the body.
///
/// 50 attempts always suffice for 50 racers (no timing involved): a run loses only if
/// another racer's write landed between its load and its compare-and-set, the runs of
/// one caller do not overlap, and each of the 49 others writes once.
#[retry_on_conflict(attempts = 50, backoff = "1ms", max_backoff = "50ms")]
async fn add_one(idem: &Idem, account: &str, conflicts: &AtomicUsize) -> Result<u64, AppError> {
    let current = idem.load::<u64>(&BALANCE, account).await?;
    let (cents, version) = current.map_or((0, 0), |v| (v.value, v.version));
    // Let the other racers in between the read and the write.
    tokio::task::yield_now().await;
    match idem
        .compare_and_set(&BALANCE, account, version, cents + 1)
        .await
    {
        Err(e) if e.is_conflict() => {
            conflicts.fetch_add(1, Ordering::Relaxed);
            Err(e.into())
        }
        other => Ok(other?),
    }
}

/// Credits one point per order, once per order id however often it is called: the
/// retries on conflict run inside the order's claim.
#[retry_on_conflict(attempts = 50, backoff = "1ms", max_backoff = "50ms")]
#[idempotent(key = "credit:{order_id}", wait = "120s")]
async fn credit(
    idem: &Idem,
    account: &str,
    order_id: u64,
    runs: &AtomicUsize,
) -> Result<u64, AppError> {
    runs.fetch_add(1, Ordering::SeqCst);
    let current = idem.load::<u64>(&BALANCE, account).await?;
    let (points, version) = current.map_or((0, 0), |v| (v.value, v.version));
    tokio::task::yield_now().await;
    idem.compare_and_set(&BALANCE, account, version, points + 1)
        .await?;
    Ok(points + 1)
}

/// Waiters poll a held move until it settles: generous, so that 100 callers on a slow
/// SQL store never give up (`Error::InProgress`) before the body ends.
static ORDER: LazyLock<StateMachine> = LazyLock::new(|| {
    StateMachine::builder("attributes::order")
        .states(["created", "paid", "shipped", "cancelled"])
        .initial("created")
        .allow("created", ["paid", "cancelled"])
        .allow("paid", ["shipped", "cancelled"])
        .terminal(["shipped", "cancelled"])
        .wait(Duration::from_secs(120))
        .build()
        .expect("a valid table")
});

/// Ships an order: the body runs only for the caller that moves it to `shipped`.
#[transition(machine = ORDER, key = "{order_id}", to = "shipped")]
async fn ship(
    order_id: String,
    carrier_up: bool,
    runs: Arc<AtomicUsize>,
) -> Result<Moved<String>, AppError> {
    runs.fetch_add(1, Ordering::SeqCst);
    if !carrier_up {
        return Err(AppError::CarrierDown);
    }
    // Long enough for the other callers to find the move held.
    tokio::time::sleep(Duration::from_millis(20)).await;
    Ok(format!("parcel-for-{order_id}"))
}

fn idem_on(store: Arc<dyn Store>, test: &str) -> Idem {
    Idem::builder()
        .shared_store(store)
        .namespace(support::unique(test))
        .build()
}

/// 50 concurrent tasks add 1 to one balance through `#[retry_on_conflict]`: exactly 50,
/// version 50.
async fn retry_adds_exactly_50(store: Arc<dyn Store>) {
    let idem = idem_on(store, "attr-retry");
    let conflicts = Arc::new(AtomicUsize::new(0));
    let start = Arc::new(Barrier::new(50));
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let (idem, conflicts, start) = (idem.clone(), conflicts.clone(), start.clone());
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            idem.scope(add_one(&idem, "acct", &conflicts)).await
        }));
    }
    for task in tasks {
        task.await
            .unwrap()
            .expect("every add lands within its attempts");
    }
    let balance = idem.load::<u64>(&BALANCE, "acct").await.unwrap().unwrap();
    assert_eq!((balance.value, balance.version), (50, 50));
    eprintln!(
        "retry_adds_exactly_50 on {}: {} lost races re-run",
        idem.store().name(),
        conflicts.load(Ordering::Relaxed)
    );
}

/// `#[retry_on_conflict]` above `#[idempotent]`: 25 orders, each credited by two racing
/// callers, on one balance. Each order is credited once (both its callers get the same
/// answer), and no credit is lost to a conflict: the balance ends at exactly 25.
async fn retry_inside_idempotent_credits_each_order_once(store: Arc<dyn Store>) {
    let idem = idem_on(store, "attr-credit");
    let runs = Arc::new(AtomicUsize::new(0));
    let start = Arc::new(Barrier::new(50));
    let mut tasks = Vec::new();
    for i in 0..50u64 {
        let (idem, runs, start) = (idem.clone(), runs.clone(), start.clone());
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            let order_id = i % 25;
            let points = idem.scope(credit(&idem, "acct", order_id, &runs)).await;
            (
                order_id,
                points.expect("every credit lands within its attempts"),
            )
        }));
    }
    let mut answers = std::collections::HashMap::<u64, Vec<u64>>::new();
    for task in tasks {
        let (order_id, points) = task.await.unwrap();
        answers.entry(order_id).or_default().push(points);
    }
    assert_eq!(answers.len(), 25);
    for (order_id, points) in &answers {
        assert_eq!(points.len(), 2);
        assert_eq!(
            points[0], points[1],
            "order {order_id}: one credit, replayed"
        );
    }
    let mut credited: Vec<u64> = answers.values().map(|p| p[0]).collect();
    credited.sort_unstable();
    assert_eq!(
        credited,
        (1..=25).collect::<Vec<_>>(),
        "each credit saw the one before"
    );
    let balance = idem.load::<u64>(&BALANCE, "acct").await.unwrap().unwrap();
    assert_eq!((balance.value, balance.version), (25, 25));
    // Body runs: one per order plus one per lost race, never a second credit.
    assert!(runs.load(Ordering::SeqCst) >= 25);
}

/// 100 concurrent callers of `#[transition(to = "shipped")]` on a paid order: the body
/// runs once, one caller sees `Performed`, the 99 others wait for the held move and see
/// `AlreadyThere`.
async fn transition_100_callers_ship_once(store: Arc<dyn Store>) {
    let idem = idem_on(store, "attr-ship");
    let order = "order-1".to_owned();
    idem.transition(&ORDER, &order, "created").await.unwrap();
    idem.transition(&ORDER, &order, "paid").await.unwrap();

    let runs = Arc::new(AtomicUsize::new(0));
    let start = Arc::new(Barrier::new(100));
    let mut tasks = Vec::new();
    for _ in 0..100 {
        let (idem, order, runs, start) = (idem.clone(), order.clone(), runs.clone(), start.clone());
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            idem.scope(ship(order, true, runs)).await
        }));
    }
    let (mut performed, mut already) = (Vec::new(), 0);
    for task in tasks {
        match task.await.unwrap() {
            Ok(Moved::Performed { from, value }) => performed.push((from, value)),
            Ok(Moved::AlreadyThere) => already += 1,
            Err(e) => panic!("a caller failed: {e:?}"),
        }
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the body ran once");
    assert_eq!(
        performed,
        vec![(Some("paid".to_owned()), "parcel-for-order-1".to_owned())]
    );
    assert_eq!(already, 99);
    assert_eq!(
        idem.state(&ORDER, &order).await.unwrap().as_deref(),
        Some("shipped")
    );
}

/// A move the table does not allow (`shipped` from `created`) is `InvalidTransition`
/// and the body does not run; a body that fails leaves the order where it was, and the
/// next call performs the move.
async fn transition_refused_and_failed_moves(store: Arc<dyn Store>) {
    let idem = idem_on(store, "attr-refused");
    let runs = Arc::new(AtomicUsize::new(0));
    idem.transition(&ORDER, "early", "created").await.unwrap();
    let early = idem.scope(ship("early".into(), true, runs.clone())).await;
    match early {
        Err(AppError::Idem(Error::InvalidTransition { from, to })) => {
            assert_eq!((from.as_deref(), to.as_str()), (Some("created"), "shipped"));
        }
        other => panic!("expected InvalidTransition, got {other:?}"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the body did not run");
    assert_eq!(
        idem.state(&ORDER, "early").await.unwrap().as_deref(),
        Some("created")
    );

    idem.transition(&ORDER, "late", "created").await.unwrap();
    idem.transition(&ORDER, "late", "paid").await.unwrap();
    let down = idem.scope(ship("late".into(), false, runs.clone())).await;
    assert!(matches!(down, Err(AppError::CarrierDown)), "{down:?}");
    assert_eq!(
        idem.state(&ORDER, "late").await.unwrap().as_deref(),
        Some("paid"),
        "a failed body leaves the order where it was"
    );
    let up = idem
        .scope(ship("late".into(), true, runs.clone()))
        .await
        .unwrap();
    assert!(up.performed());
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// One test per case on the store that `$make` builds.
macro_rules! on_store {
    ($name:ident, $make:expr) => {
        mod $name {
            #[test]
            fn retry_adds_exactly_50() {
                idem_runtime::testing::run_case($make, super::retry_adds_exactly_50);
            }

            #[test]
            fn retry_inside_idempotent_credits_each_order_once() {
                idem_runtime::testing::run_case(
                    $make,
                    super::retry_inside_idempotent_credits_each_order_once,
                );
            }

            #[test]
            fn transition_100_callers_ship_once() {
                idem_runtime::testing::run_case($make, super::transition_100_callers_ship_once);
            }

            #[test]
            fn transition_refused_and_failed_moves() {
                idem_runtime::testing::run_case($make, super::transition_refused_and_failed_moves);
            }
        }
    };
}

/// One SQLite file per test binary run, shared by its tests as processes would.
fn sqlite_url() -> String {
    static PATH: LazyLock<String> = LazyLock::new(|| {
        std::env::temp_dir()
            .join(format!("idem-sqlite-attributes-{}.db", support::suffix()))
            .display()
            .to_string()
    });
    format!("sqlite://{}?mode=rwc", *PATH)
}

/// Connects, failing loudly with the command that starts the server.
async fn sql(url: String, start: &str) -> Arc<dyn Store> {
    match tokio::time::timeout(
        Duration::from_secs(20),
        idem_runtime::SqlStore::connect(&url),
    )
    .await
    {
        Ok(Ok(store)) => Arc::new(store),
        other => {
            panic!("the SQL store at {url} is not reachable ({other:?}).\nStart it with: {start}")
        }
    }
}

on_store!(memory, || async {
    std::sync::Arc::new(idem_runtime::MemoryStore::new()) as std::sync::Arc<dyn idem_runtime::Store>
});

on_store!(redis, || async {
    std::sync::Arc::new(
        idem_runtime::RedisStore::connect(crate::harness::shared_url()).expect("store"),
    ) as std::sync::Arc<dyn idem_runtime::Store>
});

on_store!(postgres, || crate::sql(
    crate::support::pg_url(),
    "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start (or set IDEM_TEST_PG_URL)"
));

on_store!(mysql, || crate::sql(
    crate::support::mysql_url(),
    "service mariadb start (or set IDEM_TEST_MYSQL_URL)"
));

on_store!(sqlite, || crate::sql(
    crate::sqlite_url(),
    "(a local file: check the temp directory is writable)"
));
