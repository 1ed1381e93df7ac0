//! The consumer's metrics, with no broker: toy deliveries on the in-memory store (and a
//! store that can be switched off), counted by a recorder installed for the test.
#![cfg(feature = "metrics")]

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use idem_consumer::observe::{MESSAGES_TOTAL, OUTCOMES};
use idem_consumer::{Consumer, Message, Outcome};
use idem_runtime::store::BoxError;
use idem_runtime::store::{BoxFuture, ClaimOutcome, ClaimRequest, Owner, VersionedStore};
use idem_runtime::{Error, Idem, Key, MemoryStore, Options, Store};
use tokio::sync::Notify;

mod common;
use common::{Toy, toy};

// ---- a recorder that keeps counters, rendered as `name{label=value,...}` ----

struct Count(Arc<AtomicU64>);

impl metrics::CounterFn for Count {
    fn increment(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    fn absolute(&self, n: u64) {
        self.0.store(n, Ordering::Relaxed);
    }
}

#[derive(Clone, Default)]
struct Recorded(Arc<Mutex<HashMap<String, Arc<AtomicU64>>>>);

impl Recorded {
    fn get(&self, rendered: &str) -> u64 {
        self.0
            .lock()
            .expect("recorder lock")
            .get(rendered)
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }
    /// Every series of `name`, rendered, with its value.
    fn series(&self, name: &str) -> Vec<(String, u64)> {
        let mut all: Vec<_> = self
            .0
            .lock()
            .expect("recorder lock")
            .iter()
            .filter(|(k, _)| k.starts_with(&format!("{name}{{")))
            .map(|(k, c)| (k.clone(), c.load(Ordering::Relaxed)))
            .collect();
        all.sort();
        all
    }
}

fn render(key: &metrics::Key) -> String {
    let labels: Vec<String> = key
        .labels()
        .map(|l| format!("{}={}", l.key(), l.value()))
        .collect();
    format!("{}{{{}}}", key.name(), labels.join(","))
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
            .0
            .lock()
            .expect("recorder lock")
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
        _: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        metrics::Histogram::noop()
    }
}

// ---- a memory store that can be switched off ----

struct Switch {
    inner: MemoryStore,
    down: AtomicBool,
}

impl Switch {
    fn check(&self) -> Result<(), Error> {
        if self.down.load(Ordering::Relaxed) {
            Err(Error::store("the store is down"))
        } else {
            Ok(())
        }
    }
}

impl Store for Switch {
    fn claim<'a>(
        &'a self,
        key: &'a Key,
        req: &'a ClaimRequest,
    ) -> BoxFuture<'a, Result<ClaimOutcome, Error>> {
        Box::pin(async move {
            self.check()?;
            self.inner.claim(key, req).await
        })
    }
    fn complete<'a>(
        &'a self,
        key: &'a Key,
        owner: Owner,
        value: Bytes,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        self.inner.complete(key, owner, value, ttl)
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
    fn versioned(&self) -> Option<&dyn VersionedStore> {
        self.inner.versioned()
    }
}

const OP: &str = "ledger::credit";

fn messages(rec: &Recorded, outcome: &str) -> u64 {
    rec.get(&format!(
        "{MESSAGES_TOTAL}{{operation={OP},outcome={outcome}}}"
    ))
}

fn counted(rec: &Recorded, name: &str) -> u64 {
    rec.get(&format!("{name}{{operation={OP}}}"))
}

#[test]
fn every_delivery_is_counted_once_by_what_was_done_with_it() {
    let rec = Recorded::default();
    let _local = metrics::set_default_local_recorder(&rec);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let store = Arc::new(Switch {
            inner: MemoryStore::new(),
            down: AtomicBool::new(false),
        });
        let idem = Idem::builder().store(store.clone()).build();
        let release = Arc::new(Notify::new());
        let gate = release.clone();
        static CREDIT: Options = Options::dedup(OP);
        let consumer = Consumer::builder(idem, CREDIT.clone().wait(Duration::ZERO))
            .max_attempts(2)
            .backoff(Duration::from_millis(1), Duration::from_millis(1))
            .handler(move |msg: Message| {
                let gate = gate.clone();
                async move {
                    match msg.id.as_str() {
                        "fails" => Err::<(), BoxError>("the ledger said no".into()),
                        "slow" => {
                            gate.notified().await;
                            Ok(())
                        }
                        _ => Ok(()),
                    }
                }
            });

        // Runs, then replays as a redelivery.
        assert_eq!(consumer.process(toy("m-1")).await, Outcome::Processed);
        let again = Toy {
            attempt: 2,
            ..toy("m-1")
        };
        assert_eq!(consumer.process(again).await, Outcome::Duplicate);
        // No id: terminated.
        let anonymous = Toy {
            id: None,
            ..toy("")
        };
        assert_eq!(consumer.process(anonymous).await, Outcome::Poison);
        // A failing handler: nak'ed once, then dead-lettered.
        assert_eq!(consumer.process(toy("fails")).await, Outcome::Retry);
        assert_eq!(consumer.process(toy("fails")).await, Outcome::Poison);
        // The ack of a run is refused by the broker.
        let refused = Toy {
            refuse: true,
            ..toy("m-2")
        };
        assert_eq!(consumer.process(refused).await, Outcome::AckFailed);
        // A twin still runs: the duplicate is nak'ed at once (wait is zero).
        let (first, twin) = tokio::join!(consumer.process(toy("slow")), async {
            let twin = consumer.process(toy("slow")).await;
            release.notify_one();
            twin
        });
        assert_eq!((first, twin), (Outcome::Processed, Outcome::InFlight));
        // The store is down.
        store.down.store(true, Ordering::Relaxed);
        assert_eq!(consumer.process(toy("m-3")).await, Outcome::StoreError);

        let c = consumer.counters();
        assert_eq!(messages(&rec, "processed"), 2);
        assert_eq!(messages(&rec, "processed"), c.processed);
        assert_eq!(messages(&rec, "duplicate"), 1);
        assert_eq!(messages(&rec, "duplicate"), c.duplicates);
        assert_eq!(messages(&rec, "in_flight"), 1);
        assert_eq!(messages(&rec, "retry"), 1);
        assert_eq!(messages(&rec, "dead_lettered"), 1);
        assert_eq!(messages(&rec, "no_id"), 1);
        assert_eq!(
            messages(&rec, "dead_lettered") + messages(&rec, "no_id"),
            c.poison
        );
        assert_eq!(messages(&rec, "store_error"), 1);
        assert_eq!(messages(&rec, "store_error"), c.store_errors);
        assert_eq!(messages(&rec, "ack_failed"), 1);
        assert_eq!(messages(&rec, "ack_failed"), c.ack_failures);
        assert_eq!(counted(&rec, idem_consumer::observe::REDELIVERIES_TOTAL), 1);
        assert_eq!(
            counted(&rec, idem_consumer::observe::IN_FLIGHT_DUPLICATES_TOTAL),
            c.in_flight_duplicates
        );
        assert_eq!(c.in_flight_duplicates, 1);
        assert_eq!(
            counted(&rec, idem_consumer::observe::HANDLER_ERRORS_TOTAL),
            2
        );

        // One series per outcome seen, each with a known outcome, and one count per
        // delivery: nine deliveries above.
        let series = rec.series(MESSAGES_TOTAL);
        assert!(
            series.iter().all(|(k, _)| OUTCOMES
                .iter()
                .any(|o| k.ends_with(&format!("outcome={o}}}")))),
            "{series:?}"
        );
        assert_eq!(series.iter().map(|(_, n)| n).sum::<u64>(), 9, "{series:?}");
        // The runtime counts the calls it made for the consumer, under the same name.
        assert!(
            rec.get(&format!(
                "idem_calls_total{{function={OP},strategy=dedup,outcome=ran}}"
            )) >= 2,
            "{:?}",
            rec.series("idem_calls_total")
        );
    });
}
