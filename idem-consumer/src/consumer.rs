//! The rules, written once over [`Delivery`]: claim, run, record, then settle.

use std::convert::Infallible;
use std::future::{Future, poll_fn};
use std::panic::AssertUnwindSafe;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use futures_util::FutureExt as _;
use idem_runtime::toolbox::Optimistic;
use idem_runtime::{Error, Idem, Key, Options};
use tokio::sync::{Mutex, watch};
use tokio::task::JoinSet;

use crate::counters::{Counters, Live};
use crate::effect::{Effect, Plain, Ran};
use crate::observe::Fate;
use crate::{ConsumerError, Delivery, Handler, Horizon, Message, Source};

/// Builds a [`Consumer`]; see [`Consumer::builder`].
#[derive(Debug, Clone)]
#[must_use]
pub struct ConsumerBuilder {
    idem: Idem,
    opts: Options,
    max_attempts: u32,
    backoff: (Duration, Duration),
    concurrency: usize,
    derive_ids: bool,
}

/// A consumer: the rules, a handler, an idem runtime and its counters. Cheap to clone;
/// clones share the counters.
pub struct Consumer<E = ()> {
    shared: Arc<Shared<E>>,
}

impl<E> Clone for Consumer<E> {
    fn clone(&self) -> Self {
        Consumer {
            shared: self.shared.clone(),
        }
    }
}

impl<E> std::fmt::Debug for Consumer<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("operation", &self.shared.opts.name())
            .field("counters", &self.counters())
            .finish_non_exhaustive()
    }
}

struct Shared<E> {
    idem: Idem,
    /// The user's options.
    opts: Options,
    /// The same with no wait: the first look, so a twin still running is seen (and
    /// counted) before waiting for it with `opts`.
    look: Options,
    /// Where failed attempts are counted, per message id (kept as long as the records).
    attempts: Optimistic,
    max_attempts: u32,
    backoff: (Duration, Duration),
    concurrency: usize,
    derive_ids: bool,
    effect: E,
    live: Live,
}

impl ConsumerBuilder {
    /// The operation's options: its name (part of every record key), the record `ttl`
    /// (must outlast the broker's redeliveries), the `lease` and the `wait` for a
    /// duplicate whose twin is still running. They must be dedup options.
    pub fn options(mut self, opts: Options) -> Self {
        self.opts = opts;
        self
    }

    /// Handler failures before a message is terminated (dead-lettered). Counted in the
    /// store, so the count survives consumer crashes. Default 5; 0 is treated as 1.
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n.max(1);
        self
    }

    /// The nak delay after the n-th failure: `min(max, base · 2^(n-1))`. Default
    /// 100 ms up to 30 s.
    pub fn backoff(mut self, base: Duration, max: Duration) -> Self {
        self.backoff = (base, max.max(base));
        self
    }

    /// At most this many deliveries in flight at once (default 64; 0 is treated as 1).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.max(1);
        self
    }

    /// Opt-in: a message without an id is deduplicated under the digest of its payload
    /// (`blake3:<hex>`), so two different messages with equal bodies count as one.
    /// Default: such a message is terminated (dead-lettered) and counted as poison.
    pub fn derive_ids_from_payload(mut self, on: bool) -> Self {
        self.derive_ids = on;
        self
    }

    /// The consumer, with `handler` as the effect, recorded in the idem store.
    ///
    /// # Panics
    ///
    /// If the process already keeps as many distinct names as
    /// [`Key::intern`](idem_runtime::Key::intern) allows: the consumer's attempt counter
    /// needs one more, its function's name with `::attempts`.
    pub fn handler<H: Handler>(self, handler: H) -> Consumer<Plain<H>> {
        self.build(Plain(handler))
    }

    /// The consumer in SQL transactional mode on PostgreSQL: `handler` writes through the
    /// claim's transaction, which commits the record with the writes; the ack follows the
    /// commit. `store` must be the idem runtime's store (or share its database and
    /// namespace).
    ///
    /// A transaction left idle for the lease (a paused or hung consumer) is ended by the
    /// server, so a redelivery can take the message over and the paused holder's commit
    /// is refused: set the lease above the handler's longest pause between statements.
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub fn transactional<H: crate::TxHandler>(
        self,
        store: idem_runtime::SqlStore,
        handler: H,
    ) -> Consumer<crate::tx::Transactional<H>> {
        self.build(crate::tx::Transactional { store, handler })
    }

    fn build<E>(self, effect: E) -> Consumer<E> {
        // One name per consumer function, kept for the process's life like the function's
        // own: only a process already at the interning limit (thousands of names) fails.
        let family = Key::intern(&format!("{}::attempts", self.opts.name()))
            .unwrap_or_else(|e| panic!("idem-consumer: {e}"));
        let attempts = Optimistic::new(family).ttl(self.opts.ttl_for());
        Consumer {
            shared: Arc::new(Shared {
                look: self.opts.clone().wait(Duration::ZERO),
                live: Live::new(self.opts.name()),
                idem: self.idem,
                opts: self.opts,
                attempts,
                max_attempts: self.max_attempts,
                backoff: self.backoff,
                concurrency: self.concurrency,
                derive_ids: self.derive_ids,
                effect,
            }),
        }
    }
}

impl Consumer {
    /// A builder on `idem`, for the operation `opts` (dedup options: see
    /// [`ConsumerBuilder::options`]).
    pub fn builder(idem: Idem, opts: Options) -> ConsumerBuilder {
        ConsumerBuilder {
            idem,
            opts,
            max_attempts: 5,
            backoff: (Duration::from_millis(100), Duration::from_secs(30)),
            concurrency: 64,
            derive_ids: false,
        }
    }
}

/// What happened to one delivery (also counted in [`Counters`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// The effect ran here, was recorded, and the ack was sent.
    Processed,
    /// The message had completed: acked without running the handler.
    Duplicate,
    /// Another consumer still held the message after `wait`: nak'ed with the time left
    /// on its lease.
    InFlight,
    /// The handler failed: nak'ed with backoff.
    Retry,
    /// Terminated (dead-lettered): `max_attempts` failures, or no message id.
    Poison,
    /// The store failed, or a commit's outcome is unknown: nak'ed with backoff.
    StoreError,
    /// The settlement the rules chose did not reach the broker (counted in
    /// `ack_failures`); the broker delivers the message again.
    AckFailed,
}

impl<E> Consumer<E> {
    /// The counters so far.
    pub fn counters(&self) -> Counters {
        self.shared.live.snapshot()
    }

    /// The idem runtime.
    pub fn idem(&self) -> &Idem {
        &self.shared.idem
    }
}

impl<E: Effect> Consumer<E> {
    /// Checks the record ttl against how long the broker may redeliver a message: a ttl
    /// that ends first would let a late redelivery run the effect again.
    pub fn check_retention(&self, horizon: Horizon) -> Result<(), ConsumerError> {
        let ttl = self.shared.opts.ttl_for();
        match horizon {
            Horizon::Bounded(h) if h > ttl => {
                Err(ConsumerError::RetentionTooShort { ttl, horizon: h })
            }
            Horizon::Unbounded => Err(ConsumerError::UnboundedRedelivery),
            Horizon::Unknown => {
                tracing::info!(
                    ?ttl,
                    "the broker's redelivery horizon is unknown; records are kept for the ttl"
                );
                Ok(())
            }
            Horizon::Bounded(_) => Ok(()),
        }
    }

    /// Pulls deliveries from `source` until it ends or `shutdown` resolves, with at most
    /// `concurrency` in flight, each processed by [`Consumer::process`]. On shutdown it
    /// stops pulling, lets the deliveries in flight finish and settle, closes the source
    /// ([`Source::close`]), then returns the counters. Refuses to start if
    /// [`Consumer::check_retention`] fails.
    ///
    /// The deliveries are processed by `concurrency` workers that take turns pulling
    /// from the source, rather than a task spawned per delivery: a delivery's future is
    /// built in place in its worker, with no allocation and no copy of it per message.
    pub async fn run<S: Source + 'static>(
        &self,
        source: S,
        shutdown: impl Future<Output = ()>,
    ) -> Result<Counters, ConsumerError> {
        if let Err(e) = self.check_retention(source.redelivery_horizon()) {
            source.close().await;
            return Err(e);
        }
        let pull = Arc::new(Mutex::new(Pull {
            source,
            ended: false,
        }));
        let (stop, stopped) = watch::channel(false);
        let mut workers = JoinSet::new();
        for _ in 0..self.shared.concurrency {
            workers.spawn(self.clone().work(pull.clone(), stopped.clone()));
        }
        let all_done = async { while workers.join_next().await.is_some() {} };
        tokio::select! {
            biased;
            () = shutdown => {
                let _ = stop.send(true);
            }
            () = all_done => {}
        }
        // The deliveries in flight finish and settle.
        while workers.join_next().await.is_some() {}
        // Every worker is gone, and with it every other handle on the source.
        if let Some(pull) = Arc::into_inner(pull) {
            pull.into_inner().source.close().await;
        }
        Ok(self.counters())
    }

    /// One worker: pulls a delivery (waiting its turn at the source) and processes it,
    /// until the source ends or the run is told to stop. A handler's panic is caught, so
    /// the worker goes on: its delivery stays unsettled, and the broker delivers it again.
    async fn work<S: Source + 'static>(
        self,
        pull: Arc<Mutex<Pull<S>>>,
        mut stopped: watch::Receiver<bool>,
    ) {
        loop {
            if *stopped.borrow() {
                return;
            }
            let next = tokio::select! {
                biased;
                next = async { pull.lock().await.next().await } => next,
                _ = stopped.wait_for(|stop| *stop) => return,
            };
            let delivery = match next {
                Pulled::Delivery(d) => d,
                Pulled::Again => continue,
                Pulled::Ended => return,
            };
            let processed = AssertUnwindSafe(self.process(delivery))
                .catch_unwind()
                .await;
            if processed.is_err() {
                tracing::error!("a delivery's processing panicked; the broker delivers it again");
            }
        }
    }

    /// Applies the rules to one delivery: claim its id, run the effect once, record it,
    /// then ack (checking the broker took the ack); a duplicate is acked without running;
    /// a twin still running elsewhere is waited for; a failure is nak'ed with backoff,
    /// then terminated after `max_attempts`.
    pub async fn process<D: Delivery>(&self, delivery: D) -> Outcome {
        let s = &*self.shared;
        let attempt = delivery.attempt();
        if attempt > 1 {
            s.live.redelivery();
        }
        let payload = delivery.payload();
        let id = match delivery.message_id() {
            Some(id) if !id.is_empty() => id.to_owned(),
            _ if s.derive_ids => format!("blake3:{}", blake3::hash(&payload).to_hex()),
            _ => {
                tracing::error!("a message without an id: terminated (dead-lettered)");
                s.live.poison(true);
                return self.settle(&delivery, Settle::Terminate, Fate::NoId).await;
            }
        };
        let msg = Message {
            id,
            payload,
            attempt,
        };
        // Pinned here, so the effect's future (the largest part of this one) is kept
        // once rather than again inside `with_progress`; in a block of its own, so its
        // space is free again for the settlement's futures.
        let ran = {
            let effect = pin!(self.run_effect(&msg));
            with_progress(&delivery, effect).await
        };
        match ran {
            Ok(Ran::Effect) => self.settle(&delivery, Settle::Ack, Fate::Processed).await,
            Ok(Ran::Replayed) => self.settle(&delivery, Settle::Ack, Fate::Duplicate).await,
            Ok(Ran::Failed(e)) => self.failed(&delivery, &msg, e).await,
            Err(Error::InProgress { .. }) => {
                let delay = s.effect.lease_left(&s.idem, &s.opts, &msg).await;
                self.settle(&delivery, Settle::Nak(delay), Fate::InFlight)
                    .await
            }
            Err(e) => {
                tracing::warn!(id = %msg.id, error = %e, "store failure; delivering again later");
                s.live.store_error();
                let delay = self.backoff(attempt);
                self.settle(&delivery, Settle::Nak(delay), Fate::StoreError)
                    .await
            }
        }
    }

    /// The effect under its claim: a first look without waiting, so a twin still running
    /// is counted, then the wait on the runtime (woken when the twin ends).
    async fn run_effect(&self, msg: &Message) -> Result<Ran, Error> {
        let s = &*self.shared;
        match s.effect.run(&s.idem, &s.look, msg).await {
            Err(Error::InProgress { .. }) => {
                s.live.in_flight_duplicate();
                s.effect.run(&s.idem, &s.opts, msg).await
            }
            other => other,
        }
    }

    async fn failed<D: Delivery>(
        &self,
        delivery: &D,
        msg: &Message,
        err: idem_runtime::store::BoxError,
    ) -> Outcome {
        let s = &*self.shared;
        s.live.handler_error();
        let counted = s
            .idem
            .update(&s.attempts, &msg.id, |n: Option<u32>| {
                Ok::<_, Error>(n.unwrap_or(0) + 1)
            })
            .await;
        let failures = match counted {
            Ok(v) => v.value,
            Err(e) => {
                tracing::warn!(id = %msg.id, error = %e, "could not count the failure; delivering again later");
                s.live.store_error();
                let delay = self.backoff(msg.attempt);
                return self
                    .settle(delivery, Settle::Nak(delay), Fate::StoreError)
                    .await;
            }
        };
        if failures >= s.max_attempts {
            tracing::error!(id = %msg.id, failures, error = %err, "poison message: terminated (dead-lettered)");
            s.live.poison(false);
            self.settle(delivery, Settle::Terminate, Fate::DeadLettered)
                .await
        } else {
            tracing::warn!(id = %msg.id, failures, error = %err, "handler failed; delivering again");
            let delay = self.backoff(failures);
            self.settle(delivery, Settle::Nak(delay), Fate::Retry).await
        }
    }

    fn backoff(&self, n: u32) -> Duration {
        let (base, max) = self.shared.backoff;
        base.saturating_mul(1 << n.saturating_sub(1).min(20))
            .min(max)
    }

    /// Settles the delivery as `fate` chose and counts what came of it.
    async fn settle<D: Delivery>(&self, delivery: &D, how: Settle, fate: Fate) -> Outcome {
        let s = &*self.shared;
        let done = match how {
            Settle::Ack => delivery.ack().await,
            Settle::Nak(delay) => delivery.nak(delay).await,
            Settle::Terminate => delivery.terminate().await,
        };
        let fate = match done {
            Ok(()) => fate,
            Err(e) => {
                // The effect (if any) is recorded: the broker delivers the message again
                // and that delivery is acked as a replay.
                let outcome = outcome_of(fate);
                tracing::warn!(error = %e, ?outcome, "the broker did not take the settlement");
                Fate::AckFailed
            }
        };
        s.live.settled(fate);
        outcome_of(fate)
    }
}

/// The outcome `process` returns for what was done with a delivery.
fn outcome_of(fate: Fate) -> Outcome {
    match fate {
        Fate::Processed => Outcome::Processed,
        Fate::Duplicate => Outcome::Duplicate,
        Fate::InFlight => Outcome::InFlight,
        Fate::Retry => Outcome::Retry,
        Fate::DeadLettered | Fate::NoId => Outcome::Poison,
        Fate::StoreError => Outcome::StoreError,
        Fate::AckFailed => Outcome::AckFailed,
    }
}

enum Settle {
    Ack,
    Nak(Duration),
    Terminate,
}

/// The source, shared by the workers in turn.
struct Pull<S> {
    source: S,
    /// The source returned `None`: it is not asked again.
    ended: bool,
}

/// What one turn at the source gave.
enum Pulled<D> {
    Delivery(D),
    /// A transient error (logged): try again.
    Again,
    Ended,
}

impl<S: Source> Pull<S> {
    async fn next(&mut self) -> Pulled<S::Delivery> {
        if self.ended {
            return Pulled::Ended;
        }
        match self.source.next().await {
            Some(Ok(delivery)) => Pulled::Delivery(delivery),
            Some(Err(e)) => {
                // Slept with the source held, so no worker pulls before then.
                tracing::warn!(error = %e, "the subscription failed; pulling again");
                tokio::time::sleep(Duration::from_millis(50)).await;
                Pulled::Again
            }
            None => {
                self.ended = true;
                Pulled::Ended
            }
        }
    }
}

/// Runs `fut`, telling the broker every `progress_interval` that the delivery is still
/// being worked on. Nothing is armed if `fut` finishes on its first poll; the timer and
/// its signal are boxed, so the common case does not carry their space.
async fn with_progress<D: Delivery, F: Future>(delivery: &D, mut fut: Pin<&mut F>) -> F::Output {
    let Some(every) = delivery.progress_interval() else {
        return fut.await;
    };
    let first = poll_fn(|cx| match fut.as_mut().poll(cx) {
        Poll::Ready(out) => Poll::Ready(Some(out)),
        Poll::Pending => Poll::Ready(None),
    })
    .await;
    if let Some(out) = first {
        return out;
    }
    let signals = Box::pin(signal_progress(delivery, every));
    tokio::select! {
        biased;
        out = fut => out,
        never = signals => match never {},
    }
}

/// Tells the broker every `every` that `delivery` is still being worked on; never ends.
async fn signal_progress<D: Delivery>(delivery: &D, every: Duration) -> Infallible {
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    loop {
        tick.tick().await;
        if let Err(e) = delivery.in_progress().await {
            tracing::warn!(error = %e, "in-progress signal failed");
        }
    }
}
