//! The toolbox primitives of [`MemoryStore`](super::MemoryStore): versioned values and
//! state records, each in maps of their own beside the claim records. (Its Bloom bitmaps
//! are the in-process ones every store may use: `store::local_blooms`.)
//!
//! Same rules as the claim records: every primitive is one critical section on one
//! shard (a `std` mutex never held across an `.await`), time is tokio's monotonic clock,
//! and expired records are dropped when touched and swept as a shard doubles.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use super::{DigestHasher, ready};
use crate::store::{
    BoxFuture, Owner, Settle, StateStore, TransitionOutcome, TransitionRequest, VersionedBytes,
    VersionedStore,
};
use crate::{Error, Key};

const SHARDS: usize = 16;
const MIN_SWEEP: usize = 256;
/// Versioned values, sharded like the claim records.
pub(super) struct Values(Box<[Mutex<TimedMap<ValueEntry>>]>);

/// State records, sharded like the claim records.
pub(super) struct States(Box<[Mutex<TimedMap<StateEntry>>]>);

struct ValueEntry {
    value: Bytes,
    version: u64,
}

struct StateEntry {
    /// `None` only while a move out of "no record" is held.
    state: Option<String>,
    pending: Option<Pending>,
}

struct Pending {
    to: String,
    owner: Owner,
    lease_until: Instant,
}

/// A map of records that may expire, swept when it has doubled since the last sweep.
struct TimedMap<V> {
    map: HashMap<[u8; 16], (V, Option<Instant>), BuildHasherDefault<DigestHasher>>,
    swept_at: usize,
}

impl<V> Default for TimedMap<V> {
    fn default() -> Self {
        TimedMap {
            map: HashMap::default(),
            swept_at: 0,
        }
    }
}

impl<V> TimedMap<V> {
    /// The live record under `key`; an expired one is dropped here.
    fn live(&mut self, key: &Key, now: Instant) -> Option<&mut (V, Option<Instant>)> {
        let d = key.digest();
        if self
            .map
            .get(d)
            .is_some_and(|(_, exp)| exp.is_some_and(|e| e <= now))
        {
            self.map.remove(d);
        }
        self.map.get_mut(d)
    }

    fn insert(&mut self, key: &Key, v: V, expires_at: Option<Instant>, now: Instant) {
        self.map.insert(*key.digest(), (v, expires_at));
        if self.map.len() >= MIN_SWEEP.max(self.swept_at * 2) {
            self.map.retain(|_, (_, exp)| exp.is_none_or(|e| e > now));
            self.swept_at = self.map.len();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // No code path panics while holding these locks; recover rather than propagate poison.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn shard<'s, V>(shards: &'s [Mutex<TimedMap<V>>], key: &Key) -> MutexGuard<'s, TimedMap<V>> {
    // Byte 14, not 15 (the claim shards' byte), is as uniform and keeps the two
    // shardings independent.
    lock(&shards[usize::from(key.digest()[14]) % SHARDS])
}

impl Default for Values {
    fn default() -> Self {
        Values((0..SHARDS).map(|_| Mutex::default()).collect())
    }
}

impl Default for States {
    fn default() -> Self {
        States((0..SHARDS).map(|_| Mutex::default()).collect())
    }
}

impl Values {
    fn load(&self, key: &Key) -> Option<VersionedBytes> {
        let now = Instant::now();
        let mut s = shard(&self.0, key);
        s.live(key, now)
            .map(|(e, _)| VersionedBytes::new(e.value.clone(), e.version))
    }

    fn set(&self, key: &Key, expected: u64, value: Bytes, ttl: Option<Duration>) -> Option<u64> {
        let now = Instant::now();
        let mut s = shard(&self.0, key);
        let current = s.live(key, now).map_or(0, |(e, _)| e.version);
        if current != expected {
            return None;
        }
        let version = expected + 1;
        s.insert(
            key,
            ValueEntry { value, version },
            ttl.map(|t| now + t),
            now,
        );
        Some(version)
    }
}

impl States {
    fn move_to(&self, key: &Key, req: &TransitionRequest<'_>) -> TransitionOutcome {
        let now = Instant::now();
        let mut s = shard(&self.0, key);
        let (current, pending) = match s.live(key, now) {
            Some((e, _)) => (e.state.clone(), e.pending.as_ref()),
            None => (None, None),
        };
        if current.as_deref() == Some(req.to) {
            return TransitionOutcome::Already;
        }
        if let Some(p) = pending.filter(|p| p.lease_until > now) {
            return TransitionOutcome::Pending {
                to: p.to.clone(),
                retry_in: p.lease_until - now,
            };
        }
        if !req.allows(current.as_deref()) {
            return TransitionOutcome::Refused { current };
        }
        match req.hold {
            None => {
                let entry = StateEntry {
                    state: Some(req.to.to_owned()),
                    pending: None,
                };
                s.insert(key, entry, req.ttl.map(|t| now + t), now);
                TransitionOutcome::Moved { from: current }
            }
            Some((owner, lease)) => {
                let lease_until = now + lease;
                let pending = Some(Pending {
                    to: req.to.to_owned(),
                    owner,
                    lease_until,
                });
                match s.live(key, now) {
                    Some((e, exp)) => {
                        e.pending = pending;
                        // The record outlives the hold, so a commit finds it.
                        *exp = exp.map(|x| x.max(lease_until));
                    }
                    None => {
                        let entry = StateEntry {
                            state: None,
                            pending,
                        };
                        s.insert(key, entry, Some(lease_until), now);
                    }
                }
                TransitionOutcome::Held { from: current }
            }
        }
    }

    fn settle(&self, key: &Key, owner: Owner, action: Settle) -> bool {
        let now = Instant::now();
        let mut s = shard(&self.0, key);
        let Some((e, exp)) = s.live(key, now) else {
            return false;
        };
        let Some(p) = e.pending.as_mut().filter(|p| p.owner == owner) else {
            return false;
        };
        match action {
            Settle::Commit { ttl } => {
                e.state = e.pending.take().map(|p| p.to);
                *exp = ttl.map(|t| now + t);
            }
            Settle::Abort => {
                e.pending = None;
                if e.state.is_none() {
                    // Nothing was ever entered: the key goes back to having no record.
                    s.map.remove(key.digest());
                }
            }
            Settle::Renew(lease) => {
                p.lease_until = now + lease;
                let until = p.lease_until;
                if e.state.is_none() {
                    *exp = Some(until);
                } else {
                    *exp = exp.map(|x| x.max(until));
                }
            }
        }
        true
    }

    fn load(&self, key: &Key) -> Option<String> {
        let now = Instant::now();
        let mut s = shard(&self.0, key);
        s.live(key, now).and_then(|(e, _)| e.state.clone())
    }
}

impl VersionedStore for Values {
    fn load_versioned<'a>(
        &'a self,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<Option<VersionedBytes>, Error>> {
        ready(self.load(key))
    }

    fn compare_and_set<'a>(
        &'a self,
        key: &'a Key,
        expected: u64,
        value: Bytes,
        ttl: Option<Duration>,
    ) -> BoxFuture<'a, Result<Option<u64>, Error>> {
        ready(self.set(key, expected, value, ttl))
    }
}

impl StateStore for States {
    fn transition<'a>(
        &'a self,
        key: &'a Key,
        req: &'a TransitionRequest<'a>,
    ) -> BoxFuture<'a, Result<TransitionOutcome, Error>> {
        ready(self.move_to(key, req))
    }

    fn settle_transition<'a>(
        &'a self,
        key: &'a Key,
        owner: Owner,
        action: Settle,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        ready(self.settle(key, owner, action))
    }

    fn load_state<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Option<String>, Error>> {
        ready(self.load(key))
    }
}
