//! Helpers shared by the broker tests: unique names, an effect log, a consumer run in the
//! background until a condition holds.
#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_consumer::{ConsumerError, Counters, Effect, Source};
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
