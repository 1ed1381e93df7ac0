//! What operators see: the `idem` span of every call (captured with a subscriber
//! layer), its outcome, the warnings, and the metrics (captured with a recorder).
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use idem_runtime::store::{BoxFuture, ClaimOutcome, ClaimRequest, Owner, Subscription};
use idem_runtime::{Error, Idem, MemoryStore, Options, Store, idempotent};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

// ---- a layer that keeps every `idem` span's fields and every event ----

type FieldMap = HashMap<String, String>;
type Shared<T> = Arc<Mutex<T>>;

#[derive(Default, Clone)]
struct Captured {
    /// Closed `idem` spans, in closing order: field name -> value.
    spans: Shared<Vec<FieldMap>>,
    /// Events: level, message and fields.
    events: Shared<Vec<(Level, FieldMap)>>,
    /// Closed `idem_step` spans, in closing order.
    steps: Shared<Vec<FieldMap>>,
}

#[derive(Default)]
struct Fields(HashMap<String, String>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Captured {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(fields);
        }
    }
    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id)
            && let Some(fields) = span.extensions_mut().get_mut::<Fields>()
        {
            values.record(fields);
        }
    }
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        self.events
            .lock()
            .unwrap()
            .push((*event.metadata().level(), fields.0));
    }
    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(&id)
            && span.name() == idem_runtime::observe::SPAN
            && let Some(fields) = span.extensions_mut().remove::<Fields>()
        {
            self.spans.lock().unwrap().push(fields.0);
        } else if let Some(span) = ctx.span(&id)
            && span.name() == idem_runtime::observe::STEP_SPAN
            && let Some(fields) = span.extensions_mut().remove::<Fields>()
        {
            self.steps.lock().unwrap().push(fields.0);
        }
    }
}

impl Captured {
    fn outcomes(&self) -> Vec<(String, String, String)> {
        self.spans
            .lock()
            .unwrap()
            .iter()
            .map(|f| {
                let get = |k: &str| f.get(k).cloned().unwrap_or_default();
                (get("function"), get("strategy"), get("outcome"))
            })
            .collect()
    }
    fn warnings(&self) -> Vec<String> {
        self.events
            .lock()
            .unwrap()
            .iter()
            .filter(|(l, _)| *l == Level::WARN)
            .map(|(_, f)| f.get("message").cloned().unwrap_or_default())
            .collect()
    }
}

// ---- a recorder that keeps counters and histogram samples ----

#[derive(Default, Clone)]
struct Recorded {
    counters: Shared<HashMap<String, Arc<AtomicU64>>>,
    histograms: Shared<HashMap<String, Shared<Vec<f64>>>>,
}

struct Count(Arc<AtomicU64>);
impl metrics::CounterFn for Count {
    fn increment(&self, v: u64) {
        self.0.fetch_add(v, Ordering::Relaxed);
    }
    fn absolute(&self, v: u64) {
        self.0.store(v, Ordering::Relaxed);
    }
}
struct Samples(Arc<Mutex<Vec<f64>>>);
impl metrics::HistogramFn for Samples {
    fn record(&self, v: f64) {
        self.0.lock().unwrap().push(v);
    }
}

/// `name{a="x",b="y"}` with labels in the order given.
fn render(key: &metrics::Key) -> String {
    let labels: Vec<String> = key
        .labels()
        .map(|l| format!("{}=\"{}\"", l.key(), l.value()))
        .collect();
    if labels.is_empty() {
        key.name().to_owned()
    } else {
        format!("{}{{{}}}", key.name(), labels.join(","))
    }
}

impl metrics::Recorder for Recorded {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        let c = self
            .counters
            .lock()
            .unwrap()
            .entry(render(key))
            .or_default()
            .clone();
        metrics::Counter::from_arc(Arc::new(Count(c)))
    }
    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::noop()
    }
    fn register_histogram(
        &self,
        key: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        let h = self
            .histograms
            .lock()
            .unwrap()
            .entry(render(key))
            .or_default()
            .clone();
        metrics::Histogram::from_arc(Arc::new(Samples(h)))
    }
}

impl Recorded {
    fn counter(&self, name: &str) -> u64 {
        self.counters
            .lock()
            .unwrap()
            .get(name)
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }
    fn samples(&self, name: &str) -> usize {
        self.histograms
            .lock()
            .unwrap()
            .get(name)
            .map_or(0, |h| h.lock().unwrap().len())
    }
}

/// Runs `f` on a current-thread runtime with both the layer and the recorder installed
/// for this thread only, so parallel tests never see each other's calls.
fn observed<F: std::future::Future<Output = ()>>(f: impl FnOnce() -> F) -> (Captured, Recorded) {
    let captured = Captured::default();
    let recorded = Recorded::default();
    let subscriber = tracing_subscriber::registry().with(captured.clone());
    let _sub = tracing::subscriber::set_default(subscriber);
    let recorder = recorded.clone();
    let rec = metrics::set_default_local_recorder(&recorder);
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
        .block_on(f());
    drop(rec);
    (captured, recorded)
}

fn triple(f: &str, s: &str, o: &str) -> (String, String, String) {
    (f.to_owned(), s.to_owned(), o.to_owned())
}

/// The path the attribute gives a function of this test crate (its root module).
fn path(f: &str) -> String {
    format!("{}::{f}", module_path!())
}

// ---- functions under test ----

#[derive(Debug)]
struct AppError(#[allow(dead_code)] Error);
impl From<Error> for AppError {
    fn from(e: Error) -> Self {
        AppError(e)
    }
}

#[idempotent(key = "charge:{email}", ttl = "1h")]
async fn charge(email: &str, cents: u64) -> Result<u64, AppError> {
    Ok(cents)
}

#[idempotent(key = "coupon:{id}", on_duplicate = "reject")]
async fn coupon(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

#[idempotent(key = "pay:{id}", fingerprint = [cents])]
async fn pay(id: u64, cents: u64) -> Result<u64, AppError> {
    Ok(cents)
}

#[idempotent(key = "slow:{id}", wait = "5s")]
async fn slow(id: u64) -> Result<u64, AppError> {
    tokio::time::sleep(Duration::from_millis(50)).await;
    Ok(id)
}

#[idempotent(key = "busy:{id}", wait = "0s")]
async fn busy(id: u64, hold: bool) -> Result<u64, AppError> {
    if hold {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(id)
}

#[idempotent(key = "restock:{sku}", strategy = "lock", wait = "0s")]
async fn restock(sku: u64, hold: bool) -> Result<u64, AppError> {
    if hold {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(sku)
}

#[idempotent(key = "{token}", strategy = "token")]
async fn redeem(token: &str) -> Result<(), AppError> {
    let _ = token;
    Ok(())
}

const SECRET: &str = "alice@example.com";

#[test]
fn every_call_is_one_idem_span_with_its_outcome() {
    let (captured, recorded) = observed(|| async {
        let idem = Idem::builder()
            .store(MemoryStore::new())
            .namespace("observe-spans")
            .build();
        idem.scope(async {
            charge(SECRET, 100).await.unwrap();
            charge(SECRET, 999).await.unwrap(); // decoded, and the value kept
            charge(SECRET, 999).await.unwrap(); // in-process replay, answered at once
            coupon(7).await.unwrap();
            coupon(7).await.unwrap_err();
            pay(1, 10).await.unwrap();
            pay(1, 11).await.unwrap_err();
            let (a, b) = tokio::join!(slow(3), async {
                tokio::time::sleep(Duration::from_millis(5)).await;
                slow(3).await
            });
            assert_eq!((a.unwrap(), b.unwrap()), (3, 3));
            let (a, b) = tokio::join!(busy(4, true), async {
                tokio::time::sleep(Duration::from_millis(5)).await;
                busy(4, false).await
            });
            a.unwrap();
            b.unwrap_err();
            let (a, b) = tokio::join!(restock(5, true), async {
                tokio::time::sleep(Duration::from_millis(5)).await;
                restock(5, false).await
            });
            a.unwrap();
            b.unwrap_err();
            let token = idem_runtime::current()
                .issue_token(Duration::from_secs(60))
                .await
                .unwrap();
            redeem(&token).await.unwrap();
            redeem(&token).await.unwrap_err();
            redeem("not-a-token").await.unwrap_err();
        })
        .await;
    });

    let mut got = captured.outcomes();
    got.sort();
    let mut want = vec![
        triple(&path("charge"), "dedup", "ran"),
        triple(&path("charge"), "dedup", "replayed"),
        triple(&path("charge"), "dedup", "replayed"),
        triple(&path("coupon"), "dedup", "ran"),
        triple(&path("coupon"), "dedup", "rejected"),
        triple(&path("pay"), "dedup", "ran"),
        triple(&path("pay"), "dedup", "mismatch"),
        triple(&path("slow"), "dedup", "ran"),
        triple(&path("slow"), "dedup", "waited"),
        triple(&path("busy"), "dedup", "ran"),
        triple(&path("busy"), "dedup", "in_progress"),
        triple(&path("restock"), "lock", "ran"),
        triple(&path("restock"), "lock", "in_progress"),
        triple(&path("redeem"), "token", "ran"),
        triple(&path("redeem"), "token", "rejected"),
        triple(&path("redeem"), "token", "rejected"),
    ];
    want.sort();
    assert_eq!(got, want);

    // The key field names the record as errors do; the rendered key never appears.
    for span in captured.spans.lock().unwrap().iter() {
        let key = &span["key"];
        assert!(key.starts_with("observe-spans/"), "{key}");
        assert!(key.contains('#'), "{key}");
        for value in span.values() {
            assert!(!value.contains(SECRET), "raw key in span: {span:?}");
        }
    }
    for (_, fields) in captured.events.lock().unwrap().iter() {
        for value in fields.values() {
            assert!(!value.contains(SECRET), "raw key in event: {fields:?}");
        }
    }
    assert!(captured.warnings().is_empty(), "{:?}", captured.warnings());

    // The same calls, counted.
    let calls = |f: &str, s: &str, o: &str| {
        recorded.counter(&format!(
            "idem_calls_total{{function=\"{}\",strategy=\"{s}\",outcome=\"{o}\"}}",
            path(f)
        ))
    };
    assert_eq!(calls("charge", "dedup", "ran"), 1);
    assert_eq!(calls("charge", "dedup", "replayed"), 2);
    assert_eq!(calls("coupon", "dedup", "rejected"), 1);
    assert_eq!(calls("pay", "dedup", "mismatch"), 1);
    assert_eq!(calls("slow", "dedup", "waited"), 1);
    assert_eq!(calls("busy", "dedup", "in_progress"), 1);
    assert_eq!(calls("restock", "lock", "ran"), 1);
    assert_eq!(calls("restock", "lock", "in_progress"), 1);
    assert_eq!(calls("redeem", "token", "rejected"), 2);
    // Every wait is timed: the twin's, the busy key's and the taken lock's.
    assert!(recorded.samples("idem_wait_seconds") >= 3);
    // An in-process store is not timed.
    assert_eq!(recorded.samples("idem_store_seconds{op=\"claim\"}"), 0);
}

// ---- a shared store whose failures a test switches on ----

#[derive(Default)]
struct Faults {
    lose_completion: AtomicBool,
    fail_completion: AtomicBool,
    corrupt_claim: AtomicBool,
}

/// A MemoryStore seen as a shared store (no in-process fast path), with faults.
struct Faulty {
    inner: MemoryStore,
    faults: Arc<Faults>,
}

impl Store for Faulty {
    fn claim<'a>(
        &'a self,
        key: &'a idem_runtime::Key,
        req: &'a ClaimRequest,
    ) -> BoxFuture<'a, Result<ClaimOutcome, Error>> {
        if self.faults.corrupt_claim.load(Ordering::Relaxed) {
            let e = Error::Corrupt {
                key: *key,
                reason: "test damage".into(),
            };
            return Box::pin(async move { Err(e) });
        }
        self.inner.claim(key, req)
    }
    fn complete<'a>(
        &'a self,
        key: &'a idem_runtime::Key,
        owner: Owner,
        value: Bytes,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        if self.faults.fail_completion.load(Ordering::Relaxed) {
            return Box::pin(async { Err(Error::store("test: connection reset")) });
        }
        if self.faults.lose_completion.load(Ordering::Relaxed) {
            return Box::pin(async { Ok(false) });
        }
        self.inner.complete(key, owner, value, ttl)
    }
    fn release<'a>(
        &'a self,
        key: &'a idem_runtime::Key,
        owner: Owner,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        self.inner.release(key, owner)
    }
    fn renew<'a>(
        &'a self,
        key: &'a idem_runtime::Key,
        owner: Owner,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        self.inner.renew(key, owner, lease)
    }
    fn issue<'a>(
        &'a self,
        key: &'a idem_runtime::Key,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        self.inner.issue(key, ttl)
    }
    fn subscribe<'a>(
        &'a self,
        key: &'a idem_runtime::Key,
    ) -> BoxFuture<'a, Result<Subscription, Error>> {
        self.inner.subscribe(key)
    }
}

static ORDER: Options = Options::dedup("shop::order");

#[test]
fn lost_leases_store_failures_and_corrupt_records_warn_and_count() {
    let faults = Arc::new(Faults::default());
    let f = faults.clone();
    let (captured, recorded) = observed(move || async move {
        let idem = Idem::builder()
            .store(Faulty {
                inner: MemoryStore::new(),
                faults: f.clone(),
            })
            .namespace("observe-faults")
            .build();
        let ok = || async { Ok::<_, Error>(1u64) };
        // A clean call on a shared store: timed.
        idem.dedup(&ORDER, "a", ok()).await.unwrap();
        f.lose_completion.store(true, Ordering::Relaxed);
        assert_eq!(idem.dedup(&ORDER, "b", ok()).await.unwrap(), 1);
        f.lose_completion.store(false, Ordering::Relaxed);
        f.fail_completion.store(true, Ordering::Relaxed);
        assert_eq!(idem.dedup(&ORDER, "c", ok()).await.unwrap(), 1);
        f.fail_completion.store(false, Ordering::Relaxed);
        f.corrupt_claim.store(true, Ordering::Relaxed);
        let e = idem.dedup(&ORDER, "d", ok()).await.unwrap_err();
        assert!(matches!(e, Error::Corrupt { .. }), "{e}");
        assert_eq!(idem.stats().lease_lost, 1);
    });

    let got = captured.outcomes();
    assert_eq!(
        got,
        vec![
            triple("shop::order", "dedup", "ran"),
            triple("shop::order", "dedup", "lease_lost"),
            triple("shop::order", "dedup", "store_error"),
            triple("shop::order", "dedup", "store_error"),
        ]
    );
    let warnings = captured.warnings().join("\n");
    assert!(warnings.contains("claim was lost"), "{warnings}");
    assert!(
        warnings.contains("could not record the result"),
        "{warnings}"
    );
    assert!(warnings.contains("corrupt record"), "{warnings}");

    assert_eq!(recorded.counter("idem_lease_lost_total"), 1);
    assert_eq!(
        recorded.counter("idem_store_errors_total{op=\"complete\"}"),
        1
    );
    assert_eq!(recorded.counter("idem_store_errors_total{op=\"claim\"}"), 1);
    assert!(recorded.samples("idem_store_seconds{op=\"claim\"}") >= 4);
    assert!(recorded.samples("idem_store_seconds{op=\"complete\"}") >= 3);
}

// ---- transactional mode: the same span and the same counts ----

#[idempotent(key = "book:{id}", transaction = tx)]
async fn book(
    tx: &mut idem_runtime::store::sql::sqlx::Transaction<
        'static,
        idem_runtime::store::sql::sqlx::Sqlite,
    >,
    id: u64,
) -> Result<u64, Error> {
    let _ = tx;
    Ok(id * 10)
}

static RESERVE: Options = Options::dedup("observe::reserve");

/// Transactional mode goes through the same flow as every other call: the caller's
/// transaction (`transaction = tx`) and a transaction idem opens
/// ([`SqlStore::transaction`]) each run in an `idem` span with their outcome, and count
/// in `idem_calls_total`. (SQLite in memory: no server needed.)
#[test]
fn transactional_calls_are_idem_spans_and_counted() {
    use idem_runtime::SqlStore;
    use idem_runtime::store::sql::sqlx::{Sqlite, Transaction};
    let (captured, recorded) = observed(|| async {
        let store = SqlStore::connect("sqlite::memory:").await.unwrap();
        let pool = store.sqlite_pool().unwrap().clone();
        let idem = Idem::builder()
            .store(store.clone())
            .namespace("observe-tx")
            .build();
        idem.scope(async {
            for _ in 0..2 {
                let mut tx = pool.begin().await.unwrap();
                assert_eq!(book(&mut tx, 4).await.unwrap(), 40);
                tx.commit().await.unwrap();
            }
        })
        .await;
        let key = idem.key(&RESERVE, format_args!("sku-9"));
        for _ in 0..2 {
            let got = store
                .transaction(&RESERVE, &key, |_: &mut Transaction<'static, Sqlite>| {
                    Box::pin(async { Ok::<_, Error>(9u64) })
                })
                .await
                .unwrap();
            assert_eq!(got, 9);
        }
        // SQLite's connection worker thread may hold the last call's span until its next
        // command: closing the pool ends the workers, so every span has closed (and been
        // captured) before this returns.
        store.close().await;
    });
    let mut got = captured.outcomes();
    got.sort();
    let mut want = vec![
        triple(&path("book"), "dedup", "ran"),
        triple(&path("book"), "dedup", "replayed"),
        triple("observe::reserve", "dedup", "ran"),
        triple("observe::reserve", "dedup", "replayed"),
    ];
    want.sort();
    assert_eq!(got, want);
    let calls = |f: &str, o: &str| {
        recorded.counter(&format!(
            "idem_calls_total{{function=\"{f}\",strategy=\"dedup\",outcome=\"{o}\"}}"
        ))
    };
    assert_eq!(calls(&path("book"), "ran"), 1);
    assert_eq!(calls(&path("book"), "replayed"), 1);
    assert_eq!(calls("observe::reserve", "ran"), 1);
    assert_eq!(calls("observe::reserve", "replayed"), 1);
}

/// Each durable step runs in an `idem_step` span with its outcome, and the steps that
/// ran, replayed or were verified are counted by function and outcome.
#[test]
fn steps_are_spanned_and_counted() {
    static CHECKOUT: Options = Options::dedup("observe::checkout");
    let (captured, recorded) = observed(|| async {
        let idem = Idem::builder().store(MemoryStore::new()).build();
        for attempt in 0..2 {
            let _: Result<(), Error> = idem
                .dedup(&CHECKOUT, "o-1", async move {
                    idem_runtime::step("charge", |_| async { Ok::<_, Error>(1u8) }).await?;
                    idem_runtime::Verified::new("ship")
                        .verify(|_| async { Ok::<_, Error>(Some(3u8)) })
                        .run(|_| async move {
                            // The first attempt's shipment ends in an unknown state.
                            if attempt == 0 {
                                return Err(Error::Config("carrier timed out".into()));
                            }
                            Ok(2u8)
                        })
                        .await?;
                    Ok(())
                })
                .await;
        }
    });
    let steps: Vec<(String, String, String)> = captured
        .steps
        .lock()
        .unwrap()
        .iter()
        .map(|f| {
            let get = |k: &str| f.get(k).cloned().unwrap_or_default();
            (get("function"), get("step"), get("outcome"))
        })
        .collect();
    let f = "observe::checkout";
    assert_eq!(
        steps,
        [
            triple(f, "charge", "ran"),
            triple(f, "ship", "failed"),
            triple(f, "charge", "replayed"),
            triple(f, "ship", "verified"),
        ]
    );
    for (outcome, n) in [("ran", 1), ("replayed", 1), ("verified", 1), ("failed", 0)] {
        let name = format!("idem_steps_total{{function=\"{f}\",outcome=\"{outcome}\"}}");
        assert_eq!(recorded.counter(&name), n, "{name}");
    }
}
