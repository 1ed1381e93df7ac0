//! NATS JetStream pull consumers (async-nats).
//!
//! Acks and terminations are double acks (the server confirms them); naks carry their
//! delay (`-NAK {"delay": ...}`); a long handler sends `+WPI` every third of `ack_wait`.
//! The redelivery horizon is `ack_wait` × `max_deliver` plus the consumer's backoff,
//! capped by the stream's `max_age`.

use std::time::Duration;

use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::consumer::pull::Stream as Messages;
use async_nats::jetstream::message::{AckKind, Acker};
use bytes::Bytes;
use futures_util::StreamExt;
use idem_runtime::store::BoxError;

pub use async_nats;

use crate::{AckError, ConsumerError, Delivery, Horizon, Source};

/// The deliveries of a JetStream pull consumer.
pub struct NatsSource {
    messages: Messages,
    progress: Duration,
    horizon: Horizon,
}

impl std::fmt::Debug for NatsSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsSource")
            .field("progress", &self.progress)
            .field("horizon", &self.horizon)
            .finish_non_exhaustive()
    }
}

impl NatsSource {
    /// Subscribes to `consumer` (bound to an existing durable or ephemeral pull consumer),
    /// pulling up to `batch` messages ahead. `stream_max_age` is the stream's
    /// `max_age` (zero: none), which also bounds the redeliveries.
    pub async fn new(
        consumer: &mut PullConsumer,
        stream_max_age: Duration,
        batch: usize,
    ) -> Result<Self, ConsumerError> {
        let info = consumer.info().await.map_err(ConsumerError::broker)?;
        let config = &info.config;
        let horizon = horizon(
            config.ack_wait,
            config.max_deliver,
            &config.backoff,
            stream_max_age,
        );
        let progress = (config.ack_wait / 3).max(Duration::from_millis(1));
        let messages = consumer
            .stream()
            .max_messages_per_batch(batch.max(1))
            .messages()
            .await
            .map_err(ConsumerError::broker)?;
        Ok(NatsSource {
            messages,
            progress,
            horizon,
        })
    }
}

/// How long JetStream may redeliver: every delivery waits `ack_wait` (or the backoff
/// step that applies to it), up to `max_deliver` deliveries, and a message older than
/// the stream's `max_age` is gone.
fn horizon(
    ack_wait: Duration,
    max_deliver: i64,
    backoff: &[Duration],
    max_age: Duration,
) -> Horizon {
    let by_age = (!max_age.is_zero()).then_some(max_age);
    let by_count = (max_deliver > 0).then(|| {
        let n = max_deliver as u32;
        // The server uses the backoff steps in turn, then repeats the last one.
        (0..n)
            .map(|i| match backoff {
                [] => ack_wait,
                steps => steps[(i as usize).min(steps.len() - 1)],
            })
            .sum::<Duration>()
            + ack_wait
    });
    match (by_count, by_age) {
        (Some(a), Some(b)) => Horizon::Bounded(a.min(b)),
        (Some(h), None) | (None, Some(h)) => Horizon::Bounded(h),
        (None, None) => Horizon::Unbounded,
    }
}

impl Source for NatsSource {
    type Delivery = NatsDelivery;

    async fn next(&mut self) -> Option<Result<NatsDelivery, BoxError>> {
        let msg = match self.messages.next().await? {
            Ok(m) => m,
            Err(e) => return Some(Err(e.into())),
        };
        let attempt = msg
            .info()
            .map_or(1, |i| i.delivered.clamp(1, u32::MAX as i64) as u32);
        let (msg, acker) = msg.split();
        let id = msg
            .headers
            .as_ref()
            .and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))
            .map(|v| v.as_str().to_owned());
        Some(Ok(NatsDelivery {
            id,
            payload: msg.payload,
            attempt,
            acker,
            progress: self.progress,
        }))
    }

    fn redelivery_horizon(&self) -> Horizon {
        self.horizon
    }
}

/// One JetStream delivery.
pub struct NatsDelivery {
    id: Option<String>,
    payload: Bytes,
    attempt: u32,
    acker: Acker,
    progress: Duration,
}

impl std::fmt::Debug for NatsDelivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsDelivery")
            .field("id", &self.id)
            .field("attempt", &self.attempt)
            .finish_non_exhaustive()
    }
}

fn failed(what: &'static str) -> impl FnOnce(async_nats::Error) -> AckError {
    move |source| AckError::Failed { what, source }
}

impl Delivery for NatsDelivery {
    fn message_id(&self) -> Option<&str> {
        self.id.as_deref()
    }

    fn payload(&self) -> Bytes {
        self.payload.clone()
    }

    fn attempt(&self) -> u32 {
        self.attempt
    }

    fn progress_interval(&self) -> Option<Duration> {
        Some(self.progress)
    }

    async fn ack(&self) -> Result<(), AckError> {
        self.acker.double_ack().await.map_err(failed("ack"))
    }

    async fn nak(&self, delay: Duration) -> Result<(), AckError> {
        let delay = (!delay.is_zero()).then_some(delay);
        self.acker
            .ack_with(AckKind::Nak(delay))
            .await
            .map_err(failed("nak"))
    }

    async fn in_progress(&self) -> Result<(), AckError> {
        self.acker
            .ack_with(AckKind::Progress)
            .await
            .map_err(failed("in-progress ack"))
    }

    async fn terminate(&self) -> Result<(), AckError> {
        self.acker
            .double_ack_with(AckKind::Term)
            .await
            .map_err(failed("term"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn horizon_counts_deliveries_backoff_and_age() {
        let s = Duration::from_secs;
        assert_eq!(
            horizon(s(30), 5, &[], Duration::ZERO),
            Horizon::Bounded(s(180))
        );
        assert_eq!(
            horizon(s(30), 3, &[s(1), s(10)], Duration::ZERO),
            Horizon::Bounded(s(1 + 10 + 10 + 30))
        );
        assert_eq!(horizon(s(30), 5, &[], s(60)), Horizon::Bounded(s(60)));
        assert_eq!(horizon(s(30), -1, &[], s(60)), Horizon::Bounded(s(60)));
        assert_eq!(horizon(s(30), -1, &[], Duration::ZERO), Horizon::Unbounded);
    }
}
