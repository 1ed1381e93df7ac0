//! Conformance cases of dedup: one run per key, replay, errors, waiting twins,
//! fingerprints, isolation and ttl.

use super::*;

/// 200 concurrent identical calls run the body once and all get its value.
pub async fn dedup_concurrent_calls_run_once(store: Arc<dyn Store>) {
    let idem = idem(&store);
    let runs = Arc::new(AtomicUsize::new(0));
    let start = Arc::new(Barrier::new(200));
    let mut tasks = Vec::new();
    for i in 0..200u64 {
        let (idem, runs, start) = (idem.clone(), runs.clone(), start.clone());
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            idem.dedup(&DEDUP, "order-1", async move {
                runs.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(ms(50)).await;
                Ok::<_, Error>(i)
            })
            .await
        }));
    }
    let mut values = Vec::new();
    for t in tasks {
        values.push(t.await.unwrap().expect("every caller gets the value"));
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "body ran more than once");
    assert!(
        values.windows(2).all(|w| w[0] == w[1]),
        "callers saw different values"
    );
}

/// A completed key replays its value and does not run the body.
pub async fn dedup_replays_completed(store: Arc<dyn Store>) {
    let idem = idem(&store);
    let a: String = idem
        .dedup(&DEDUP, "k", async { Ok::<_, Error>("first".to_string()) })
        .await
        .unwrap();
    let b: String = idem
        .dedup(&DEDUP, "k", async { Ok::<_, Error>("second".to_string()) })
        .await
        .unwrap();
    assert_eq!((a.as_str(), b.as_str()), ("first", "first"));
}

/// An `Err` releases the key: the retry runs and its value is then replayed.
pub async fn dedup_err_releases_and_retry_runs(store: Arc<dyn Store>) {
    let idem = idem(&store);
    let r: Result<u32, Error> = idem
        .dedup(&DEDUP, "k", async {
            Err(Error::Config("gateway down".into()))
        })
        .await;
    assert!(r.is_err());
    let r: u32 = idem
        .dedup(&DEDUP, "k", async { Ok::<_, Error>(2) })
        .await
        .unwrap();
    assert_eq!(r, 2);
    let r: u32 = idem
        .dedup(&DEDUP, "k", async { Ok::<_, Error>(3) })
        .await
        .unwrap();
    assert_eq!(r, 2);
}

#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
enum AppError {
    Declined(String),
    Idem(String),
}
impl From<Error> for AppError {
    fn from(e: Error) -> Self {
        AppError::Idem(e.to_string())
    }
}

/// With `ReplayResult` (`cache_err`), an `Err` is stored and replayed too.
pub async fn dedup_cache_err_replays_err(store: Arc<dyn Store>) {
    let idem = idem(&store);
    let first: Result<u32, AppError> = idem
        .dedup_with::<ReplayResult, _, _, _>(&DEDUP, "k", None, async {
            Err(AppError::Declined("card".into()))
        })
        .await;
    let again: Result<u32, AppError> = idem
        .dedup_with::<ReplayResult, _, _, _>(&DEDUP, "k", None, async { Ok(1) })
        .await;
    assert_eq!(first, Err(AppError::Declined("card".into())));
    assert_eq!(again, first);
}

/// Reject mode: a completed key is `Error::Duplicate`, and the value need not be serde.
pub async fn dedup_reject_mode(store: Arc<dyn Store>) {
    static REJECT: Options =
        Options::dedup("conformance::reject").on_duplicate(crate::OnDuplicate::Reject);
    struct NotSerde;
    let idem = idem(&store);
    let r = idem
        .dedup_with::<NoReplay, _, _, _>(&REJECT, "k", None, async { Ok::<_, Error>(NotSerde) })
        .await;
    assert!(r.is_ok());
    let r = idem
        .dedup_with::<NoReplay, _, _, _>(&REJECT, "k", None, async { Ok::<_, Error>(NotSerde) })
        .await;
    assert!(matches!(r, Err(Error::Duplicate { .. })));
}

/// `wait = 0`: a duplicate of an in-flight call fails at once with `InProgress`.
pub async fn dedup_wait_zero_fails_fast(store: Arc<dyn Store>) {
    static NOWAIT: Options = Options::dedup("conformance::dedup").wait(Duration::ZERO);
    let idem = idem(&store);
    let started = Arc::new(Notify::new());
    let finish = Arc::new(Notify::new());
    let holder = {
        let (idem, started, finish) = (idem.clone(), started.clone(), finish.clone());
        tokio::spawn(async move {
            idem.dedup(&DEDUP, "k", async move {
                started.notify_one();
                finish.notified().await;
                Ok::<_, Error>(1u8)
            })
            .await
        })
    };
    started.notified().await;
    let r: Result<u8, Error> = idem.dedup(&NOWAIT, "k", async { Ok(2) }).await;
    assert!(matches!(r, Err(Error::InProgress { .. })), "{r:?}");
    finish.notify_one();
    assert_eq!(holder.await.unwrap().unwrap(), 1);
    let r: u8 = idem
        .dedup(&NOWAIT, "k", async { Ok::<_, Error>(2) })
        .await
        .unwrap();
    assert_eq!(r, 1);
}

/// When the in-flight call fails, exactly one waiter claims and runs; the others wait
/// for it and replay its value.
pub async fn waiters_take_over_when_twin_fails(store: Arc<dyn Store>) {
    let idem = idem(&store);
    let runs = Arc::new(AtomicUsize::new(0));
    let started = Arc::new(Notify::new());
    let first = {
        let (idem, runs, started) = (idem.clone(), runs.clone(), started.clone());
        tokio::spawn(async move {
            idem.dedup(&DEDUP, "k", async move {
                runs.fetch_add(1, Ordering::SeqCst);
                started.notify_one();
                tokio::time::sleep(ms(200)).await;
                Err::<u32, _>(Error::Config("declined".into()))
            })
            .await
        })
    };
    started.notified().await;
    let mut waiters = Vec::new();
    for i in 0..20u32 {
        let (idem, runs) = (idem.clone(), runs.clone());
        waiters.push(tokio::spawn(async move {
            idem.dedup(&DEDUP, "k", async move {
                runs.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(ms(50)).await;
                Ok::<_, Error>(100 + i)
            })
            .await
        }));
    }
    assert!(first.await.unwrap().is_err());
    let mut values = Vec::new();
    for w in waiters {
        values.push(
            w.await
                .unwrap()
                .expect("waiter gets the second run's value"),
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 2, "exactly one waiter ran");
    assert!(values.windows(2).all(|w| w[0] == w[1]));
}

/// The same key with a different payload is `PayloadMismatch`, in flight and after.
pub async fn fingerprint_mismatch(store: Arc<dyn Store>) {
    let idem = idem(&store);
    let fp = |n: u64| {
        let mut b = crate::codec::FingerprintBuilder::new();
        b.add(&n).unwrap();
        Some(b.finish())
    };
    let started = Arc::new(Notify::new());
    let finish = Arc::new(Notify::new());
    let holder = {
        let (idem, started, finish) = (idem.clone(), started.clone(), finish.clone());
        tokio::spawn(async move {
            idem.dedup_with::<ReplayOk, _, _, _>(&DEDUP, "k", fp(1), async move {
                started.notify_one();
                finish.notified().await;
                Ok::<_, Error>(1u8)
            })
            .await
        })
    };
    started.notified().await;
    let r: Result<u8, Error> = idem
        .dedup_with::<ReplayOk, _, _, _>(&DEDUP, "k", fp(2), async { Ok(2) })
        .await;
    assert!(matches!(r, Err(Error::PayloadMismatch { .. })), "{r:?}");
    finish.notify_one();
    holder.await.unwrap().unwrap();
    let r: Result<u8, Error> = idem
        .dedup_with::<ReplayOk, _, _, _>(&DEDUP, "k", fp(2), async { Ok(2) })
        .await;
    assert!(matches!(r, Err(Error::PayloadMismatch { .. })), "{r:?}");
    let r: u8 = idem
        .dedup_with::<ReplayOk, _, _, _>(&DEDUP, "k", fp(1), async { Ok::<_, Error>(3) })
        .await
        .unwrap();
    assert_eq!(r, 1);
}

/// Many keys at once: each body runs exactly once.
pub async fn distinct_keys_do_not_interfere(store: Arc<dyn Store>) {
    let idem = idem(&store);
    let runs: Arc<Vec<AtomicUsize>> = Arc::new((0..50).map(|_| AtomicUsize::new(0)).collect());
    let mut tasks = Vec::new();
    for i in 0..500usize {
        let (idem, runs) = (idem.clone(), runs.clone());
        tasks.push(tokio::spawn(async move {
            let k = i % 50;
            let v: usize = idem
                .dedup(&DEDUP, format!("key-{k}"), async move {
                    runs[k].fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(ms(5)).await;
                    Ok::<_, Error>(k * 10)
                })
                .await
                .unwrap();
            assert_eq!(v, k * 10);
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert!(runs.iter().all(|r| r.load(Ordering::SeqCst) == 1));
}

/// The same key in two namespaces is two records.
pub async fn namespaces_are_isolated(store: Arc<dyn Store>) {
    let (a, b) = (idem(&store), idem(&store));
    let x: u8 = a
        .dedup(&DEDUP, "k", async { Ok::<_, Error>(1) })
        .await
        .unwrap();
    let y: u8 = b
        .dedup(&DEDUP, "k", async { Ok::<_, Error>(2) })
        .await
        .unwrap();
    assert_eq!((x, y), (1, 2));
    static OTHER: Options = Options::dedup("conformance::other");
    let z: u8 = a
        .dedup(&OTHER, "k", async { Ok::<_, Error>(3) })
        .await
        .unwrap();
    assert_eq!(z, 3, "two functions never share a record");
}

/// A completed record disappears after its ttl; the body then runs again.
pub async fn ttl_expiry_runs_again(store: Arc<dyn Store>) {
    static SHORT: Options = Options::dedup("conformance::ttl").ttl(Duration::from_millis(300));
    let idem = idem(&store);
    let a: u8 = idem
        .dedup(&SHORT, "k", async { Ok::<_, Error>(1) })
        .await
        .unwrap();
    let b: u8 = idem
        .dedup(&SHORT, "k", async { Ok::<_, Error>(2) })
        .await
        .unwrap();
    assert_eq!((a, b), (1, 1));
    tokio::time::sleep(ms(900)).await;
    let c: u8 = idem
        .dedup(&SHORT, "k", async { Ok::<_, Error>(3) })
        .await
        .unwrap();
    assert_eq!(c, 3);
}
