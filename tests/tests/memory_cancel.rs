//! The runtime's rules around cancellation and misuse, on the embedded store: the
//! shortest lease, a function calling itself with its own key, a result that does not
//! decode back, and the downstream key a claimed body gets (`call_key`). The races of
//! cancelled calls are conformance cases (`idem_runtime::testing`), run on every store.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_runtime::codec::ReplayOk;
use idem_runtime::options::MIN_LEASE;
use idem_runtime::{Error, Idem, MemoryStore, Options, call_key};
use serde::{Deserialize, Serialize};

/// A bound on calls that must end at once; reaching it fails the test (it is a guard
/// against a hang, not a measure of speed).
const HANG: Duration = Duration::from_secs(60);

fn idem() -> Idem {
    Idem::builder().store(MemoryStore::new()).build()
}

#[tokio::test]
async fn a_lease_below_the_floor_is_refused_before_any_claim() {
    static SHORT: Options = Options::dedup("cancel::short").lease(Duration::from_millis(1));
    static ZERO: Options = Options::lock("cancel::zero").lease(Duration::ZERO);
    static FLOOR: Options = Options::dedup("cancel::floor").lease(MIN_LEASE);
    let idem = idem();
    let runs = AtomicUsize::new(0);
    let body = || async {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<u8, Error>(1)
    };
    let r = idem.dedup(&SHORT, "k", body()).await;
    assert!(
        matches!(&r, Err(Error::Config(m)) if m.contains("MIN_LEASE")),
        "{r:?}"
    );
    let r = idem.lock(&ZERO, "k", body()).await;
    assert!(matches!(r, Err(Error::Config(_))), "{r:?}");
    let token = idem.issue_token(Duration::from_secs(60)).await.unwrap();
    static SHORT_TOKEN: Options = Options::token("cancel::t").lease(Duration::from_millis(99));
    let r = idem
        .consume_token::<ReplayOk, _, _, _>(&SHORT_TOKEN, &token, body())
        .await;
    assert!(matches!(r, Err(Error::Config(_))), "{r:?}");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "a refused call ran its body"
    );
    // The refused token was not consumed.
    static TOKEN: Options = Options::token("cancel::t");
    assert_eq!(
        idem.consume_token::<ReplayOk, _, _, _>(&TOKEN, &token, body())
            .await
            .unwrap(),
        1
    );
    assert_eq!(idem.dedup(&FLOOR, "k", body()).await.unwrap(), 1);
    assert_eq!(MIN_LEASE, Duration::from_millis(100));
}

/// A body that calls its own function with its own key would wait for itself until
/// `wait` runs out (an hour here): it fails at once with `InProgress` instead, also
/// through another function in between. Another key nests normally.
/// The attribute refuses a lease under 100 ms at compile time (`short_lease` UI case,
/// `MIN_LEASE_MS` in idem-macros); the runtime refuses the same floor at run time. The
/// attribute's shortest accepted lease must run, and the two floors must be one.
#[idem_runtime::idempotent(key = "floor:{n}", lease = "100ms")]
async fn at_the_attribute_floor(n: u32) -> Result<u32, Error> {
    Ok(n)
}

#[tokio::test]
async fn the_attribute_floor_is_the_runtime_floor() {
    assert_eq!(
        MIN_LEASE,
        Duration::from_millis(100),
        "change MIN_LEASE_MS in idem-macros too"
    );
    assert_eq!(idem().scope(at_the_attribute_floor(7)).await.unwrap(), 7);
}

#[tokio::test]
async fn a_call_with_its_own_key_inside_its_body_fails_at_once() {
    static OUTER: Options = Options::dedup("cancel::outer").wait(Duration::from_secs(3600));
    static INNER: Options = Options::dedup("cancel::inner").wait(Duration::from_secs(3600));
    static LOCK: Options = Options::lock("cancel::lock").wait(Duration::from_secs(3600));
    let idem = idem();
    let direct = tokio::time::timeout(
        HANG,
        idem.dedup(&OUTER, "k", async {
            let again = idem.dedup(&OUTER, "k", async { Ok::<u8, Error>(2) }).await;
            assert!(matches!(again, Err(Error::InProgress { .. })), "{again:?}");
            Ok::<u8, Error>(1)
        }),
    )
    .await
    .expect("the self-call waited for itself");
    assert_eq!(direct.unwrap(), 1);

    let through = tokio::time::timeout(
        HANG,
        idem.dedup(&OUTER, "j", async {
            let nested = idem
                .dedup(&INNER, "other", async {
                    idem.dedup(&OUTER, "j", async { Ok::<u8, Error>(3) }).await
                })
                .await;
            assert!(
                matches!(nested, Err(Error::InProgress { .. })),
                "{nested:?}"
            );
            // A different key of the same function nests and runs.
            idem.dedup(&OUTER, "j2", async { Ok::<u8, Error>(4) }).await
        }),
    )
    .await
    .expect("the self-call through another function waited for itself");
    assert_eq!(through.unwrap(), 4);

    let locked = tokio::time::timeout(
        HANG,
        idem.lock(&LOCK, "l", async {
            idem.lock(&LOCK, "l", async { Ok::<u8, Error>(5) }).await
        }),
    )
    .await
    .expect("the re-entered lock waited for itself");
    assert!(matches!(locked, Err(Error::Locked { .. })), "{locked:?}");
}

/// Serializes with a field that deserializing requires: the value cannot be replayed.
#[derive(Debug, Serialize, Deserialize)]
struct OneWay {
    cents: u64,
    // Never read back: the point is that it cannot be.
    #[allow(dead_code)]
    #[serde(skip_serializing)]
    secret: u64,
}

/// A result that serializes but does not decode back would answer every duplicate
/// with a codec error for the whole ttl. Checked before completing: the first caller
/// gets `Error::Codec`, the key is recorded as done (its effect happened), and a retry
/// gets `Duplicate` without running the body again.
#[tokio::test]
async fn a_result_that_does_not_decode_back_is_refused_not_stored() {
    static OPTS: Options = Options::dedup("cancel::one_way");
    let idem = idem();
    let runs = AtomicUsize::new(0);
    let body = || async {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, Error>(OneWay {
            cents: 100,
            secret: 7,
        })
    };
    let first = idem.dedup(&OPTS, "k", body()).await;
    assert!(matches!(first, Err(Error::Codec { .. })), "{first:?}");
    let again = idem.dedup(&OPTS, "k", body()).await;
    assert!(matches!(again, Err(Error::Duplicate { .. })), "{again:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the body ran again");
    // A value that round-trips is unaffected.
    static FINE: Options = Options::dedup("cancel::fine");
    let v: u64 = idem
        .dedup(&FINE, "k", async { Ok::<_, Error>(9) })
        .await
        .unwrap();
    let w: u64 = idem
        .dedup(&FINE, "k", async { Ok::<_, Error>(10) })
        .await
        .unwrap();
    assert_eq!((v, w), (9, 9));
}

/// The downstream key: the same on every attempt at one record (here after an `Err`
/// released it), different for another key, function or namespace, printable ASCII of
/// at most 255 characters without the key's text; none outside a body or in a lock.
#[tokio::test]
async fn call_key_is_stable_per_record_and_opaque() {
    static CHARGE: Options = Options::dedup("cancel::charge");
    static REFUND: Options = Options::dedup("cancel::refund");
    static LOCK: Options = Options::lock("cancel::charge");
    let store: Arc<MemoryStore> = Arc::new(MemoryStore::new());
    let a = Idem::builder().shared_store(store.clone()).build();
    let b = Idem::builder().shared_store(store.clone()).build();
    let other_ns = Idem::builder()
        .shared_store(store)
        .namespace("elsewhere")
        .build();
    assert_eq!(call_key(), None);
    let key_of = |idem: &Idem, opts: &'static Options, k: &'static str, fail: bool| {
        let idem = idem.clone();
        async move {
            let mut seen = None;
            let r = idem
                .dedup(opts, k, async {
                    seen = call_key();
                    if fail {
                        Err(Error::Config("retry".into()))
                    } else {
                        Ok(())
                    }
                })
                .await;
            assert_eq!(r.is_err(), fail);
            seen.expect("a claimed body has a call key")
        }
    };
    let first = key_of(&a, &CHARGE, "alice@example.com", true).await;
    let retried = key_of(&a, &CHARGE, "alice@example.com", false).await;
    assert_eq!(first, retried, "a retry after a release got another key");
    assert!(
        first.len() <= 255 && first.bytes().all(|c| c.is_ascii_graphic()),
        "{first}"
    );
    assert!(!first.contains("alice"), "raw key material in {first}");
    assert_ne!(key_of(&a, &CHARGE, "bob@example.com", false).await, first);
    assert_ne!(key_of(&a, &REFUND, "alice@example.com", false).await, first);
    assert_ne!(
        key_of(&other_ns, &CHARGE, "alice@example.com", true).await,
        first
    );
    // Another runtime on the same store and namespace: the same record, the same key.
    static CHARGE2: Options = Options::dedup("cancel::charge2");
    let ka = key_of(&a, &CHARGE2, "carol", true).await;
    let kb = key_of(&b, &CHARGE2, "carol", true).await;
    assert_eq!(ka, kb);
    let in_lock = a
        .lock(&LOCK, "k", async { Ok::<_, Error>(call_key()) })
        .await;
    assert_eq!(in_lock.unwrap(), None, "a lock's body runs every time");
    // A nested call has its own key, and the outer one is back after it.
    let (outer, inner, after) = a
        .dedup(&CHARGE, "nest", async {
            let outer = call_key();
            let inner = a
                .dedup(&REFUND, "nest", async { Ok::<_, Error>(call_key()) })
                .await?;
            Ok::<_, Error>((outer, inner, call_key()))
        })
        .await
        .unwrap();
    assert!(outer.is_some() && inner.is_some());
    assert_ne!(outer, inner);
    assert_eq!(outer, after);
}
