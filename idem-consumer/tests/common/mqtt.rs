//! MQTT helpers shared by the MQTT tests and the consumer example's: options for
//! Mosquitto on 127.0.0.1:1883, a QoS 1 publisher, and the end of a persistent session.
//! Included by path as `mqtt_support`, beside `common` (whose `unique` it uses).
#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use idem_consumer::mqtt::rumqttc::v5::mqttbytes::QoS;
use idem_consumer::mqtt::rumqttc::v5::mqttbytes::v5::{Packet, PublishProperties};
use idem_consumer::mqtt::rumqttc::v5::{AsyncClient, Event, MqttOptions};

/// Options for `client_id` on the local Mosquitto.
pub fn options(client_id: &str) -> MqttOptions {
    let mut o = MqttOptions::new(client_id, "127.0.0.1", 1883);
    o.set_keep_alive(Duration::from_secs(10));
    o
}

/// Publishes QoS 1 messages `(id, body)` (the id in the `message-id` user property when
/// given), and waits for the broker's PUBACKs. The sends run beside the polling, so any
/// number of messages fits through the client's request queue.
pub async fn publish(topic: &str, messages: &[(Option<&str>, &str)]) {
    let (client, mut events) = AsyncClient::new(options(&crate::common::unique("pub")), 64);
    let owned: Vec<(Option<String>, String)> = messages
        .iter()
        .map(|(id, body)| (id.map(str::to_owned), (*body).to_owned()))
        .collect();
    let (sender, topic) = (client.clone(), topic.to_owned());
    let send = tokio::spawn(async move {
        for (id, body) in owned {
            let mut props = PublishProperties::default();
            if let Some(id) = id {
                props.user_properties.push(("message-id".into(), id));
            }
            sender
                .publish_with_properties(topic.as_str(), QoS::AtLeastOnce, false, body, props)
                .await
                .expect("publish");
        }
    });
    let mut acked = 0;
    let wait = async {
        while acked < messages.len() {
            match events.poll().await {
                Ok(Event::Incoming(Packet::PubAck(_))) => acked += 1,
                Ok(_) => {}
                Err(e) => panic!("Mosquitto must run on 127.0.0.1:1883 (mosquitto): {e}"),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(60), wait)
        .await
        .expect("the broker acks the publishes");
    send.await.expect("the sender");
    let _ = client.disconnect().await;
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        while events.poll().await.is_ok() {}
    })
    .await;
}

/// Ends a persistent session (a clean start with no session expiry), so none is left
/// queued at the broker.
pub async fn end_session(client_id: &str) {
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
