//! The raw writes the steps are priced against: the same store, the same connections,
//! the journal's shape, no owner check.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use bytes::Bytes;
use idem_runtime::store::JournalEntry;
use idem_runtime::store::redis::redis;
use idem_runtime::store::sql::sqlx;
use idem_runtime::{Key, RedisStore};

use super::TTL;
use crate::work::{BenchError, Receipt};

/// Where a body's raw writes go: the same store as the steps, in the journal's shape.
#[derive(Clone)]
pub(super) enum Raw {
    Memory(Arc<RawMap>),
    Redis(RedisStore),
    Postgres(sqlx::PgPool),
}

/// SqlStore's step write (`WRITE_STEP` in its postgres/journal.rs) without its checks:
/// it numbers the step and sets the journal's expiry on the record's row, and inserts
/// (or replaces) the step's row in `idem_steps`, stamped with the database's clock, in
/// one statement, whoever holds the record and whatever its state or lease, and without
/// dropping an older journal's rows.
const PG_RAW_WRITE: &str = "\
WITH t AS (SELECT (extract(epoch from now()) * 1000000)::int8 AS now),
upd AS (
    UPDATE idem_records r SET steps_n = r.steps_n + 1, steps_expires_us = t.now + $4
    FROM t WHERE r.id = $1
    RETURNING r.id, r.steps_n
)
INSERT INTO idem_steps AS s (id, name_id, seq, at_us, entry)
SELECT upd.id, $2, upd.steps_n, t.now, $3 FROM upd, t
ON CONFLICT (id, name_id) DO UPDATE SET
    seq = EXCLUDED.seq, at_us = EXCLUDED.at_us, entry = EXCLUDED.entry";

impl Raw {
    /// One owner-less write of step `name`'s `value` beside `key`'s record.
    pub(super) async fn write(
        &self,
        key: &Key,
        name: &str,
        value: &Receipt,
    ) -> Result<(), BenchError> {
        let json = serde_json::to_vec(value).map_err(|e| BenchError::of("serialize", e))?;
        match self {
            Raw::Memory(map) => {
                map.write(key, name, Bytes::from(json));
                Ok(())
            }
            Raw::Redis(store) => {
                // The journal's entry (`d`, 15 digits of milliseconds, the value), in the
                // journal's own hash, which the completion deletes as it does a journal.
                let ms = SystemTime::now()
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis());
                let mut entry = format!("d{ms:015}").into_bytes();
                entry.extend_from_slice(&json);
                let mut hset = redis::cmd("HSET");
                hset.arg(format!("{}:steps", store.record_name(key)))
                    .arg(name)
                    .arg(entry);
                store
                    .command::<redis::Value>(&hset)
                    .await
                    .map(drop)
                    .map_err(|e| BenchError::of("raw HSET", e))
            }
            Raw::Postgres(pool) => {
                // The journal's entry as SqlStore sends it: kind, name length (u16 BE),
                // name, value length (u32 BE), value.
                let mut entry = Vec::with_capacity(7 + name.len() + json.len());
                entry.push(b'd');
                entry.extend_from_slice(&(name.len() as u16).to_be_bytes());
                entry.extend_from_slice(name.as_bytes());
                entry.extend_from_slice(&(json.len() as u32).to_be_bytes());
                entry.extend_from_slice(&json);
                // The step's row key as SqlStore makes it: 16 bytes of BLAKE3 of the name.
                let name_id = blake3::hash(name.as_bytes());
                let done = sqlx::query(PG_RAW_WRITE)
                    .bind(&key.digest()[..])
                    .bind(&name_id.as_bytes()[..16])
                    .bind(entry)
                    .bind(TTL.as_micros() as i64)
                    .execute(pool)
                    .await
                    .map_err(|e| BenchError::of("raw step write", e))?;
                if done.rows_affected() == 1 {
                    Ok(())
                } else {
                    Err(BenchError(format!(
                        "the raw step write found no record row for call {key}"
                    )))
                }
            }
        }
    }

    /// At the end of a raw body, timed: the in-process entries of `key` are dropped, as
    /// MemoryStore's completion drops a journal. On PostgreSQL idem's completion already
    /// deletes the raw rows (those up to the record's step counter) within the timed
    /// call. On Redis nothing is dropped here: a `DEL` would be a round trip a journal
    /// does not cost, and the run's cleanup removes the hashes.
    pub(super) fn done(&self, key: &Key) {
        if let Raw::Memory(map) = self {
            map.remove(key);
        }
    }

    /// Between slices, unmeasured: the in-process map is emptied, so a long run does not
    /// grow it without bound (MemoryStore's journals are dropped as their calls complete).
    pub(super) fn tidy(&self) {
        if let Raw::Memory(map) = self {
            map.clear();
        }
    }
}

/// MemoryStore's journal layout, without its owner check: as many shards, chosen from
/// the same digest bytes, each a map from the record's digest to its entries and expiry.
pub(super) struct RawMap {
    shards: Vec<Mutex<RawShard>>,
}

type RawShard = HashMap<[u8; 16], Box<RawSlot>, BuildHasherDefault<DigestHasher>>;

struct RawSlot {
    entries: Vec<JournalEntry>,
    expires_at: Instant,
}

/// MemoryStore's shard count.
const SHARDS: usize = 1024;

impl RawMap {
    pub(super) fn new() -> RawMap {
        RawMap {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
        }
    }

    /// The shard of `key`'s record, locked (chosen as MemoryStore chooses it).
    fn shard(&self, key: &Key) -> std::sync::MutexGuard<'_, RawShard> {
        let d = key.digest();
        let shard = &self.shards[usize::from(u16::from_le_bytes([d[14], d[15]])) % SHARDS];
        shard.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self, key: &Key, name: &str, value: Bytes) {
        let d = key.digest();
        let mut shard = self.shard(key);
        let entry = JournalEntry::new(name, Some(value), SystemTime::now());
        let expires_at = Instant::now() + TTL;
        let slot = shard.entry(*d).or_insert_with(|| {
            Box::new(RawSlot {
                entries: Vec::new(),
                expires_at,
            })
        });
        slot.expires_at = expires_at;
        match slot.entries.iter_mut().find(|e| e.name == name) {
            Some(e) => *e = entry,
            None => slot.entries.push(entry),
        }
    }

    fn remove(&self, key: &Key) {
        self.shard(key).remove(key.digest());
    }

    fn clear(&self) {
        for s in &self.shards {
            s.lock().unwrap_or_else(|p| p.into_inner()).clear();
        }
    }
}

/// Digests are uniform already: their first 8 bytes are the hash (as MemoryStore's maps).
#[derive(Default)]
struct DigestHasher(u64);

impl std::hash::Hasher for DigestHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for (i, b) in bytes.iter().take(8).enumerate() {
            self.0 |= u64::from(*b) << (8 * i);
        }
    }
}
