//! Redis Streams consumer groups (the redis crate).
//!
//! A [`RedisStreamSource`] reads new entries with `XREADGROUP … >` under its consumer
//! name, creating the group (with `MKSTREAM`) if it is missing; a group that already
//! exists is used as it is. Entries another consumer left pending (it crashed, or was
//! killed) for at least `min_idle` are taken over with `XAUTOCLAIM`, every
//! `claim_every`. Settling a delivery:
//!
//! - **ack** is `XACK`, sent after the result is recorded, and resolved once Redis
//!   answered it. The acks of a source's deliveries go out together: one `XACK` carries
//!   every ack queued while the previous one was on its way (one command per batch
//!   rather than one per entry, at any concurrency). An entry a twin already acked counts
//!   as acked: nothing delivers it again.
//! - **in progress** is `XCLAIM <stream> <group> <me> 0 <id> JUSTID`, sent every third of
//!   `min_idle` while the handler runs (the `+WPI` of streams): the entry's idle time
//!   starts again, so `XAUTOCLAIM` does not hand a live consumer's entry to another. It is
//!   sent only while this consumer still owns the entry (checked in the same script): an
//!   entry already taken over stays with its new owner, and the store's claim keeps that
//!   one from running the effect twice (it waits for this one, then acks a replay).
//! - **nak** leaves the entry pending: Redis has no negative ack. Its idle time is set so
//!   that it reaches `min_idle` after the nak's delay (capped at `min_idle`), and
//!   `XAUTOCLAIM` (here or in another consumer) delivers it again then.
//! - **terminate** adds the entry's fields to the dead-letter stream (`<stream>:dlq` by
//!   default), with its entry id as field `source_id`, and acks it, in one `MULTI`/`EXEC`.
//!
//! The message id is the entry id, or the value of a configured field
//! ([`RedisStreamConfig::id_field`]; an entry without it has no id). The payload is the
//! value of the field `payload` (configurable); an entry without that field gets the
//! JSON object of its other fields (all values JSON strings, since Redis stores strings),
//! so `XADD S * message_id m1 account a amount 5` is delivered as
//! `{"account":"a","amount":"5"}`.
//!
//! The attempt is the entry's delivery count: 1 for a new entry, `XPENDING`'s
//! times-delivered for a reclaimed one. Pending entries are reclaimed for ever, so the
//! redelivery horizon is [`Horizon::Unbounded`](crate::Horizon::Unbounded) (and [`Consumer::run`](crate::Consumer::run)
//! refuses it) unless [`RedisStreamConfig::max_deliveries`] bounds it: an entry
//! reclaimed after that many deliveries is dead-lettered without running.
//!
//! Entries read just as the consumer shuts down stay pending under its name, and are
//! reclaimed after `min_idle`, by it when it restarts or by another consumer.
//!
//! ```no_run
//! use std::time::Duration;
//! use idem_consumer::redis_streams::{redis, RedisStreamConfig, RedisStreamSource};
//! use idem_consumer::{Consumer, Message};
//! use idem_runtime::{Idem, Options};
//! use idem_runtime::store::BoxError;
//!
//! # async fn run() -> Result<(), BoxError> {
//! static CREDIT: Options = Options::dedup("ledger::credit").ttl(Duration::from_secs(86_400));
//! let client = redis::Client::open("redis://127.0.0.1:6379")?;
//! let config = RedisStreamConfig::new("credits", "ledger", "worker-1")
//!     .id_field("message_id") // XADD credits * message_id m-1 payload {...}
//!     .min_idle(Duration::from_secs(30))
//!     .max_deliveries(20); // bounds the redeliveries, so the record ttl can cover them
//! let source = RedisStreamSource::new(&client, config).await?;
//! let consumer = Consumer::builder(Idem::builder().build(), CREDIT.clone())
//!     .handler(|msg: Message| async move {
//!         println!("credit {}", msg.id); // runs once per message id
//!         Ok::<_, BoxError>(())
//!     });
//! consumer.run(source, async { let _ = tokio::signal::ctrl_c().await; }).await?;
//! # Ok(())
//! # }
//! ```

mod acks;
mod config;
mod delivery;
mod read;

use std::time::Duration;

use redis::AsyncConnectionConfig;
use tokio::sync::mpsc;

pub use redis;

use self::acks::PendingAck;
pub use self::config::RedisStreamConfig;
pub use self::delivery::RedisStreamDelivery;
pub use self::read::RedisStreamSource;

/// What the source and its deliveries share.
#[derive(Debug)]
struct Shared {
    stream: String,
    group: String,
    consumer: String,
    dead_letter: String,
    min_idle: Duration,
    progress: Option<Duration>,
    /// Where acks wait for the next `XACK` (see [`acks::acker`]).
    acks: mpsc::UnboundedSender<PendingAck>,
}

/// Settlements (acks, naks, dead letters) are bounded by 5 s, to connect and to answer.
fn settling() -> AsyncConnectionConfig {
    AsyncConnectionConfig::new()
        .set_response_timeout(Some(Duration::from_secs(5)))
        .set_connection_timeout(Some(Duration::from_secs(5)))
}

/// A duration as whole milliseconds, as Redis takes them.
fn millis(d: Duration) -> u64 {
    d.as_millis().min(u64::MAX as u128) as u64
}
