//! The conformance suite: one set of semantic tests that any [`Store`] must pass.
//!
//! Run it on your store with one macro call in an integration test; it expands to one
//! `#[test]` per case, each on its own multi-threaded tokio runtime:
//!
//! ```
//! use std::sync::Arc;
//! use idem_runtime::{MemoryStore, Store};
//!
//! idem_runtime::conformance_tests!(memory, || async { Arc::new(MemoryStore::new()) as Arc<dyn Store> });
//! # fn main() {}
//! ```
//!
//! The factory runs once per case. Every case uses a fresh random namespace, so a
//! shared server (one Redis, one database) may serve all cases at once. Cases use real
//! time with margins of several hundred milliseconds and assert behaviour only, never
//! how long something took.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{Barrier, Notify};

use crate::store::{ClaimKind, ClaimOutcome, ClaimRequest, Owner};
use crate::{Error, Fingerprint, Idem, Key, NoReplay, Options, ReplayOk, ReplayResult, Store};

/// Runs one case: builds a multi-threaded runtime, makes the store, runs the case.
pub fn run_case<M, MF, C, CF>(make: M, case: C)
where
    M: FnOnce() -> MF,
    MF: Future<Output = Arc<dyn Store>>,
    C: FnOnce(Arc<dyn Store>) -> CF,
    CF: Future<Output = ()>,
{
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(async {
        let store = make().await;
        case(store).await;
    });
}

/// Expands to one `#[test]` per conformance case, in a module named `$name`.
/// `$make` is a closure returning a future of `Arc<dyn Store>`.
#[macro_export]
macro_rules! conformance_tests {
    ($name:ident, $make:expr) => {
        $crate::__conformance_tests!($name, $make;
            dedup_concurrent_calls_run_once,
            dedup_replays_completed,
            dedup_err_releases_and_retry_runs,
            dedup_cache_err_replays_err,
            dedup_reject_mode,
            dedup_wait_zero_fails_fast,
            waiters_take_over_when_twin_fails,
            fingerprint_mismatch,
            distinct_keys_do_not_interfere,
            namespaces_are_isolated,
            ttl_expiry_runs_again,
            cancellation_releases_claim,
            crashed_holder_taken_over_after_lease,
            heartbeat_keeps_long_body_claimed,
            stale_owner_cannot_complete_release_or_renew,
            corrupt_record_is_an_error,
            lock_excludes_and_fences_increase,
            lock_wait_zero_is_locked,
            token_consumed_once,
            token_invalid_and_expiry,
            token_err_returns_token,
            issue_refuses_existing,
            inspect_reports_each_state,
            forget_removes_whatever_the_state,
            forget_in_progress_makes_the_old_completion_a_lost_lease,
            forget_wakes_waiters,
            count_records_by_function_and_state
        );
    };
}

/// Expands to one `#[test]` per conformance case of the toolbox primitives (versioned
/// values, state-machine moves, Bloom bitmaps), in a module named `$name`; see
/// [`conformance_tests!`]. Separate so that a store without these primitives still runs
/// the main suite.
///
/// ```
/// use std::sync::Arc;
/// use idem_runtime::{MemoryStore, Store};
///
/// idem_runtime::toolbox_conformance_tests!(memory_toolbox, || async { Arc::new(MemoryStore::new()) as Arc<dyn Store> });
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! toolbox_conformance_tests {
    ($name:ident, $make:expr) => {
        $crate::__toolbox_conformance_tests!($name, $make;
            versioned_compare_and_set,
            versioned_ttl_expiry,
            optimistic_balance_50_tasks,
            state_machine_moves,
            state_machine_concurrent_movers,
            state_machine_body_failure_and_cancel,
            state_machine_crashed_hold_taken_over,
            bloom_insert_and_contains,
            bloom_ttl_is_not_refreshed,
            bloom_false_positive_rate,
            bloom_dedup_never_drops_new_ids,
            bloom_new_verdict_expires_with_the_records
        );
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __toolbox_conformance_tests {
    ($name:ident, $make:expr; $($case:ident),* $(,)?) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[test]
                fn $case() {
                    $crate::testing::run_case($make, $crate::testing::cases::toolbox::$case);
                }
            )*
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_tests {
    ($name:ident, $make:expr; $($case:ident),* $(,)?) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[test]
                fn $case() {
                    $crate::testing::run_case($make, $crate::testing::cases::$case);
                }
            )*
        }
    };
}

fn idem(store: &Arc<dyn Store>) -> Idem {
    let mut b = [0u8; 6];
    getrandom::fill(&mut b).expect("os rng");
    let ns: String = b.iter().map(|x| format!("{x:02x}")).collect();
    Idem::builder()
        .shared_store(store.clone())
        .namespace(format!("conformance-{ns}"))
        .build()
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The cases, as plain async functions of a store.
pub mod cases {
    use super::*;

    pub mod inspect;
    pub mod toolbox;
    pub use inspect::*;

    static DEDUP: Options = Options::dedup("conformance::dedup");

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
            let mut b = crate::FingerprintBuilder::new();
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

    /// A dropped (cancelled) call gives its claim back at once, long before its lease
    /// would end: the next call claims and runs.
    pub async fn cancellation_releases_claim(store: Arc<dyn Store>) {
        static LONG: Options = Options::dedup("conformance::cancel")
            .lease(Duration::from_secs(120))
            .wait(Duration::from_secs(10));
        let idem = idem(&store);
        let started = Arc::new(Notify::new());
        let task = {
            let (idem, started) = (idem.clone(), started.clone());
            tokio::spawn(async move {
                idem.dedup(&LONG, "k", async move {
                    started.notify_one();
                    std::future::pending::<()>().await;
                    Ok::<_, Error>(1u8)
                })
                .await
            })
        };
        started.notified().await;
        task.abort();
        assert!(task.await.unwrap_err().is_cancelled());
        let r: u8 = idem
            .dedup(&LONG, "k", async { Ok::<_, Error>(2) })
            .await
            .unwrap();
        assert_eq!(r, 2, "the cancelled call's claim was not released");
    }

    /// A holder that vanished without releasing (a crash) blocks the key until its lease
    /// ends, not before, and not forever.
    pub async fn crashed_holder_taken_over_after_lease(store: Arc<dyn Store>) {
        static NOWAIT: Options = Options::dedup("conformance::dedup").wait(Duration::ZERO);
        static WAIT: Options = Options::dedup("conformance::dedup").wait(Duration::from_secs(10));
        let idem = idem(&store);
        let key = idem.key(&DEDUP, format_args!("k"));
        let crashed = ClaimRequest::new(ClaimKind::Dedup, Owner::next(), ms(700));
        assert!(matches!(
            store.claim(&key, &crashed).await.unwrap(),
            ClaimOutcome::Claimed { .. }
        ));
        let r: Result<u8, Error> = idem.dedup(&NOWAIT, "k", async { Ok(1) }).await;
        assert!(
            matches!(r, Err(Error::InProgress { .. })),
            "taken over before the lease ended"
        );
        let r: u8 = idem
            .dedup(&WAIT, "k", async { Ok::<_, Error>(2) })
            .await
            .unwrap();
        assert_eq!(r, 2);
        assert!(
            !store
                .complete(&key, crashed.owner, Bytes::from_static(b"x"), ms(1000))
                .await
                .unwrap()
        );
    }

    /// A body running for several leases keeps its claim (the heartbeat renews it).
    pub async fn heartbeat_keeps_long_body_claimed(store: Arc<dyn Store>) {
        static SHORT_LEASE: Options =
            Options::dedup("conformance::hb").lease(Duration::from_millis(300));
        static PEEK: Options = Options::dedup("conformance::hb").wait(Duration::ZERO);
        let idem = idem(&store);
        let runs = Arc::new(AtomicUsize::new(0));
        let holder = {
            let (idem, runs) = (idem.clone(), runs.clone());
            tokio::spawn(async move {
                idem.dedup(&SHORT_LEASE, "k", async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(ms(1500)).await;
                    Ok::<_, Error>(1u8)
                })
                .await
            })
        };
        for _ in 0..6 {
            tokio::time::sleep(ms(200)).await;
            let r: Result<u8, Error> = idem.dedup(&PEEK, "k", async { Ok(9) }).await;
            if runs.load(Ordering::SeqCst) == 1 && !holder.is_finished() {
                assert!(matches!(r, Err(Error::InProgress { .. })), "{r:?}");
            }
        }
        assert_eq!(holder.await.unwrap().unwrap(), 1);
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert_eq!(idem.stats().lease_lost, 0);
    }

    /// After its lease ended and another owner claimed, the old owner can neither
    /// complete, release nor renew: the new holder's record is untouched.
    pub async fn stale_owner_cannot_complete_release_or_renew(store: Arc<dyn Store>) {
        let idem = idem(&store);
        for kind in [ClaimKind::Dedup, ClaimKind::Lock] {
            static LOCK: Options = Options::lock("conformance::stale");
            let key = idem.key(&LOCK, format_args!("{kind:?}"));
            let old = ClaimRequest::new(kind, Owner::next(), ms(300));
            let ClaimOutcome::Claimed { fence: f1 } = store.claim(&key, &old).await.unwrap() else {
                panic!("first claim")
            };
            tokio::time::sleep(ms(700)).await;
            let new = ClaimRequest::new(kind, Owner::next(), ms(30_000));
            let ClaimOutcome::Claimed { fence: f2 } = store.claim(&key, &new).await.unwrap() else {
                panic!("claim after the lease ended")
            };
            if kind == ClaimKind::Lock {
                assert!(f2 > f1, "fences must increase: {f1} then {f2}");
            }
            assert!(!store.release(&key, old.owner).await.unwrap());
            assert!(!store.renew(&key, old.owner, ms(30_000)).await.unwrap());
            assert!(
                !store
                    .complete(&key, old.owner, Bytes::from_static(b"stale"), ms(30_000))
                    .await
                    .unwrap()
            );
            assert!(matches!(
                store
                    .claim(&key, &ClaimRequest::new(kind, Owner::next(), ms(1000)))
                    .await
                    .unwrap(),
                ClaimOutcome::Busy { .. }
            ));
            assert!(store.renew(&key, new.owner, ms(30_000)).await.unwrap());
            assert!(store.release(&key, new.owner).await.unwrap());
            assert!(
                !store.release(&key, new.owner).await.unwrap(),
                "released twice"
            );
        }
    }

    /// Bytes that are not a valid record are `Error::Corrupt`, never replayed.
    pub async fn corrupt_record_is_an_error(store: Arc<dyn Store>) {
        let idem = idem(&store);
        let key = idem.key(&DEDUP, format_args!("k"));
        let req = ClaimRequest::new(ClaimKind::Dedup, Owner::next(), ms(5000));
        assert!(matches!(
            store.claim(&key, &req).await.unwrap(),
            ClaimOutcome::Claimed { .. }
        ));
        assert!(
            store
                .complete(
                    &key,
                    req.owner,
                    Bytes::from_static(b"\x00garbage\xff"),
                    ms(30_000)
                )
                .await
                .unwrap()
        );
        let runs = AtomicUsize::new(0);
        let r: Result<u64, Error> = idem
            .dedup(&DEDUP, "k", async {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok(1)
            })
            .await;
        assert!(matches!(r, Err(Error::Corrupt { .. })), "{r:?}");
        assert_eq!(runs.load(Ordering::SeqCst), 0);
    }

    /// 40 contenders: never two holders at once, and fences strictly increase in the
    /// order the lock was held.
    pub async fn lock_excludes_and_fences_increase(store: Arc<dyn Store>) {
        static LOCK: Options = Options::lock("conformance::lock").wait(Duration::from_secs(30));
        let idem = idem(&store);
        let inside = Arc::new(AtomicBool::new(false));
        let order = Arc::new(std::sync::Mutex::new(Vec::<u64>::new()));
        let mut tasks = Vec::new();
        for _ in 0..40 {
            let (idem, inside, order) = (idem.clone(), inside.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                idem.lock(&LOCK, "stock", async move {
                    assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                    let f = crate::fence().expect("fence inside a lock body");
                    order.lock().unwrap().push(f);
                    tokio::time::sleep(ms(5)).await;
                    inside.store(false, Ordering::SeqCst);
                    Ok::<_, Error>(())
                })
                .await
            }));
        }
        for t in tasks {
            t.await.unwrap().unwrap();
        }
        let order = order.lock().unwrap();
        assert_eq!(order.len(), 40);
        assert!(
            order.windows(2).all(|w| w[0] < w[1]),
            "fences not increasing: {order:?}"
        );
    }

    /// A held lock with `wait = 0` is `Error::Locked`.
    pub async fn lock_wait_zero_is_locked(store: Arc<dyn Store>) {
        static LOCK: Options = Options::lock("conformance::lock0");
        static NOWAIT: Options = Options::lock("conformance::lock0").wait(Duration::ZERO);
        let idem = idem(&store);
        let started = Arc::new(Notify::new());
        let finish = Arc::new(Notify::new());
        let holder = {
            let (idem, started, finish) = (idem.clone(), started.clone(), finish.clone());
            tokio::spawn(async move {
                idem.lock(&LOCK, "k", async move {
                    started.notify_one();
                    finish.notified().await;
                    Ok::<_, Error>(())
                })
                .await
            })
        };
        started.notified().await;
        let r = idem.lock(&NOWAIT, "k", async { Ok::<_, Error>(()) }).await;
        assert!(matches!(r, Err(Error::Locked { .. })), "{r:?}");
        finish.notify_one();
        holder.await.unwrap().unwrap();
        idem.lock(&NOWAIT, "k", async { Ok::<_, Error>(()) })
            .await
            .unwrap();
    }

    static TOKEN: Options = Options::token("conformance::redeem");

    /// 50 concurrent consumers of one token: one runs, the rest are rejected.
    pub async fn token_consumed_once(store: Arc<dyn Store>) {
        let idem = idem(&store);
        let token = idem.issue_token(Duration::from_secs(60)).await.unwrap();
        assert!(token.len() >= 32, "at least 128 bits");
        let runs = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..50 {
            let (idem, runs, token) = (idem.clone(), runs.clone(), token.clone());
            tasks.push(tokio::spawn(async move {
                idem.consume_token::<NoReplay, _, _, _>(&TOKEN, &token, async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(ms(20)).await;
                    Ok::<_, Error>(())
                })
                .await
            }));
        }
        let mut ok = 0;
        for t in tasks {
            match t.await.unwrap() {
                Ok(()) => ok += 1,
                Err(Error::Duplicate { .. }) => {}
                Err(e) => panic!("unexpected {e:?}"),
            }
        }
        assert_eq!((ok, runs.load(Ordering::SeqCst)), (1, 1));
    }

    /// Unknown, garbage and expired tokens are `TokenInvalid`; tokens are namespaced.
    pub async fn token_invalid_and_expiry(store: Arc<dyn Store>) {
        let idem = idem(&store);
        for bad in [
            "",
            "not-a-token",
            "00000000000000000000000000000000",
            &"x".repeat(10_000),
        ] {
            let r = idem
                .consume_token::<NoReplay, _, _, _>(&TOKEN, bad, async { Ok::<_, Error>(()) })
                .await;
            assert!(matches!(r, Err(Error::TokenInvalid { .. })), "{r:?}");
        }
        let other = super::idem(&store);
        let token = other.issue_token(Duration::from_secs(60)).await.unwrap();
        let r = idem
            .consume_token::<NoReplay, _, _, _>(&TOKEN, &token, async { Ok::<_, Error>(()) })
            .await;
        assert!(
            matches!(r, Err(Error::TokenInvalid { .. })),
            "another namespace's token"
        );
        let token = idem.issue_token(ms(300)).await.unwrap();
        tokio::time::sleep(ms(900)).await;
        let r = idem
            .consume_token::<NoReplay, _, _, _>(&TOKEN, &token, async { Ok::<_, Error>(()) })
            .await;
        assert!(
            matches!(r, Err(Error::TokenInvalid { .. })),
            "expired token: {r:?}"
        );
    }

    /// A body `Err` returns the token to `Issued`: it can be consumed again, once.
    pub async fn token_err_returns_token(store: Arc<dyn Store>) {
        let idem = idem(&store);
        let token = idem.issue_token(Duration::from_secs(60)).await.unwrap();
        let r = idem
            .consume_token::<NoReplay, (), _, _>(&TOKEN, &token, async {
                Err(Error::Config("declined".into()))
            })
            .await;
        assert!(matches!(r, Err(Error::Config(_))));
        let r: Result<u32, Error> = idem
            .consume_token::<ReplayOk, _, _, _>(&TOKEN, &token, async { Ok(7) })
            .await;
        assert_eq!(r.unwrap(), 7);
        static REPLAY: Options =
            Options::token("conformance::redeem").on_duplicate(crate::OnDuplicate::Replay);
        let r: Result<u32, Error> = idem
            .consume_token::<ReplayOk, _, _, _>(&REPLAY, &token, async { Ok(8) })
            .await;
        assert_eq!(
            r.unwrap(),
            7,
            "replay mode returns the first consumption's value"
        );
        let r: Result<u32, Error> = idem
            .consume_token::<ReplayOk, _, _, _>(&TOKEN, &token, async { Ok(9) })
            .await;
        assert!(matches!(r, Err(Error::Duplicate { .. })));
    }

    /// `issue` never overwrites an existing record; fingerprints come back with records.
    pub async fn issue_refuses_existing(store: Arc<dyn Store>) {
        let ns: Arc<str> = Arc::from(format!("conformance-issue-{}", Owner::next().0));
        let key = Key::token(&ns, "t");
        assert!(store.issue(&key, Duration::from_secs(60)).await.unwrap());
        assert!(!store.issue(&key, Duration::from_secs(60)).await.unwrap());
        let fp = Some(Fingerprint([7; 16]));
        let req = ClaimRequest::new(ClaimKind::Token, Owner::next(), ms(5000)).with_fingerprint(fp);
        assert!(matches!(
            store.claim(&key, &req).await.unwrap(),
            ClaimOutcome::Claimed { .. }
        ));
        assert!(!store.issue(&key, Duration::from_secs(60)).await.unwrap());
        let other = ClaimRequest::new(ClaimKind::Token, Owner::next(), ms(5000));
        match store.claim(&key, &other).await.unwrap() {
            ClaimOutcome::Busy { fingerprint, .. } => assert_eq!(fingerprint, fp),
            o => panic!("expected Busy, got {o:?}"),
        }
        let value = Bytes::from_static(b"done");
        assert!(
            store
                .complete(&key, req.owner, value.clone(), Duration::from_secs(60))
                .await
                .unwrap()
        );
        match store.claim(&key, &other).await.unwrap() {
            ClaimOutcome::Completed {
                value: v,
                fingerprint,
            } => {
                assert_eq!((v, fingerprint), (value, fp));
            }
            o => panic!("expected Completed, got {o:?}"),
        }
        let missing = Key::token(&ns, "never-issued");
        assert_eq!(
            store.claim(&missing, &other).await.unwrap(),
            ClaimOutcome::Missing
        );
    }
}
