//! Reading: new entries with `XREADGROUP`, entries other consumers left pending taken
//! over with `XAUTOCLAIM` (and their delivery counts from `XPENDING`), the replies
//! parsed, and each entry made a delivery.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use idem_runtime::store::BoxError;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, Value};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::acks::acker;
use super::{RedisStreamConfig, RedisStreamDelivery, Shared, millis, settling};
use crate::{ConsumerError, Delivery, Horizon, Source};

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
