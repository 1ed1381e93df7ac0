//! The consumer rules on a real MQTT 5 broker (Mosquitto on 127.0.0.1:1883), one private
//! topic and client id per test. Mosquitto's settings are its defaults.
#![cfg(feature = "mqtt")]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use common::{Effects, eventually, settle, spawn, unique};
use idem_consumer::mqtt::rumqttc::v5::mqttbytes::QoS;
use idem_consumer::mqtt::rumqttc::v5::mqttbytes::v5::{Packet, PublishProperties};
use idem_consumer::mqtt::rumqttc::v5::{AsyncClient, Event, MqttOptions};
use idem_consumer::mqtt::{MqttConfig, MqttDelivery, MqttSource};
use idem_consumer::{AckError, Consumer, Delivery, Horizon, Message, Source};
use idem_runtime::{BoxError, Idem, MemoryStore, Options};

static CREDIT: Options = Options::dedup("test::credit")
    .lease(Duration::from_secs(10))
    .wait(Duration::from_secs(15));

fn options(client_id: &str) -> MqttOptions {
    let mut o = MqttOptions::new(client_id, "127.0.0.1", 1883);
    o.set_keep_alive(Duration::from_secs(5));
    o
}

async fn source(client_id: &str, topic: &str) -> MqttSource {
    MqttSource::new(options(client_id), MqttConfig::new(topic))
        .await
        .unwrap_or_else(|e| panic!("Mosquitto must run on 127.0.0.1:1883 (mosquitto): {e}"))
}

/// Publishes QoS 1 messages (id in the `message-id` user property when given) and waits
/// for the broker's PUBACKs.
async fn publish(topic: &str, messages: &[(Option<&str>, &str)]) {
    let (client, mut events) = AsyncClient::new(options(&unique("pub")), 64);
    for (id, body) in messages {
        let mut props = PublishProperties::default();
        if let Some(id) = id {
            props
                .user_properties
                .push(("message-id".into(), (*id).into()));
        }
        client
            .publish_with_properties(topic, QoS::AtLeastOnce, false, body.to_string(), props)
            .await
            .expect("publish");
    }
    let mut acked = 0;
    let wait = async {
        while acked < messages.len() {
            match events.poll().await {
                Ok(Event::Incoming(Packet::PubAck(_))) => acked += 1,
                Ok(_) => {}
                Err(e) => panic!("Mosquitto must run on 127.0.0.1:1883: {e}"),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(20), wait)
        .await
        .expect("the broker acks the publishes");
    let _ = client.disconnect().await;
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        while events.poll().await.is_ok() {}
    })
    .await;
}

/// Ends a test's persistent session (a clean start with no session expiry), so none is
/// left queued at the broker.
async fn end_session(client_id: &str) {
    let mut o = options(client_id);
    o.set_clean_start(true);
    let (client, mut events) = AsyncClient::new(o, 8);
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        while let Ok(e) = events.poll().await {
            if matches!(e, Event::Incoming(Packet::ConnAck(_))) {
                let _ = client.disconnect().await;
            }
        }
    })
    .await;
}

fn idem() -> Idem {
    Idem::builder()
        .store(MemoryStore::new())
        .namespace(unique("ns"))
        .build()
}

fn recording(
    idem: Idem,
    effects: &Effects,
) -> Consumer<idem_consumer::Plain<impl idem_consumer::Handler>> {
    let effects = effects.clone();
    Consumer::builder(idem, CREDIT.clone())
        .backoff(Duration::from_millis(20), Duration::from_millis(200))
        .handler(move |msg: Message| {
            let effects = effects.clone();
            async move {
                effects.record(&msg.id);
                Ok::<_, BoxError>(())
            }
        })
}

/// A delivery whose ack never goes out for the message `held`.
struct Held(MqttDelivery, Arc<AtomicBool>);

impl Delivery for Held {
    fn message_id(&self) -> Option<&str> {
        self.0.message_id()
    }
    fn payload(&self) -> Bytes {
        self.0.payload()
    }
    fn attempt(&self) -> u32 {
        self.0.attempt()
    }
    async fn ack(&self) -> Result<(), AckError> {
        if self.message_id() == Some("held") {
            self.1.store(true, Ordering::SeqCst);
            std::future::pending::<()>().await;
        }
        self.0.ack().await
    }
    async fn nak(&self, d: Duration) -> Result<(), AckError> {
        self.0.nak(d).await
    }
    async fn in_progress(&self) -> Result<(), AckError> {
        self.0.in_progress().await
    }
    async fn terminate(&self) -> Result<(), AckError> {
        self.0.terminate().await
    }
}

struct HeldSource(MqttSource, Arc<AtomicBool>);

impl Source for HeldSource {
    type Delivery = Held;
    async fn next(&mut self) -> Option<Result<Held, BoxError>> {
        let d = self.0.next().await?;
        Some(d.map(|d| Held(d, self.1.clone())))
    }
    fn redelivery_horizon(&self) -> Horizon {
        self.0.redelivery_horizon()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dup_redelivery_after_a_reconnect_is_a_duplicate() {
    let (client_id, topic) = (unique("c"), unique("t"));
    let effects = Effects::default();
    let idem = idem();
    // The session and its subscription exist before the messages are published.
    let first = recording(idem.clone(), &effects);
    let held = Arc::new(AtomicBool::new(false));
    let src = HeldSource(source(&client_id, &topic).await, held.clone());
    let c1 = first.clone();
    let task = tokio::spawn(async move { c1.run(src, std::future::pending()).await });
    publish(&topic, &[(Some("m-1"), "{}"), (Some("held"), "{}")]).await;
    eventually(20, "m-1 processed, held recorded but not acked", || {
        first.counters().processed == 1 && held.load(Ordering::SeqCst)
    })
    .await;
    assert_eq!(effects.count("held"), 1);
    // The consumer goes away without the ack: the session keeps the message.
    task.abort();
    let _ = task.await;

    let second = recording(idem.clone(), &effects);
    let run = spawn(&second, source(&client_id, &topic).await);
    eventually(20, "the DUP redelivery acked", || {
        second.counters().duplicates == 1
    })
    .await;
    let c = run.stop().await;
    assert_eq!(
        (c.redeliveries, c.duplicates, c.processed),
        (1, 1, 0),
        "{c:?}"
    );
    assert_eq!((effects.count("held"), effects.count("m-1")), (1, 1));

    // Acked now: a third session gets nothing to run.
    let third = recording(idem, &effects);
    let run = spawn(&third, source(&client_id, &topic).await);
    settle(1000).await;
    let c = run.stop().await;
    assert_eq!((c.processed, c.redeliveries), (0, 0), "{c:?}");
    assert_eq!(effects.total(), 2);
    end_session(&client_id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_queued_for_an_offline_session_run_once_each() {
    let (client_id, topic) = (unique("c"), unique("t"));
    let effects = Effects::default();
    let idem = idem();
    // Create the persistent session, then go offline.
    drop(source(&client_id, &topic).await);
    settle(300).await;
    let msgs: Vec<String> = (0..50).map(|i| format!("q-{i}")).collect();
    let mut batch: Vec<(Option<&str>, &str)> =
        msgs.iter().map(|m| (Some(m.as_str()), "{}")).collect();
    batch.extend(msgs.iter().take(10).map(|m| (Some(m.as_str()), "{}")));
    publish(&topic, &batch).await;
    let consumer = recording(idem, &effects);
    let run = spawn(&consumer, source(&client_id, &topic).await);
    eventually(20, "60 settled", || {
        let c = consumer.counters();
        c.processed + c.duplicates == 60
    })
    .await;
    let c = run.stop().await;
    assert_eq!((c.processed, c.duplicates), (50, 10), "{c:?}");
    assert_eq!((effects.distinct(), effects.total()), (50, 50));
    end_session(&client_id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_without_an_id_is_acked_and_counted_and_a_payload_field_can_be_the_id() {
    let (client_id, topic) = (unique("c"), unique("t"));
    let effects = Effects::default();
    let idem = idem();
    let cfg = MqttConfig::new(&topic).id_field("message_id");
    let consumer = recording(idem.clone(), &effects);
    let src = MqttSource::new(options(&client_id), cfg.clone())
        .await
        .expect("Mosquitto on 1883");
    let run = spawn(&consumer, src);
    publish(
        &topic,
        &[
            (None, r#"{"amount":1}"#),
            (None, r#"{"message_id":"f-1"}"#),
            (None, r#"{"message_id":"f-1"}"#),
        ],
    )
    .await;
    eventually(20, "three settled", || {
        let c = consumer.counters();
        c.processed + c.duplicates + c.poison == 3
    })
    .await;
    let c = run.stop().await;
    assert_eq!(
        (c.processed, c.duplicates, c.missing_id, c.ack_failures),
        (1, 1, 1, 0),
        "{c:?}"
    );
    assert_eq!(effects.count("f-1"), 1);
    // All three were acked: the session has nothing left. The stopped source sends its
    // DISCONNECT from its own task (ended after 2 s at the latest); a reconnect before
    // it left would take the session over while the acks sit unread in the old
    // socket, and the broker would rightly deliver them again. Let it leave first.
    settle(2500).await;
    let again = recording(idem, &effects);
    let src = MqttSource::new(options(&client_id), cfg)
        .await
        .expect("reconnect");
    let run = spawn(&again, src);
    settle(1000).await;
    let c = run.stop().await;
    assert_eq!((c.processed, c.duplicates, c.poison), (0, 0, 0), "{c:?}");
    end_session(&client_id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_message_is_retried_then_acked_as_poison() {
    let (client_id, topic) = (unique("c"), unique("t"));
    let consumer = Consumer::builder(idem(), CREDIT.clone())
        .max_attempts(3)
        .backoff(Duration::from_millis(20), Duration::from_millis(50))
        .handler(|_: Message| async { Err::<(), BoxError>("unreadable".into()) });
    let run = spawn(&consumer, source(&client_id, &topic).await);
    publish(&topic, &[(Some("bad-1"), "x")]).await;
    eventually(20, "terminated", || consumer.counters().poison == 1).await;
    let c = run.stop().await;
    assert_eq!(
        (c.handler_errors, c.poison, c.ack_failures),
        (3, 1, 0),
        "{c:?}"
    );
    end_session(&client_id).await;
}
