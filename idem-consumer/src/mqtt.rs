//! MQTT 5 QoS 1 subscriptions on a persistent session (rumqttc).
//!
//! [`MqttSource::new`] connects with `clean_start` false and a session expiry above zero
//! (one day unless the options set one), manual acks, and a receive maximum, then
//! subscribes at QoS 1. The broker keeps the session while the consumer is away, and
//! sends every message it has not seen a PUBACK for again, flagged DUP, when the session
//! reconnects.
//!
//! - **ack** is the PUBACK, sent only after the result is recorded. MQTT has no answer to
//!   a PUBACK: the ack resolves once the client wrote it to the connection.
//! - The **message id** is the `message-id` user property (configurable), or a field of
//!   a JSON payload ([`MqttConfig::id_field`]); never the packet id, which is 16-bit and
//!   reused. A DUP redelivery carries the same id, so it is a duplicate, acked without
//!   running. A message without an id is acked and counted (`missing_id`, outcome
//!   `no_id`), unless ids are derived from the payload.
//! - The **attempt** is 2 for a DUP redelivery, else 1 (MQTT counts no further).
//! - **nak**: MQTT has no negative ack and the broker resends only on reconnect, so the
//!   delivery is handed to the consumer again after the delay, from this process, while
//!   it stays unacked at the broker (which resends it if the process dies).
//! - **in progress** needs nothing: an unacked message stays with the session.
//! - **terminate** acks: MQTT has no dead-letter queue; the rules log it as poison.
//!
//! The broker's limits (message expiry, session expiry) are not visible to the client,
//! so the redelivery horizon is [`Horizon::Unknown`]. Brokers cap what they queue for an
//! offline session (Mosquitto: 1,000 messages by default): a session away longer than
//! that loses messages, which no consumer can bring back.
//!
//! ```no_run
//! use idem_consumer::mqtt::rumqttc::v5::MqttOptions;
//! use idem_consumer::mqtt::{MqttConfig, MqttSource};
//! use idem_consumer::{Consumer, Message};
//! use idem_runtime::{Idem, Options};
//! use idem_runtime::store::BoxError;
//!
//! # async fn run() -> Result<(), BoxError> {
//! static CREDIT: Options = Options::dedup("ledger::credit");
//! // The client id names the persistent session: keep it across restarts.
//! let options = MqttOptions::new("ledger-1", "127.0.0.1", 1883);
//! let source = MqttSource::new(options, MqttConfig::new("credits")).await?;
//! let consumer = Consumer::builder(Idem::builder().build(), CREDIT.clone())
//!     .handler(|msg: Message| async move {
//!         println!("credit {}", msg.id); // the message-id user property
//!         Ok::<_, BoxError>(())
//!     });
//! consumer.run(source, async { let _ = tokio::signal::ctrl_c().await; }).await?;
//! # Ok(())
//! # }
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use idem_runtime::store::BoxError;
use rumqttc::Outgoing;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Packet, Publish};
use rumqttc::v5::{AsyncClient, Event, EventLoop, MqttOptions};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

pub use rumqttc;

use crate::{AckError, ConsumerError, Delivery, Horizon, Source};

/// How an [`MqttSource`] reads messages.
#[derive(Debug, Clone)]
#[must_use]
pub struct MqttConfig {
    topic: String,
    id_property: String,
    id_field: Option<String>,
    receive_maximum: u16,
}

impl MqttConfig {
    /// Subscribes to `topic` (a filter: wildcards allowed).
    pub fn new(topic: impl Into<String>) -> Self {
        MqttConfig {
            topic: topic.into(),
            id_property: "message-id".into(),
            id_field: None,
            receive_maximum: 32,
        }
    }

    /// The user property holding the message id (default `message-id`).
    pub fn id_property(mut self, name: impl Into<String>) -> Self {
        self.id_property = name.into();
        self
    }

    /// Without the user property, take the id from this field of a JSON object payload
    /// (a string or a number).
    pub fn id_field(mut self, field: impl Into<String>) -> Self {
        self.id_field = Some(field.into());
        self
    }

    /// At most this many unacked messages the broker sends at once (default 32; the
    /// broker may allow fewer).
    pub fn receive_maximum(mut self, n: u16) -> Self {
        self.receive_maximum = n.max(1);
        self
    }
}

type Sent = Result<MqttDelivery, BoxError>;

/// The deliveries of one MQTT 5 subscription on a persistent session.
///
/// A task drives the connection (it reconnects after an error, resuming the session).
/// [`Source::close`] (which [`Consumer::run`](crate::Consumer::run) awaits before it
/// returns) has that task write the acks still queued, then a DISCONNECT, and waits for
/// it to end; dropping the source does the same without waiting. The session and its
/// unacked messages stay with the broker until the session expiry.
pub struct MqttSource {
    rx: mpsc::UnboundedReceiver<Sent>,
    /// `None` once closed.
    driver: Option<JoinHandle<()>>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for MqttSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MqttSource").finish_non_exhaustive()
    }
}

/// How long [`Source::close`] (and a dropped source) lets the driver write what is
/// queued and the DISCONNECT before stopping it.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

impl Drop for MqttSource {
    fn drop(&mut self) {
        let Some(driver) = self.driver.take() else {
            return; // closed
        };
        // The driver writes the acks still queued, then the DISCONNECT, and ends; it is
        // stopped regardless after `CLOSE_WAIT`.
        if self.shared.client.try_disconnect().is_err() {
            driver.abort();
            return;
        }
        let driver = driver.abort_handle();
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move {
                    tokio::time::sleep(CLOSE_WAIT).await;
                    driver.abort();
                });
            }
            Err(_) => driver.abort(),
        }
    }
}

impl MqttSource {
    /// Connects with `options` (client id, broker, credentials), made persistent here:
    /// `clean_start` false, a session expiry of one day unless set above zero, manual
    /// acks. Waits for the broker's CONNACK and subscribes to the topic at QoS 1.
    pub async fn new(mut options: MqttOptions, cfg: MqttConfig) -> Result<Self, ConsumerError> {
        options.set_clean_start(false);
        if options.session_expiry_interval().unwrap_or(0) == 0 {
            options.set_session_expiry_interval(Some(24 * 3600));
        }
        options.set_receive_maximum(Some(cfg.receive_maximum));
        options.set_manual_acks(true);
        let (client, mut events) = AsyncClient::new(options, usize::from(cfg.receive_maximum) * 2);
        // The first CONNACK, so a broker that is down or refuses fails here.
        let connected = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                match events.poll().await {
                    Ok(Event::Incoming(Packet::ConnAck(_))) => return Ok(()),
                    Ok(_) => {}
                    Err(e) => return Err(ConsumerError::broker(e)),
                }
            }
        })
        .await;
        match connected {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(ConsumerError::broker("no CONNACK within 10 s")),
        }
        client
            .subscribe(cfg.topic.clone(), QoS::AtLeastOnce)
            .await
            .map_err(ConsumerError::broker)?;
        let (tx, rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            client,
            cfg,
            tx: tx.clone(),
            written: Mutex::default(),
        });
        let driver = Some(tokio::spawn(drive(events, shared.clone())));
        Ok(MqttSource { rx, driver, shared })
    }
}

struct Shared {
    client: AsyncClient,
    cfg: MqttConfig,
    /// Where deliveries go: the driver's, and naks' (handed over again).
    tx: mpsc::UnboundedSender<Sent>,
    /// Acks waiting for their PUBACK to be written, by packet id.
    written: Mutex<HashMap<u16, Vec<oneshot::Sender<()>>>>,
}

impl Shared {
    fn waiters(&self) -> std::sync::MutexGuard<'_, HashMap<u16, Vec<oneshot::Sender<()>>>> {
        self.written.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Polls the connection for ever: the client's requests (acks) go out only while it is
/// polled, so it never waits on the consumer (the broker's receive maximum bounds what
/// is queued). After an error the next poll reconnects, resuming the session.
async fn drive(mut events: EventLoop, shared: Arc<Shared>) {
    loop {
        match events.poll().await {
            Ok(Event::Incoming(Packet::Publish(p))) => {
                let d = delivery(&shared, p);
                if shared.tx.send(Ok(d)).is_err() {
                    return;
                }
            }
            Ok(Event::Outgoing(Outgoing::PubAck(pkid))) => {
                for w in shared.waiters().remove(&pkid).unwrap_or_default() {
                    let _ = w.send(());
                }
            }
            Ok(Event::Outgoing(Outgoing::Disconnect)) => return,
            Ok(_) => {}
            Err(e) => {
                if shared.tx.send(Err(e.into())).is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

fn delivery(shared: &Arc<Shared>, p: Publish) -> MqttDelivery {
    let cfg = &shared.cfg;
    let from_property = p.properties.as_ref().and_then(|props| {
        props
            .user_properties
            .iter()
            .find(|(k, _)| *k == cfg.id_property)
            .map(|(_, v)| v.clone())
    });
    let id = from_property.or_else(|| {
        let field = cfg.id_field.as_ref()?;
        let json: serde_json::Value = serde_json::from_slice(&p.payload).ok()?;
        match json.get(field)? {
            serde_json::Value::String(s) => Some(s.clone()),
            serde_json::Value::Number(n) => Some(n.to_string()),
            _ => None,
        }
    });
    MqttDelivery {
        id,
        attempt: if p.dup { 2 } else { 1 },
        publish: Arc::new(p),
        shared: shared.clone(),
    }
}

impl Source for MqttSource {
    type Delivery = MqttDelivery;

    /// The next message; a connection error is returned (the driver reconnects).
    async fn next(&mut self) -> Option<Result<MqttDelivery, BoxError>> {
        self.rx.recv().await
    }

    fn redelivery_horizon(&self) -> Horizon {
        Horizon::Unknown
    }

    /// Queues a DISCONNECT behind the acks already sent to the client, and waits (up to
    /// 2 s) until the driver wrote them all and ended. Once it returns, the broker has
    /// (or is reading) every ack and the goodbye on this connection, so a new session
    /// with the same client id takes over a session with nothing left unacked that was
    /// acked here.
    async fn close(mut self) {
        let Some(mut driver) = self.driver.take() else {
            return;
        };
        let queued = tokio::time::timeout(CLOSE_WAIT, self.shared.client.disconnect()).await;
        if !matches!(queued, Ok(Ok(()))) {
            driver.abort();
            return;
        }
        if tokio::time::timeout(CLOSE_WAIT, &mut driver).await.is_err() {
            tracing::warn!("the MQTT connection did not write its DISCONNECT in time");
            driver.abort();
        }
    }
}

/// One delivery of an MQTT message.
pub struct MqttDelivery {
    id: Option<String>,
    attempt: u32,
    publish: Arc<Publish>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for MqttDelivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MqttDelivery")
            .field("id", &self.id)
            .field("attempt", &self.attempt)
            .field("dup", &self.publish.dup)
            .finish_non_exhaustive()
    }
}

impl MqttDelivery {
    /// Whether the broker flagged it as a redelivery (DUP).
    pub fn dup(&self) -> bool {
        self.publish.dup
    }

    /// Sends the PUBACK and waits (up to 10 s) until the driver wrote it.
    async fn puback(&self, what: &'static str) -> Result<(), AckError> {
        if self.publish.qos == QoS::AtMostOnce {
            return Ok(()); // QoS 0: nothing to ack
        }
        let (done, written) = oneshot::channel();
        let pkid = self.publish.pkid;
        self.shared.waiters().entry(pkid).or_default().push(done);
        if let Err(e) = self.shared.client.ack(&self.publish).await {
            self.shared.waiters().remove(&pkid);
            return Err(AckError::Failed {
                what,
                source: e.into(),
            });
        }
        match tokio::time::timeout(Duration::from_secs(10), written).await {
            Ok(Ok(())) => Ok(()),
            _ => Err(AckError::Failed {
                what,
                source: "the connection did not write it".into(),
            }),
        }
    }
}

impl Delivery for MqttDelivery {
    fn message_id(&self) -> Option<&str> {
        self.id.as_deref()
    }

    fn payload(&self) -> Bytes {
        self.publish.payload.clone()
    }

    fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The PUBACK.
    async fn ack(&self) -> Result<(), AckError> {
        self.puback("PUBACK").await
    }

    /// Hands the delivery to the consumer again after `delay`, still unacked.
    async fn nak(&self, delay: Duration) -> Result<(), AckError> {
        let again = MqttDelivery {
            id: self.id.clone(),
            attempt: self.attempt.saturating_add(1),
            publish: self.publish.clone(),
            shared: self.shared.clone(),
        };
        let tx = self.shared.tx.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            // A source already dropped: the broker resends it to the next session.
            let _ = tx.send(Ok(again));
        });
        Ok(())
    }

    async fn in_progress(&self) -> Result<(), AckError> {
        Ok(())
    }

    /// Acks: MQTT has no dead-letter queue.
    async fn terminate(&self) -> Result<(), AckError> {
        self.puback("PUBACK (terminated)").await
    }
}
