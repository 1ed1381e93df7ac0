//! The `checkout` example killed with SIGKILL at random moments, three times, then run
//! to completion: every order is charged once at the gateway and mailed once, and with
//! `--transactional` reserved once, on Redis and PostgreSQL stores. The ledger is the
//! loopback PostgreSQL; the rows are counted from outside, as its users would.
//!
//! The kill moments come from a seeded generator: `CHECKOUT_SEED=N` replays a run's
//! moments (each case prints its seed).

use std::os::unix::process::ExitStatusExt as _;
use std::process::Stdio;
use std::time::Duration;

use idem_runtime::store::sql::sqlx::{self, PgPool};
use idem_runtime::{Idem, Options};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const PG: &str = "postgres://postgres@127.0.0.1:5432/test";
const REDIS: &str = "redis://127.0.0.1:6379";
const ORDERS: u64 = 200;
const LEASE_MS: &str = "500";
/// A bound on one run of the program, far past what it needs: a run that hangs fails
/// the test instead of hanging it.
const RUN_BOUND: Duration = Duration::from_secs(180);

/// One case at a time: each run holds up to two dozen PostgreSQL connections, and the
/// server's default limit is shared with every other test.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// SplitMix64: the kill moments, reproducible by seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % n.max(1)
    }
}

fn nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

fn seed() -> u64 {
    std::env::var("CHECKOUT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(nanos)
}

async fn ledger() -> PgPool {
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(PG)
        .await
        .unwrap_or_else(|e| {
            panic!("PostgreSQL at {PG} is needed (start it with default settings, trust auth, database test): {e}")
        })
}

fn checkout(store: &str, run: &str, transactional: bool) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_checkout"));
    cmd.args(["--store", store, "--ledger", PG])
        .args(["--orders", &ORDERS.to_string(), "--run", run])
        .args(["--lease-ms", LEASE_MS])
        .kill_on_drop(true);
    if transactional {
        cmd.arg("--transactional");
    }
    cmd
}

/// Starts a run and waits for the line that says it started: its tables exist and
/// its workers are taking orders.
async fn start(store: &str, run: &str, transactional: bool) -> Child {
    let mut child = checkout(store, run, transactional)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the checkout example");
    let stdout = child.stdout.take().expect("piped stdout");
    let mut lines = BufReader::new(stdout).lines();
    tokio::time::timeout(RUN_BOUND, async {
        loop {
            match lines.next_line().await.expect("read stdout") {
                Some(l) if l.contains("started") => return,
                Some(_) => continue,
                None => panic!("checkout exited before it started"),
            }
        }
    })
    .await
    .expect("checkout starts");
    child
}

async fn charged(ledger: &PgPool, run: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM checkout_gateway WHERE run_id = $1")
        .bind(run)
        .fetch_one(ledger)
        .await
        .expect("count the gateway's rows")
}

/// Starts a run, lets it charge a random number of further orders, waits a random
/// moment more and kills it with SIGKILL. Returns how many orders had been charged.
async fn kill_at_random(
    ledger: &PgPool,
    store: &str,
    run: &str,
    transactional: bool,
    rng: &mut Rng,
) -> i64 {
    let mut child = start(store, run, transactional).await;
    let before = charged(ledger, run).await;
    // Never so far that the run could finish before the kill lands.
    let target = (before + 5 + rng.below(40) as i64).min(ORDERS as i64 - 30);
    let pause = Duration::from_millis(rng.below(10));
    tokio::time::timeout(RUN_BOUND, async {
        while charged(ledger, run).await < target {
            if let Some(status) = child.try_wait().expect("poll the child") {
                panic!("checkout ended ({status}) before it charged {target} orders");
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
    .expect("the run makes progress");
    tokio::time::sleep(pause).await;
    child.start_kill().expect("SIGKILL the run");
    let status = child.wait().await.expect("reap the killed run");
    assert_eq!(
        status.signal(),
        Some(9),
        "the run was still working when killed: {status}"
    );
    charged(ledger, run).await
}

/// Runs to completion; returns the summary line's `name=value` pairs.
async fn finish(store: &str, run: &str, transactional: bool) -> Vec<(String, u64)> {
    let out = tokio::time::timeout(RUN_BOUND, checkout(store, run, transactional).output())
        .await
        .expect("the last run finishes")
        .expect("run the checkout example");
    let stdout = String::from_utf8_lossy(&out.stdout);
    // Retries and their causes, if any.
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "the last run failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let summary = stdout
        .lines()
        .find(|l| l.starts_with("summary "))
        .unwrap_or_else(|| panic!("no summary line in:\n{stdout}"));
    println!("{summary}");
    summary
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
        .collect()
}

/// What the ledger holds for one run.
#[derive(Debug)]
struct Counts {
    gateway_rows: i64,
    gateway_orders: i64,
    gateway_lowest: Option<i64>,
    gateway_highest: Option<i64>,
    gateway_calls: i64,
    keys_called_twice: i64,
    mails: i64,
    mailed_orders: i64,
    reservations: i64,
    reserved_orders: i64,
}

async fn counts(ledger: &PgPool, run: &str) -> Counts {
    let (gateway_rows, gateway_orders, gateway_lowest, gateway_highest, gateway_calls, twice): (
        i64,
        i64,
        Option<i64>,
        Option<i64>,
        Option<i64>,
        i64,
    ) = sqlx::query_as(
        "SELECT count(*), count(DISTINCT order_id), min(order_id), max(order_id), \
         sum(calls)::bigint, count(*) FILTER (WHERE calls > 1) \
         FROM checkout_gateway WHERE run_id = $1",
    )
    .bind(run)
    .fetch_one(ledger)
    .await
    .expect("count the gateway");
    let per_order = |table: &str| {
        format!("SELECT count(*), count(DISTINCT order_id) FROM {table} WHERE run_id = $1")
    };
    let (mails, mailed_orders): (i64, i64) =
        sqlx::query_as(sqlx::AssertSqlSafe(per_order("checkout_mails")))
            .bind(run)
            .fetch_one(ledger)
            .await
            .expect("count the mails");
    let (reservations, reserved_orders): (i64, i64) =
        sqlx::query_as(sqlx::AssertSqlSafe(per_order("checkout_reservations")))
            .bind(run)
            .fetch_one(ledger)
            .await
            .expect("count the reservations");
    Counts {
        gateway_rows,
        gateway_orders,
        gateway_lowest,
        gateway_highest,
        gateway_calls: gateway_calls.unwrap_or(0),
        keys_called_twice: twice,
        mails,
        mailed_orders,
        reservations,
        reserved_orders,
    }
}

/// Removes the run's rows from the ledger and its records from the store.
async fn clean_up(ledger: &PgPool, store: &str, run: &str) {
    for table in [
        "checkout_gateway",
        "checkout_reservations",
        "checkout_mails",
    ] {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DELETE FROM {table} WHERE run_id = $1"
        )))
        .bind(run)
        .execute(ledger)
        .await
        .expect("delete the run's rows");
    }
    if store == "memory" {
        return;
    }
    // The example's records: namespace `checkout-RUN`, function `checkout::order`,
    // keyed by order id.
    let idem = Idem::builder()
        .shared_store(
            idem_runtime::store::connect(store)
                .await
                .expect("reach the store"),
        )
        .namespace(format!("checkout-{run}"))
        .build();
    let opts = Options::dedup("checkout::order");
    for order in 0..ORDERS {
        idem.forget(&opts, order).await.expect("forget a record");
    }
}

fn assert_once_each(c: &Counts, transactional: bool) {
    let n = ORDERS as i64;
    assert_eq!(c.gateway_rows, n, "one gateway row per order: {c:?}");
    assert_eq!(
        c.gateway_orders, n,
        "no order missing at the gateway: {c:?}"
    );
    assert_eq!(c.gateway_lowest, Some(0), "{c:?}");
    assert_eq!(c.gateway_highest, Some(n - 1), "{c:?}");
    assert_eq!(c.mails, n, "one mail per order: {c:?}");
    assert_eq!(c.mailed_orders, n, "no order missing a mail: {c:?}");
    assert_eq!(c.reserved_orders, n, "every order reserved: {c:?}");
    if transactional {
        assert_eq!(c.reservations, n, "one reservation per order: {c:?}");
    } else {
        assert!(c.reservations >= n, "{c:?}");
    }
}

/// Three SIGKILLs at random moments, then a run to completion, on `store`.
async fn killed_three_times(store: &str, transactional: bool, label: &str) {
    let _turn = ONE_AT_A_TIME.lock().await;
    let ledger = ledger().await;
    let run = format!("test-{label}-{}-{}", std::process::id(), nanos());
    let seed = seed();
    println!("{label}: run {run}, CHECKOUT_SEED={seed}");
    let mut rng = Rng(seed);
    let mut at_kills = Vec::new();
    for _ in 0..3 {
        at_kills.push(kill_at_random(&ledger, store, &run, transactional, &mut rng).await);
    }
    let summary = finish(store, &run, transactional).await;
    // The same command once more: every order replays, nothing runs.
    let again = finish(store, &run, transactional).await;
    let c = counts(&ledger, &run).await;
    clean_up(&ledger, store, &run).await;
    println!(
        "{label}: charged orders at the kills {at_kills:?}; gateway calls {} for {} keys, \
         {} keys called more than once; {} mails; {} reservations for {} orders",
        c.gateway_calls,
        c.gateway_rows,
        c.keys_called_twice,
        c.mails,
        c.reservations,
        c.reserved_orders
    );
    assert_once_each(&c, transactional);
    let get = |k: &str| {
        summary
            .iter()
            .find(|(name, _)| name == k)
            .map(|(_, v)| *v)
            .unwrap_or_else(|| panic!("no {k} in the summary"))
    };
    assert_eq!(get("done"), ORDERS);
    // The last run found the killed runs' work: finished orders replay, the rest ran
    // here, some of them resumed from a journal. Of the orders charged before the last
    // kill, at most the 8 workers' orders of each killed run were unfinished.
    assert_eq!(get("bodies_ran") + get("orders_replayed"), ORDERS);
    assert!(
        get("orders_replayed") as i64 >= at_kills[2] - 3 * 8,
        "{summary:?}"
    );
    assert!(
        again.contains(&("orders_replayed".to_string(), ORDERS))
            && again.contains(&("bodies_ran".to_string(), 0)),
        "{again:?}"
    );
}

/// One SIGKILL at a random moment, some orders left half done (charged, not mailed);
/// then a run that only recovers, and exits 0 having finished every abandoned order:
/// every order with any effect has exactly one charge and one mail (and with
/// `transactional`, one reservation). Nobody submits the orders again.
async fn recovered_after_a_kill(store: &str, transactional: bool, label: &str) {
    let _turn = ONE_AT_A_TIME.lock().await;
    let ledger = ledger().await;
    let run = format!("test-recover-{label}-{}-{}", std::process::id(), nanos());
    let seed = seed();
    println!("{label}: run {run}, CHECKOUT_SEED={seed}");
    let at_kill = kill_at_random(&ledger, store, &run, transactional, &mut Rng(seed)).await;
    let before = counts(&ledger, &run).await;
    let mut cmd = checkout(store, &run, transactional);
    cmd.arg("--recover-only");
    let out = tokio::time::timeout(RUN_BOUND, cmd.output())
        .await
        .expect("the recovering run finishes")
        .expect("run the checkout example");
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    let c = counts(&ledger, &run).await;
    clean_up(&ledger, store, &run).await;
    assert!(
        out.status.success(),
        "--recover-only failed ({}):\n{stdout}",
        out.status
    );
    let summary = stdout
        .lines()
        .find(|l| l.starts_with("summary "))
        .unwrap_or_default();
    println!(
        "{label}: {at_kill} orders charged at the kill, {} of them not mailed yet; {summary}",
        before.gateway_orders - before.mailed_orders
    );
    assert!(summary.contains(" recovered="), "{stdout}");
    assert_eq!(
        c.gateway_rows, c.gateway_orders,
        "one charge per order: {c:?}"
    );
    assert_eq!(c.mails, c.mailed_orders, "one mail per order: {c:?}");
    assert_eq!(
        c.mailed_orders, c.gateway_orders,
        "every charged order mailed: {c:?}"
    );
    assert_eq!(
        c.reserved_orders, c.gateway_orders,
        "every charged order reserved: {c:?}"
    );
    if transactional {
        assert_eq!(
            c.reservations, c.reserved_orders,
            "one reservation per order: {c:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_recover_only_finishes_a_killed_run() {
    recovered_after_a_kill(REDIS, false, "redis").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_transactional_recover_only_finishes_a_killed_run() {
    recovered_after_a_kill(PG, true, "postgres-tx").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_store_survives_three_kills() {
    killed_three_times(REDIS, false, "redis").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_store_survives_three_kills() {
    killed_three_times(PG, false, "postgres").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_transactional_reserves_once_through_three_kills() {
    killed_three_times(PG, true, "postgres-tx").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_store_completes_every_order_once() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let ledger = ledger().await;
    let run = format!("test-memory-{}-{}", std::process::id(), nanos());
    let summary = finish("memory", &run, false).await;
    let c = counts(&ledger, &run).await;
    clean_up(&ledger, "memory", &run).await;
    assert_once_each(&c, true);
    assert!(
        summary.contains(&("charge_ran".to_string(), ORDERS)),
        "{summary:?}"
    );
    assert!(
        summary.contains(&("mail_ran".to_string(), ORDERS)),
        "{summary:?}"
    );
}

#[tokio::test]
async fn transactional_needs_the_ledgers_postgres_as_store() {
    for store in ["memory", REDIS] {
        let out = checkout(store, "never-runs", true)
            .output()
            .await
            .expect("run the checkout example");
        assert_eq!(
            out.status.code(),
            Some(2),
            "--store {store} --transactional"
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("--transactional"), "{stderr}");
    }
}
