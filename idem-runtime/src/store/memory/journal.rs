//! Step journals of [`MemoryStore`](super::MemoryStore): kept in the shard of their
//! record, under the same lock, so each journal operation is one critical section with
//! the record's owner check (see [`crate::store::journal`] for the contract).

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use tokio::time::Instant;

use super::{DigestHasher, MemoryStore, Shard, State, answered, ready};
use crate::store::{BoxFuture, ClaimOutcome, Journal, JournalEntry, JournalStore, Owner};
use crate::{Error, Fingerprint, Key};

/// A shard's journals, swept like its records: when the map has doubled since the last
/// sweep (and with every sweep of the records).
#[derive(Default)]
pub(super) struct Journals {
    map: HashMap<[u8; 16], Box<Slot>, BuildHasherDefault<DigestHasher>>,
    swept_at: usize,
}

struct Slot {
    entries: Journal,
    expires_at: Instant,
    /// The payload the entries were written for: that of the last writer that had one.
    fingerprint: Option<Fingerprint>,
}

const MIN_SWEEP: usize = 16;

impl Journals {
    /// The live journal under `key`; an expired one is dropped here.
    fn live(&mut self, key: &Key, now: Instant) -> Option<&mut Slot> {
        if self.map.is_empty() {
            return None;
        }
        let d = key.digest();
        if self.map.get(d).is_some_and(|s| s.expires_at <= now) {
            self.map.remove(d);
        }
        self.map.get_mut(d).map(|s| &mut **s)
    }

    /// How many entries the live journal of `key` has (read-only: an expired one counts 0).
    pub(super) fn len_of(&self, key: &Key, now: Instant) -> u32 {
        self.map
            .get(key.digest())
            .filter(|s| s.expires_at > now)
            .map_or(0, |s| u32::try_from(s.entries.len()).unwrap_or(u32::MAX))
    }

    pub(super) fn drop_journal(&mut self, key: &Key) {
        if !self.map.is_empty() {
            self.map.remove(key.digest());
        }
    }

    pub(super) fn sweep(&mut self, now: Instant) {
        self.map.retain(|_, s| s.expires_at > now);
        self.swept_at = self.map.len();
    }
}

impl Shard {
    /// The journal's fingerprint, if `key` has a live journal written for another
    /// payload than `fingerprint`: a claim must then not take the record.
    pub(super) fn other_payload(
        &mut self,
        key: &Key,
        fingerprint: Option<Fingerprint>,
        now: Instant,
    ) -> Option<Fingerprint> {
        let ours = fingerprint?;
        let theirs = self.journals.live(key, now)?.fingerprint?;
        (ours != theirs).then_some(theirs)
    }

    /// The answer to a dedup or token claim that has just taken `key`, with a copy of
    /// its live journal if it has one (the journal stays: a release keeps it).
    pub(super) fn claimed(&mut self, key: &Key, now: Instant) -> ClaimOutcome {
        match self.journals.live(key, now) {
            Some(slot) if !slot.entries.is_empty() => ClaimOutcome::resuming(slot.entries.clone()),
            _ => ClaimOutcome::claimed(0),
        }
    }
}

impl MemoryStore {
    fn write_step_now(
        &self,
        key: &Key,
        owner: Owner,
        name: &str,
        value: Option<Bytes>,
        ttl: Duration,
    ) -> bool {
        let now = Instant::now();
        let mut shard = self.shard(key);
        let fingerprint = match shard.live(key, now) {
            Some(e)
                if matches!(e.state, State::InProgress { owner: o, lease_until, .. }
                if o == owner && lease_until > now) =>
            {
                e.fingerprint
            }
            _ => return false,
        };
        let entry = JournalEntry::new(name, value, SystemTime::now());
        let expires_at = now + ttl;
        match shard.journals.live(key, now) {
            Some(slot) => {
                slot.expires_at = expires_at;
                slot.fingerprint = fingerprint.or(slot.fingerprint);
                match slot.entries.iter_mut().find(|e| e.name == name) {
                    Some(e) => *e = entry,
                    None => slot.entries.push(entry),
                }
            }
            None => {
                let j = &mut shard.journals;
                j.map.insert(
                    *key.digest(),
                    Box::new(Slot {
                        entries: vec![entry],
                        expires_at,
                        fingerprint,
                    }),
                );
                if j.map.len() >= MIN_SWEEP.max(j.swept_at * 2) {
                    j.sweep(now);
                }
            }
        }
        true
    }

    fn read_journal_now(&self, key: &Key) -> Journal {
        let now = Instant::now();
        let mut shard = self.shard(key);
        shard
            .journals
            .live(key, now)
            .map(|s| s.entries.clone())
            .unwrap_or_default()
    }
}

impl JournalStore for MemoryStore {
    fn write_step<'a>(
        &'a self,
        key: &'a Key,
        owner: Owner,
        name: &'a str,
        value: Option<Bytes>,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        answered(self.write_step_now(key, owner, name, value, ttl))
    }

    fn read_journal<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Journal, Error>> {
        ready(self.read_journal_now(key))
    }
}
