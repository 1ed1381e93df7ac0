//! Recovery: the records a recoverer finishes when nobody calls again (see
//! [`crate::recover`]), reached through [`Store::recovery`](super::Store::recovery).
//!
//! A *recoverable* claim ([`ClaimRequest::recover`](super::ClaimRequest)) records the
//! call's arguments with the claim, in the same atomic step, and puts the record in an
//! index of calls that may need recovery, keyed by when they may (the lease deadline).
//! The contract, on every store:
//!
//! - a recoverable claim keeps its record (and its journal) for the recovery ttl, not
//!   only the lease: a call whose lease ran out is still there to be found;
//! - [`RecoveryStore::settle`] completes a recoverable call, or releases it after an
//!   `Err` (the caller got the error and decides, so the call is **not** recovered), and
//!   drops its arguments and index entry in the same step; a plain
//!   [`Store::complete`](super::Store::complete) or [`Store::release`](super::Store::release)
//!   may leave them, for [`RecoveryStore::take`] to find finished;
//! - [`RecoveryStore::abandon`] is the release of a dropped call (cancelled, panicked):
//!   the key is free at once, as after a release, and the call is due for recovery now;
//! - the index is found by [`RecoveryStore::due`] without scanning records that carry no
//!   recovery data, and [`RecoveryStore::take`] decides, by the store's clock and in one
//!   atomic step, whether a due call is really abandoned (free, or its lease ran out)
//!   and counts the attempt. A call still held has its due time moved to its lease
//!   deadline; a finished or vanished one leaves the index.
//!
//! A call without `recover` never touches any of it.

use std::time::Duration;

use bytes::Bytes;

use super::{BoxFuture, Owner};
use crate::{Error, Key};

/// What a recoverable claim records: the call's arguments (encoded by the runtime), and
/// how long they are kept if nobody completes the call.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Recover {
    /// The arguments, as the function's recovery entry decodes them.
    pub args: Bytes,
    /// How long the record, its journal and its arguments are kept (the call's ttl).
    pub ttl: Duration,
}

impl Recover {
    /// Arguments `args`, kept for `ttl`.
    pub fn new(args: Bytes, ttl: Duration) -> Self {
        Recover { args, ttl }
    }
}

/// A call in a store's recovery index, as [`RecoveryStore::due`] finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Due {
    /// The function's scope (its path, as the attribute names it).
    pub scope: String,
    /// The key's digest.
    pub digest: [u8; 16],
}

impl Due {
    /// The call of `scope` under `digest`.
    pub fn new(scope: impl Into<String>, digest: [u8; 16]) -> Self {
        Due {
            scope: scope.into(),
            digest,
        }
    }
}

/// A call taken for one recovery attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Taken {
    /// The recorded arguments.
    pub args: Bytes,
    /// Attempts made so far, this one included (1 for the first).
    pub attempts: u32,
}

impl Taken {
    /// Attempt `attempts` with `args`.
    pub fn new(args: Bytes, attempts: u32) -> Self {
        Taken { args, attempts }
    }
}

/// A recoverable call, as operators list it ([`RecoveryStore::list`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecoverableCall {
    /// The namespace the call ran in.
    pub namespace: String,
    /// The function's scope.
    pub scope: String,
    /// The key's digest.
    pub digest: [u8; 16],
    /// Recovery attempts made.
    pub attempts: u32,
    /// Why it was parked, if it was: never retried again, until a caller completes it.
    pub parked: Option<String>,
    /// How long ago it became due (zero if it is not due yet: still held).
    pub overdue: Duration,
    /// `false`: its owner still holds it with a live lease (in flight, not abandoned).
    pub abandoned: bool,
    /// Entries in its step journal: the steps it got to (done, or begun if verified).
    pub steps: u32,
}

/// The recovery index: reached through [`Store::recovery`](super::Store::recovery). See
/// the [module documentation](self) for what claims, completions and releases do to it.
pub trait RecoveryStore: Send + Sync {
    /// Ends a recoverable call whose body returned: completes it with `Some((value,
    /// ttl))` as [`Store::complete`](super::Store::complete) does, or releases it with
    /// `None` as [`Store::release`](super::Store::release) does (an `Err`: not
    /// recovered), and drops its recovery data in the same step. A store whose
    /// completion and release keep the index already forwards to them.
    fn settle<'a>(
        &'a self,
        key: &'a Key,
        owner: Owner,
        settle: Option<(Bytes, Duration)>,
    ) -> BoxFuture<'a, Result<bool, Error>>;

    /// The release of a dropped call: if `owner` holds `key`, frees it as
    /// [`Store::release`](super::Store::release) would, keeps its arguments and journal,
    /// and makes it due for recovery now. `false` if `owner` does not hold it.
    fn abandon<'a>(&'a self, key: &'a Key, owner: Owner) -> BoxFuture<'a, Result<bool, Error>>;

    /// Up to `limit` calls of `namespace` due for recovery, the longest due first; a
    /// store may return calls that turn out not to be abandoned ([`take`](Self::take)
    /// decides). `cursor` is 0 at first and then what the last call returned; a store
    /// whose index is split (Redis Cluster: one per slot) walks it across calls.
    fn due<'a>(
        &'a self,
        namespace: &'a str,
        limit: usize,
        cursor: u64,
    ) -> BoxFuture<'a, Result<(Vec<Due>, u64), Error>>;

    /// Takes the due call under `key` for one attempt, in one atomic step: if it is
    /// abandoned (free, or its lease ran out by the store's clock) and not parked, counts
    /// the attempt, makes it due again `backoff` from now (should the attempt die too),
    /// and returns its arguments. `None`: not abandoned, parked, or gone.
    fn take<'a>(
        &'a self,
        key: &'a Key,
        backoff: Duration,
    ) -> BoxFuture<'a, Result<Option<Taken>, Error>>;

    /// Parks the call under `key` with `error`: kept (until its ttl) and listed, never
    /// taken again. `false` if it has no recovery data any more (it finished).
    fn park<'a>(&'a self, key: &'a Key, error: &'a str) -> BoxFuture<'a, Result<bool, Error>>;

    /// The recovery state of the call under `key`, if it is recoverable (for
    /// `idem inspect`).
    fn call<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Option<RecoverableCall>, Error>>;

    /// Recoverable calls, due or parked or still held (up to `limit`), of `namespace` or
    /// of all namespaces: for `idem recoverable` and inspection.
    fn list<'a>(
        &'a self,
        namespace: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<RecoverableCall>, Error>>;
}
