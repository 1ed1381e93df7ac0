//! The types of the toolbox primitives of [`Store`](super::Store): versioned values
//! (optimistic concurrency), state records (state-machine guards) and Bloom bitmaps.
//!
//! These records live beside the claim records of dedup, lock and token, in their own
//! key space: a backend keeps a versioned value, a state record and a claim record under
//! the same [`Key`](crate::Key) apart (memory: separate maps; Redis: separate prefixes; SQL:
//! separate tables), so mixing them up is impossible rather than an error.

use std::time::Duration;

use bytes::Bytes;

use super::Owner;

/// A versioned value as stored: the bytes and the version that wrote them.
///
/// Versions start at 1 for the first write and grow by exactly 1 per successful
/// [`compare_and_set`](super::Store::compare_and_set); 0 means "absent" when expected.
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
    /// [`settle_transition`](super::Store::settle_transition).
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

/// The answer to a [`transition`](super::Store::transition).
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

/// What to do with a held move; see [`settle_transition`](super::Store::settle_transition).
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
