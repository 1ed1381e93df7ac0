//! Run-time behaviour of functions rewritten by `#[idempotent]`: the expansion must keep
//! the function's meaning (arguments, `?`, early `return`, methods, references) while
//! routing every call through the runtime. Each test has its own `Idem` on a fresh
//! `MemoryStore`, so tests do not share records.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use idem_runtime::{Error, Idem, MemoryStore, idempotent};
use serde::{Deserialize, Serialize};
use tokio::task::JoinSet;

#[derive(Debug)]
enum AppError {
    Idem(Error),
    Declined,
    BadInput(std::num::ParseIntError),
}

impl From<Error> for AppError {
    fn from(e: Error) -> Self {
        AppError::Idem(e)
    }
}

impl From<std::num::ParseIntError> for AppError {
    fn from(e: std::num::ParseIntError) -> Self {
        AppError::BadInput(e)
    }
}

fn idem() -> Idem {
    Idem::builder()
        .store(MemoryStore::new())
        .namespace("macro-tests")
        .build()
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    order: u64,
    cents: u64,
    serial: usize,
}

#[derive(Serialize)]
struct Order {
    id: u64,
}

static FREE_RUNS: AtomicUsize = AtomicUsize::new(0);

#[idempotent(key = "charge:{order_id}")]
async fn charge_free(order_id: u64, cents: u64) -> Result<Receipt, AppError> {
    let serial = FREE_RUNS.fetch_add(1, Ordering::SeqCst);
    // Long enough that the concurrent duplicates really overlap with this run.
    tokio::time::sleep(Duration::from_millis(50)).await;
    Ok(Receipt {
        order: order_id,
        cents,
        serial,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn free_fn_runs_once_under_concurrent_duplicates() {
    let idem = idem();
    let mut tasks = JoinSet::new();
    for _ in 0..100 {
        let idem = idem.clone();
        tasks.spawn(async move { idem.scope(charge_free(7, 500)).await });
    }
    let mut receipts = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        receipts.push(joined.expect("task panicked").expect("charge failed"));
    }
    assert_eq!(
        FREE_RUNS.load(Ordering::SeqCst),
        1,
        "body ran more than once"
    );
    assert_eq!(receipts.len(), 100);
    assert!(
        receipts.iter().all(|r| *r == receipts[0]),
        "callers got different values"
    );

    // A different key is a different operation.
    let other = idem
        .scope(charge_free(8, 500))
        .await
        .expect("charge failed");
    assert_eq!(other.order, 8);
    assert_eq!(FREE_RUNS.load(Ordering::SeqCst), 2);
}

struct Shop {
    name: String,
    runs: AtomicUsize,
}

impl Shop {
    #[idempotent(key = "{self.name}:refund:{order.id}:{sku}")]
    async fn refund(&self, order: &Order, sku: &str) -> Result<String, AppError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        Ok(format!(
            "{} refunded {} of order {}",
            self.name, sku, order.id
        ))
    }
}

#[tokio::test]
async fn method_with_reference_args_and_field_paths() {
    let idem = idem();
    let shop = Shop {
        name: "corner".into(),
        runs: AtomicUsize::new(0),
    };
    let order = Order { id: 42 };
    let first = idem
        .scope(shop.refund(&order, "apple"))
        .await
        .expect("refund");
    let again = idem
        .scope(shop.refund(&order, "apple"))
        .await
        .expect("refund");
    assert_eq!(first, "corner refunded apple of order 42");
    assert_eq!(again, first);
    assert_eq!(shop.runs.load(Ordering::SeqCst), 1);

    // Each part of the key matters: another sku, another order, another shop.
    idem.scope(shop.refund(&order, "pear"))
        .await
        .expect("refund");
    idem.scope(shop.refund(&Order { id: 43 }, "apple"))
        .await
        .expect("refund");
    assert_eq!(shop.runs.load(Ordering::SeqCst), 3);
    let other_shop = Shop {
        name: "market".into(),
        runs: AtomicUsize::new(0),
    };
    idem.scope(other_shop.refund(&order, "apple"))
        .await
        .expect("refund");
    assert_eq!(other_shop.runs.load(Ordering::SeqCst), 1);
}

static OWNED_RUNS: AtomicUsize = AtomicUsize::new(0);

// `name` is rendered into the key before the body takes ownership of it.
#[idempotent(key = "greet:{name}")]
async fn greet(name: String) -> Result<String, AppError> {
    OWNED_RUNS.fetch_add(1, Ordering::SeqCst);
    let mut name = name;
    name.insert_str(0, "hello ");
    Ok(name)
}

#[tokio::test]
async fn owned_args_used_in_key_and_body() {
    let idem = idem();
    assert_eq!(
        idem.scope(greet("ann".into())).await.expect("greet"),
        "hello ann"
    );
    assert_eq!(
        idem.scope(greet("ann".into())).await.expect("greet"),
        "hello ann"
    );
    assert_eq!(
        idem.scope(greet("bob".into())).await.expect("greet"),
        "hello bob"
    );
    assert_eq!(OWNED_RUNS.load(Ordering::SeqCst), 2);
}

static PARSE_RUNS: AtomicUsize = AtomicUsize::new(0);

#[idempotent(key = "parse:{id}")]
async fn parse_amount(id: u64, raw: &str) -> Result<u64, AppError> {
    PARSE_RUNS.fetch_add(1, Ordering::SeqCst);
    if raw == "free" {
        return Ok(0);
    }
    // `?` converts into the function's own error type, as without the attribute.
    let cents: u64 = raw.parse()?;
    if cents > 10_000 {
        return Err(AppError::Declined);
    }
    Ok(cents)
}

#[tokio::test]
async fn question_mark_and_early_return_inside_the_body() {
    let idem = idem();
    // `?` fails: the error reaches the caller and the key is released...
    let err = idem
        .scope(parse_amount(1, "x1"))
        .await
        .expect_err("bad input");
    assert!(
        matches!(&err, AppError::BadInput(e) if e.to_string().contains("invalid digit")),
        "{err:?}"
    );
    // ...so a retry with the same key runs the body again.
    let err = idem
        .scope(parse_amount(1, "20000"))
        .await
        .expect_err("declined");
    assert!(matches!(err, AppError::Declined), "{err:?}");
    assert_eq!(
        idem.scope(parse_amount(1, "250")).await.expect("parsed"),
        250
    );
    assert_eq!(PARSE_RUNS.load(Ordering::SeqCst), 3);
    // Completed: replayed, even though this input would now parse differently.
    assert_eq!(
        idem.scope(parse_amount(1, "999")).await.expect("replay"),
        250
    );
    assert_eq!(PARSE_RUNS.load(Ordering::SeqCst), 3);

    // An early `return Ok(..)` is stored and replayed like the tail value.
    assert_eq!(idem.scope(parse_amount(2, "free")).await.expect("free"), 0);
    assert_eq!(idem.scope(parse_amount(2, "5")).await.expect("replay"), 0);
    assert_eq!(PARSE_RUNS.load(Ordering::SeqCst), 4);
}

// Every path returns early, so the tail the expansion adds after the body is unreachable;
// that must not warn (this file is built with `-D warnings` in CI).
#[allow(clippy::needless_return)]
#[idempotent(key = "sign:{n}")]
async fn sign(n: i64) -> Result<String, AppError> {
    if n < 0 {
        return Ok("negative".into());
    }
    return Ok("non-negative".into());
}

#[tokio::test]
async fn a_body_that_always_returns_early() {
    let idem = idem();
    assert_eq!(idem.scope(sign(-1)).await.expect("sign"), "negative");
    assert_eq!(idem.scope(sign(1)).await.expect("sign"), "non-negative");
}

static FP_RUNS: AtomicUsize = AtomicUsize::new(0);

#[idempotent(key = "pay:{order.id}", fingerprint = [order, cents])]
async fn pay(order: &Order, cents: u64) -> Result<u64, AppError> {
    FP_RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(cents)
}

#[tokio::test]
async fn fingerprint_rejects_the_same_key_with_another_payload() {
    let idem = idem();
    let order = Order { id: 9 };
    assert_eq!(idem.scope(pay(&order, 100)).await.expect("pay"), 100);
    assert_eq!(idem.scope(pay(&order, 100)).await.expect("replay"), 100);
    let err = idem.scope(pay(&order, 999)).await.expect_err("mismatch");
    assert!(
        matches!(err, AppError::Idem(Error::PayloadMismatch { .. })),
        "{err:?}"
    );
    assert_eq!(FP_RUNS.load(Ordering::SeqCst), 1);
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
enum GatewayError {
    Declined(String),
    Idem(String),
}

impl From<Error> for GatewayError {
    fn from(e: Error) -> Self {
        GatewayError::Idem(e.to_string())
    }
}

static CACHE_ERR_RUNS: AtomicUsize = AtomicUsize::new(0);

#[idempotent(key = "card:{card}", cache_err = true)]
async fn charge_card(card: &str) -> Result<u64, GatewayError> {
    let run = CACHE_ERR_RUNS.fetch_add(1, Ordering::SeqCst);
    Err(GatewayError::Declined(format!(
        "{card} declined on run {run}"
    )))
}

#[tokio::test]
async fn cache_err_replays_the_error() {
    let idem = idem();
    let first = idem.scope(charge_card("4242")).await.expect_err("declined");
    let again = idem.scope(charge_card("4242")).await.expect_err("declined");
    assert_eq!(
        first,
        GatewayError::Declined("4242 declined on run 0".into())
    );
    assert_eq!(
        again, first,
        "the stored error is replayed, the body is not re-run"
    );
    assert_eq!(CACHE_ERR_RUNS.load(Ordering::SeqCst), 1);
}

/// Not serde: with `on_duplicate = "reject"` nothing is replayed, so nothing is stored.
#[derive(Debug)]
struct Connection {
    id: u64,
}

static REJECT_RUNS: AtomicUsize = AtomicUsize::new(0);

#[idempotent(key = "open:{id}", on_duplicate = "reject")]
async fn open(id: u64) -> Result<Connection, AppError> {
    REJECT_RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(Connection { id })
}

#[tokio::test]
async fn reject_with_a_non_serde_ok_type() {
    let idem = idem();
    let conn = idem.scope(open(3)).await.expect("first call runs");
    assert_eq!(conn.id, 3);
    let err = idem.scope(open(3)).await.expect_err("duplicate");
    assert!(
        matches!(err, AppError::Idem(Error::Duplicate { .. })),
        "{err:?}"
    );
    assert_eq!(REJECT_RUNS.load(Ordering::SeqCst), 1);
}

static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);
static MAX_IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);
static LOCK_RUNS: AtomicUsize = AtomicUsize::new(0);

#[idempotent(key = "stock:{sku}", strategy = "lock", lease = "5s", wait = "10s")]
async fn reserve(sku: &str) -> Result<Option<u64>, AppError> {
    let now = IN_FLIGHT.fetch_add(1, Ordering::SeqCst) + 1;
    MAX_IN_FLIGHT.fetch_max(now, Ordering::SeqCst);
    LOCK_RUNS.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(5)).await;
    IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
    Ok(idem_runtime::fence())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lock_excludes_and_hands_out_increasing_fences() {
    let idem = idem();
    assert_eq!(idem_runtime::fence(), None, "no fence outside a lock body");
    let mut tasks = JoinSet::new();
    for _ in 0..20 {
        let idem = idem.clone();
        tasks.spawn(async move { idem.scope(reserve("sku-1")).await });
    }
    let mut fences = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        let fence = joined.expect("task panicked").expect("reserve failed");
        fences.push(fence.expect("a lock body sees its fencing token"));
    }
    assert_eq!(
        LOCK_RUNS.load(Ordering::SeqCst),
        20,
        "a lock runs every call"
    );
    assert_eq!(
        MAX_IN_FLIGHT.load(Ordering::SeqCst),
        1,
        "two bodies overlapped"
    );
    fences.sort_unstable();
    fences.dedup();
    assert_eq!(fences.len(), 20, "fencing tokens must be distinct");

    // A later holder always gets a larger token than every earlier one.
    let later = idem.scope(reserve("sku-1")).await.expect("reserve");
    assert!(later > fences.last().copied(), "{later:?} after {fences:?}");
}

static TOKEN_RUNS: AtomicUsize = AtomicUsize::new(0);

#[idempotent(key = "{token}", strategy = "token")]
async fn submit_form(token: &str, amount: u64) -> Result<u64, AppError> {
    TOKEN_RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(amount)
}

#[tokio::test]
async fn token_is_consumed_once() {
    let idem = idem();
    let token = idem
        .issue_token(Duration::from_secs(60))
        .await
        .expect("issue token");
    assert_eq!(
        idem.scope(submit_form(&token, 10))
            .await
            .expect("first use"),
        10
    );
    let err = idem
        .scope(submit_form(&token, 10))
        .await
        .expect_err("second use");
    assert!(
        matches!(err, AppError::Idem(Error::Duplicate { .. })),
        "{err:?}"
    );
    let err = idem
        .scope(submit_form("not-a-token", 10))
        .await
        .expect_err("unknown token");
    assert!(
        matches!(err, AppError::Idem(Error::TokenInvalid { .. })),
        "{err:?}"
    );
    assert_eq!(TOKEN_RUNS.load(Ordering::SeqCst), 1);
}

static SLOW_STARTED: AtomicUsize = AtomicUsize::new(0);

#[idempotent(key = "slow:{id}", wait = "0s")]
async fn slow(id: u64, gate: Arc<tokio::sync::Notify>) -> Result<u64, AppError> {
    SLOW_STARTED.fetch_add(1, Ordering::SeqCst);
    gate.notified().await;
    Ok(id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_zero_fails_at_once_while_a_twin_runs() {
    let idem = idem();
    let gate = Arc::new(tokio::sync::Notify::new());
    let first = tokio::spawn({
        let (idem, gate) = (idem.clone(), gate.clone());
        async move { idem.scope(slow(1, gate)).await }
    });
    while SLOW_STARTED.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let err = idem
        .scope(slow(1, gate.clone()))
        .await
        .expect_err("twin in flight");
    assert!(
        matches!(err, AppError::Idem(Error::InProgress { .. })),
        "{err:?}"
    );
    gate.notify_one();
    assert_eq!(first.await.expect("task panicked").expect("first call"), 1);
    assert_eq!(SLOW_STARTED.load(Ordering::SeqCst), 1);
}

mod renamed_crate {
    use super::{AppError, idem};
    use std::sync::atomic::{AtomicUsize, Ordering};

    // What a user with a renamed dependency writes.
    use idem_runtime as renamed;

    static RUNS: AtomicUsize = AtomicUsize::new(0);

    #[renamed::idempotent(key = "renamed:{id}", crate = "renamed")]
    async fn work(id: u64) -> Result<u64, AppError> {
        RUNS.fetch_add(1, Ordering::SeqCst);
        Ok(id * 2)
    }

    #[tokio::test]
    async fn crate_option_points_at_the_runtime() {
        let idem = idem();
        assert_eq!(idem.scope(work(21)).await.expect("work"), 42);
        assert_eq!(idem.scope(work(21)).await.expect("replay"), 42);
        assert_eq!(RUNS.load(Ordering::SeqCst), 1);
    }
}

static SCOPED_RUNS: AtomicU64 = AtomicU64::new(0);

#[idempotent(key = "scoped:{id}")]
async fn scoped(id: u64) -> Result<u64, AppError> {
    SCOPED_RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(id)
}

#[tokio::test]
async fn records_belong_to_the_runtime_in_scope() {
    // Two runtimes with their own stores: the same key runs once in each.
    let (a, b) = (idem(), idem());
    a.scope(scoped(1)).await.expect("a");
    a.scope(scoped(1)).await.expect("a replay");
    b.scope(scoped(1)).await.expect("b");
    assert_eq!(SCOPED_RUNS.load(Ordering::SeqCst), 2);
}

// Replays by clone on the in-process store (`CloneReplay`): the first replay decodes the
// record and keeps the value; later replays clone it. Callers must not see a difference.

/// A value whose `Clone` is observable, so the tests can tell which path answered.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Counted {
    order: u64,
    note: String,
    #[serde(skip)]
    clones: u32,
}

impl Clone for Counted {
    fn clone(&self) -> Self {
        Counted {
            order: self.order,
            note: self.note.clone(),
            clones: self.clones + 1,
        }
    }
}

static COUNTED_RUNS: AtomicUsize = AtomicUsize::new(0);

#[idempotent(key = "counted:{order}:{note}", ttl = "200ms", fingerprint = [cents])]
async fn counted(order: u64, note: &str, cents: u64) -> Result<Counted, AppError> {
    COUNTED_RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(Counted {
        order,
        note: format!("{note}/{cents}"),
        clones: 0,
    })
}

#[tokio::test]
async fn replays_clone_a_decoded_value_and_never_outlive_the_record() {
    let idem = idem();
    idem.scope(async {
        let first = counted(7, "a", 100).await.unwrap();
        assert_eq!((first.note.as_str(), first.clones), ("a/100", 0));
        // First replay: decoded from the record (serde skips `clones`, so 0), then kept.
        let decoded = counted(7, "a", 100).await.unwrap();
        assert_eq!((decoded.note.as_str(), decoded.clones), ("a/100", 0));
        // Later replays: clones of the kept decoded value, equal to what decoding gives.
        for _ in 0..3 {
            let cloned = counted(7, "a", 100).await.unwrap();
            assert_eq!((cloned.order, cloned.note.as_str()), (7, "a/100"));
            // The record keeps a copy of the decoded value; each replay clones that.
            assert_eq!(
                cloned.clones, 2,
                "a clone of the kept copy of the decoded value"
            );
        }
        assert_eq!(COUNTED_RUNS.load(Ordering::SeqCst), 1);
        // The fast path still checks the fingerprint.
        assert!(matches!(
            counted(7, "a", 999).await,
            Err(AppError::Idem(Error::PayloadMismatch { .. }))
        ));
        // String and integer key parts render as `Display` does: another note is
        // another key.
        assert_eq!(counted(7, "b", 100).await.unwrap().note, "b/100");
        assert_eq!(COUNTED_RUNS.load(Ordering::SeqCst), 2);
        // The kept value goes with its record: after the ttl the body runs again and
        // the new value (not the old clone) is replayed.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(counted(7, "a", 100).await.unwrap().clones, 0);
        assert_eq!(COUNTED_RUNS.load(Ordering::SeqCst), 3);
        assert_eq!(counted(7, "a", 100).await.unwrap().clones, 0);
        assert_eq!(counted(7, "a", 100).await.unwrap().clones, 2);
    })
    .await;
}

/// A key part through `Display` and one through the fast path give the same record.
struct Sku(&'static str);

impl std::fmt::Display for Sku {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

static PART_RUNS: AtomicUsize = AtomicUsize::new(0);

#[idempotent(key = "reserve:{sku}:{qty}")]
async fn reserve_display(sku: Sku, qty: i32) -> Result<u32, AppError> {
    Ok(PART_RUNS.fetch_add(1, Ordering::SeqCst) as u32)
}

#[tokio::test]
async fn key_parts_render_like_display_on_every_path() {
    use idem_runtime::Options;
    let idem = idem();
    let first = idem.scope(reserve_display(Sku("sku-1"), -3)).await.unwrap();
    // The direct API renders with `format_args!`; under the same options (the
    // function's scope) it must find the record the attribute wrote.
    static SAME: Options = Options::dedup(concat!(module_path!(), "::reserve_display"));
    let direct: Result<u32, Error> = idem
        .dedup(
            &SAME,
            format_args!("reserve:{}:{}", "sku-1", -3i32),
            async { Ok(99) },
        )
        .await;
    assert_eq!(direct.unwrap(), first);
    assert_eq!(PART_RUNS.load(Ordering::SeqCst), 1);
}

/// A type that is not `Clone` replays by decoding, as before.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct NotClone(u64);

#[idempotent(key = "not-clone:{id}")]
async fn not_clone(id: u64) -> Result<NotClone, AppError> {
    Ok(NotClone(id * 2))
}

#[tokio::test]
async fn values_without_clone_replay_by_decoding() {
    idem()
        .scope(async {
            for _ in 0..3 {
                assert_eq!(not_clone(21).await.unwrap(), NotClone(42));
            }
        })
        .await;
}

/// A `Result` alias that fixes the error type: the `Ok` type is still seen (so a `Clone`
/// value replays by clone), and `?` converts into the alias's error type.
type AppResult<T> = Result<T, AppError>;

static ALIAS_RUNS: AtomicUsize = AtomicUsize::new(0);

#[idempotent(key = "alias:{order_id}")]
async fn charge_alias(order_id: u64, raw: &str) -> AppResult<Receipt> {
    let serial = ALIAS_RUNS.fetch_add(1, Ordering::SeqCst);
    let cents: u64 = raw.parse()?;
    tokio::time::sleep(Duration::from_millis(20)).await;
    Ok(Receipt {
        order: order_id,
        cents,
        serial,
    })
}

/// An alias with no parameters hides the `Ok` type: replays decode the stored value.
type CountResult = std::result::Result<u64, AppError>;

static COUNT_RUNS: AtomicUsize = AtomicUsize::new(0);

#[idempotent(key = "count:{id}")]
async fn count_alias(id: u64) -> CountResult {
    COUNT_RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(id * 3)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn result_aliases_run_once_under_concurrent_duplicates() {
    let idem = idem();
    let mut tasks = JoinSet::new();
    for _ in 0..50 {
        let idem = idem.clone();
        tasks.spawn(async move {
            idem.scope(async { (charge_alias(3, "250").await, count_alias(5).await) })
                .await
        });
    }
    while let Some(joined) = tasks.join_next().await {
        let (receipt, count) = joined.expect("task panicked");
        let receipt = receipt.expect("charge failed");
        assert_eq!((receipt.order, receipt.cents, receipt.serial), (3, 250, 0));
        assert_eq!(count.expect("count failed"), 15);
    }
    assert_eq!(
        ALIAS_RUNS.load(Ordering::SeqCst),
        1,
        "body ran more than once"
    );
    assert_eq!(
        COUNT_RUNS.load(Ordering::SeqCst),
        1,
        "body ran more than once"
    );

    // The body's own error, through `?` into the alias's error type, releases the key.
    let bad = idem.scope(charge_alias(4, "twelve")).await;
    assert!(matches!(bad, Err(AppError::BadInput(_))), "{bad:?}");
    let good = idem
        .scope(charge_alias(4, "12"))
        .await
        .expect("charge failed");
    assert_eq!((good.order, good.cents), (4, 12));
}
