//! Helpers shared by the broker tests (and the consumer example's): unique names, an
//! effect log, a recording consumer, a source whose acks can be held back, a consumer run
//! in the background until a condition holds. MQTT's are in `mqtt.rs` beside it,
//! included by path as `mqtt_support` where needed.
#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use idem_consumer::{
    AckError, Consumer, ConsumerError, Counters, Delivery, Effect, Handler, Horizon, Message,
    Plain, Source,
};
use idem_runtime::store::BoxError;
use idem_runtime::{Idem, MemoryStore, Options};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A name no other test (or run) uses.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        "{prefix}_{}_{}_{nanos}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// An idem runtime on a fresh memory store, in a namespace of its own.
pub fn idem() -> Idem {
    Idem::builder()
        .store(MemoryStore::new())
        .namespace(unique("ns"))
        .build()
}

/// A consumer of `opts` whose effect is one entry in `effects`, after `pause`; `started`
/// is set as a handler starts.
pub fn recording(
    idem: Idem,
    opts: &Options,
    effects: &Effects,
    pause: Duration,
    started: Arc<AtomicBool>,
) -> Consumer<Plain<impl Handler>> {
    let effects = effects.clone();
    Consumer::builder(idem, opts.clone())
        .backoff(Duration::from_millis(20), Duration::from_millis(200))
        .handler(move |msg: Message| {
            let (effects, started) = (effects.clone(), started.clone());
            async move {
                started.store(true, Ordering::SeqCst);
                tokio::time::sleep(pause).await;
                effects.record(&msg.id);
                Ok::<_, BoxError>(())
            }
        })
}

/// Which acks a [`HeldSource`] holds back: asked with the message id at each ack.
pub type Hold = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// A source whose deliveries' acks are held back for ever when [`Hold`] says so (the
/// "after the effect, before the ack" fault: a consumer killed or gone at that point).
pub struct HeldSource<S> {
    inner: S,
    hold: Hold,
}

impl<S> HeldSource<S> {
    pub fn new(inner: S, hold: Hold) -> Self {
        HeldSource { inner, hold }
    }
}

/// A delivery of a [`HeldSource`].
pub struct Held<D> {
    inner: D,
    hold: Hold,
}

impl<D: Delivery> Delivery for Held<D> {
    fn message_id(&self) -> Option<&str> {
        self.inner.message_id()
    }
    fn payload(&self) -> Bytes {
        self.inner.payload()
    }
    fn attempt(&self) -> u32 {
        self.inner.attempt()
    }
    fn progress_interval(&self) -> Option<Duration> {
        self.inner.progress_interval()
    }
    async fn ack(&self) -> Result<(), AckError> {
        if (self.hold)(self.message_id().unwrap_or("")) {
            std::future::pending::<()>().await;
        }
        self.inner.ack().await
    }
    async fn nak(&self, d: Duration) -> Result<(), AckError> {
        self.inner.nak(d).await
    }
    async fn in_progress(&self) -> Result<(), AckError> {
        self.inner.in_progress().await
    }
    async fn terminate(&self) -> Result<(), AckError> {
        self.inner.terminate().await
    }
}

impl<S: Source> Source for HeldSource<S> {
    type Delivery = Held<S::Delivery>;
    async fn next(&mut self) -> Option<Result<Self::Delivery, BoxError>> {
        let d = self.inner.next().await?;
        Some(d.map(|inner| Held {
            inner,
            hold: self.hold.clone(),
        }))
    }
    fn redelivery_horizon(&self) -> Horizon {
        self.inner.redelivery_horizon()
    }
    async fn close(self) {
        self.inner.close().await;
    }
}

/// How many times each message id's effect ran.
#[derive(Clone, Default)]
pub struct Effects(Arc<Mutex<HashMap<String, u32>>>);

impl Effects {
    pub fn record(&self, id: &str) {
        *self
            .0
            .lock()
            .expect("effects lock")
            .entry(id.to_owned())
            .or_default() += 1;
    }
    pub fn count(&self, id: &str) -> u32 {
        self.0
            .lock()
            .expect("effects lock")
            .get(id)
            .copied()
            .unwrap_or(0)
    }
    pub fn distinct(&self) -> usize {
        self.0.lock().expect("effects lock").len()
    }
    pub fn total(&self) -> u32 {
        self.0.lock().expect("effects lock").values().sum()
    }
    pub fn doubled(&self) -> Vec<(String, u32)> {
        self.0
            .lock()
            .expect("effects lock")
            .iter()
            .filter(|(_, n)| **n > 1)
            .map(|(k, n)| (k.clone(), *n))
            .collect()
    }
}

/// Waits until two consumers (`a` running as `ra`, `b` as `rb`) have settled 400
/// deliveries of 300 distinct ids, stops them, and checks that they split the work:
/// each id's effect ran exactly once, and both consumers took some.
pub async fn two_consumers_split_300_ids<A: Effect, B: Effect>(
    (a, ra): (&idem_consumer::Consumer<A>, Running),
    (b, rb): (&idem_consumer::Consumer<B>, Running),
    effects: &Effects,
) {
    eventually(30, "400 deliveries settled", || {
        let (x, y) = (a.counters(), b.counters());
        x.processed + x.duplicates + y.processed + y.duplicates == 400
    })
    .await;
    let (x, y) = (ra.stop().await, rb.stop().await);
    assert_eq!(effects.distinct(), 300);
    assert!(effects.doubled().is_empty(), "{:?}", effects.doubled());
    assert_eq!(x.processed + y.processed, 300);
    assert!(
        x.processed > 0 && y.processed > 0,
        "both consumers took work: {x:?} {y:?}"
    );
}

/// A consumer running in the background.
pub struct Running {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<Counters, ConsumerError>>,
}

pub fn spawn<E: Effect, S: Source + 'static>(
    consumer: &idem_consumer::Consumer<E>,
    source: S,
) -> Running {
    let (tx, rx) = oneshot::channel::<()>();
    let c = consumer.clone();
    let task = tokio::spawn(async move {
        c.run(source, async {
            let _ = rx.await;
        })
        .await
    });
    Running {
        stop: Some(tx),
        task,
    }
}

impl Running {
    /// Graceful shutdown; the counters at the end.
    pub async fn stop(mut self) -> Counters {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        tokio::time::timeout(Duration::from_secs(30), self.task)
            .await
            .expect("the consumer shuts down")
            .expect("the consumer task does not panic")
            .expect("the consumer runs")
    }
}

/// Waits (up to `secs`) until `cond` holds; panics with `what` otherwise.
pub async fn eventually<F: FnMut() -> bool>(secs: u64, what: &str, mut cond: F) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Lets a little time pass, to see that nothing more happens.
pub async fn settle(ms: u64) {
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

pub async fn with_deadline<T>(secs: u64, what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(secs), fut)
        .await
        .unwrap_or_else(|_| panic!("timed out: {what}"))
}

/// A toy broker's delivery, for tests without a broker; its settlements can be refused.
pub struct Toy {
    pub id: Option<&'static str>,
    pub attempt: u32,
    pub refuse: bool,
}

/// A first delivery of message `id`.
pub fn toy(id: &'static str) -> Toy {
    Toy {
        id: Some(id),
        attempt: 1,
        refuse: false,
    }
}

impl Toy {
    fn settle(&self, what: &'static str) -> Result<(), AckError> {
        if self.refuse {
            Err(AckError::Refused(what))
        } else {
            Ok(())
        }
    }
}

impl Delivery for Toy {
    fn message_id(&self) -> Option<&str> {
        self.id
    }
    fn payload(&self) -> Bytes {
        Bytes::from_static(b"{}")
    }
    fn attempt(&self) -> u32 {
        self.attempt
    }
    async fn ack(&self) -> Result<(), AckError> {
        self.settle("ack")
    }
    async fn nak(&self, _: Duration) -> Result<(), AckError> {
        self.settle("nak")
    }
    async fn in_progress(&self) -> Result<(), AckError> {
        Ok(())
    }
    async fn terminate(&self) -> Result<(), AckError> {
        self.settle("terminate")
    }
}
