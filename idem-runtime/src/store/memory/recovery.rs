//! The recovery index of [`MemoryStore`](super::MemoryStore): recoverable calls' arguments
//! in their record's shard, under the same lock, so a claim records them, and a
//! completion or a release drops them, in the critical section that changes the record
//! (see [`crate::store::recovery`] for the contract). Only recoverable calls have an
//! entry, so finding the due ones walks nothing else.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use super::{DigestHasher, MemoryStore, Shard, State, ready};
use crate::Error;
use crate::Key;
use crate::store::{BoxFuture, Due, Owner, Recover, RecoverableCall, RecoveryStore, Taken};

/// A shard's recoverable calls, by digest.
#[derive(Default)]
pub(super) struct Pending {
    map: HashMap<[u8; 16], Box<Call>, BuildHasherDefault<DigestHasher>>,
}

struct Call {
    key: Key,
    args: Bytes,
    attempts: u32,
    parked: Option<String>,
    /// When it may be abandoned: the lease deadline it was claimed (or taken) with.
    due: Instant,
    expires_at: Instant,
}

impl Pending {
    /// A recoverable claim of `key` was just made: records (or refreshes) its arguments.
    /// Attempts are kept (they count recoveries, not claims); a parked call taken by a
    /// caller is in flight again.
    pub(super) fn claimed(&mut self, key: &Key, recover: &Recover, due: Instant, now: Instant) {
        let expires_at = now + recover.ttl.max(due - now);
        match self.map.get_mut(key.digest()) {
            Some(call) if call.expires_at > now => {
                call.args = recover.args.clone();
                call.parked = None;
                call.due = due;
                call.expires_at = expires_at;
            }
            _ => {
                self.map.insert(
                    *key.digest(),
                    Box::new(Call {
                        key: *key,
                        args: recover.args.clone(),
                        attempts: 0,
                        parked: None,
                        due,
                        expires_at,
                    }),
                );
            }
        }
    }

    /// Completed or released after `Err`: never recovered.
    pub(super) fn finished(&mut self, key: &Key) {
        if !self.map.is_empty() {
            self.map.remove(key.digest());
        }
    }

    /// Abandoned by a dropped call: due now.
    pub(super) fn abandoned(&mut self, key: &Key, now: Instant) {
        if let Some(call) = self.map.get_mut(key.digest()) {
            call.due = now;
        }
    }

    pub(super) fn sweep(&mut self, now: Instant) {
        if !self.map.is_empty() {
            self.map.retain(|_, c| c.expires_at > now);
        }
    }
}

impl MemoryStore {
    fn take_now(&self, key: &Key, backoff: Duration) -> Option<Taken> {
        let now = Instant::now();
        let mut shard = self.shard(key);
        let held = match shard.live(key, now).map(|e| &e.state) {
            Some(State::InProgress { lease_until, .. }) if *lease_until > now => Some(*lease_until),
            Some(State::Completed { .. }) => {
                shard.pending.finished(key);
                return None;
            }
            _ => None,
        };
        let call = shard.pending.map.get_mut(key.digest())?;
        if call.expires_at <= now || call.parked.is_some() {
            return None;
        }
        if let Some(until) = held {
            call.due = until;
            return None;
        }
        call.attempts += 1;
        call.due = now + backoff;
        Some(Taken::new(call.args.clone(), call.attempts))
    }

    fn abandon_now(&self, key: &Key, owner: Owner) -> bool {
        self.give_back(key, owner, true)
    }

    fn park_now(&self, key: &Key, error: &str) -> bool {
        let now = Instant::now();
        let mut shard = self.shard(key);
        match shard.pending.map.get_mut(key.digest()) {
            Some(call) if call.expires_at > now => {
                call.parked = Some(error.to_owned());
                true
            }
            _ => false,
        }
    }

    fn calls(
        &self,
        now: Instant,
        mut keep: impl FnMut(&Call) -> bool,
    ) -> Vec<(Key, RecoverableCall, Instant)> {
        let mut out = Vec::new();
        for shard in self.shards.iter() {
            let shard = super::lock(shard);
            for call in shard.pending.map.values() {
                if call.expires_at > now && keep(call) {
                    out.push((call.key, describe(&shard, call, now), call.due));
                }
            }
        }
        out.sort_by_key(|(_, _, due)| *due);
        out
    }
}

/// A recoverable call as operators see it.
fn describe(shard: &Shard, call: &Call, now: Instant) -> RecoverableCall {
    RecoverableCall {
        namespace: call.key.namespace().to_owned(),
        scope: call.key.scope().to_owned(),
        digest: *call.key.digest(),
        attempts: call.attempts,
        parked: call.parked.clone(),
        overdue: now.saturating_duration_since(call.due),
        abandoned: !matches!(
            shard.map.get(call.key.digest()).map(|e| &e.state),
            Some(State::InProgress { lease_until, .. }) if *lease_until > now
        ),
        steps: shard.journals.len_of(&call.key, now),
    }
}

impl RecoveryStore for MemoryStore {
    fn settle<'a>(
        &'a self,
        key: &'a Key,
        owner: Owner,
        settle: Option<(Bytes, Duration)>,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        // Completion and release drop the call's entry already.
        ready(match settle {
            Some((value, ttl)) => self.complete_now(key, owner, value, ttl),
            None => self.release_now(key, owner),
        })
    }

    fn abandon<'a>(&'a self, key: &'a Key, owner: Owner) -> BoxFuture<'a, Result<bool, Error>> {
        ready(self.abandon_now(key, owner))
    }

    fn due<'a>(
        &'a self,
        namespace: &'a str,
        limit: usize,
        _cursor: u64,
    ) -> BoxFuture<'a, Result<(Vec<Due>, u64), Error>> {
        let now = Instant::now();
        let due = self
            .calls(now, |c| {
                c.parked.is_none() && c.due <= now && c.key.namespace() == namespace
            })
            .into_iter()
            .take(limit)
            .map(|(key, _, _)| Due::new(key.scope(), *key.digest()))
            .collect();
        ready((due, 0))
    }

    fn take<'a>(
        &'a self,
        key: &'a Key,
        backoff: Duration,
    ) -> BoxFuture<'a, Result<Option<Taken>, Error>> {
        ready(self.take_now(key, backoff))
    }

    fn park<'a>(&'a self, key: &'a Key, error: &'a str) -> BoxFuture<'a, Result<bool, Error>> {
        ready(self.park_now(key, error))
    }

    fn call<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Option<RecoverableCall>, Error>> {
        let now = Instant::now();
        let shard = self.shard(key);
        let found = shard
            .pending
            .map
            .get(key.digest())
            .filter(|c| c.expires_at > now)
            .map(|c| describe(&shard, c, now));
        ready(found)
    }

    fn list<'a>(
        &'a self,
        namespace: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<RecoverableCall>, Error>> {
        let calls = self
            .calls(Instant::now(), |c| {
                namespace.is_none_or(|ns| c.key.namespace() == ns)
            })
            .into_iter()
            .take(limit)
            .map(|(_, call, _)| call)
            .collect();
        ready(calls)
    }
}
