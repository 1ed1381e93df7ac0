//! What a store reports about its records, for operators: one record's state
//! ([`RecordInfo`]) and counts by function and state ([`RecordCounts`]).

use std::fmt;
use std::time::Duration;

use super::{BoxFuture, ClaimKind, Owner};
use crate::Error;

/// Where a record is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RecordState {
    /// A call holds it (a running dedup body, a held lock, a token being consumed).
    InProgress,
    /// The call finished; its result is kept until the ttl ends.
    Completed,
    /// A one-time token waiting to be consumed.
    Issued,
}

impl RecordState {
    /// `in_progress`, `completed` or `issued`: the name the CLI and `--json` print.
    pub fn as_str(self) -> &'static str {
        match self {
            RecordState::InProgress => "in_progress",
            RecordState::Completed => "completed",
            RecordState::Issued => "issued",
        }
    }
}

impl fmt::Display for RecordState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What one record holds, as [`Idem::inspect`](crate::Idem::inspect) (or [`Store::inspect`](crate::Store::inspect))
/// reports it. Times are left by the store's clock when it was read.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecordInfo {
    /// The state.
    pub state: RecordState,
    /// Which strategy wrote it, when the store keeps that (`None`: a completed or issued
    /// record whose kind the store does not keep).
    pub kind: Option<ClaimKind>,
    /// Who holds it (in progress only): unique per call; the high 64 bits are the same
    /// for every call of one process.
    pub owner: Option<Owner>,
    /// How long the holder's lease runs unless renewed (in progress only).
    pub lease_left: Option<Duration>,
    /// How long until the record disappears (for an in-progress dedup or lock claim, the
    /// end of its lease; for a claimed token, the token's own deadline).
    pub ttl_left: Option<Duration>,
    /// Whether a payload fingerprint is stored with it.
    pub fingerprint: bool,
    /// Bytes of the stored result (completed only), as the store keeps them.
    pub value_size: Option<usize>,
    /// The fencing token of the lock holder (locks in progress only), when the store
    /// keeps it per key.
    pub fence: Option<u64>,
    /// The record's step journal (durable steps), in no particular order: filled by
    /// [`Idem::inspect`](crate::Idem::inspect) on a store with a journal, empty otherwise
    /// (a store's own [`Store::inspect`](crate::Store::inspect) leaves it empty).
    pub steps: Vec<super::StepInfo>,
}

impl RecordInfo {
    /// A record in `state` with nothing else known; fill the rest with the fields.
    pub fn new(state: RecordState) -> Self {
        RecordInfo {
            state,
            kind: None,
            owner: None,
            lease_left: None,
            ttl_left: None,
            fingerprint: false,
            value_size: None,
            fence: None,
            steps: Vec::new(),
        }
    }
}

/// How many records one function has in one state: a row of [`RecordCounts::count_records`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub struct RecordCount {
    /// The namespace.
    pub namespace: String,
    /// The function's path (for tokens, the scope [`Options::scope`](crate::Options::scope) gives).
    pub function: String,
    /// `in_progress`, `completed`, `issued`, or `corrupt` for records that do not parse.
    pub state: String,
    /// How many.
    pub count: u64,
}

impl RecordCount {
    /// A row.
    pub fn new(
        namespace: impl Into<String>,
        function: impl Into<String>,
        state: impl Into<String>,
        count: u64,
    ) -> Self {
        RecordCount {
            namespace: namespace.into(),
            function: function.into(),
            state: state.into(),
            count,
        }
    }
}

/// Counting records by namespace, function and state, as `idem stats` shows them: a
/// capability of stores that name records by function ([`Store::record_counts`](crate::Store::record_counts)).
pub trait RecordCounts: Send + Sync {
    /// Live records of `namespace` (every namespace if `None`), one row per function
    /// and state. Reads in bounded batches (Redis `SCAN`, never `KEYS`) or one
    /// `GROUP BY` (SQL); a store under writes gives an approximate snapshot.
    fn count_records<'a>(
        &'a self,
        namespace: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<RecordCount>, Error>>;
}
