//! The seam between the rules and a broker: one delivery of one message.

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;

/// Why a settlement (ack, nak, in-progress, terminate) did not reach the broker.
///
/// The message is then still pending on the broker, which delivers it again; the rules
/// count the failure and the redelivery is acked as a replay.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AckError {
    /// The broker (or the client) refused it: the channel was already closed, the
    /// delivery was already settled.
    #[error("the broker refused the {0}")]
    Refused(&'static str),
    /// It failed or timed out on the way; the broker may or may not have applied it.
    #[error("the {what} failed: {source}")]
    Failed {
        /// Which settlement.
        what: &'static str,
        /// The client's error.
        #[source]
        source: idem_runtime::store::BoxError,
    },
}

/// One delivery of a message, as a broker adapter hands it to the rules.
///
/// An adapter keeps its broker's types behind this trait (the NATS `Acker`, lapin's
/// `Acker`), the way a store keeps its client behind [`idem_runtime::Store`]. Every
/// settlement reports whether the broker accepted it.
pub trait Delivery: Send + Sync + 'static {
    /// The message id the producer set (NATS `Nats-Msg-Id`, AMQP `message_id`), if any.
    fn message_id(&self) -> Option<&str>;

    /// The message body (cheap to clone).
    fn payload(&self) -> Bytes;

    /// Which delivery of this message this is, as the broker counts it: 1 for the first.
    /// A broker that only flags redeliveries reports 2 for any of them.
    fn attempt(&self) -> u32;

    /// How often to tell the broker the message is still being worked on, so it does
    /// not redeliver a long handler (`None`: the broker needs no such signal).
    fn progress_interval(&self) -> Option<Duration> {
        None
    }

    /// The message is done: the broker drops it. Resolves once the broker confirmed it,
    /// where the broker can confirm.
    fn ack(&self) -> impl Future<Output = Result<(), AckError>> + Send;

    /// Deliver the message again after `delay`.
    fn nak(&self, delay: Duration) -> impl Future<Output = Result<(), AckError>> + Send;

    /// The message is still being worked on: push its redelivery deadline back.
    fn in_progress(&self) -> impl Future<Output = Result<(), AckError>> + Send;

    /// Never deliver the message again: terminate it, or send it to the dead-letter
    /// exchange where the broker has one.
    fn terminate(&self) -> impl Future<Output = Result<(), AckError>> + Send;
}

/// What a handler gets: the message, with the id it is deduplicated under.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Message {
    /// The message id (the producer's, or `blake3:<hex>` of the payload when deriving
    /// ids is enabled).
    pub id: String,
    /// The body.
    pub payload: Bytes,
    /// The broker's delivery count (see [`Delivery::attempt`]).
    pub attempt: u32,
}

/// Where deliveries come from: an adapter's subscription.
pub trait Source: Send {
    /// The deliveries it yields.
    type Delivery: Delivery;

    /// The next delivery; `None` when the subscription ended (the channel or connection
    /// closed). An `Err` is a transient trouble of the subscription, logged by the loop.
    fn next(
        &mut self,
    ) -> impl Future<Output = Option<Result<Self::Delivery, idem_runtime::store::BoxError>>> + Send;

    /// How long after its first delivery the broker may still deliver a message again,
    /// as far as the adapter can see from the broker's settings.
    fn redelivery_horizon(&self) -> Horizon {
        Horizon::Unknown
    }

    /// Ends the subscription cleanly, once every delivery it handed out is settled:
    /// [`Consumer::run`](crate::Consumer::run) awaits it before returning. The default
    /// drops the source; an adapter whose settlements are written by a task of its own
    /// (MQTT) lets that task write them, and the goodbye, first.
    fn close(self) -> impl Future<Output = ()> + Send
    where
        Self: Sized,
    {
        async move { drop(self) }
    }
}

/// How long a broker may keep redelivering a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Horizon {
    /// At most this long after the first delivery.
    Bounded(Duration),
    /// Without end (no delivery limit and no message age limit).
    Unbounded,
    /// The adapter cannot see the broker's settings.
    Unknown,
}
