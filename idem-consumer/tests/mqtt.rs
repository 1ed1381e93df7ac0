//! The consumer rules on a real MQTT 5 broker (Mosquitto on 127.0.0.1:1883), one private
//! topic and client id per test. Mosquitto's settings are its defaults.
#![cfg(feature = "mqtt")]

mod common;
#[path = "common/mqtt.rs"]
mod mqtt_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::{Effects, HeldSource, eventually, idem, settle, spawn, unique};
use idem_consumer::mqtt::{MqttConfig, MqttSource};
use idem_consumer::{Consumer, Message, Source};
use idem_runtime::store::BoxError;
use idem_runtime::{Idem, Options};
use mqtt_support::{end_session, options, publish};

static CREDIT: Options = Options::dedup("test::credit")
    .lease(Duration::from_secs(10))
    .wait(Duration::from_secs(15));

async fn source(client_id: &str, topic: &str) -> MqttSource {
    MqttSource::new(options(client_id), MqttConfig::new(topic))
        .await
        .unwrap_or_else(|e| panic!("Mosquitto must run on 127.0.0.1:1883 (mosquitto): {e}"))
}

fn recording(
    idem: Idem,
    effects: &Effects,
) -> Consumer<idem_consumer::Plain<impl idem_consumer::Handler>> {
    common::recording(idem, &CREDIT, effects, Duration::ZERO, Arc::default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dup_redelivery_after_a_reconnect_is_a_duplicate() {
    let (client_id, topic) = (unique("c"), unique("t"));
    let effects = Effects::default();
    let idem = idem();
    // The session and its subscription exist before the messages are published.
    let first = recording(idem.clone(), &effects);
    let held = Arc::new(AtomicBool::new(false));
    let seen = held.clone();
    let hold = move |id: &str| {
        let hold = id == "held";
        if hold {
            seen.store(true, Ordering::SeqCst);
        }
        hold
    };
    let src = HeldSource::new(source(&client_id, &topic).await, Arc::new(hold));
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
    source(&client_id, &topic).await.close().await;
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
    // All three were acked: the session has nothing left. The consumer's run returned
    // once its source wrote the acks and its DISCONNECT, so this new connection takes
    // over a session whose acks the broker has read.
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
