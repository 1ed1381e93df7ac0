//! The toolbox primitives on Redis: versioned values, state records and Bloom bitmaps,
//! each one Lua script (one round trip) beside the claim scripts.
//!
//! Layout: beside a key's claim record `R` = `{prefix}{namespace}:{scope}:{<digest>}`,
//! its versioned value is the hash `R:v` (`v` value, `n` version), its state record the
//! hash `R:s` (`s` state, `p`/`o`/`l` a held move's target, owner and lease deadline), and
//! a Bloom filter of `m` bits is a meta key `R:b:<m>` plus the bitmap cut in shards
//! `R:b:<m>:<n>` of at most [`SHARD_BITS`] bits. All share the digest as hash tag, so in
//! a Cluster each script touches one slot. The names carry the size: two processes
//! configured with different capacities use two filters rather than corrupt one (each
//! is still only a pre-filter, so both stay correct).
//!
//! Why shards: one 12 MB string is allocated in the allocator's next size class (12 MiB
//! for a 10,000,000-id filter at 1%, so `MEMORY USAGE` is over 12 MiB by its header) and
//! is a "big key" (slow to migrate between Cluster nodes, slow to delete). Shards of
//! 1 MiB minus 64 bytes each fill a 1 MiB class exactly, so the bitmap costs its size.
//! An insert touches at most `k` shards, named in its one script call.

use std::sync::LazyLock;
use std::time::Duration;

use bytes::Bytes;
use redis::{Cmd, Script, Value};

use super::RedisStore;
use super::record::corrupt;
use super::record::{ceil_millis, evalsha, owner_hex};
use super::reply::corrupt_from;
use crate::store::{
    BloomStore, BoxFuture, Owner, Settle, StateStore, TransitionOutcome, TransitionRequest,
    VersionedBytes, VersionedStore,
};
use crate::{Error, Key};

static VERSIONED_LOAD: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/versioned_load.lua")));
static VERSIONED_CAS: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/versioned_cas.lua")));
static TRANSITION: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/transition.lua")));
static SETTLE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("scripts/settle.lua")));
static STATE_LOAD: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/state_load.lua")));
static BLOOM_CREATE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/bloom_create.lua")));
static BLOOM_INSERT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/bloom_insert.lua")));
static BLOOM_CONTAINS: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/bloom_contains.lua")));

/// Bits per bitmap shard: 1 MiB less 64 bytes (room for the string's header), so a
/// shard's allocation is exactly one 1 MiB size class.
pub(super) const SHARD_BITS: u64 = ((1 << 20) - 64) * 8;

/// `None` (no expiry) is 0 to the scripts; a ttl is at least 1 ms.
fn ttl_ms(ttl: Option<Duration>) -> u64 {
    ttl.map_or(0, ceil_millis)
}

fn int(key: &Key, v: Option<&Value>) -> Result<u64, Error> {
    match v {
        Some(Value::Int(n)) => u64::try_from(*n).map_err(|_| corrupt(key, "negative number")),
        Some(Value::BulkString(b)) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| corrupt(key, "not a number")),
        other => Err(corrupt(key, format!("expected a number, got {other:?}"))),
    }
}

fn text(key: &Key, v: Option<Value>) -> Result<Option<String>, Error> {
    match v {
        None | Some(Value::Nil) => Ok(None),
        Some(Value::BulkString(b)) => String::from_utf8(b)
            .map(Some)
            .map_err(|_| corrupt(key, "a state name is not UTF-8")),
        Some(other) => Err(corrupt(key, format!("expected a state, got {other:?}"))),
    }
}

/// Splits a `{tag, ...}` reply; a `{0, reason}` reply is the script's corrupt-record report.
fn tagged(key: &Key, reply: Value) -> Result<(i64, Vec<Value>), Error> {
    let Value::Array(items) = reply else {
        return Err(corrupt(key, format!("unexpected reply {reply:?}")));
    };
    let mut items = items.into_iter();
    match items.next() {
        Some(Value::Int(0)) => match items.next() {
            Some(Value::BulkString(why)) => Err(corrupt(key, String::from_utf8_lossy(&why))),
            other => Err(corrupt(key, format!("unexpected reply {other:?}"))),
        },
        Some(Value::Int(tag)) => Ok((tag, items.collect())),
        other => Err(corrupt(key, format!("unexpected reply {other:?}"))),
    }
}

fn parse_transition(key: &Key, reply: Value) -> Result<TransitionOutcome, Error> {
    let (tag, rest) = tagged(key, reply)?;
    let mut rest = rest.into_iter();
    Ok(match tag {
        1 => TransitionOutcome::Moved {
            from: text(key, rest.next())?,
        },
        2 => TransitionOutcome::Held {
            from: text(key, rest.next())?,
        },
        3 => TransitionOutcome::Already,
        4 => {
            let to = text(key, rest.next())?
                .ok_or_else(|| corrupt(key, "held move without a target"))?;
            let retry_in = Duration::from_millis(int(key, rest.next().as_ref())?);
            TransitionOutcome::Pending { to, retry_in }
        }
        5 => TransitionOutcome::Refused {
            current: text(key, rest.next())?,
        },
        other => return Err(corrupt(key, format!("unexpected reply tag {other}"))),
    })
}

impl RedisStore {
    pub(super) async fn tb_load_versioned(
        &self,
        key: &Key,
    ) -> Result<Option<VersionedBytes>, Error> {
        let mut cmd = evalsha(&VERSIONED_LOAD, 1);
        cmd.arg(format!("{}:v", self.record_name(key)));
        let (tag, rest) = tagged(key, self.eval(&VERSIONED_LOAD, cmd).await?)?;
        let mut rest = rest.into_iter();
        match (tag, rest.next()) {
            (2, _) => Ok(None),
            (1, Some(Value::BulkString(v))) => Ok(Some(VersionedBytes::new(
                Bytes::from(v),
                int(key, rest.next().as_ref())?,
            ))),
            (tag, v) => Err(corrupt(key, format!("unexpected reply {tag} {v:?}"))),
        }
    }

    pub(super) async fn tb_compare_and_set(
        &self,
        key: &Key,
        expected: u64,
        value: Bytes,
        ttl: Option<Duration>,
    ) -> Result<Option<u64>, Error> {
        let mut cmd = evalsha(&VERSIONED_CAS, 1);
        cmd.arg(format!("{}:v", self.record_name(key)))
            .arg(expected)
            .arg(value.as_ref())
            .arg(ttl_ms(ttl));
        let (tag, rest) = tagged(key, self.eval(&VERSIONED_CAS, cmd).await?)?;
        match tag {
            1 => Ok(Some(int(key, rest.first())?)),
            2 => Ok(None),
            other => Err(corrupt(key, format!("unexpected reply tag {other}"))),
        }
    }

    pub(super) async fn tb_transition(
        &self,
        key: &Key,
        req: &TransitionRequest<'_>,
    ) -> Result<TransitionOutcome, Error> {
        let mut cmd = evalsha(&TRANSITION, 1);
        let (owner, lease) = match req.hold {
            Some((o, lease)) => (Some(owner_hex(o)), ceil_millis(lease)),
            None => (None, 0),
        };
        cmd.arg(format!("{}:s", self.record_name(key)))
            .arg(req.to)
            .arg(if req.from_absent { "1" } else { "0" })
            .arg(owner.as_ref().map_or(&b""[..], |o| &o[..]))
            .arg(lease)
            .arg(ttl_ms(req.ttl));
        for from in req.from {
            cmd.arg(*from);
        }
        parse_transition(key, self.eval(&TRANSITION, cmd).await?)
    }

    pub(super) async fn tb_settle_transition(
        &self,
        key: &Key,
        owner: Owner,
        action: Settle,
    ) -> Result<bool, Error> {
        let (code, ms) = match action {
            Settle::Commit { ttl } => ("c", ttl_ms(ttl)),
            Settle::Abort => ("a", 0),
            Settle::Renew(lease) => ("r", ceil_millis(lease)),
        };
        let mut cmd = evalsha(&SETTLE, 1);
        cmd.arg(format!("{}:s", self.record_name(key)))
            .arg(&owner_hex(owner)[..])
            .arg(code)
            .arg(ms);
        self.eval_bool(key, &SETTLE, cmd).await
    }

    pub(super) async fn tb_load_state(&self, key: &Key) -> Result<Option<String>, Error> {
        let mut cmd = evalsha(&STATE_LOAD, 1);
        cmd.arg(format!("{}:s", self.record_name(key)));
        let (tag, rest) = tagged(key, self.eval(&STATE_LOAD, cmd).await?)?;
        match tag {
            1 => text(key, rest.into_iter().next()),
            2 => Ok(None),
            other => Err(corrupt(key, format!("unexpected reply tag {other}"))),
        }
    }

    /// The name of the meta key of `filter`'s bitmap of `size_bits` bits; shard `n` is
    /// this name followed by `:n`.
    ///
    /// ```
    /// use idem_runtime::{Idem, RedisStore};
    /// use idem_runtime::toolbox::BloomFilter;
    /// # fn main() -> Result<(), idem_runtime::Error> {
    /// let store = RedisStore::connect("redis://127.0.0.1:6379")?;
    /// let idem = Idem::builder().store(store.clone()).namespace("shop").build();
    /// let seen = BloomFilter::new(&idem, "events", 1_000, 0.01)?;
    /// let name = store.bloom_name(seen.key(), seen.size_bits());
    /// assert!(name.starts_with("idem:shop:idem::bloom:{") && name.ends_with(":b:9586"));
    /// # Ok(()) }
    /// ```
    pub fn bloom_name(&self, filter: &Key, size_bits: u64) -> String {
        format!("{}:b:{size_bits}", self.record_name(filter))
    }

    /// `EVALSHA` of `script` on the meta key and the shards touched by `indexes`, then
    /// the (key, offset) pairs.
    fn bloom_command(
        &self,
        script: &Script,
        filter: &Key,
        indexes: &[u64],
        size_bits: u64,
    ) -> Result<Cmd, Error> {
        check_bits(indexes, size_bits)?;
        let meta = self.bloom_name(filter, size_bits);
        let mut shards: Vec<u64> = Vec::with_capacity(indexes.len());
        let mut pairs: Vec<(usize, u64)> = Vec::with_capacity(indexes.len());
        for &i in indexes {
            let shard = i / SHARD_BITS;
            let slot = shards.iter().position(|&s| s == shard).unwrap_or_else(|| {
                shards.push(shard);
                shards.len() - 1
            });
            // KEYS[1] is the meta key: shard keys start at KEYS[2].
            pairs.push((slot + 2, i % SHARD_BITS));
        }
        let mut cmd = evalsha(script, 1 + shards.len());
        cmd.arg(&meta);
        for shard in &shards {
            cmd.arg(format!("{meta}:{shard}"));
        }
        for (slot, offset) in pairs {
            cmd.arg(slot).arg(offset);
        }
        Ok(cmd)
    }

    /// Creates the filter's meta key and all its shards, empty, with one deadline.
    async fn bloom_create(
        &self,
        filter: &Key,
        size_bits: u64,
        ttl: Option<Duration>,
    ) -> Result<(), Error> {
        let meta = self.bloom_name(filter, size_bits);
        let shards = size_bits.div_ceil(SHARD_BITS);
        let mut cmd = evalsha(&BLOOM_CREATE, 1 + usize::try_from(shards).unwrap_or(0));
        cmd.arg(&meta);
        for shard in 0..shards {
            cmd.arg(format!("{meta}:{shard}"));
        }
        cmd.arg(ttl_ms(ttl)).arg(size_bits);
        for shard in 0..shards {
            cmd.arg((size_bits - shard * SHARD_BITS).min(SHARD_BITS));
        }
        match self.eval(&BLOOM_CREATE, cmd).await? {
            Value::Int(_) => Ok(()),
            other => Err(corrupt(filter, format!("unexpected reply {other:?}"))),
        }
    }

    pub(super) async fn tb_bloom_insert(
        &self,
        filter: &Key,
        indexes: &[u64],
        size_bits: u64,
        ttl: Option<Duration>,
    ) -> Result<bool, Error> {
        // A missing filter is created once, then the insert runs again; a filter that
        // vanishes again at once (ttl shorter than a round trip) is reported, not looped.
        for _ in 0..2 {
            let cmd = self.bloom_command(&BLOOM_INSERT, filter, indexes, size_bits)?;
            match self.eval(&BLOOM_INSERT, cmd).await? {
                Value::Int(-1) => self.bloom_create(filter, size_bits, ttl).await?,
                Value::Int(n) => return Ok(n == 1),
                Value::Array(items) => return Err(corrupt_from(filter, &items)),
                other => return Err(corrupt(filter, format!("unexpected reply {other:?}"))),
            }
        }
        Err(Error::Config(format!(
            "Bloom filter {filter} expired while it was created; its ttl is too short"
        )))
    }

    pub(super) async fn tb_bloom_contains(
        &self,
        filter: &Key,
        indexes: &[u64],
        size_bits: u64,
    ) -> Result<bool, Error> {
        let cmd = self.bloom_command(&BLOOM_CONTAINS, filter, indexes, size_bits)?;
        self.eval_bool(filter, &BLOOM_CONTAINS, cmd).await
    }
}

fn check_bits(indexes: &[u64], size_bits: u64) -> Result<(), Error> {
    // Redis strings stop at 512 MiB = 2^32 bits.
    if size_bits == 0 || size_bits > 1 << 32 || indexes.iter().any(|&i| i >= size_bits) {
        return Err(Error::Config(format!(
            "a Bloom filter has 1 to 2^32 bits and indexes below its size (size {size_bits})"
        )));
    }
    Ok(())
}

impl VersionedStore for RedisStore {
    fn load_versioned<'a>(
        &'a self,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<Option<VersionedBytes>, Error>> {
        Box::pin(self.tb_load_versioned(key))
    }

    fn compare_and_set<'a>(
        &'a self,
        key: &'a Key,
        expected: u64,
        value: Bytes,
        ttl: Option<Duration>,
    ) -> BoxFuture<'a, Result<Option<u64>, Error>> {
        Box::pin(self.tb_compare_and_set(key, expected, value, ttl))
    }
}

impl StateStore for RedisStore {
    fn transition<'a>(
        &'a self,
        key: &'a Key,
        req: &'a TransitionRequest<'a>,
    ) -> BoxFuture<'a, Result<TransitionOutcome, Error>> {
        Box::pin(self.tb_transition(key, req))
    }

    fn settle_transition<'a>(
        &'a self,
        key: &'a Key,
        owner: Owner,
        action: Settle,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.tb_settle_transition(key, owner, action))
    }

    fn load_state<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Option<String>, Error>> {
        Box::pin(self.tb_load_state(key))
    }
}

impl BloomStore for RedisStore {
    fn bloom_insert<'a>(
        &'a self,
        filter: &'a Key,
        indexes: &'a [u64],
        size_bits: u64,
        ttl: Option<Duration>,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.tb_bloom_insert(filter, indexes, size_bits, ttl))
    }

    fn bloom_contains<'a>(
        &'a self,
        filter: &'a Key,
        indexes: &'a [u64],
        size_bits: u64,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.tb_bloom_contains(filter, indexes, size_bits))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_transition_replies_are_corrupt() {
        let key = Key::from_str("t", "s", "k");
        for v in [
            Value::Nil,
            Value::Int(1),
            Value::Array(vec![]),
            Value::Array(vec![Value::Int(9)]),
            Value::Array(vec![Value::Int(4), Value::Nil, Value::Int(1)]),
            Value::Array(vec![Value::Int(1), Value::Int(3)]),
            Value::Array(vec![Value::Int(0), Value::BulkString(b"bad".to_vec())]),
        ] {
            assert!(
                matches!(
                    parse_transition(&key, v.clone()),
                    Err(Error::Corrupt { .. })
                ),
                "{v:?}"
            );
        }
        assert_eq!(
            parse_transition(&key, Value::Array(vec![Value::Int(1), Value::Nil])).unwrap(),
            TransitionOutcome::Moved { from: None }
        );
        assert_eq!(
            parse_transition(
                &key,
                Value::Array(vec![
                    Value::Int(4),
                    Value::BulkString(b"paid".to_vec()),
                    Value::Int(20)
                ])
            )
            .unwrap(),
            TransitionOutcome::Pending {
                to: "paid".into(),
                retry_in: Duration::from_millis(20)
            }
        );
    }
}
