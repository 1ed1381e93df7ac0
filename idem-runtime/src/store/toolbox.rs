//! The toolbox capabilities a [`Store`](super::Store) may offer, each a trait reached
//! through an accessor of `Store`: versioned values ([`VersionedStore`], for optimistic
//! concurrency), state records ([`StateStore`], for state-machine guards) and Bloom
//! bitmaps ([`BloomStore`]), with the types they exchange.
//!
//! A backend implements the ones it can, each method one atomic step like the rest of
//! `Store`, and runs `toolbox_conformance_tests!` on them.
//!
//! These records live beside the claim records of dedup, lock and token, in their own
//! key space: a backend keeps a versioned value, a state record and a claim record under
//! the same [`Key`](crate::Key) apart (memory: separate maps; Redis: separate prefixes; SQL:
//! separate tables), so mixing them up is impossible rather than an error.

use std::time::Duration;

use bytes::Bytes;

use super::{BoxFuture, Owner};
use crate::{Error, Key};

/// Versioned values: reached through [`Store::versioned`](super::Store::versioned).
pub trait VersionedStore: Send + Sync {
    /// Reads the versioned value under `key` and its version, or `None` if there is none.
    /// One atomic read.
    fn load_versioned<'a>(
        &'a self,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<Option<VersionedBytes>, Error>>;

    /// Writes `value` under `key` if its current version is `expected` (0: no value
    /// yet), as one atomic step, and returns the new version (`expected + 1`). If the
    /// version differs, changes nothing and returns `None` (a lost race: a conflict).
    ///
    /// `ttl`: the value disappears `ttl` after this write; `None` keeps it without expiry.
    /// After it expires the key is absent again and versions restart at 1, so a ttl must
    /// outlast any read-modify-write cycle that may still hold an old version.
    fn compare_and_set<'a>(
        &'a self,
        key: &'a Key,
        expected: u64,
        value: Bytes,
        ttl: Option<Duration>,
    ) -> BoxFuture<'a, Result<Option<u64>, Error>>;
}

/// State records with guarded moves: reached through
/// [`Store::states`](super::Store::states).
pub trait StateStore: Send + Sync {
    /// Moves the state record under `key` to `req.to`, as one atomic step:
    ///
    /// - already in `req.to` → [`TransitionOutcome::Already`], nothing written;
    /// - another owner holds a move whose lease has not ended → [`TransitionOutcome::Pending`];
    /// - current state allowed by `req` → moved ([`TransitionOutcome::Moved`]) or, with
    ///   `req.hold`, held for that owner ([`TransitionOutcome::Held`]);
    /// - otherwise [`TransitionOutcome::Refused`] with the current state.
    ///
    /// A hold whose lease ended is ignored (and may be replaced) by every request.
    fn transition<'a>(
        &'a self,
        key: &'a Key,
        req: &'a TransitionRequest<'a>,
    ) -> BoxFuture<'a, Result<TransitionOutcome, Error>>;

    /// Commits, aborts or renews the move on `key` held by `owner`, as one atomic step.
    /// Returns `false` (and changes nothing) if `owner` no longer holds it: another
    /// owner replaced the hold after its lease ended, or the record expired. A hold whose
    /// lease ended but that nobody replaced is still the owner's and may be settled.
    fn settle_transition<'a>(
        &'a self,
        key: &'a Key,
        owner: Owner,
        action: Settle,
    ) -> BoxFuture<'a, Result<bool, Error>>;

    /// The current state under `key` (`None`: no record). One atomic read; a held move
    /// is not reported (the state is the one before it).
    fn load_state<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Option<String>, Error>>;
}

/// Bloom bitmaps: reached through [`Store::blooms`](super::Store::blooms).
pub trait BloomStore: Send + Sync {
    /// Sets the bits at `indexes` in the Bloom bitmap `filter` of `size_bits` bits, as one
    /// atomic step, and returns whether they were **all** set already (the id may have
    /// been inserted before). `false` proves that no earlier insert of the same indexes
    /// happened, and of concurrent inserts of the same indexes exactly one gets `false`.
    ///
    /// A missing bitmap is created empty, to expire `ttl` after its creation (`None`:
    /// never); later inserts do not push that expiry back, so the filter is renewed as a
    /// whole rather than kept alive forever by traffic. Every index is `< size_bits`.
    fn bloom_insert<'a>(
        &'a self,
        filter: &'a Key,
        indexes: &'a [u64],
        size_bits: u64,
        ttl: Option<Duration>,
    ) -> BoxFuture<'a, Result<bool, Error>>;

    /// Whether the bits at `indexes` are all set in the Bloom bitmap `filter` (a missing
    /// bitmap has none set). One atomic read.
    fn bloom_contains<'a>(
        &'a self,
        filter: &'a Key,
        indexes: &'a [u64],
        size_bits: u64,
    ) -> BoxFuture<'a, Result<bool, Error>>;
}

/// A versioned value as stored: the bytes and the version that wrote them.
///
/// Versions start at 1 for the first write and grow by exactly 1 per successful
/// [`compare_and_set`](VersionedStore::compare_and_set); 0 means "absent" when expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionedBytes {
    /// The stored bytes.
    pub value: Bytes,
    /// The version of this value (≥ 1).
    pub version: u64,
}

impl VersionedBytes {
    /// A stored value and its version.
    pub fn new(value: Bytes, version: u64) -> Self {
        VersionedBytes { value, version }
    }
}

/// One state-machine move, as the store sees it: which states may move to `to`.
///
/// The store knows nothing of the transition table; the runtime has already resolved
/// it into the list of allowed source states, so the store's check-and-move is one
/// comparison and one write, inside one atomic step.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct TransitionRequest<'a> {
    /// The states from which the move to `to` is allowed.
    pub from: &'a [&'a str],
    /// Whether a key with no state record may move to `to` (`to` is an initial state).
    pub from_absent: bool,
    /// The target state.
    pub to: &'a str,
    /// `None`: perform the move now. `Some((owner, lease))`: *hold* it instead: the record
    /// keeps its state but carries a pending move to `to` owned by `owner` until the lease
    /// ends; every other move on the key sees [`TransitionOutcome::Pending`] meanwhile.
    /// The owner then commits or aborts it with
    /// [`settle_transition`](StateStore::settle_transition).
    pub hold: Option<(Owner, Duration)>,
    /// How long the record lives after this move: `None` keeps it until it is moved again
    /// (no expiry), `Some(ttl)` lets it disappear `ttl` after the move.
    pub ttl: Option<Duration>,
}

impl<'a> TransitionRequest<'a> {
    /// A move to `to` allowed from `from` (and from no record if `from_absent`),
    /// performed at once and kept without expiry.
    pub fn new(from: &'a [&'a str], from_absent: bool, to: &'a str) -> Self {
        TransitionRequest {
            from,
            from_absent,
            to,
            hold: None,
            ttl: None,
        }
    }

    /// Hold the move for `owner` for `lease` instead of performing it.
    pub fn hold(mut self, owner: Owner, lease: Duration) -> Self {
        self.hold = Some((owner, lease));
        self
    }

    /// Let the record expire `ttl` after the move (`None`: never).
    pub fn ttl(mut self, ttl: Option<Duration>) -> Self {
        self.ttl = ttl;
        self
    }

    /// Whether the move is allowed out of `current` (`None`: no record).
    pub fn allows(&self, current: Option<&str>) -> bool {
        match current {
            None => self.from_absent,
            Some(s) => self.from.contains(&s),
        }
    }
}

/// The answer to a [`transition`](StateStore::transition).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TransitionOutcome {
    /// The move was performed: the record was in `from` (`None`: no record) and is now in
    /// the target state.
    Moved {
        /// The state the record left.
        from: Option<String>,
    },
    /// The move is held by the requesting owner (a request with `hold`): the record still
    /// is in `from` and no one else can move it until the hold is settled or its lease ends.
    Held {
        /// The state the record is in.
        from: Option<String>,
    },
    /// The record already is in the target state: nothing was changed.
    Already,
    /// Another owner holds a move on this key and its lease has not ended.
    Pending {
        /// The state the held move goes to.
        to: String,
        /// Time left on that owner's lease, by the store's clock.
        retry_in: Duration,
    },
    /// The move is not allowed from the record's current state; nothing was changed.
    Refused {
        /// The state the record is in (`None`: no record).
        current: Option<String>,
    },
}

/// What to do with a held move; see [`settle_transition`](StateStore::settle_transition).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Settle {
    /// Perform the held move: the record enters its target state. The ttl is as in
    /// [`TransitionRequest::ttl`].
    Commit {
        /// How long the record lives after the move (`None`: no expiry).
        ttl: Option<Duration>,
    },
    /// Drop the held move: the record stays in its state, free for other moves.
    Abort,
    /// Extend the hold's lease to this long from now.
    Renew(Duration),
}
