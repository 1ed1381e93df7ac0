//! Conformance cases of cancelled calls: however a call is dropped (a `timeout`, a
//! `select!`, an aborted task), a body that returned never runs again, and a key is
//! never left held by a call that is gone.
//!
//! Bodies here end on their first poll, so a drop always lands in the claim, the wait
//! or the completion, never mid-body: each key must run exactly once.

use std::sync::atomic::AtomicU64;

use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::*;

/// Scenarios in flight at once. Each is one key's story (a cut call, then its retry),
/// so the race is in every one of them whatever their number; a bound keeps a store
/// with a small pool (SQL: 16 connections) from queueing calls long enough to open
/// diagnostic probe connections on a server that other tests share.
const IN_FLIGHT: usize = 12;

fn gate() -> Arc<Semaphore> {
    Arc::new(Semaphore::new(IN_FLIGHT))
}

/// Long enough that a key left held by a dropped call would outlast every wait below:
/// such a key shows up as `InProgress`, never as a slow pass.
const HOUR: Duration = Duration::from_secs(3600);

fn counters(n: usize) -> Arc<Vec<AtomicUsize>> {
    Arc::new((0..n).map(|_| AtomicUsize::new(0)).collect())
}

fn assert_each_ran_once(runs: &[AtomicUsize], what: &str) {
    for (i, n) in runs.iter().enumerate() {
        let n = n.load(Ordering::SeqCst);
        assert_eq!(n, 1, "{what}: key {i} ran {n} times");
    }
}

async fn join_all(tasks: &mut JoinSet<()>) {
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
}

/// A seeded xorshift: random points to cut calls at, reproducible from the seed that a
/// failure prints.
struct Rng(u64);

impl Rng {
    fn seeded() -> Self {
        let mut b = [0u8; 8];
        getrandom::fill(&mut b).expect("os rng");
        Rng(u64::from_le_bytes(b) | 1)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// 200 calls, each dropped the moment its body returned (a `select!` that prefers a
/// signal the body sends): the completion is then still on its way to the store. The
/// retry replays the first result; the body never runs again.
pub async fn dropped_after_its_body_never_runs_again(store: Arc<dyn Store>) {
    static OPTS: Options = Options::dedup("conformance::cancel_after")
        .lease(HOUR)
        .wait(Duration::from_secs(10));
    const KEYS: usize = 200;
    let idem = idem(&store);
    let runs = counters(KEYS);
    let gate = gate();
    let mut tasks = JoinSet::new();
    for i in 0..KEYS {
        let (idem, runs, gate) = (idem.clone(), runs.clone(), gate.clone());
        tasks.spawn(async move {
            let _permit = gate.acquire().await.unwrap();
            let done = Notify::new();
            let call = idem.dedup(&OPTS, i, async {
                runs[i].fetch_add(1, Ordering::SeqCst);
                done.notify_one();
                Ok::<usize, Error>(i)
            });
            tokio::select! {
                biased;
                _ = done.notified() => {}
                r = call => assert_eq!(r.unwrap(), i),
            }
            let again = idem
                .dedup(&OPTS, i, async {
                    runs[i].fetch_add(1, Ordering::SeqCst);
                    Ok::<usize, Error>(usize::MAX)
                })
                .await;
            assert_eq!(again.unwrap(), i, "key {i}: the retry did not replay");
        });
    }
    join_all(&mut tasks).await;
    assert_each_ran_once(&runs, "dropped after the body");
}

/// Calls cut by timeouts swept from 0 to 400 µs, so the cut lands anywhere in the
/// claim, the wait or the completion: dedup on 200 keys, lock on 100, token on 50.
/// The retry (which waits) never finds the key held by the dropped call, and never
/// runs a body that returned.
pub async fn timeout_sweep_never_runs_twice_nor_sticks(store: Arc<dyn Store>) {
    static DEDUP: Options = Options::dedup("conformance::cancel_sweep")
        .lease(HOUR)
        .wait(Duration::from_secs(10));
    static LOCK: Options = Options::lock("conformance::cancel_sweep_lock")
        .lease(HOUR)
        .wait(Duration::from_secs(10));
    static TOKEN: Options = Options::token("conformance::cancel_sweep_token")
        .lease(HOUR)
        .wait(Duration::from_secs(10));
    const KEYS: usize = 200;
    const LOCKS: usize = 100;
    const TOKENS: usize = 50;
    let idem = idem(&store);
    let cut = |i: usize| Duration::from_micros((i as u64 * 37) % 401);
    let runs = counters(KEYS);
    let gate = gate();
    let mut tasks = JoinSet::new();
    for i in 0..KEYS {
        let (idem, runs, gate) = (idem.clone(), runs.clone(), gate.clone());
        tasks.spawn(async move {
            let _permit = gate.acquire().await.unwrap();
            let body = || async {
                runs[i].fetch_add(1, Ordering::SeqCst);
                Ok::<usize, Error>(i)
            };
            let _ = tokio::time::timeout(cut(i), idem.dedup(&DEDUP, i, body())).await;
            let again = idem.dedup(&DEDUP, i, body()).await;
            assert_eq!(again.unwrap(), i, "dedup key {i} (cut at {:?})", cut(i));
        });
    }
    for i in 0..LOCKS {
        let (idem, gate) = (idem.clone(), gate.clone());
        tasks.spawn(async move {
            let _permit = gate.acquire().await.unwrap();
            let _ = tokio::time::timeout(cut(i), idem.lock(&LOCK, i, async { Ok::<_, Error>(()) }))
                .await;
            let again = idem.lock(&LOCK, i, async { Ok::<_, Error>(()) }).await;
            assert!(again.is_ok(), "lock {i} (cut at {:?}): {again:?}", cut(i));
        });
    }
    let token_runs = counters(TOKENS);
    for i in 0..TOKENS {
        let (idem, runs, gate) = (idem.clone(), token_runs.clone(), gate.clone());
        tasks.spawn(async move {
            let _permit = gate.acquire().await.unwrap();
            let token = idem.issue_token(HOUR).await.unwrap();
            let body = || async {
                runs[i].fetch_add(1, Ordering::SeqCst);
                Ok::<_, Error>(())
            };
            let consume = idem.consume_token::<NoReplay, _, _, _>(&TOKEN, &token, body());
            let _ = tokio::time::timeout(cut(i), consume).await;
            let again = idem
                .consume_token::<NoReplay, _, _, _>(&TOKEN, &token, body())
                .await;
            assert!(
                matches!(again, Ok(()) | Err(Error::Duplicate { .. })),
                "token {i} (cut at {:?}): {again:?}",
                cut(i)
            );
        });
    }
    join_all(&mut tasks).await;
    assert_each_ran_once(&runs, "dedup under timeouts");
    assert_each_ran_once(&token_runs, "tokens under timeouts");
}

/// 1,000 calls on 100 keys, about half of them aborted at random points: once the
/// survivors are done, each key is free (a waiting call gets its result at once or
/// after the background completions) and ran exactly once. The storm comes in ten
/// waves of 100 calls on 10 keys (`IN_FLIGHT` in this file).
pub async fn abort_storm_runs_each_key_once(store: Arc<dyn Store>) {
    static OPTS: Options = Options::dedup("conformance::abort_storm")
        .lease(HOUR)
        .wait(Duration::from_secs(10));
    const KEYS: usize = 100;
    const WAVES: usize = 10;
    const PER_KEY: usize = 10;
    let idem = idem(&store);
    let runs = counters(KEYS);
    let mut rng = Rng::seeded();
    let seed = rng.0;
    let mut aborted = 0;
    for wave in 0..WAVES {
        let keys = wave * KEYS / WAVES..(wave + 1) * KEYS / WAVES;
        let calls: Vec<_> = (0..keys.len() * PER_KEY)
            .map(|c| {
                let (idem, runs) = (idem.clone(), runs.clone());
                let k = keys.start + c % keys.len();
                let call = tokio::spawn(async move {
                    idem.dedup(&OPTS, k, async {
                        runs[k].fetch_add(1, Ordering::SeqCst);
                        Ok::<usize, Error>(k)
                    })
                    .await
                });
                (k, call)
            })
            .collect();
        for (_, call) in &calls {
            if rng.below(2) == 0 {
                if rng.below(4) == 0 {
                    tokio::time::sleep(Duration::from_micros(rng.below(300))).await;
                } else {
                    tokio::task::yield_now().await;
                }
                call.abort();
                aborted += 1;
            }
        }
        for (k, call) in calls {
            match call.await {
                Ok(r) => assert_eq!(r.unwrap(), k, "key {k} (seed {seed:#x})"),
                Err(e) => assert!(e.is_cancelled(), "key {k} (seed {seed:#x}): {e}"),
            }
        }
    }
    for k in 0..KEYS {
        let settled = idem
            .dedup(&OPTS, k, async {
                runs[k].fetch_add(1, Ordering::SeqCst);
                Ok::<usize, Error>(k)
            })
            .await;
        assert_eq!(settled.unwrap(), k, "key {k} (seed {seed:#x})");
    }
    assert!(aborted > 0);
    for (k, n) in runs.iter().enumerate() {
        let n = n.load(Ordering::SeqCst);
        assert_eq!(n, 1, "key {k} ran {n} times (seed {seed:#x})");
    }
}

/// `inner`, with the answer to every claim held back (the server has applied it) and
/// every completion held back before it is sent: a dropped call is then certain to be
/// dropped with its claim, or its completion, in flight.
struct InFlight {
    inner: Arc<dyn Store>,
    claim_answer: Duration,
    complete_send: Duration,
    completions: AtomicU64,
}

impl Store for InFlight {
    fn claim<'a>(
        &'a self,
        key: &'a Key,
        req: &'a ClaimRequest,
    ) -> crate::store::BoxFuture<'a, Result<ClaimOutcome, Error>> {
        Box::pin(async move {
            let answer = self.inner.claim(key, req).await;
            tokio::time::sleep(self.claim_answer).await;
            answer
        })
    }
    fn complete<'a>(
        &'a self,
        key: &'a Key,
        owner: Owner,
        value: Bytes,
        ttl: Duration,
    ) -> crate::store::BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            tokio::time::sleep(self.complete_send).await;
            self.completions.fetch_add(1, Ordering::SeqCst);
            self.inner.complete(key, owner, value, ttl).await
        })
    }
    fn release<'a>(
        &'a self,
        key: &'a Key,
        owner: Owner,
    ) -> crate::store::BoxFuture<'a, Result<bool, Error>> {
        self.inner.release(key, owner)
    }
    fn renew<'a>(
        &'a self,
        key: &'a Key,
        owner: Owner,
        lease: Duration,
    ) -> crate::store::BoxFuture<'a, Result<bool, Error>> {
        self.inner.renew(key, owner, lease)
    }
    fn issue<'a>(
        &'a self,
        key: &'a Key,
        ttl: Duration,
    ) -> crate::store::BoxFuture<'a, Result<bool, Error>> {
        self.inner.issue(key, ttl)
    }
    fn subscribe<'a>(
        &'a self,
        key: &'a Key,
    ) -> crate::store::BoxFuture<'a, Result<crate::store::Subscription, Error>> {
        self.inner.subscribe(key)
    }
}

/// 50 calls each dropped while its claim's answer is on its way (the server applied
/// the claim): the claim is given back once the answer arrives, and the retry, which
/// waits, runs the body; it never finds the key held for the lease. For dedup, lock
/// and token alike.
pub async fn dropped_during_its_claim_never_holds_the_key(store: Arc<dyn Store>) {
    static DEDUP: Options = Options::dedup("conformance::cancel_claim")
        .lease(HOUR)
        .wait(Duration::from_secs(10));
    static LOCK: Options = Options::lock("conformance::cancel_claim_lock")
        .lease(HOUR)
        .wait(Duration::from_secs(10));
    static TOKEN: Options = Options::token("conformance::cancel_claim_token")
        .lease(HOUR)
        .wait(Duration::from_secs(10));
    const KEYS: usize = 50;
    let slow: Arc<dyn Store> = Arc::new(InFlight {
        inner: store,
        claim_answer: ms(200),
        complete_send: Duration::ZERO,
        completions: AtomicU64::new(0),
    });
    let idem = idem(&slow);
    let (runs, token_runs) = (counters(KEYS), counters(KEYS));
    let gate = gate();
    let mut tasks = JoinSet::new();
    for i in 0..KEYS {
        let (idem, runs, token_runs) = (idem.clone(), runs.clone(), token_runs.clone());
        let gate = gate.clone();
        tasks.spawn(async move {
            let _permit = gate.acquire().await.unwrap();
            let body = || async {
                runs[i].fetch_add(1, Ordering::SeqCst);
                Ok::<usize, Error>(i)
            };
            let _ = tokio::time::timeout(ms(20), idem.dedup(&DEDUP, i, body())).await;
            let again = idem.dedup(&DEDUP, i, body()).await;
            assert_eq!(again.unwrap(), i, "dedup key {i}");

            let _ = tokio::time::timeout(ms(20), idem.lock(&LOCK, i, async { Ok::<_, Error>(()) }))
                .await;
            let again = idem.lock(&LOCK, i, async { Ok::<_, Error>(()) }).await;
            assert!(again.is_ok(), "lock {i}: {again:?}");

            let token = idem.issue_token(HOUR).await.unwrap();
            let body = || async {
                token_runs[i].fetch_add(1, Ordering::SeqCst);
                Ok::<_, Error>(())
            };
            let consume = idem.consume_token::<NoReplay, _, _, _>(&TOKEN, &token, body());
            let _ = tokio::time::timeout(ms(20), consume).await;
            let again = idem
                .consume_token::<NoReplay, _, _, _>(&TOKEN, &token, body())
                .await;
            assert!(again.is_ok(), "token {i}: {again:?}");
        });
    }
    join_all(&mut tasks).await;
    assert_each_ran_once(&runs, "dedup dropped in its claim");
    assert_each_ran_once(&token_runs, "tokens dropped in their claim");
}

/// 50 calls each dropped after its body returned, while its completion has not yet
/// been sent: the completion is sent anyway, in the background, and the retry (which
/// waits for it) replays. The key is never released to run the body again.
pub async fn dropped_during_its_completion_still_completes(store: Arc<dyn Store>) {
    static DEDUP: Options = Options::dedup("conformance::cancel_complete")
        .lease(HOUR)
        .wait(Duration::from_secs(10));
    static TOKEN: Options = Options::token("conformance::cancel_complete_token")
        .lease(HOUR)
        .wait(Duration::from_secs(10));
    const KEYS: usize = 50;
    let slow = Arc::new(InFlight {
        inner: store,
        claim_answer: Duration::ZERO,
        complete_send: ms(200),
        completions: AtomicU64::new(0),
    });
    let idem = idem(&(slow.clone() as Arc<dyn Store>));
    let (runs, token_runs) = (counters(KEYS), counters(KEYS));
    let gate = gate();
    let mut tasks = JoinSet::new();
    for i in 0..KEYS {
        let (idem, runs, token_runs) = (idem.clone(), runs.clone(), token_runs.clone());
        let gate = gate.clone();
        tasks.spawn(async move {
            let _permit = gate.acquire().await.unwrap();
            let body = || async {
                runs[i].fetch_add(1, Ordering::SeqCst);
                Ok::<usize, Error>(i)
            };
            let _ = tokio::time::timeout(ms(20), idem.dedup(&DEDUP, i, body())).await;
            let again = idem.dedup(&DEDUP, i, body()).await;
            assert_eq!(again.unwrap(), i, "dedup key {i}: the retry did not replay");

            let token = idem.issue_token(HOUR).await.unwrap();
            let body = || async {
                token_runs[i].fetch_add(1, Ordering::SeqCst);
                Ok::<_, Error>(())
            };
            let consume = idem.consume_token::<NoReplay, _, _, _>(&TOKEN, &token, body());
            let _ = tokio::time::timeout(ms(20), consume).await;
            let again = idem
                .consume_token::<NoReplay, _, _, _>(&TOKEN, &token, body())
                .await;
            // `Ok`: the cut landed in the claim (a slow store), the token went back
            // and the retry consumed it. Either way the body ran once (checked below).
            assert!(
                matches!(again, Ok(()) | Err(Error::Duplicate { .. })),
                "token {i}: {again:?}"
            );
        });
    }
    join_all(&mut tasks).await;
    assert_each_ran_once(&runs, "dedup dropped in its completion");
    assert_each_ran_once(&token_runs, "tokens dropped in their completion");
    assert_eq!(
        slow.completions.load(Ordering::SeqCst),
        2 * KEYS as u64,
        "every completion was sent, dropped call or not"
    );
}
