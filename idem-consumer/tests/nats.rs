//! The consumer rules on a real NATS JetStream server (127.0.0.1:4222), one private stream
//! and durable consumer per test.
#![cfg(feature = "nats")]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Effects, eventually, idem, settle, spawn, two_consumers_split_300_ids, unique};
use idem_consumer::nats::NatsSource;
use idem_consumer::nats::async_nats::{
    self,
    jetstream::{self, consumer::PullConsumer, message::PublishMessage, stream},
};
use idem_consumer::{Consumer, ConsumerError, Handler, Message, Plain};
use idem_runtime::store::BoxError;
use idem_runtime::{Idem, MemoryStore, Options, Store};

const NATS: &str = "nats://127.0.0.1:4222";

struct Nats {
    js: jetstream::Context,
    stream: String,
    subject: String,
}

async fn nats(duplicate_window: Duration) -> Nats {
    let client = async_nats::connect(NATS).await.unwrap_or_else(|e| {
        panic!("NATS with JetStream must run on {NATS} (nats-server -js): {e}")
    });
    let js = jetstream::new(client);
    let name = unique("T");
    let subject = format!("{name}.credits");
    js.create_stream(stream::Config {
        name: name.clone(),
        subjects: vec![format!("{name}.>")],
        duplicate_window,
        max_age: Duration::from_secs(600),
        ..Default::default()
    })
    .await
    .expect("create the test stream");
    Nats {
        js,
        stream: name,
        subject,
    }
}

impl Nats {
    async fn durable(&self, ack_wait: Duration, max_deliver: i64) -> PullConsumer {
        self.durable_named("D", ack_wait, max_deliver).await
    }

    async fn durable_named(
        &self,
        suffix: &str,
        ack_wait: Duration,
        max_deliver: i64,
    ) -> PullConsumer {
        let stream = self.js.get_stream(&self.stream).await.expect("stream");
        let name = format!("{}_{suffix}", self.stream);
        stream
            .get_or_create_consumer(
                &name,
                jetstream::consumer::pull::Config {
                    durable_name: Some(name.clone()),
                    ack_wait,
                    max_deliver,
                    ..Default::default()
                },
            )
            .await
            .expect("create the durable consumer")
    }

    async fn source(&self, ack_wait: Duration) -> NatsSource {
        let mut c = self.durable(ack_wait, 20).await;
        NatsSource::new(&mut c, Duration::from_secs(600), 64)
            .await
            .expect("subscribe")
    }

    async fn publish(&self, id: Option<&str>, body: &str) {
        let mut m = PublishMessage::build().payload(body.to_owned().into());
        if let Some(id) = id {
            m = m.message_id(id);
        }
        self.js
            .send_publish(self.subject.clone(), m)
            .await
            .expect("publish")
            .await
            .expect("publish ack");
    }

    async fn pending(&self, ack_wait: Duration) -> (u64, usize, usize) {
        let mut c = self.durable(ack_wait, 20).await;
        let info = c.info().await.expect("consumer info");
        (info.num_pending, info.num_ack_pending, info.num_redelivered)
    }

    async fn drop_stream(self) {
        let _ = self.js.delete_stream(&self.stream).await;
    }
}

static CREDIT: Options = Options::dedup("test::credit")
    .lease(Duration::from_secs(2))
    .wait(Duration::from_secs(10));

/// A consumer whose effect is one entry in `effects`, after `pause`.
fn recording(idem: Idem, effects: &Effects, pause: Duration) -> Consumer<Plain<impl Handler>> {
    let effects = effects.clone();
    Consumer::builder(idem, CREDIT.clone())
        .backoff(Duration::from_millis(20), Duration::from_millis(200))
        .handler(move |msg: Message| {
            let effects = effects.clone();
            async move {
                tokio::time::sleep(pause).await;
                effects.record(&msg.id);
                Ok::<_, BoxError>(())
            }
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_id_past_the_duplicate_window_runs_once() {
    let n = nats(Duration::from_millis(200)).await;
    n.publish(Some("m-1"), "{}").await;
    settle(400).await; // past the stream's duplicate window: JetStream stores it again
    n.publish(Some("m-1"), "{}").await;
    n.publish(Some("m-2"), "{}").await;
    let effects = Effects::default();
    let consumer = recording(idem(), &effects, Duration::ZERO);
    let run = spawn(&consumer, n.source(Duration::from_secs(5)).await);
    eventually(20, "three deliveries settled", || {
        let c = consumer.counters();
        c.processed + c.duplicates == 3
    })
    .await;
    let c = run.stop().await;
    assert_eq!((effects.count("m-1"), effects.count("m-2")), (1, 1));
    assert_eq!((c.processed, c.duplicates, c.ack_failures), (2, 1, 0));
    assert_eq!(
        n.pending(Duration::from_secs(5)).await,
        (0, 0, 0),
        "all acked"
    );
    n.drop_stream().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_longer_than_ack_wait_is_not_redelivered() {
    let n = nats(Duration::from_secs(1)).await;
    n.publish(Some("slow-1"), "{}").await;
    let effects = Effects::default();
    let consumer = recording(idem(), &effects, Duration::from_secs(3));
    let run = spawn(&consumer, n.source(Duration::from_secs(1)).await);
    eventually(20, "the slow message processed", || {
        consumer.counters().processed == 1
    })
    .await;
    settle(1500).await; // past another ack_wait: an unacked message would come back now
    let c = run.stop().await;
    assert_eq!(effects.count("slow-1"), 1);
    assert_eq!(
        (c.redeliveries, c.duplicates, c.in_flight_duplicates),
        (0, 0, 0)
    );
    let (pending, ack_pending, redelivered) = n.pending(Duration::from_secs(1)).await;
    assert_eq!(
        (pending, ack_pending, redelivered),
        (0, 0, 0),
        "no redelivery at all"
    );
    n.drop_stream().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_of_a_running_message_waits_for_it_then_acks() {
    let n = nats(Duration::from_millis(100)).await;
    n.publish(Some("twin"), "{}").await;
    settle(250).await;
    n.publish(Some("twin"), "{}").await;
    let effects = Effects::default();
    let consumer = recording(idem(), &effects, Duration::from_millis(800));
    let run = spawn(&consumer, n.source(Duration::from_secs(5)).await);
    eventually(20, "both deliveries settled", || {
        let c = consumer.counters();
        c.processed + c.duplicates == 2
    })
    .await;
    let c = run.stop().await;
    assert_eq!(effects.count("twin"), 1);
    assert_eq!(
        (c.processed, c.duplicates, c.in_flight_duplicates),
        (1, 1, 1)
    );
    n.drop_stream().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_wait_a_running_duplicate_is_nakd_with_the_lease_left() {
    static SHORT_WAIT: Options = Options::dedup("test::credit")
        .lease(Duration::from_secs(2))
        .wait(Duration::from_millis(100));
    let n = nats(Duration::from_millis(100)).await;
    n.publish(Some("held"), "{}").await;
    settle(250).await;
    n.publish(Some("held"), "{}").await;
    let effects = Effects::default();
    let e = effects.clone();
    let consumer = Consumer::builder(idem(), SHORT_WAIT.clone()).handler(move |msg: Message| {
        let e = e.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            e.record(&msg.id);
            Ok::<_, BoxError>(())
        }
    });
    let run = spawn(&consumer, n.source(Duration::from_secs(5)).await);
    eventually(20, "the duplicate acked after its nak", || {
        let c = consumer.counters();
        c.processed == 1 && c.duplicates == 1
    })
    .await;
    let c = run.stop().await;
    assert_eq!(effects.count("held"), 1);
    assert!(c.in_flight_duplicates >= 1, "{c:?}");
    assert_eq!(
        c.redeliveries, 1,
        "nak'ed once, then redelivered and acked: {c:?}"
    );
    n.drop_stream().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_competing_consumers_on_one_durable_run_each_message_once() {
    let n = nats(Duration::from_millis(100)).await;
    for i in 0..300 {
        n.publish(Some(&format!("c-{i}")), "{}").await;
    }
    settle(250).await; // then every third again, past the window
    for i in (0..300).step_by(3) {
        n.publish(Some(&format!("c-{i}")), "{}").await;
    }
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let ns = unique("ns");
    let shared = |store: &Arc<dyn Store>| {
        Idem::builder()
            .shared_store(store.clone())
            .namespace(ns.clone())
            .build()
    };
    let effects = Effects::default();
    let a = recording(shared(&store), &effects, Duration::from_millis(1));
    let b = recording(shared(&store), &effects, Duration::from_millis(1));
    let ra = spawn(&a, n.source(Duration::from_secs(5)).await);
    let rb = spawn(&b, n.source(Duration::from_secs(5)).await);
    two_consumers_split_300_ids((&a, ra), (&b, rb), &effects).await;
    n.drop_stream().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_message_is_terminated_after_max_attempts_counted_across_restarts() {
    let n = nats(Duration::from_millis(100)).await;
    n.publish(Some("poison"), "{}").await;
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let ns = unique("ns");
    let failing = |base: u64| {
        Consumer::builder(
            Idem::builder()
                .shared_store(store.clone())
                .namespace(ns.clone())
                .build(),
            CREDIT.clone(),
        )
        .max_attempts(3)
        .backoff(Duration::from_millis(base), Duration::from_millis(2 * base))
        .handler(|_: Message| async { Err::<(), BoxError>("the payload is unreadable".into()) })
    };
    // A first consumer fails twice, then goes away (its counters with it).
    // Its second failure is nak'ed for 2 s: time enough to stop it before a third.
    let first = failing(1000);
    let run = spawn(&first, n.source(Duration::from_secs(5)).await);
    eventually(20, "two failures", || first.counters().handler_errors >= 2).await;
    let c1 = run.stop().await;
    assert_eq!((c1.handler_errors, c1.poison), (2, 0), "{c1:?}");
    // The next one sees the count in the store: one more failure is the third.
    let second = failing(10);
    let run = spawn(&second, n.source(Duration::from_secs(5)).await);
    eventually(20, "terminated", || second.counters().poison == 1).await;
    settle(300).await;
    let c2 = run.stop().await;
    assert_eq!(
        (c2.handler_errors, c2.poison, c2.ack_failures),
        (1, 1, 0),
        "{c2:?}"
    );
    assert_eq!(
        n.pending(Duration::from_secs(5)).await,
        (0, 0, 0),
        "terminated, not pending"
    );
    n.drop_stream().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_without_an_id_is_terminated_unless_ids_are_derived() {
    let n = nats(Duration::from_millis(100)).await;
    n.publish(None, "{\"a\":1}").await;
    let effects = Effects::default();
    let consumer = recording(idem(), &effects, Duration::ZERO);
    let run = spawn(&consumer, n.source(Duration::from_secs(5)).await);
    eventually(20, "terminated", || consumer.counters().poison == 1).await;
    let c = run.stop().await;
    assert_eq!((c.missing_id, c.processed, effects.total()), (1, 0, 0));

    let n = nats(Duration::from_millis(100)).await;
    n.publish(None, "{\"a\":1}").await;
    n.publish(None, "{\"a\":1}").await;
    let e = effects.clone();
    let consumer = Consumer::builder(idem(), CREDIT.clone())
        .derive_ids_from_payload(true)
        .handler(move |msg: Message| {
            let e = e.clone();
            async move {
                assert!(msg.id.starts_with("blake3:"));
                e.record(&msg.id);
                Ok::<_, BoxError>(())
            }
        });
    let run = spawn(&consumer, n.source(Duration::from_secs(5)).await);
    eventually(20, "both settled", || {
        let c = consumer.counters();
        c.processed + c.duplicates == 2
    })
    .await;
    run.stop().await;
    assert_eq!(
        (effects.distinct(), effects.total()),
        (1, 1),
        "equal bodies are one message"
    );
    n.drop_stream().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_ttl_shorter_than_the_redelivery_horizon_refuses_to_start() {
    static SHORT_TTL: Options = Options::dedup("test::credit").ttl(Duration::from_secs(60));
    let n = nats(Duration::from_millis(100)).await;
    // 5 deliveries 30 s apart: redeliveries for 180 s, longer than the 60 s records.
    let mut durable = n.durable(Duration::from_secs(30), 5).await;
    let source = NatsSource::new(&mut durable, Duration::ZERO, 8)
        .await
        .expect("subscribe");
    let consumer = Consumer::builder(idem(), SHORT_TTL.clone())
        .handler(|_: Message| async { Ok::<_, BoxError>(()) });
    let refused = consumer.run(source, std::future::pending()).await;
    assert!(
        matches!(refused, Err(ConsumerError::RetentionTooShort { ttl, horizon })
            if ttl == Duration::from_secs(60) && horizon == Duration::from_secs(180)),
        "{refused:?}"
    );
    // Without a delivery limit or an age limit, no ttl is long enough.
    let mut unlimited = n.durable_named("U", Duration::from_secs(30), -1).await;
    let source = NatsSource::new(&mut unlimited, Duration::ZERO, 8)
        .await
        .expect("subscribe");
    let refused = consumer.run(source, std::future::pending()).await;
    assert!(
        matches!(refused, Err(ConsumerError::UnboundedRedelivery)),
        "{refused:?}"
    );
    n.drop_stream().await;
}

/// The `idem_consumer_*` series of a run on the broker, as a Prometheus scrape shows
/// them: a processed message, its duplicate stored again past the duplicate window, and
/// a message without an id.
#[cfg(feature = "metrics")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_on_the_broker_is_counted_in_the_prometheus_text() {
    // The recorder is the process's; only this test uses the operation below, so its
    // series are this test's alone.
    static METERED: Options = Options::dedup("test::metered")
        .lease(Duration::from_secs(2))
        .wait(Duration::from_secs(10));
    let scrape = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .expect("the only recorder of this test binary");
    idem_consumer::observe::describe_metrics();
    let n = nats(Duration::from_millis(200)).await;
    n.publish(Some("p-1"), "{}").await;
    settle(400).await; // past the duplicate window: JetStream stores it again
    n.publish(Some("p-1"), "{}").await;
    n.publish(None, "{}").await;
    let effects = Effects::default();
    let recorded = effects.clone();
    let consumer = Consumer::builder(idem(), METERED.clone()).handler(move |msg: Message| {
        let effects = recorded.clone();
        async move {
            effects.record(&msg.id);
            Ok::<_, BoxError>(())
        }
    });
    let run = spawn(&consumer, n.source(Duration::from_secs(5)).await);
    eventually(20, "three deliveries settled", || {
        let c = consumer.counters();
        c.processed + c.duplicates + c.poison == 3
    })
    .await;
    let c = run.stop().await;
    assert_eq!((c.processed, c.duplicates, c.missing_id), (1, 1, 1));
    let text = scrape.render();
    for outcome in ["processed", "duplicate", "no_id"] {
        let line = format!(
            "idem_consumer_messages_total{{operation=\"test::metered\",outcome=\"{outcome}\"}} 1"
        );
        assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
    }
    assert!(
        text.contains("# HELP idem_consumer_messages_total"),
        "help text described:\n{text}"
    );
    assert_eq!(effects.count("p-1"), 1);
    n.drop_stream().await;
}
