//! The embedded store: records in process memory.

mod inspection;
mod journal;
mod recovery;
mod toolbox;

use std::any::Any;
use std::collections::HashMap;
use std::future::Future;
use std::hash::{BuildHasherDefault, Hasher};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::{
    BloomStore, BoxFuture, ClaimKind, ClaimOutcome, ClaimRequest, LocalStore, Memo, Owner,
    StateStore, Store, Subscription, VersionedStore,
};
use crate::store::RecordInfo;
use crate::{Error, Fingerprint, Key};

/// Many small shards rather than a few large ones: a shard grows (and is swept) in one
/// step under its lock, so its size bounds the longest wait of a call that meets it.
/// Uniform digests make every shard grow at about the same time; with 64 shards one
/// step took 40 ms at four million records, with 1,024 boxed ones half a millisecond.
const SHARDS: usize = 1024;
/// A shard sweeps out expired records when it has doubled since its last sweep, and
/// never below this size, so reaping costs O(1) amortized per insert and memory stays
/// within about twice the live records (plus this many per shard: 16,384 in all).
const MIN_SWEEP: usize = 16;

/// Records in process memory: the default store when nothing is configured, and the
/// reference implementation of the [`Store`] semantics.
///
/// Sharded by key digest (1,024 shards, each a `std` mutex never held across an
/// `.await`), so it never blocks the executor: a call holds its shard for a few hundred
/// nanoseconds, and the call that makes a shard grow (or sweeps it) for as long as moving
/// that shard's records takes, about half a millisecond with four million records in
/// the store. Records are boxed so that growing moves pointers, not records.
/// Time is tokio's monotonic clock, so tests may pause it. Expired records are dropped
/// when touched and swept out as a shard grows, so a stream of distinct keys keeps
/// memory bounded. Waiters are woken through one-shot channels the moment a record
/// completes or is released.
///
/// Records live as long as the process: use Redis or SQL to survive restarts or to
/// deduplicate across processes.
///
/// ```
/// use idem_runtime::{Idem, MemoryStore};
/// let idem = Idem::builder().store(MemoryStore::new()).namespace("shop").build();
/// # let _ = idem;
/// ```
pub struct MemoryStore {
    shards: Box<[Mutex<Shard>]>,
    /// One counter for every key: a fence is then strictly increasing per key (and
    /// across keys), survives the release of the lock, and costs no memory per key.
    fence: AtomicU64,
    /// Versioned values, state records and Bloom bitmaps, in maps of their own.
    values: toolbox::Values,
    states: toolbox::States,
    blooms: super::local_blooms::Blooms,
}

#[derive(Default)]
struct Shard {
    map: HashMap<[u8; 16], Box<Entry>, BuildHasherDefault<DigestHasher>>,
    swept_at: usize,
    /// Step journals, beside the records they belong to (same shard, same lock) so that
    /// a claim reads one and a step writes one in the same critical section as the
    /// record's owner check; they outlive a release or an expired lease.
    journals: journal::Journals,
    /// Recoverable calls' arguments, beside their records for the same reason.
    pending: recovery::Pending,
}

struct Entry {
    state: State,
    fingerprint: Option<Fingerprint>,
    /// When the record disappears: the lease end for an in-progress dedup or lock claim,
    /// the ttl for a completed record or an issued token.
    expires_at: Instant,
    waiters: Vec<oneshot::Sender<()>>,
}

enum State {
    Issued,
    InProgress {
        owner: Owner,
        lease_until: Instant,
        /// For a claimed token: when the token itself expires, restored on release.
        token_expires: Option<Instant>,
        /// A lock's fencing token (0 for dedup and token claims), for inspection.
        fence: u64,
    },
    Completed {
        value: Bytes,
        /// The value decoded once by a replay, handed to later replays (see [`Memo`]).
        memo: Option<Memo>,
    },
}

impl Entry {
    fn wake(&mut self) {
        for w in self.waiters.drain(..) {
            let _ = w.send(());
        }
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("records", &self.len())
            .finish()
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        MemoryStore {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            fence: AtomicU64::new(0),
            values: toolbox::Values::default(),
            states: toolbox::States::default(),
            blooms: super::local_blooms::Blooms::default(),
        }
    }

    /// The number of records held, including expired ones not yet swept.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).map.len()).sum()
    }

    /// True if no record is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every expired record now and returns how many were dropped.
    pub fn purge_expired(&self) -> usize {
        let now = Instant::now();
        self.shards
            .iter()
            .map(|s| {
                let mut s = lock(s);
                let before = s.map.len();
                s.sweep(now);
                before - s.map.len()
            })
            .sum()
    }

    fn shard(&self, key: &Key) -> MutexGuard<'_, Shard> {
        let d = key.digest();
        lock(&self.shards[usize::from(u16::from_le_bytes([d[14], d[15]])) % SHARDS])
    }

    fn claim_memo(&self, key: &Key, req: &ClaimRequest) -> (ClaimOutcome, Option<Memo>) {
        let now = Instant::now();
        let mut shard = self.shard(key);
        let lease_until = now + req.lease;
        // Asked before the record is looked at (the borrow of one excludes the other); it
        // costs nothing to a claim without a fingerprint or a shard without journals.
        let other = match req.kind {
            ClaimKind::Lock => None,
            _ => shard.other_payload(key, req.fingerprint, now),
        };
        if let Some(e) = shard.live(key, now) {
            match &e.state {
                State::Completed { value, memo } => {
                    let done = ClaimOutcome::Completed {
                        value: value.clone(),
                        fingerprint: e.fingerprint,
                    };
                    return (done, memo.clone());
                }
                State::InProgress {
                    lease_until: held_until,
                    ..
                } if *held_until > now || req.kind != ClaimKind::Token => {
                    return (
                        ClaimOutcome::Busy {
                            retry_in: held_until.saturating_duration_since(now),
                            fingerprint: e.fingerprint,
                        },
                        None,
                    );
                }
                State::Issued if req.kind != ClaimKind::Token => {
                    // A token record under a dedup or lock key cannot be produced through
                    // the runtime (their scopes differ); treat it as held until it expires.
                    return (
                        ClaimOutcome::Busy {
                            retry_in: e.expires_at.saturating_duration_since(now),
                            fingerprint: e.fingerprint,
                        },
                        None,
                    );
                }
                // An issued token, or a token claim whose lease ended: take it, unless
                // its journal records another payload's effects.
                State::Issued | State::InProgress { .. } => {
                    if let Some(fingerprint) = other {
                        return (ClaimOutcome::OtherPayload { fingerprint }, None);
                    }
                    let token_expires = match e.state {
                        State::InProgress { token_expires, .. } => token_expires,
                        _ => Some(e.expires_at),
                    }
                    .unwrap_or(e.expires_at);
                    e.state = State::InProgress {
                        owner: req.owner,
                        lease_until,
                        token_expires: Some(token_expires),
                        fence: 0,
                    };
                    e.expires_at = token_expires.max(lease_until);
                    e.fingerprint = req.fingerprint;
                    e.wake();
                    return (shard.claimed(key, now), None);
                }
            }
        }
        if req.kind == ClaimKind::Token {
            return (ClaimOutcome::Missing, None);
        }
        let fence = if req.kind == ClaimKind::Lock {
            self.fence.fetch_add(1, Ordering::Relaxed) + 1
        } else {
            if let Some(fingerprint) = other {
                return (ClaimOutcome::OtherPayload { fingerprint }, None);
            }
            0
        };
        shard.insert(
            key,
            Entry {
                state: State::InProgress {
                    owner: req.owner,
                    lease_until,
                    token_expires: None,
                    fence,
                },
                fingerprint: req.fingerprint,
                expires_at: lease_until,
                waiters: Vec::new(),
            },
            now,
        );
        if req.kind == ClaimKind::Lock {
            return (ClaimOutcome::claimed(fence), None);
        }
        if let Some(recover) = &req.recover {
            shard.pending.claimed(key, recover, lease_until, now);
        }
        (shard.claimed(key, now), None)
    }

    fn complete_now(&self, key: &Key, owner: Owner, value: Bytes, ttl: Duration) -> bool {
        let now = Instant::now();
        let mut shard = self.shard(key);
        let Some(e) = shard.live(key, now) else {
            return false;
        };
        match e.state {
            State::InProgress {
                owner: o,
                lease_until,
                ..
            } if o == owner && lease_until > now => {
                e.state = State::Completed { value, memo: None };
                e.expires_at = now + ttl;
                e.wake();
                shard.journals.drop_journal(key);
                shard.pending.finished(key);
                true
            }
            _ => false,
        }
    }

    fn release_now(&self, key: &Key, owner: Owner) -> bool {
        self.give_back(key, owner, false)
    }

    /// Releases `owner`'s claim; `abandoned`: a dropped call's, which a recoverer finishes
    /// (its arguments stay, due now), where a released one is not recovered.
    fn give_back(&self, key: &Key, owner: Owner, abandoned: bool) -> bool {
        let now = Instant::now();
        let mut shard = self.shard(key);
        let Some(e) = shard.live(key, now) else {
            return false;
        };
        match e.state {
            State::InProgress {
                owner: o,
                token_expires,
                ..
            } if o == owner => {
                e.wake();
                match token_expires {
                    Some(t) if t > now => {
                        e.state = State::Issued;
                        e.expires_at = t;
                        e.fingerprint = None;
                    }
                    _ => {
                        shard.map.remove(key.digest());
                    }
                }
                if abandoned {
                    shard.pending.abandoned(key, now);
                } else {
                    shard.pending.finished(key);
                }
                true
            }
            _ => false,
        }
    }

    fn renew_now(&self, key: &Key, owner: Owner, lease: Duration) -> bool {
        let now = Instant::now();
        let mut shard = self.shard(key);
        let Some(e) = shard.live(key, now) else {
            return false;
        };
        match &mut e.state {
            State::InProgress {
                owner: o,
                lease_until,
                token_expires,
                ..
            } if *o == owner && *lease_until > now => {
                *lease_until = now + lease;
                e.expires_at = token_expires.map_or(*lease_until, |t| t.max(*lease_until));
                true
            }
            _ => false,
        }
    }

    fn issue_now(&self, key: &Key, ttl: Duration) -> bool {
        let now = Instant::now();
        let mut shard = self.shard(key);
        if shard.live(key, now).is_some() {
            return false;
        }
        shard.insert(
            key,
            Entry {
                state: State::Issued,
                fingerprint: None,
                expires_at: now + ttl,
                waiters: Vec::new(),
            },
            now,
        );
        true
    }

    fn subscribe_now(&self, key: &Key) -> Subscription {
        let now = Instant::now();
        let mut shard = self.shard(key);
        match shard.live(key, now) {
            Some(e) if matches!(e.state, State::InProgress { .. }) => {
                let (tx, rx) = oneshot::channel();
                e.waiters.push(tx);
                Subscription::new(async move {
                    // A dropped sender (record expired or removed) is a change too.
                    let _ = rx.await;
                })
            }
            _ => Subscription::ready(),
        }
    }
}

impl Shard {
    /// The record under `key` if it has not expired; an expired one is dropped here.
    fn live(&mut self, key: &Key, now: Instant) -> Option<&mut Entry> {
        let d = key.digest();
        if self.map.get(d).is_some_and(|e| e.expires_at <= now) {
            // Dropping the entry drops its waiters' senders, which wakes them.
            self.map.remove(d);
        }
        self.map.get_mut(d).map(|e| &mut **e)
    }

    fn insert(&mut self, key: &Key, entry: Entry, now: Instant) {
        self.map.insert(*key.digest(), Box::new(entry));
        if self.map.len() >= MIN_SWEEP.max(self.swept_at * 2) {
            self.sweep(now);
        }
    }

    fn sweep(&mut self, now: Instant) {
        self.map.retain(|_, e| e.expires_at > now);
        self.swept_at = self.map.len();
        self.journals.sweep(now);
        self.pending.sweep(now);
    }
}

fn lock(m: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    // No code path panics while holding a shard; recover rather than propagate poison.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Keys are already uniform cryptographic digests: their first 8 bytes are the hash.
#[derive(Default)]
struct DigestHasher(u64);

impl Hasher for DigestHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // `[u8; 16]` hashes as its bytes (after a length prefix for slices; arrays have
        // none): fold whatever arrives.
        for chunk in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            self.0 = self.0.rotate_left(5) ^ u64::from_le_bytes(b);
        }
    }
}

fn ready<T: Send + 'static>(v: T) -> BoxFuture<'static, Result<T, Error>> {
    Box::pin(std::future::ready(Ok(v)))
}

/// A yes-or-no answer known at once, boxed without an allocation: each answer is a
/// zero-sized future of its own, and a `Box` of a zero-sized value allocates nothing.
/// Every completion, release, renewal, issue and step write of this store answers so;
/// the allocation and free of a boxed `Ready` cost about 170 instructions per answer.
fn answered(yes: bool) -> BoxFuture<'static, Result<bool, Error>> {
    struct Answer<const YES: bool>;
    impl<const YES: bool> Future for Answer<YES> {
        type Output = Result<bool, Error>;
        fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Self::Output> {
            Poll::Ready(Ok(YES))
        }
    }
    if yes {
        Box::pin(Answer::<true>)
    } else {
        Box::pin(Answer::<false>)
    }
}

impl LocalStore for MemoryStore {
    fn claim_now(
        &self,
        key: &Key,
        req: &ClaimRequest,
    ) -> Result<(ClaimOutcome, Option<Memo>), Error> {
        Ok(self.claim_memo(key, req))
    }

    fn memoize(&self, key: &Key, value: &Bytes, memo: Memo) {
        let now = Instant::now();
        let mut shard = self.shard(key);
        if let Some(Entry {
            state: State::Completed { value: v, memo: m },
            ..
        }) = shard.live(key, now)
        {
            // The caller holds a clone of the bytes it decoded, so their allocation is
            // alive: the same pointer means the same record, not a newer one that
            // happens to reuse the address.
            if v.as_ptr() == value.as_ptr() && v.len() == value.len() {
                *m = Some(memo);
            }
        }
    }
    fn peek_memo(
        &self,
        key: &Key,
        read: &mut dyn FnMut(Option<Fingerprint>, &(dyn Any + Send + Sync)),
    ) -> bool {
        let now = Instant::now();
        let mut shard = self.shard(key);
        match shard.live(key, now) {
            Some(Entry {
                state: State::Completed {
                    memo: Some(memo), ..
                },
                fingerprint,
                ..
            }) => {
                read(*fingerprint, &**memo);
                true
            }
            _ => false,
        }
    }
}

impl Store for MemoryStore {
    fn claim<'a>(
        &'a self,
        key: &'a Key,
        req: &'a ClaimRequest,
    ) -> BoxFuture<'a, Result<ClaimOutcome, Error>> {
        ready(self.claim_memo(key, req).0)
    }

    fn complete<'a>(
        &'a self,
        key: &'a Key,
        owner: Owner,
        value: Bytes,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        answered(self.complete_now(key, owner, value, ttl))
    }

    fn release<'a>(&'a self, key: &'a Key, owner: Owner) -> BoxFuture<'a, Result<bool, Error>> {
        answered(self.release_now(key, owner))
    }

    fn renew<'a>(
        &'a self,
        key: &'a Key,
        owner: Owner,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        answered(self.renew_now(key, owner, lease))
    }

    fn issue<'a>(&'a self, key: &'a Key, ttl: Duration) -> BoxFuture<'a, Result<bool, Error>> {
        answered(self.issue_now(key, ttl))
    }

    fn subscribe<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Subscription, Error>> {
        ready(self.subscribe_now(key))
    }

    fn inspect<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Option<RecordInfo>, Error>> {
        ready(self.inspect_now(key))
    }

    fn forget<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<bool, Error>> {
        ready(self.forget_now(key))
    }

    fn versioned(&self) -> Option<&dyn VersionedStore> {
        Some(&self.values)
    }

    fn states(&self) -> Option<&dyn StateStore> {
        Some(&self.states)
    }

    fn blooms(&self) -> Option<&dyn BloomStore> {
        Some(&self.blooms)
    }

    fn journal(&self) -> Option<&dyn super::JournalStore> {
        Some(self)
    }

    fn name(&self) -> &'static str {
        "memory"
    }

    fn local(&self) -> Option<&dyn LocalStore> {
        Some(self)
    }

    fn recovery(&self) -> Option<&dyn super::RecoveryStore> {
        Some(self)
    }
}
