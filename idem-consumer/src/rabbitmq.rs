//! RabbitMQ through lapin.
//!
//! Acks, nacks and rejects report whether the channel took them (lapin's `Ok(false)`:
//! already settled or the channel is closed; an error: the channel ended meanwhile).
//! RabbitMQ has no delayed requeue: a nak keeps the delivery for its delay, then
//! requeues it, so the delay holds one prefetch slot. Terminating rejects without
//! requeue: the message goes to the queue's dead-letter exchange if it has one.
//! The message id is the AMQP `message_id` property; the attempt is the quorum queues'
//! `x-delivery-count` header plus one, else 2 for a redelivery.

use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use idem_runtime::store::BoxError;
use lapin::Acker;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions, BasicRejectOptions,
};
use lapin::types::{AMQPValue, FieldTable};

pub use lapin;

use crate::{AckError, ConsumerError, Delivery, Source};

/// The deliveries of one queue on one channel.
pub struct RabbitSource {
    consumer: lapin::Consumer,
}

impl std::fmt::Debug for RabbitSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RabbitSource").finish_non_exhaustive()
    }
}

impl RabbitSource {
    /// Consumes `queue` on `channel` with manual acks and at most `prefetch` unacked
    /// deliveries (the channel's QoS).
    pub async fn new(
        channel: &lapin::Channel,
        queue: &str,
        prefetch: u16,
    ) -> Result<Self, ConsumerError> {
        channel
            .basic_qos(prefetch.max(1), BasicQosOptions::default())
            .await
            .map_err(ConsumerError::broker)?;
        let consumer = channel
            .basic_consume(
                queue.into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(ConsumerError::broker)?;
        Ok(RabbitSource { consumer })
    }
}

impl Source for RabbitSource {
    type Delivery = RabbitDelivery;

    async fn next(&mut self) -> Option<Result<RabbitDelivery, BoxError>> {
        let d = match self.consumer.next().await? {
            Ok(d) => d,
            Err(e) => return Some(Err(e.into())),
        };
        let count = d
            .properties
            .headers()
            .as_ref()
            .and_then(|h| h.inner().get("x-delivery-count"))
            .and_then(as_u32);
        let attempt = match count {
            Some(n) => n.saturating_add(1),
            None if d.redelivered => 2,
            None => 1,
        };
        let id = d
            .properties
            .message_id()
            .as_ref()
            .map(|s| s.as_str().to_owned());
        Some(Ok(RabbitDelivery {
            id,
            payload: Bytes::from(d.data),
            attempt,
            acker: d.acker,
        }))
    }
}

fn as_u32(v: &AMQPValue) -> Option<u32> {
    let n: i64 = match v {
        AMQPValue::ShortShortInt(n) => (*n).into(),
        AMQPValue::ShortShortUInt(n) => (*n).into(),
        AMQPValue::ShortInt(n) => (*n).into(),
        AMQPValue::ShortUInt(n) => (*n).into(),
        AMQPValue::LongInt(n) => (*n).into(),
        AMQPValue::LongUInt(n) => (*n).into(),
        AMQPValue::LongLongInt(n) => *n,
        _ => return None,
    };
    u32::try_from(n).ok()
}

/// One RabbitMQ delivery.
pub struct RabbitDelivery {
    id: Option<String>,
    payload: Bytes,
    attempt: u32,
    acker: Acker,
}

impl std::fmt::Debug for RabbitDelivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RabbitDelivery")
            .field("id", &self.id)
            .field("attempt", &self.attempt)
            .finish_non_exhaustive()
    }
}

fn checked(what: &'static str, r: lapin::Result<bool>) -> Result<(), AckError> {
    match r {
        Ok(true) => Ok(()),
        Ok(false) => Err(AckError::Refused(what)),
        Err(e) => Err(AckError::Failed {
            what,
            source: e.into(),
        }),
    }
}

impl Delivery for RabbitDelivery {
    fn message_id(&self) -> Option<&str> {
        self.id.as_deref()
    }

    fn payload(&self) -> Bytes {
        self.payload.clone()
    }

    fn attempt(&self) -> u32 {
        self.attempt
    }

    async fn ack(&self) -> Result<(), AckError> {
        checked("ack", self.acker.ack(BasicAckOptions::default()).await)
    }

    async fn nak(&self, delay: Duration) -> Result<(), AckError> {
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let opts = BasicNackOptions {
            multiple: false,
            requeue: true,
        };
        checked("nack", self.acker.nack(opts).await)
    }

    async fn in_progress(&self) -> Result<(), AckError> {
        // An unacked delivery stays with its channel as long as the channel lives.
        Ok(())
    }

    async fn terminate(&self) -> Result<(), AckError> {
        let opts = BasicRejectOptions { requeue: false };
        checked("reject", self.acker.reject(opts).await)
    }
}
