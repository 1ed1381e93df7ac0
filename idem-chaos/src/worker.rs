//! A worker process: payments against the store until its deadline (or until the
//! controller kills it). This program run again with `--worker`; its settings come in
//! `IDEM_CHAOS_*` environment variables.
//!
//! Each body run is one ledger row, written before the body returns: the effect. A
//! caller that learns from the store that a key is completed (the completion was
//! acknowledged to this worker, or a replay came back) writes a "seen" row after it;
//! from then on the failure model says the key's body must never run again.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use idem_runtime::store::{
    BoxFuture, ClaimOutcome, ClaimRequest, Due, Owner, RecoverableCall, RecoveryStore,
    Subscription, Taken,
};
use idem_runtime::{Error, Idem, Key, Options, Store};

use super::ledger::{History, Ledger};
use super::rng::Rng;

/// The payments function's options: a short lease, so a killed worker's keys come back
/// within the run; no waiting, so a duplicate in flight is counted, not queued.
pub(crate) static PAY: Options = Options::dedup("chaos::pay")
    .lease(LEASE)
    .wait(Duration::from_millis(200));

/// The lease of a claim; a killed worker's in-flight keys may run again after it.
pub(crate) const LEASE: Duration = Duration::from_secs(2);

/// `--faults netem`: the issue's short lease (1 s), over the slow link, so renewals
/// have to keep up with 50 to 200 ms each way.
pub(crate) static PAY_SHORT: Options = Options::dedup("chaos::pay")
    .lease(Duration::from_secs(1))
    .wait(Duration::from_millis(200));

/// Whether this worker runs with [`PAY_SHORT`] (`IDEM_CHAOS_SHORT_LEASE=1`).
static SHORT_LEASE: AtomicBool = AtomicBool::new(false);

/// What one worker needs, from its environment.
pub(crate) struct Settings {
    pub(crate) store: String,
    pub(crate) ledger: String,
    pub(crate) run: String,
    pub(crate) incarnation: i32,
    pub(crate) keys: u64,
    pub(crate) tasks: usize,
    pub(crate) until_ms: u64,
    pub(crate) replicas: usize,
    /// The run's history directory.
    pub(crate) history: String,
    /// Small pools and short PostgreSQL timeouts (partition runs).
    pub(crate) small: bool,
}

impl Settings {
    pub(crate) fn from_env() -> Result<Settings, String> {
        let var = |n: &str| std::env::var(n).map_err(|_| format!("{n} is not set"));
        let num =
            |n: &str| -> Result<u64, String> { var(n)?.parse().map_err(|e| format!("{n}: {e}")) };
        Ok(Settings {
            store: var("IDEM_CHAOS_STORE")?,
            ledger: var("IDEM_CHAOS_LEDGER")?,
            run: var("IDEM_CHAOS_RUN")?,
            incarnation: i32::try_from(num("IDEM_CHAOS_INC")?).map_err(|e| e.to_string())?,
            keys: num("IDEM_CHAOS_KEYS")?,
            tasks: usize::try_from(num("IDEM_CHAOS_TASKS")?).map_err(|e| e.to_string())?,
            until_ms: num("IDEM_CHAOS_UNTIL")?,
            replicas: usize::try_from(num("IDEM_CHAOS_REPLICAS")?).map_err(|e| e.to_string())?,
            history: var("IDEM_CHAOS_HISTORY")?,
            small: num("IDEM_CHAOS_SMALL")? == 1,
        })
    }
}

/// Microseconds since the epoch, by this machine's clock (the ledger's too).
pub(crate) fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// What a worker counts; printed as a `stat` line a few times a second, so the
/// controller has the counts of a worker it kills.
#[derive(Default)]
pub(crate) struct Counts {
    pub(crate) calls: AtomicU64,
    pub(crate) ran: AtomicU64,
    pub(crate) replayed: AtomicU64,
    pub(crate) store_errors: AtomicU64,
    pub(crate) busy: AtomicU64,
    pub(crate) unexpected: AtomicU64,
}

impl Counts {
    fn line(&self) -> String {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        format!(
            "stat {} {} {} {} {} {}",
            g(&self.calls),
            g(&self.ran),
            g(&self.replayed),
            g(&self.store_errors),
            g(&self.busy),
            g(&self.unexpected)
        )
    }
}

/// The store, watched: remembers which keys' completions it acknowledged, so the
/// caller can write them down as completed, and the owner of each claim it won, so the
/// body can write it with its effect.
pub(crate) struct Watched {
    inner: Arc<dyn Store>,
    acknowledged: Mutex<HashSet<Key>>,
    owners: Mutex<HashMap<Key, Owner>>,
    /// Keys whose completion the store refused: their lease was lost.
    refused: Mutex<HashSet<Key>>,
}

impl Watched {
    /// The owner of the last claim of `key` this process won, folded to 64 bits (its
    /// process half XOR its counter half).
    fn owner(&self, key: &Key) -> i64 {
        let owners = self.owners.lock().unwrap_or_else(|p| p.into_inner());
        owners.get(key).map_or(0, |o| {
            i64::from_ne_bytes(((o.0 >> 64) as u64 ^ o.0 as u64).to_ne_bytes())
        })
    }

    fn take(&self, key: &Key) -> bool {
        self.acknowledged
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key)
    }

    fn take_refused(&self, key: &Key) -> bool {
        self.refused
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key)
    }
}

impl Watched {
    /// Writes down what the store answered to a completion.
    fn note_completion(&self, key: &Key, done: &Result<bool, Error>) {
        let set = match done {
            Ok(true) => &self.acknowledged,
            Ok(false) => &self.refused,
            Err(_) => return,
        };
        set.lock().unwrap_or_else(|p| p.into_inner()).insert(*key);
    }

    fn index(&self) -> &dyn RecoveryStore {
        // Reached only through `recovery()`, which answers for a store that has one.
        self.inner
            .recovery()
            .expect("Watched::recovery answers only for a store with an index")
    }
}

/// A recoverable payment ends through the index: its completion is written down as a
/// plain one's is.
impl RecoveryStore for Watched {
    fn settle<'a>(
        &'a self,
        key: &'a Key,
        owner: Owner,
        settle: Option<(Bytes, Duration)>,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            let completing = settle.is_some();
            let done = self.index().settle(key, owner, settle).await;
            if completing {
                self.note_completion(key, &done);
            }
            done
        })
    }

    fn abandon<'a>(&'a self, key: &'a Key, owner: Owner) -> BoxFuture<'a, Result<bool, Error>> {
        self.index().abandon(key, owner)
    }

    fn due<'a>(
        &'a self,
        namespace: &'a str,
        limit: usize,
        cursor: u64,
    ) -> BoxFuture<'a, Result<(Vec<Due>, u64), Error>> {
        self.index().due(namespace, limit, cursor)
    }

    fn take<'a>(
        &'a self,
        key: &'a Key,
        backoff: Duration,
    ) -> BoxFuture<'a, Result<Option<Taken>, Error>> {
        self.index().take(key, backoff)
    }

    fn park<'a>(&'a self, key: &'a Key, error: &'a str) -> BoxFuture<'a, Result<bool, Error>> {
        self.index().park(key, error)
    }

    fn call<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Option<RecoverableCall>, Error>> {
        self.index().call(key)
    }

    fn list<'a>(
        &'a self,
        namespace: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<RecoverableCall>, Error>> {
        self.index().list(namespace, limit)
    }
}

impl Store for Watched {
    fn claim<'a>(
        &'a self,
        key: &'a Key,
        req: &'a ClaimRequest,
    ) -> BoxFuture<'a, Result<ClaimOutcome, Error>> {
        Box::pin(async move {
            let outcome = self.inner.claim(key, req).await;
            if let Ok(ClaimOutcome::Claimed { .. }) = outcome {
                self.owners
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(*key, req.owner);
            }
            outcome
        })
    }

    fn complete<'a>(
        &'a self,
        key: &'a Key,
        owner: Owner,
        value: Bytes,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            let done = self.inner.complete(key, owner, value, ttl).await;
            self.note_completion(key, &done);
            done
        })
    }

    fn recovery(&self) -> Option<&dyn RecoveryStore> {
        self.inner.recovery().map(|_| self as &dyn RecoveryStore)
    }

    fn release<'a>(&'a self, key: &'a Key, owner: Owner) -> BoxFuture<'a, Result<bool, Error>> {
        self.inner.release(key, owner)
    }

    fn renew<'a>(
        &'a self,
        key: &'a Key,
        owner: Owner,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        self.inner.renew(key, owner, lease)
    }

    fn issue<'a>(&'a self, key: &'a Key, ttl: Duration) -> BoxFuture<'a, Result<bool, Error>> {
        self.inner.issue(key, ttl)
    }

    fn subscribe<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Subscription, Error>> {
        self.inner.subscribe(key)
    }

    fn name(&self) -> &'static str {
        self.inner.name()
    }
}

/// How one call ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The body ran here (and the store acknowledged its completion, or not).
    Ran {
        acknowledged: bool,
        /// The completion was refused: the lease was lost, another owner may run it.
        lost: bool,
    },
    Replayed,
    StoreError,
    Busy,
    Unexpected(String),
}

impl Outcome {
    /// Its name in the history.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Outcome::Ran {
                acknowledged: true, ..
            } => "ran",
            Outcome::Ran { lost: true, .. } => "ran-lost",
            Outcome::Ran { .. } => "ran-unacked",
            Outcome::Replayed => "replayed",
            Outcome::StoreError => "store-error",
            Outcome::Busy => "busy",
            Outcome::Unexpected(_) => "unexpected",
        }
    }
}

/// One payment of `key` through `idem`, its effect written to `ledger` by incarnation
/// `inc`, the call to `history`.
pub(crate) async fn pay(
    idem: &Idem,
    watched: &Arc<Watched>,
    ledger: &Ledger,
    history: &History,
    inc: i32,
    key: u64,
    rng: &mut Rng,
) -> Outcome {
    let start = now_us();
    history.started(inc, key, start);
    let outcome = pay_once(idem, watched, ledger, inc, key, rng).await;
    history.call(inc, key, start, now_us(), outcome.name());
    outcome
}

async fn pay_once(
    idem: &Idem,
    watched: &Arc<Watched>,
    ledger: &Ledger,
    inc: i32,
    key: u64,
    rng: &mut Rng,
) -> Outcome {
    let ran = Arc::new(AtomicBool::new(false));
    let pause = Duration::from_millis(rng.below(20));
    let id = i64::try_from(key).unwrap_or(i64::MAX);
    let rendered = idem.key(&PAY, format_args!("pay-{key}"));
    let body = {
        let (ran, ledger, watched) = (ran.clone(), ledger.clone(), watched.clone());
        async move {
            ran.store(true, Ordering::SeqCst);
            // The effect, with the claim it ran under; if it cannot be written, it did
            // not happen and the key is released for a retry.
            ledger
                .ran(id, inc, watched.owner(&rendered))
                .await
                .map_err(|e| Error::Store(Box::new(e)))?;
            // A body takes a while, so that kills land in the middle of some.
            tokio::time::sleep(pause).await;
            Ok::<u64, Error>(key * 100)
        }
    };
    let opts = if SHORT_LEASE.load(Ordering::Relaxed) {
        &PAY_SHORT
    } else {
        &PAY
    };
    // Recoverable: the key is recorded with the claim, so a recoverer (another
    // worker's, or the controller's at the end) finishes a payment whose worker died.
    let result = idem
        .dedup_recoverable(opts, format!("pay-{key}"), &key, body)
        .await;
    let acknowledged = watched.take(&rendered);
    let lost = watched.take_refused(&rendered);
    let ran = ran.load(Ordering::SeqCst);
    match result {
        Ok(v) if v != key * 100 => Outcome::Unexpected(format!("key {key} replayed {v}")),
        Ok(_) if ran => Outcome::Ran { acknowledged, lost },
        Ok(_) => Outcome::Replayed,
        Err(Error::Store(_)) => Outcome::StoreError,
        Err(Error::InProgress { .. }) => Outcome::Busy,
        Err(e) => Outcome::Unexpected(format!("key {key}: {e}")),
    }
}

/// What the checker needs to know of a payment's outcome, written to the ledger by a
/// worker's own calls and its recoverer's alike: a completion reported to the caller
/// (`seen`), and a completion the store refused (`lost <key>`), so that the checker can
/// tell a visible double (this key's lease lost, counted) from a silent one.
async fn written_down(ledger: &Ledger, inc: i32, key: u64, outcome: &Outcome) {
    let id = i64::try_from(key).unwrap_or(0);
    match outcome {
        Outcome::Ran { acknowledged, lost } => {
            if *lost {
                let _ = ledger.event(&super::ledger::lost_event(key), inc).await;
            }
            if *acknowledged {
                let _ = ledger.seen(id, inc).await;
            }
        }
        Outcome::Replayed => {
            let _ = ledger.seen(id, inc).await;
        }
        _ => {}
    }
}

/// A recoverer of the payments function on `idem`: it finishes the payments a killed,
/// cut or paused worker abandoned, as the same call, its effects written by
/// incarnation `inc` and its completions marked seen, as a worker's are.
pub(crate) fn recoverer(
    idem: &Idem,
    watched: &Arc<Watched>,
    ledger: &Ledger,
    history: &Arc<History>,
    inc: i32,
) -> Result<idem_runtime::recover::RecovererHandle, String> {
    let (on, watched, ledger, history) = (
        idem.clone(),
        watched.clone(),
        ledger.clone(),
        history.clone(),
    );
    idem.recoverer()
        .interval(RECOVERY_INTERVAL)
        .register(&PAY, move |key: u64, _| {
            let (idem, watched, ledger, history) =
                (on.clone(), watched.clone(), ledger.clone(), history.clone());
            async move {
                let mut rng = Rng::new(key);
                let outcome = pay(&idem, &watched, &ledger, &history, inc, key, &mut rng).await;
                written_down(&ledger, inc, key, &outcome).await;
                match outcome {
                    Outcome::Ran { .. } | Outcome::Replayed => Ok(()),
                    other => Err(other.name()),
                }
            }
        })
        .spawn()
        .map_err(|e| format!("recoverer: {e}"))
}

/// How often a recoverer looks for abandoned payments.
pub(crate) const RECOVERY_INTERVAL: Duration = Duration::from_millis(250);

/// Builds the store a worker (or the controller's final sweep) uses, watched.
pub(crate) async fn open(
    store: &str,
    replicas: usize,
    namespace: &str,
    small: bool,
) -> Result<(Idem, Arc<Watched>), String> {
    let inner = super::connect(store, replicas, small).await?;
    let watched = Arc::new(Watched {
        inner,
        acknowledged: Mutex::default(),
        owners: Mutex::default(),
        refused: Mutex::default(),
    });
    let idem = Idem::builder()
        .shared_store(watched.clone())
        .namespace(namespace.to_owned())
        .build();
    Ok((idem, watched))
}

/// The worker's main: runs `tasks` payment loops until the deadline, printing counts.
pub(crate) async fn run(s: Settings) -> Result<(), String> {
    SHORT_LEASE.store(
        std::env::var("IDEM_CHAOS_SHORT_LEASE").is_ok_and(|v| v == "1"),
        Ordering::Relaxed,
    );
    let ledger = Ledger::open(&s.ledger, &s.run, if s.small { 4 } else { 8 }).await?;
    let history = Arc::new(History::create(&s.history, s.incarnation)?);
    let (idem, watched) = open(&s.store, s.replicas, &s.run, s.small).await?;
    let counts = Arc::new(Counts::default());
    let recoverer = recoverer(&idem, &watched, &ledger, &history, s.incarnation)?;
    let parent = std::os::unix::process::parent_id();
    let mut tasks = Vec::new();
    for t in 0..s.tasks {
        let (idem, watched, ledger, counts, history) = (
            idem.clone(),
            watched.clone(),
            ledger.clone(),
            counts.clone(),
            history.clone(),
        );
        let (keys, until, inc) = (s.keys, s.until_ms, s.incarnation);
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng::new(u64::try_from(inc).unwrap_or(0) * 1000 + t as u64);
            // Bounded: one call every few milliseconds, until the deadline or the
            // controller is gone.
            while now_ms() < until && std::os::unix::process::parent_id() == parent {
                let key = rng.below(keys);
                counts.calls.fetch_add(1, Ordering::Relaxed);
                let outcome = pay(&idem, &watched, &ledger, &history, inc, key, &mut rng).await;
                written_down(&ledger, inc, key, &outcome).await;
                match outcome {
                    Outcome::Ran { .. } => {
                        counts.ran.fetch_add(1, Ordering::Relaxed);
                    }
                    Outcome::Replayed => {
                        counts.replayed.fetch_add(1, Ordering::Relaxed);
                    }
                    Outcome::StoreError => {
                        counts.store_errors.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    Outcome::Busy => {
                        counts.busy.fetch_add(1, Ordering::Relaxed);
                    }
                    Outcome::Unexpected(why) => {
                        counts.unexpected.fetch_add(1, Ordering::Relaxed);
                        println!("unexpected {why}");
                    }
                }
                tokio::time::sleep(Duration::from_millis(2 + rng.below(8))).await;
            }
        }));
    }
    // The seventh number: completions refused because the lease was lost.
    let printer = {
        let (counts, idem) = (counts.clone(), idem.clone());
        tokio::spawn(async move {
            loop {
                println!("{} {}", counts.line(), idem.stats().lease_lost);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };
    for t in tasks {
        t.await.map_err(|e| format!("worker task: {e}"))?;
    }
    printer.abort();
    recoverer.shutdown().await;
    println!("{} {}", counts.line(), idem.stats().lease_lost);
    println!("done");
    Ok(())
}
