//! A source's settings: the stream, group and consumer names, how it reads and
//! reclaims, and where its message ids, payloads and dead letters are.

use std::time::Duration;

/// Where and how a [`RedisStreamSource`](super::RedisStreamSource) reads.
#[derive(Debug, Clone)]
#[must_use]
pub struct RedisStreamConfig {
    pub(super) stream: String,
    pub(super) group: String,
    pub(super) consumer: String,
    pub(super) min_idle: Duration,
    pub(super) claim_every: Duration,
    pub(super) block: Duration,
    pub(super) batch: usize,
    pub(super) progress: Option<Duration>,
    pub(super) id_field: Option<String>,
    pub(super) payload_field: String,
    pub(super) dead_letter: Option<String>,
    pub(super) max_deliveries: Option<u32>,
    pub(super) create_from: String,
}

impl RedisStreamConfig {
    /// Reads `stream` as `consumer` of `group`. The consumer name must be unique among
    /// the group's live consumers (a restarted consumer may reuse its name).
    pub fn new(
        stream: impl Into<String>,
        group: impl Into<String>,
        consumer: impl Into<String>,
    ) -> Self {
        RedisStreamConfig {
            stream: stream.into(),
            group: group.into(),
            consumer: consumer.into(),
            min_idle: Duration::from_secs(30),
            claim_every: Duration::from_secs(1),
            block: Duration::from_secs(1),
            batch: 32,
            progress: Some(Duration::from_secs(10)),
            id_field: None,
            payload_field: "payload".into(),
            dead_letter: None,
            max_deliveries: None,
            create_from: "0".into(),
        }
    }

    /// How long an entry stays pending with another consumer before it is reclaimed
    /// (`XAUTOCLAIM`'s min-idle-time; default 30 s, at least 1 ms). Also sets the
    /// in-progress interval to a third of it.
    pub fn min_idle(mut self, d: Duration) -> Self {
        self.min_idle = d.max(Duration::from_millis(1));
        self.progress = Some((self.min_idle / 3).max(Duration::from_millis(1)));
        self
    }

    /// How often to look for entries to reclaim (default 1 s).
    pub fn claim_every(mut self, d: Duration) -> Self {
        self.claim_every = d.max(Duration::from_millis(1));
        self
    }

    /// How long one `XREADGROUP` blocks waiting for new entries (default 1 s).
    pub fn block(mut self, d: Duration) -> Self {
        self.block = d.max(Duration::from_millis(1));
        self
    }

    /// Entries read (or reclaimed) per call (default 32).
    pub fn batch(mut self, n: usize) -> Self {
        self.batch = n.max(1);
        self
    }

    /// How often a running handler refreshes its entry's idle time (default a third of
    /// `min_idle`); `None`: never, so a handler longer than `min_idle` loses its entry to
    /// `XAUTOCLAIM` and only the store's claim keeps the effect single.
    pub fn progress(mut self, every: Option<Duration>) -> Self {
        self.progress = every.map(|d| d.max(Duration::from_millis(1)));
        self
    }

    /// Take the message id from this field instead of the entry id.
    pub fn id_field(mut self, field: impl Into<String>) -> Self {
        self.id_field = Some(field.into());
        self
    }

    /// The field holding the payload (default `payload`).
    pub fn payload_field(mut self, field: impl Into<String>) -> Self {
        self.payload_field = field.into();
        self
    }

    /// The dead-letter stream (default `<stream>:dlq`).
    pub fn dead_letter(mut self, stream: impl Into<String>) -> Self {
        self.dead_letter = Some(stream.into());
        self
    }

    /// Dead-letter an entry reclaimed after more than `n` deliveries, without running
    /// it; this bounds the redelivery horizon to `(min_idle + claim_every) × (n + 1)`.
    pub fn max_deliveries(mut self, n: u32) -> Self {
        self.max_deliveries = Some(n.max(1));
        self
    }

    /// Where a group created here starts reading (default `0`: every entry already in
    /// the stream; `$`: only entries added later). An existing group keeps its position.
    pub fn create_from(mut self, id: impl Into<String>) -> Self {
        self.create_from = id.into();
        self
    }
}
