//! Recovery: a half-finished call completes even if nobody calls again.
//!
//! A function marked `#[idempotent(key = "...", recover)]` records its arguments with
//! its claim (same round trip). If its caller goes away before the end (the process is
//! killed, the future dropped, the lease runs out), the call is *abandoned*: a
//! [`Recoverer`] running in any process of the service finds it in the store's recovery
//! index, takes it, decodes the arguments, and calls the function again. The ordinary
//! takeover hands the new attempt the step journal, so finished steps replay instead of
//! running again, and the result is stored as usual: a later caller gets the replay.
//!
//! - A call whose body returned `Err` is not recovered: its caller got the error.
//! - Each abandoned call runs in one recoverer at a time, however many run: taking it is
//!   one atomic store step, and the run itself is an ordinary claim.
//! - Attempts are bounded and backed off; after the last one the call is *parked*:
//!   listed by `idem recoverable`, never retried, until a caller completes it.
//! - A function this process does not know (not linked, or its context not provided) is
//!   left for a process that does, and counted.
//!
//! ```
//! # #[derive(Debug, thiserror::Error)]
//! # enum PayError { #[error(transparent)] Idem(#[from] idem_runtime::Error) }
//! use idem_runtime::{Idem, idempotent};
//!
//! struct Gateway;
//!
//! #[idempotent(key = "charge:{order}", recover, context = [gateway])]
//! async fn charge(order: u64, cents: u64, gateway: &Gateway) -> Result<u64, PayError> {
//!     Ok(cents)
//! }
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let idem = Idem::builder().namespace("shop").build();
//! // Once per process: finds every function marked `recover`, gives them their context.
//! let recoverer = idem.recoverer().provide(Gateway).spawn().unwrap();
//! idem.scope(charge(7, 500, &Gateway)).await.unwrap();
//! recoverer.shutdown().await;
//! # }
//! ```

mod registry;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::de::DeserializeOwned;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tracing::Instrument as _;

pub use registry::Context;
#[doc(hidden)]
pub use registry::{Need, Ran, Recoverable, decode_args, encode_args, ran};

use crate::store::RecoveryStore;
use crate::{Error, Idem, Key, Options};

/// Finds abandoned calls and completes them: built by [`Idem::recoverer`], started with
/// [`spawn`](Recoverer::spawn) (or run a sweep at a time with [`sweep`](Recoverer::sweep)).
pub struct Recoverer {
    idem: Idem,
    context: registry::Context,
    by_hand: Vec<(&'static Options, registry::Entry)>,
    interval: Duration,
    concurrency: usize,
    attempts: u32,
    backoff: Duration,
    batch: usize,
}

/// What one sweep did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Sweep {
    /// Due calls found.
    pub found: u64,
    /// Calls run to `Ok` (completed, or found completed by someone else).
    pub recovered: u64,
    /// Calls run that returned `Err` (left to their callers, not retried).
    pub failed: u64,
    /// Calls parked: out of attempts, or their arguments no longer decode.
    pub parked: u64,
    /// Due calls of functions this process does not know, left alone.
    pub unknown: u64,
}

impl Recoverer {
    /// A recoverer of `idem`'s namespace with the defaults: see [`Idem::recoverer`].
    pub(crate) fn new(idem: Idem) -> Recoverer {
        Recoverer {
            idem,
            context: registry::Context::default(),
            by_hand: Vec::new(),
            interval: Duration::from_secs(1),
            concurrency: 16,
            attempts: 5,
            backoff: Duration::from_secs(1),
            batch: 256,
        }
    }

    /// Gives the functions' context parameters a value of type `T` (a pool, a client).
    pub fn provide<T: Send + Sync + 'static>(mut self, value: T) -> Self {
        self.context.insert(value);
        self
    }

    /// Registers a function called through [`Idem::dedup_recoverable`] with `opts`: `f`
    /// gets the decoded arguments and the context, and makes the same call again.
    pub fn register<A, F, Fut, T, E>(mut self, opts: &'static Options, f: F) -> Self
    where
        A: DeserializeOwned + Send + 'static,
        F: Fn(A, Arc<Context>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
        E: fmt::Display,
    {
        self.by_hand.push((opts, registry::entry(f)));
        self
    }

    /// How often the index is looked at when the last sweep found nothing (default 1 s).
    /// On a Redis Cluster each look reads 1,024 of the 16,384 slots' indexes, so an
    /// abandoned call is found within 16 intervals.
    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// How many calls run at once (default 16).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.max(1);
        self
    }

    /// Attempts before a call is parked (default 5).
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.attempts = n.max(1);
        self
    }

    /// The wait after a first attempt that died too, doubled after each (default 1 s;
    /// never below the function's lease, so a live attempt is not taken twice).
    pub fn backoff(mut self, backoff: Duration) -> Self {
        self.backoff = backoff;
        self
    }

    /// Starts recovering on a task of its own: a sweep, then another as soon as the
    /// last found work, else after the interval. [`Error::Unsupported`] if the store has
    /// no recovery index.
    pub fn spawn(self) -> Result<RecovererHandle, Error> {
        let run = Arc::new(self.prepare()?);
        let (stop, mut stopped) = watch::channel(false);
        let counts = Arc::new(Counts::default());
        let task = {
            let counts = counts.clone();
            tokio::spawn(async move {
                loop {
                    let busy = match run.sweep(false).await {
                        Ok(s) => {
                            counts.add(&s);
                            s.found > 0 && s.found > s.unknown
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "recovery sweep failed; trying again");
                            false
                        }
                    };
                    if *stopped.borrow() {
                        return;
                    }
                    if !busy {
                        tokio::select! {
                            _ = tokio::time::sleep(run.interval) => {}
                            _ = stopped.changed() => return,
                        }
                    }
                }
            })
        };
        Ok(RecovererHandle { stop, task, counts })
    }

    /// One sweep: every call due now is taken and run (at most the concurrency at once),
    /// and this returns when they have ended. It reads the store's whole index, where a
    /// spawned recoverer reads a Redis Cluster's a window of slots per interval.
    pub async fn sweep(self) -> Result<Sweep, Error> {
        Arc::new(self.prepare()?).sweep(true).await
    }

    fn prepare(self) -> Result<Running, Error> {
        if self.idem.store().recovery().is_none() {
            return Err(Error::Unsupported(
                "recovery: this store keeps no recovery index (memory, Redis and SQL do)",
            ));
        }
        let ns = self.idem.namespace();
        let (mut known, lacking) = registry::linked(&self.context);
        for (scope, ty) in lacking {
            tracing::warn!(
                function = scope,
                lacks = ty,
                "not recovered by this process: its context has no value of this type \
                 (give one with Recoverer::provide)"
            );
        }
        for (opts, entry) in self.by_hand {
            known.insert(opts.scope(), (entry, opts));
        }
        Ok(Running {
            idem: self.idem,
            namespace: ns,
            known,
            context: Arc::new(self.context),
            interval: self.interval,
            limit: Arc::new(Semaphore::new(self.concurrency)),
            attempts: self.attempts,
            backoff: self.backoff,
            batch: self.batch,
            cursor: AtomicU64::new(0),
        })
    }
}

impl fmt::Debug for Recoverer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Recoverer")
            .field("namespace", &self.idem.namespace())
            .field("interval", &self.interval)
            .field("concurrency", &self.concurrency)
            .field("max_attempts", &self.attempts)
            .finish_non_exhaustive()
    }
}

/// A running recoverer: stop it with [`shutdown`](Self::shutdown) (it finishes the calls
/// it runs); dropping the handle leaves it running.
#[derive(Debug)]
pub struct RecovererHandle {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    counts: Arc<Counts>,
}

impl RecovererHandle {
    /// What it did so far, summed over its sweeps.
    pub fn totals(&self) -> Sweep {
        self.counts.get()
    }

    /// Stops after the current sweep, whose calls run to their end.
    pub async fn shutdown(self) -> Sweep {
        let _ = self.stop.send(true);
        let _ = self.task.await;
        self.counts.get()
    }
}

#[derive(Debug, Default)]
struct Counts([AtomicU64; 5]);

impl Counts {
    fn add(&self, s: &Sweep) {
        let n = [s.found, s.recovered, s.failed, s.parked, s.unknown];
        for (c, n) in self.0.iter().zip(n) {
            c.fetch_add(n, Ordering::Relaxed);
        }
    }

    fn get(&self) -> Sweep {
        let [found, recovered, failed, parked, unknown] =
            std::array::from_fn(|i| self.0[i].load(Ordering::Relaxed));
        Sweep {
            found,
            recovered,
            failed,
            parked,
            unknown,
        }
    }
}

/// A prepared recoverer.
struct Running {
    idem: Idem,
    namespace: &'static str,
    known: registry::Known,
    context: Arc<registry::Context>,
    interval: Duration,
    limit: Arc<Semaphore>,
    attempts: u32,
    backoff: Duration,
    batch: usize,
    cursor: AtomicU64,
}

/// How one due call ended, for the sweep's counts and the metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Recovered,
    Failed,
    Parked,
    Unknown,
    /// Not abandoned after all (held, finished, parked), or taken by another recoverer.
    Skipped,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Outcome::Recovered => "recovered",
            Outcome::Failed => "failed",
            Outcome::Parked => "parked",
            Outcome::Unknown => "unknown",
            Outcome::Skipped => "skipped",
        }
    }
}

impl Running {
    fn recovery(&self) -> &dyn RecoveryStore {
        // `prepare` checked that the store has one.
        self.idem
            .store()
            .recovery()
            .expect("checked by Recoverer::prepare")
    }

    /// Takes and runs what is due. `whole`: the store's whole index, even one a store
    /// walks a part at a time (a Redis Cluster's, slot by slot); else the next part,
    /// from where the last sweep stopped.
    async fn sweep(self: &Arc<Self>, whole: bool) -> Result<Sweep, Error> {
        let mut due = Vec::new();
        loop {
            let cursor = self.cursor.load(Ordering::Relaxed);
            let limit = self.batch - due.len();
            let (found, next) = self.recovery().due(self.namespace, limit, cursor).await?;
            self.cursor.store(next, Ordering::Relaxed);
            due.extend(found);
            if !whole || next == 0 || due.len() >= self.batch {
                break;
            }
        }
        let mut sweep = Sweep {
            found: due.len() as u64,
            ..Sweep::default()
        };
        #[cfg(feature = "metrics")]
        metrics::gauge!(crate::observe::RECOVERY_WAITING, "namespace" => self.namespace)
            .set(due.len() as f64);
        let mut running = JoinSet::new();
        for d in due {
            let Some((entry, opts)) = self.known.get(d.scope.as_str()) else {
                sweep.unknown += 1;
                count(d.scope.clone(), Outcome::Unknown);
                continue;
            };
            let key = Key::from_parts(self.namespace, opts.scope(), d.digest);
            let permit = self.limit.clone().acquire_owned().await;
            let (this, entry, opts) = (self.clone(), entry.clone(), *opts);
            running.spawn(async move {
                let _permit = permit;
                this.recover(key, opts, entry).await
            });
        }
        while let Some(done) = running.join_next().await {
            match done {
                Ok(Ok(Outcome::Recovered)) => sweep.recovered += 1,
                Ok(Ok(Outcome::Failed)) => sweep.failed += 1,
                Ok(Ok(Outcome::Parked)) => sweep.parked += 1,
                Ok(Ok(_)) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "a recovery failed on the store"),
                // A body that panicked: its claim was abandoned by the drop, so the call
                // is due again, and its attempts still count.
                Err(e) => tracing::error!(error = %e, "a recovered call panicked"),
            }
        }
        Ok(sweep)
    }

    /// Takes and runs one due call.
    async fn recover(
        &self,
        key: Key,
        opts: &'static Options,
        entry: registry::Entry,
    ) -> Result<Outcome, Error> {
        let recovery = self.recovery();
        // Never below the lease: an attempt that is still running must not be taken by
        // another recoverer before its claim shows.
        let backoff = self.backoff.max(opts.lease * 2);
        let Some(taken) = recovery.take(&key, backoff).await? else {
            return Ok(Outcome::Skipped);
        };
        let span = tracing::info_span!(
            "idem_recover",
            function = opts.scope(),
            %key,
            attempt = taken.attempts,
            outcome = tracing::field::Empty,
        );
        let outcome = async {
            if taken.attempts > self.attempts {
                let why = format!(
                    "gave up after {} recovery attempts that did not finish",
                    taken.attempts - 1
                );
                recovery.park(&key, &why).await?;
                tracing::error!(%key, "{why}; parked");
                return Ok(Outcome::Parked);
            }
            let ran = self
                .idem
                .scope((entry)(taken.args, self.context.clone()))
                .await;
            Ok(match ran {
                Ran::Done => Outcome::Recovered,
                Ran::Failed(e) => {
                    tracing::warn!(%key, error = %e, "a recovered call returned an error");
                    Outcome::Failed
                }
                Ran::Undecodable(e) => {
                    recovery.park(&key, &e).await?;
                    tracing::error!(%key, error = %e, "parked");
                    Outcome::Parked
                }
            })
        }
        .instrument(span.clone())
        .await;
        if let Ok(o) = &outcome {
            span.record("outcome", o.as_str());
            count(opts.scope().to_owned(), *o);
        }
        outcome
    }
}

#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
fn count(function: String, outcome: Outcome) {
    #[cfg(feature = "metrics")]
    if outcome != Outcome::Skipped {
        metrics::counter!(crate::observe::RECOVERED_TOTAL, "function" => function, "outcome" => outcome.as_str())
            .increment(1);
    }
}
