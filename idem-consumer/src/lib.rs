//! Exactly-once effects for broker consumers, on any idem store.
//!
//! Brokers deliver at least once: NATS JetStream redelivers after `ack_wait`, RabbitMQ
//! requeues everything unacked when a channel drops, a Redis Streams group hands an
//! entry idle for `min_idle` to another consumer through `XAUTOCLAIM` (even one whose
//! consumer is still working on it), an MQTT 5 broker resends every unacked message with
//! DUP when a persistent session reconnects. A [`Consumer`] makes each message's
//! effect happen once, with one set of rules written over the [`Delivery`] trait that
//! each broker adapter implements (`nats`, `rabbitmq`, `redis-streams`, `mqtt` features):
//!
//! - the message id is claimed through idem before the handler runs;
//! - the ack is sent only after the result is recorded (or its transaction committed),
//!   and its outcome is checked;
//! - a completed duplicate is acked without running the handler; a duplicate whose twin
//!   still runs elsewhere waits for it (then acks), or past `wait` is nak'ed with the
//!   time left on the twin's lease;
//! - a long handler keeps the broker from redelivering (NATS `+WPI`);
//! - a failing handler is nak'ed with backoff and terminated (dead-lettered) after
//!   `max_attempts` failures, counted in the store across crashes;
//! - a message without an id is terminated, unless ids derived from the payload are
//!   enabled;
//! - a record ttl shorter than the broker's redelivery horizon refuses to start.
//!
//! With [`ConsumerBuilder::handler`] the effect and its record are two writes: a consumer killed
//! between them (after the effect, before the record) leaves the claim to end with its
//! lease, and the redelivery runs the effect again. Where the effect is a database write,
//! [`ConsumerBuilder::transactional`] (feature `postgres`) commits the claim, the effect and the
//! record together, so no crash, kill or pause doubles it: a transaction left idle for
//! the lease is ended by the server, and the paused consumer's commit is refused.
//!
//! What it did is counted in [`Consumer::counters`] and, with the `metrics` feature,
//! published through the `metrics` facade as `idem_consumer_messages_total{operation,
//! outcome}` and a few more counters: see [`observe`].
//!
//! ```
//! use std::time::Duration;
//! use bytes::Bytes;
//! use idem_consumer::{AckError, Consumer, Delivery, Message, Outcome};
//! use idem_runtime::{Idem, Options};
//! use idem_runtime::store::BoxError;
//!
//! // A delivery of a toy broker; real ones come from the adapters.
//! struct Toy(&'static str);
//! impl Delivery for Toy {
//!     fn message_id(&self) -> Option<&str> { Some(self.0) }
//!     fn payload(&self) -> Bytes { Bytes::from_static(b"{}") }
//!     fn attempt(&self) -> u32 { 1 }
//!     async fn ack(&self) -> Result<(), AckError> { Ok(()) }
//!     async fn nak(&self, _: Duration) -> Result<(), AckError> { Ok(()) }
//!     async fn in_progress(&self) -> Result<(), AckError> { Ok(()) }
//!     async fn terminate(&self) -> Result<(), AckError> { Ok(()) }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! static CREDIT: Options = Options::dedup("ledger::credit");
//! let consumer = Consumer::builder(Idem::builder().build(), CREDIT.clone())
//!     .handler(|msg: Message| async move {
//!         println!("credit for {}", msg.id); // the effect: runs once per id
//!         Ok::<_, BoxError>(())
//!     });
//! assert_eq!(consumer.process(Toy("m-1")).await, Outcome::Processed);
//! assert_eq!(consumer.process(Toy("m-1")).await, Outcome::Duplicate);
//! assert_eq!(consumer.counters().processed, 1);
//! # }
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod consumer;
mod counters;
mod delivery;
mod effect;
mod error;
#[cfg(feature = "mqtt")]
#[cfg_attr(docsrs, doc(cfg(feature = "mqtt")))]
pub mod mqtt;
#[cfg(feature = "nats")]
#[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
pub mod nats;
pub mod observe;
#[cfg(feature = "rabbitmq")]
#[cfg_attr(docsrs, doc(cfg(feature = "rabbitmq")))]
pub mod rabbitmq;
#[cfg(feature = "redis-streams")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis-streams")))]
pub mod redis_streams;
#[cfg(feature = "postgres")]
mod tx;

pub use consumer::{Consumer, ConsumerBuilder, Outcome};

/// The old name of [`ConsumerBuilder`], named as idem-runtime's `IdemBuilder` is; kept
/// for one release.
#[deprecated(since = "0.1.0", note = "renamed `ConsumerBuilder`")]
pub type Builder = ConsumerBuilder;
pub use counters::Counters;
pub use delivery::{AckError, Delivery, Horizon, Message, Source};
pub use effect::{Effect, Handler, Plain};
pub use error::ConsumerError;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use tx::{Transactional, TxHandler};
