//! One delivery of a stream entry, and how it is settled: ack, nak, in progress,
//! terminate.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use redis::aio::MultiplexedConnection;
use tokio::sync::oneshot;

use super::acks::PendingAck;
use super::{Shared, millis};
use crate::{AckError, Delivery};

/// Sets an entry's idle time, only while this consumer owns it: `XCLAIM … JUSTID` leaves
/// the delivery count alone.
const TOUCH: &str = r"
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if #p == 0 or p[1][2] ~= ARGV[2] then return 0 end
redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3], 'IDLE', ARGV[4], 'JUSTID')
return 1
";

/// One delivery of a stream entry.
pub struct RedisStreamDelivery {
    pub(super) entry_id: String,
    pub(super) id: Option<String>,
    pub(super) payload: Bytes,
    pub(super) attempt: u32,
    pub(super) fields: Vec<(String, Bytes)>,
    pub(super) conn: MultiplexedConnection,
    pub(super) shared: Arc<Shared>,
}

impl std::fmt::Debug for RedisStreamDelivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStreamDelivery")
            .field("entry_id", &self.entry_id)
            .field("id", &self.id)
            .field("attempt", &self.attempt)
            .finish_non_exhaustive()
    }
}

fn failed(what: &'static str) -> impl FnOnce(redis::RedisError) -> AckError {
    move |e| AckError::Failed {
        what,
        source: e.into(),
    }
}

impl RedisStreamDelivery {
    /// The entry id (`<ms>-<seq>`).
    pub fn entry_id(&self) -> &str {
        &self.entry_id
    }

    /// Sets the entry's idle time to `idle` if this consumer still owns it; whether it
    /// did.
    async fn touch(&self, what: &'static str, idle: Duration) -> Result<bool, AckError> {
        let s = &*self.shared;
        let owned: i64 = redis::Script::new(TOUCH)
            .key(&s.stream)
            .arg(&s.group)
            .arg(&s.consumer)
            .arg(&self.entry_id)
            .arg(millis(idle))
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(failed(what))?;
        Ok(owned == 1)
    }
}

impl Delivery for RedisStreamDelivery {
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
        self.shared.progress
    }

    /// `XACK`, with the other acks queued meanwhile; resolves with Redis's answer. An
    /// entry that was no longer pending (a twin acked it) counts as acked.
    async fn ack(&self) -> Result<(), AckError> {
        let (answer, answered) = oneshot::channel();
        let queued = self.shared.acks.send(PendingAck {
            entry_id: self.entry_id.clone(),
            answer,
        });
        if queued.is_err() {
            return Err(AckError::Refused("XACK (the runtime is shutting down)"));
        }
        match answered.await {
            Ok(sent) => sent.map_err(failed("XACK")),
            Err(_) => Err(AckError::Failed {
                what: "XACK",
                source: "the acker stopped before Redis answered".into(),
            }),
        }
    }

    /// Leaves the entry pending, reclaimable `delay` from now (at most `min_idle`). An
    /// entry another consumer took over, or acked, is left to it.
    async fn nak(&self, delay: Duration) -> Result<(), AckError> {
        let idle = self
            .shared
            .min_idle
            .saturating_sub(delay.min(self.shared.min_idle));
        self.touch("nak", idle).await.map(|_| ())
    }

    /// Restarts the entry's idle time, while this consumer owns it.
    async fn in_progress(&self) -> Result<(), AckError> {
        if self.touch("in-progress XCLAIM", Duration::ZERO).await? {
            Ok(())
        } else {
            Err(AckError::Refused(
                "in-progress XCLAIM (another consumer took the entry over)",
            ))
        }
    }

    /// `XADD <dead-letter> * <fields…> source_id <entry id>` and `XACK`, in one
    /// `MULTI`/`EXEC`.
    async fn terminate(&self) -> Result<(), AckError> {
        let s = &*self.shared;
        let mut pipe = redis::pipe();
        pipe.atomic();
        let add = pipe.cmd("XADD").arg(&s.dead_letter).arg("*");
        for (k, v) in &self.fields {
            add.arg(k).arg(v.as_ref());
        }
        add.arg("source_id").arg(&self.entry_id).ignore();
        pipe.cmd("XACK")
            .arg(&s.stream)
            .arg(&s.group)
            .arg(&self.entry_id)
            .ignore();
        let _: () = pipe
            .query_async(&mut self.conn.clone())
            .await
            .map_err(failed("dead-letter XADD and XACK"))?;
        Ok(())
    }
}
