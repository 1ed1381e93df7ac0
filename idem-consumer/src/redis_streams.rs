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
//! redelivery horizon is [`Horizon::Unbounded`] (and [`Consumer::run`](crate::Consumer::run)
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

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use idem_runtime::store::BoxError;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, Value};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

pub use redis;

use crate::{AckError, ConsumerError, Delivery, Horizon, Source};

/// Where and how a [`RedisStreamSource`] reads.
#[derive(Debug, Clone)]
#[must_use]
pub struct RedisStreamConfig {
    stream: String,
    group: String,
    consumer: String,
    min_idle: Duration,
    claim_every: Duration,
    block: Duration,
    batch: usize,
    progress: Option<Duration>,
    id_field: Option<String>,
    payload_field: String,
    dead_letter: Option<String>,
    max_deliveries: Option<u32>,
    create_from: String,
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

/// What the source and its deliveries share.
#[derive(Debug)]
struct Shared {
    stream: String,
    group: String,
    consumer: String,
    dead_letter: String,
    min_idle: Duration,
    progress: Option<Duration>,
    /// Where acks wait for the next `XACK` (see [`acker`]).
    acks: mpsc::UnboundedSender<PendingAck>,
}

/// An ack waiting for its `XACK`, and where its answer goes.
struct PendingAck {
    entry_id: String,
    answer: oneshot::Sender<redis::RedisResult<()>>,
}

/// Most entry ids in one `XACK`.
const ACK_BATCH: usize = 1024;

/// Sends the acks of a source's deliveries: each `XACK` carries every ack queued while
/// the one before it was on its way, and each ack gets its batch's answer. A failed
/// `XACK` fails its batch (those entries stay pending, to be delivered again) and the
/// next batch goes out on a new connection. Ends once the source and all its deliveries
/// are gone.
async fn acker(
    stream: String,
    group: String,
    client: Client,
    mut conn: Option<MultiplexedConnection>,
    mut queue: mpsc::UnboundedReceiver<PendingAck>,
) {
    let mut batch = Vec::new();
    while queue.recv_many(&mut batch, ACK_BATCH).await > 0 {
        let mut xack = redis::cmd("XACK");
        xack.arg(&stream).arg(&group);
        for a in &batch {
            xack.arg(&a.entry_id);
        }
        let sent = match conn.as_mut() {
            Some(c) => xack.query_async::<i64>(c).await,
            None => match client
                .get_multiplexed_async_connection_with_config(&settling())
                .await
            {
                Ok(mut c) => {
                    let sent = xack.query_async::<i64>(&mut c).await;
                    conn = Some(c);
                    sent
                }
                Err(e) => Err(e),
            },
        };
        let sent = sent.map(drop);
        if sent.is_err() {
            conn = None;
        }
        for a in batch.drain(..) {
            let _ = a.answer.send(sent.clone());
        }
    }
}

/// The deliveries of one consumer of a Redis Streams consumer group.
pub struct RedisStreamSource {
    client: Client,
    cfg: RedisStreamConfig,
    shared: Arc<Shared>,
    read: MultiplexedConnection,
    settle: MultiplexedConnection,
    ready: VecDeque<RedisStreamDelivery>,
    cursor: String,
    next_claim: Instant,
    broken: bool,
}

impl std::fmt::Debug for RedisStreamSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStreamSource")
            .field("config", &self.cfg)
            .finish_non_exhaustive()
    }
}

/// Two connections: one for the blocking reads, one for settlements, which must not
/// wait behind a read's `BLOCK`.
async fn connect(
    client: &Client,
    block: Duration,
) -> redis::RedisResult<(MultiplexedConnection, MultiplexedConnection)> {
    let reading = AsyncConnectionConfig::new()
        .set_response_timeout(Some(block + Duration::from_secs(5)))
        .set_connection_timeout(Some(Duration::from_secs(5)));
    let read = client
        .get_multiplexed_async_connection_with_config(&reading)
        .await?;
    let settle = client
        .get_multiplexed_async_connection_with_config(&settling())
        .await?;
    Ok((read, settle))
}

/// Settlements are bounded by 5 s, to connect and to answer.
fn settling() -> AsyncConnectionConfig {
    AsyncConnectionConfig::new()
        .set_response_timeout(Some(Duration::from_secs(5)))
        .set_connection_timeout(Some(Duration::from_secs(5)))
}

impl RedisStreamSource {
    /// Connects, and creates the group (with the stream) if it does not exist.
    pub async fn new(client: &Client, cfg: RedisStreamConfig) -> Result<Self, ConsumerError> {
        let (read, mut settle) = connect(client, cfg.block)
            .await
            .map_err(ConsumerError::broker)?;
        let created: redis::RedisResult<Value> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(&cfg.stream)
            .arg(&cfg.group)
            .arg(&cfg.create_from)
            .arg("MKSTREAM")
            .query_async(&mut settle)
            .await;
        match created {
            Ok(_) => {}
            // The group exists: it is used with its own position and pending entries.
            Err(e) if e.code() == Some("BUSYGROUP") => {}
            Err(e) => return Err(ConsumerError::broker(e)),
        }
        let (acks, queue) = mpsc::unbounded_channel();
        tokio::spawn(acker(
            cfg.stream.clone(),
            cfg.group.clone(),
            client.clone(),
            Some(settle.clone()),
            queue,
        ));
        let shared = Arc::new(Shared {
            stream: cfg.stream.clone(),
            group: cfg.group.clone(),
            consumer: cfg.consumer.clone(),
            dead_letter: cfg
                .dead_letter
                .clone()
                .unwrap_or_else(|| format!("{}:dlq", cfg.stream)),
            min_idle: cfg.min_idle,
            progress: cfg.progress,
            acks,
        });
        Ok(RedisStreamSource {
            client: client.clone(),
            shared,
            read,
            settle,
            ready: VecDeque::new(),
            cursor: "0-0".into(),
            next_claim: Instant::now(),
            broken: false,
            cfg,
        })
    }

    /// Entries pending with any consumer for at least `min_idle`, now owned here.
    async fn reclaim(&mut self) -> Result<(), BoxError> {
        let reply: Value = redis::cmd("XAUTOCLAIM")
            .arg(&self.cfg.stream)
            .arg(&self.cfg.group)
            .arg(&self.cfg.consumer)
            .arg(millis(self.cfg.min_idle))
            .arg(&self.cursor)
            .arg("COUNT")
            .arg(self.cfg.batch)
            .query_async(&mut self.read)
            .await?;
        let Value::Array(mut parts) = reply else {
            return Err("XAUTOCLAIM: an unexpected reply".into());
        };
        if parts.len() < 2 {
            return Err("XAUTOCLAIM: an unexpected reply".into());
        }
        let claimed = entries(parts.swap_remove(1))?;
        let cursor = text(&parts[0]).ok_or("XAUTOCLAIM: no cursor")?;
        if cursor == "0-0" {
            // The whole pending list was scanned: look again after `claim_every`.
            self.next_claim = Instant::now() + self.cfg.claim_every;
        }
        self.cursor = cursor;
        if claimed.is_empty() {
            return Ok(());
        }
        // XAUTOCLAIM counted this delivery; XPENDING tells how many there were.
        let mut pipe = redis::pipe();
        for e in &claimed {
            pipe.cmd("XPENDING")
                .arg(&self.cfg.stream)
                .arg(&self.cfg.group)
                .arg(&e.id)
                .arg(&e.id)
                .arg(1);
        }
        let pending: Vec<Value> = pipe.query_async(&mut self.read).await?;
        let counts: HashMap<String, u32> = pending.iter().filter_map(delivery_count).collect();
        for e in claimed {
            let attempt = counts.get(&e.id).copied().unwrap_or(2);
            if self.cfg.max_deliveries.is_some_and(|m| attempt > m) {
                tracing::error!(entry = %e.id, attempt, "delivered too often: dead-lettered without running");
                let d = self.delivery(e, attempt);
                if let Err(err) = d.terminate().await {
                    tracing::warn!(error = %err, "dead-lettering failed; the entry stays pending");
                }
                continue;
            }
            let d = self.delivery(e, attempt);
            self.ready.push_back(d);
        }
        Ok(())
    }

    /// New entries, waiting up to `block` (and no later than the next reclaim).
    async fn read_new(&mut self) -> Result<(), BoxError> {
        let until_claim = self.next_claim.saturating_duration_since(Instant::now());
        let block = self
            .cfg
            .block
            .min(until_claim)
            .max(Duration::from_millis(1));
        let reply: Value = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg(&self.cfg.group)
            .arg(&self.cfg.consumer)
            .arg("COUNT")
            .arg(self.cfg.batch)
            .arg("BLOCK")
            .arg(millis(block))
            .arg("STREAMS")
            .arg(&self.cfg.stream)
            .arg(">")
            .query_async(&mut self.read)
            .await?;
        let streams = match reply {
            Value::Nil => return Ok(()),
            Value::Array(streams) => streams
                .into_iter()
                .filter_map(|s| match s {
                    Value::Array(mut kv) if kv.len() == 2 => Some(kv.swap_remove(1)),
                    _ => None,
                })
                .collect::<Vec<_>>(),
            Value::Map(streams) => streams.into_iter().map(|(_, v)| v).collect(),
            _ => return Err("XREADGROUP: an unexpected reply".into()),
        };
        for s in streams {
            for e in entries(s)? {
                let d = self.delivery(e, 1);
                self.ready.push_back(d);
            }
        }
        Ok(())
    }

    fn delivery(&self, e: Entry, attempt: u32) -> RedisStreamDelivery {
        let id = match &self.cfg.id_field {
            None => Some(e.id.clone()),
            Some(f) => e
                .fields
                .iter()
                .find(|(k, _)| k == f)
                .and_then(|(_, v)| std::str::from_utf8(v).ok())
                .map(str::to_owned),
        };
        let payload = match e.fields.iter().find(|(k, _)| *k == self.cfg.payload_field) {
            Some((_, v)) => v.clone(),
            None => {
                let others: serde_json::Map<String, serde_json::Value> = e
                    .fields
                    .iter()
                    .filter(|(k, _)| self.cfg.id_field.as_ref() != Some(k))
                    .map(|(k, v)| (k.clone(), String::from_utf8_lossy(v).into_owned().into()))
                    .collect();
                Bytes::from(serde_json::Value::Object(others).to_string())
            }
        };
        RedisStreamDelivery {
            entry_id: e.id,
            id,
            payload,
            attempt,
            fields: e.fields,
            conn: self.settle.clone(),
            shared: self.shared.clone(),
        }
    }

    async fn reconnect(&mut self) -> Result<(), BoxError> {
        let (read, settle) = connect(&self.client, self.cfg.block).await?;
        (self.read, self.settle, self.broken) = (read, settle, false);
        Ok(())
    }
}

impl Source for RedisStreamSource {
    type Delivery = RedisStreamDelivery;

    /// The next entry: a reclaimed one when a reclaim is due, else a new one. It never
    /// ends; a Redis error is returned (and the connections opened again next time).
    async fn next(&mut self) -> Option<Result<RedisStreamDelivery, BoxError>> {
        loop {
            if let Some(d) = self.ready.pop_front() {
                return Some(Ok(d));
            }
            if self.broken
                && let Err(e) = self.reconnect().await
            {
                return Some(Err(e));
            }
            let got = if Instant::now() >= self.next_claim {
                self.reclaim().await
            } else {
                self.read_new().await
            };
            if let Err(e) = got {
                self.broken = true;
                return Some(Err(e));
            }
        }
    }

    fn redelivery_horizon(&self) -> Horizon {
        match self.cfg.max_deliveries {
            Some(n) => Horizon::Bounded(
                (self.cfg.min_idle + self.cfg.claim_every).saturating_mul(n.saturating_add(1)),
            ),
            None => Horizon::Unbounded,
        }
    }
}

/// One entry, as read.
struct Entry {
    id: String,
    fields: Vec<(String, Bytes)>,
}

fn millis(d: Duration) -> u64 {
    d.as_millis().min(u64::MAX as u128) as u64
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

fn bytes_of(v: Value) -> Bytes {
    match v {
        Value::BulkString(b) => Bytes::from(b),
        Value::SimpleString(s) => Bytes::from(s),
        Value::Int(n) => Bytes::from(n.to_string()),
        _ => Bytes::new(),
    }
}

/// `[[id, [field, value, …]], …]` (a deleted entry has no fields).
fn entries(v: Value) -> Result<Vec<Entry>, BoxError> {
    let Value::Array(items) = v else {
        return Err("stream entries: an unexpected reply".into());
    };
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        let Value::Array(mut pair) = item else {
            continue;
        };
        if pair.len() != 2 {
            continue;
        }
        let fields = pair.pop().unwrap_or(Value::Nil);
        let Some(id) = text(&pair[0]) else { continue };
        let fields = match fields {
            Value::Array(flat) => {
                let mut it = flat.into_iter();
                let mut kv = Vec::new();
                while let (Some(k), Some(v)) = (it.next(), it.next()) {
                    kv.push((text(&k).unwrap_or_default(), bytes_of(v)));
                }
                kv
            }
            Value::Map(map) => map
                .into_iter()
                .map(|(k, v)| (text(&k).unwrap_or_default(), bytes_of(v)))
                .collect(),
            _ => Vec::new(),
        };
        out.push(Entry { id, fields });
    }
    Ok(out)
}

/// `(id, times delivered)` from one `XPENDING <id> <id> 1` reply.
fn delivery_count(v: &Value) -> Option<(String, u32)> {
    let Value::Array(rows) = v else { return None };
    let Value::Array(row) = rows.first()? else {
        return None;
    };
    let id = text(row.first()?)?;
    let n = match row.get(3)? {
        Value::Int(n) => *n,
        other => text(other)?.parse().ok()?,
    };
    Some((id, u32::try_from(n).unwrap_or(u32::MAX).max(1)))
}

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
    entry_id: String,
    id: Option<String>,
    payload: Bytes,
    attempt: u32,
    fields: Vec<(String, Bytes)>,
    conn: MultiplexedConnection,
    shared: Arc<Shared>,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_parse_flat_fields_and_deleted_entries() {
        let b = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let reply = Value::Array(vec![
            Value::Array(vec![
                b("1-0"),
                Value::Array(vec![b("message_id"), b("m1"), b("amount"), b("5")]),
            ]),
            Value::Array(vec![b("2-0"), Value::Nil]),
        ]);
        let got = entries(reply).expect("parses");
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].id, "1-0");
        assert_eq!(got[0].fields[1], ("amount".into(), Bytes::from("5")));
        assert!(got[1].fields.is_empty());
        let pending = Value::Array(vec![Value::Array(vec![
            b("1-0"),
            b("c1"),
            Value::Int(1200),
            Value::Int(3),
        ])]);
        assert_eq!(delivery_count(&pending), Some(("1-0".into(), 3)));
    }
}
