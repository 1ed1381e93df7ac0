//! The recovery index (see [`crate::store::recovery`]): one sorted set per namespace,
//! `{prefix}{namespace}:recover`, of record names scored by when each call may be
//! abandoned (its lease deadline; 0 once a dropped call gave it back; a score no clock
//! reaches once parked). A recoverable call's arguments, attempts and parking error are
//! fields of its journal (`0xFE`, `0xFD`, `0xFC`: never step names), so they live and
//! die with it. The scripts that claim, complete and release keep the index, in the
//! same round trip; a call without `recover` only ever has its record's name removed
//! from it by a completion, which finds nothing.
//!
//! Renewals leave the index alone: a score is the earliest the call may be abandoned,
//! and [`take`](RecoveryStore::take) moves a call still held to its real deadline.
//!
//! On a Cluster a script may only touch keys of its record's slot, so the index is split
//! by slot: `{prefix}{namespace}:recover:{<tag>}`, where the tag is a short string that
//! hashes to the record's slot (one per slot, found once per process). Keys are not
//! pinned: each record stays in its own slot, and its index beside it. A recoverer walks
//! the slots' indexes a window at a time, resuming where the last sweep stopped (the
//! cursor of [`due`](RecoveryStore::due)), so one sweep asks at most a window's worth of
//! slots, and the whole ring is covered every `16384 / WINDOW` sweeps.

use std::sync::LazyLock;
use std::time::Duration;

use bytes::Bytes;
use redis::{Script, Value};

use super::RedisStore;
use super::journal::STEPS;
use super::record::{ceil_millis, corrupt, evalsha};
use super::store_impl::GiveBack;
use crate::store::{BoxFuture, Due, Owner, RecoverableCall, RecoveryStore, Taken};
use crate::{Error, Key};

/// A row of `list.lua`: member, ms overdue, attempts, why parked, held (1) or not, steps.
type Row = (Vec<u8>, u64, u32, Option<String>, u8, u32);

/// The suffix of a namespace's recovery index after `{prefix}{namespace}`.
pub(super) const INDEX: &str = ":recover";

/// Redis Cluster's hash slots.
const SLOTS: u16 = 16384;
/// Slots a recoverer's sweep looks at on a Cluster (the whole ring in 16 sweeps).
const WINDOW: u16 = 1024;

/// The Cluster slot of `key`'s record: CRC16 of its hash tag, the digest's hex.
fn slot_of(key: &Key) -> u16 {
    slot_of_tag(super::record::hex32(key.digest()).as_str())
}

fn slot_of_tag(tag: &str) -> u16 {
    #[cfg(feature = "redis-cluster")]
    return crc16::State::<crc16::XMODEM>::calculate(tag.as_bytes()) % SLOTS;
    // Without Cluster support there is no Cluster to ask about.
    #[cfg(not(feature = "redis-cluster"))]
    {
        let _ = tag;
        0
    }
}

/// For each slot, a short tag that hashes to it: the first decimal number that does.
fn slot_tags() -> &'static [String] {
    static TAGS: LazyLock<Vec<String>> = LazyLock::new(|| {
        let mut tags = vec![String::new(); usize::from(SLOTS)];
        let mut left = usize::from(SLOTS);
        // Bounded: every slot is hit well before (about 170,000 numbers suffice).
        for n in 0u32..10_000_000 {
            let tag = n.to_string();
            let t = &mut tags[usize::from(slot_of_tag(&tag))];
            if t.is_empty() {
                *t = tag;
                left -= 1;
                if left == 0 {
                    break;
                }
            }
        }
        tags
    });
    &TAGS
}

static TAKE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("scripts/take.lua")));
static PARK: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("scripts/park.lua")));
static DUE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("scripts/due.lua")));
static LIST: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("scripts/list.lua")));

impl RedisStore {
    /// The recovery index of `namespace`.
    pub(super) fn index_name(&self, namespace: &str) -> String {
        let mut s = String::with_capacity(self.inner.prefix.len() + namespace.len() + INDEX.len());
        s.push_str(&self.inner.prefix);
        s.push_str(namespace);
        s.push_str(INDEX);
        s
    }

    /// The recovery index `key`'s scripts keep: the namespace's, or on a Cluster the one
    /// of the record's slot.
    pub(super) fn index_of(&self, key: &Key) -> String {
        if self.is_cluster() {
            return self.slot_index(key.namespace(), slot_of(key));
        }
        self.index_name(key.namespace())
    }

    /// `namespace`'s recovery index in Cluster slot `slot`.
    fn slot_index(&self, namespace: &str, slot: u16) -> String {
        let mut s = self.index_name(namespace);
        s.push_str(":{");
        s.push_str(&slot_tags()[usize::from(slot)]);
        s.push('}');
        s
    }

    /// The indexes a call of `due` or `list` reads, from slot `cursor` on (at most
    /// `window` slots, wrapping), and the cursor after them: the namespace's one index
    /// off a Cluster.
    fn indexes(&self, namespace: &str, cursor: u64, window: u16) -> (Vec<String>, u64) {
        if !self.is_cluster() {
            return (vec![self.index_name(namespace)], 0);
        }
        let start = u16::try_from(cursor % u64::from(SLOTS)).unwrap_or(0);
        let end = start.saturating_add(window).min(SLOTS);
        let names = (start..end)
            .map(|s| self.slot_index(namespace, s))
            .collect();
        (names, u64::from(end % SLOTS))
    }

    /// Record-and-journal and index names of `key`, the script's three keys.
    fn three(&self, key: &Key) -> (String, String) {
        (self.name_with(key, STEPS), self.index_of(key))
    }

    /// The scope and digest of a record name in `namespace`'s index.
    fn parse_member(&self, namespace: &str, member: &[u8]) -> Option<Due> {
        let s = std::str::from_utf8(member).ok()?;
        let rest = s
            .strip_prefix(self.inner.prefix.as_str())?
            .strip_prefix(namespace)?
            .strip_prefix(':')?;
        // `{scope}:{<32 hex digits>}`
        let (scope, tag) = rest.split_at_checked(rest.len().checked_sub(35)?)?;
        let hex = tag.strip_prefix(":{")?.strip_suffix('}')?;
        let mut digest = [0u8; 16];
        for (i, d) in digest.iter_mut().enumerate() {
            *d = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(Due::new(scope, digest))
    }
}

impl RecoveryStore for RedisStore {
    fn settle<'a>(
        &'a self,
        key: &'a Key,
        owner: Owner,
        settle: Option<(Bytes, Duration)>,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        // The completion and release scripts, told the call is recoverable, keep the index.
        match settle {
            Some((value, ttl)) => Box::pin(self.finish(key, owner, value, ttl, true)),
            None => Box::pin(self.give_back(key, owner, GiveBack::Released)),
        }
    }

    fn abandon<'a>(&'a self, key: &'a Key, owner: Owner) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.give_back(key, owner, GiveBack::Abandoned))
    }

    fn due<'a>(
        &'a self,
        namespace: &'a str,
        limit: usize,
        cursor: u64,
    ) -> BoxFuture<'a, Result<(Vec<Due>, u64), Error>> {
        Box::pin(async move {
            let (indexes, next) = self.indexes(namespace, cursor, WINDOW);
            // A Cluster's slots are asked all at once: the multiplexed connections carry
            // the scripts side by side, each to its slot's node.
            let asked = indexes.into_iter().map(|index| async move {
                let mut cmd = evalsha(&DUE, 1);
                cmd.arg(index).arg(limit);
                let members: Vec<Vec<u8>> =
                    redis::from_redis_value(self.eval(&DUE, cmd).await?).map_err(Error::store)?;
                Ok::<_, Error>(members)
            });
            let mut due = Vec::new();
            for members in futures_util::future::join_all(asked).await {
                due.extend(
                    members?
                        .iter()
                        .filter_map(|m| self.parse_member(namespace, m)),
                );
            }
            due.truncate(limit);
            Ok((due, next))
        })
    }

    fn take<'a>(
        &'a self,
        key: &'a Key,
        backoff: Duration,
    ) -> BoxFuture<'a, Result<Option<Taken>, Error>> {
        Box::pin(async move {
            let (names, index) = self.three(key);
            let mut cmd = evalsha(&TAKE, 3);
            cmd.arg(&names[..names.len() - STEPS.len()])
                .arg(&names)
                .arg(&index)
                .arg(ceil_millis(backoff));
            match self.eval(&TAKE, cmd).await? {
                Value::Nil => Ok(None),
                Value::Array(items) => match <[Value; 2]>::try_from(items) {
                    Ok([Value::BulkString(args), Value::Int(n)]) => Ok(Some(Taken::new(
                        args.into(),
                        u32::try_from(n).unwrap_or(u32::MAX),
                    ))),
                    other => Err(corrupt(key, format!("unexpected take reply {other:?}"))),
                },
                other => Err(corrupt(key, format!("unexpected take reply {other:?}"))),
            }
        })
    }

    fn park<'a>(&'a self, key: &'a Key, error: &'a str) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            let (names, index) = self.three(key);
            let mut cmd = evalsha(&PARK, 3);
            cmd.arg(&names[..names.len() - STEPS.len()])
                .arg(&names)
                .arg(&index)
                .arg(error);
            self.eval_bool(key, &PARK, cmd).await
        })
    }

    fn call<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Option<RecoverableCall>, Error>> {
        Box::pin(async move {
            let rec = self.record_name(key);
            let index = self.index_of(key);
            Ok(self
                .rows(&index, key.namespace(), 1, Some(&rec))
                .await?
                .pop())
        })
    }

    fn list<'a>(
        &'a self,
        namespace: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<RecoverableCall>, Error>> {
        Box::pin(async move {
            let Some(namespace) = namespace else {
                return Err(Error::Unsupported(
                    "listing recoverable calls on Redis needs a namespace",
                ));
            };
            // Every slot's index on a Cluster, a window at a time, each window's slots
            // asked side by side.
            let mut calls = Vec::new();
            let mut cursor = 0;
            loop {
                let (indexes, next) = self.indexes(namespace, cursor, WINDOW);
                let asked = indexes
                    .iter()
                    .map(|index| self.rows(index, namespace, limit, None));
                for rows in futures_util::future::join_all(asked).await {
                    calls.extend(rows?);
                }
                if next == 0 || calls.len() >= limit {
                    break;
                }
                cursor = next;
            }
            calls.truncate(limit);
            Ok(calls)
        })
    }
}

impl RedisStore {
    /// `list.lua`'s rows as calls: the first `limit` of `index` (of `namespace`), or the
    /// one named `only`.
    async fn rows(
        &self,
        index: &str,
        namespace: &str,
        limit: usize,
        only: Option<&str>,
    ) -> Result<Vec<RecoverableCall>, Error> {
        let mut cmd = evalsha(&LIST, 1);
        cmd.arg(index).arg(limit).arg(STEPS).arg(only);
        let rows: Vec<Row> =
            redis::from_redis_value(self.eval(&LIST, cmd).await?).map_err(Error::store)?;
        Ok(rows
            .into_iter()
            .filter_map(|(member, overdue, attempts, parked, held, steps)| {
                let due = self.parse_member(namespace, &member)?;
                Some(RecoverableCall {
                    namespace: namespace.to_owned(),
                    scope: due.scope,
                    digest: due.digest,
                    attempts,
                    parked,
                    overdue: Duration::from_millis(overdue),
                    abandoned: held == 0,
                    steps,
                })
            })
            .collect())
    }
}
