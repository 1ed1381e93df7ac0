//! The step journal a [`Store`](super::Store) may keep beside its claim records, for
//! durable steps ([`step`](crate::step)): reached through
//! [`Store::journal`](super::Store::journal).
//!
//! # What a store implements
//!
//! A record's journal maps step names to entries: a finished step's `Ok` value (as
//! bytes), or an *intent* (a verified step about to run, no result yet). It lives beside
//! the record, not in it, because it must outlive the claim:
//!
//! - [`JournalStore::write_step`] is **owner-checked in one atomic step**: only the owner
//!   whose claim on the record is live (the same check as
//!   [`Store::complete`](super::Store::complete)) can write, and the journal then expires
//!   `ttl` after that write (by the store's clock);
//! - a release ([`Store::release`](super::Store::release)) and a lease that runs out
//!   **keep** the journal;
//! - a dedup or token claim that takes the record (absent, released, expired lease, issued
//!   token) and finds a live, non-empty journal answers
//!   [`ClaimOutcome::Claimed`](super::ClaimOutcome::Claimed) with it: the claim orders
//!   itself after the old holder's last write (in the same atomic step), so the journal it
//!   returns misses none of them; reading it may take one more round trip on that resume
//!   path only (Redis reads it in the claim's script, SQL in a second statement). A lock
//!   claim never does;
//! - a dedup or token claim that would take the record while it has a live journal
//!   written for another payload changes nothing and answers
//!   [`ClaimOutcome::OtherPayload`](super::ClaimOutcome::OtherPayload), decided in the
//!   same atomic step (the journal's fingerprint is that of the last claim with one that
//!   wrote a step: the record's own, while it is held);
//! - [`Store::complete`](super::Store::complete) and [`Store::forget`](super::Store::forget)
//!   drop it in the same atomic step;
//! - [`JournalStore::read_journal`] reads it for operators, changing nothing.
//!
//! The conformance suite's `steps::` cases check all of it on any store that answers
//! `Some` from [`Store::journal`](super::Store::journal).

use std::time::{Duration, SystemTime};

use bytes::Bytes;

use super::{BoxFuture, Owner};
use crate::{Error, Key};

/// A record's step journal, as a claim or a read returns it: one entry per step name.
pub type Journal = Vec<JournalEntry>;

/// One entry of a record's step journal.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct JournalEntry {
    /// The step's name, as given to [`step`](crate::step).
    pub name: String,
    /// The step's `Ok` value as the runtime encoded it, or `None` for an intent (a
    /// verified step that started and has no result yet).
    pub value: Option<Bytes>,
    /// When the entry was written, by the store's clock (milliseconds are kept).
    pub at: SystemTime,
}

impl JournalEntry {
    /// An entry for step `name`: its value (`None`: an intent), written at `at`.
    pub fn new(name: impl Into<String>, value: Option<Bytes>, at: SystemTime) -> Self {
        JournalEntry {
            name: name.into(),
            value,
            at,
        }
    }

    /// The entry as an operator sees it (no value bytes).
    pub fn info(&self) -> StepInfo {
        StepInfo {
            name: self.name.clone(),
            done: self.value.is_some(),
            at: self.at,
            value_size: self.value.as_ref().map(Bytes::len),
        }
    }
}

/// One step of a record's journal, as [`Idem::inspect`](crate::Idem::inspect) lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StepInfo {
    /// The step's name.
    pub name: String,
    /// `true`: the step finished and its value is journaled. `false`: only its intent is
    /// (a verified step that started; the next attempt asks its `verify` first).
    pub done: bool,
    /// When the entry was written, by the store's clock.
    pub at: SystemTime,
    /// Bytes of the journaled value (done steps only).
    pub value_size: Option<usize>,
}

/// The step journal: reached through [`Store::journal`](super::Store::journal). See the
/// [module docs](self) for the whole contract, which includes how `claim`, `complete`,
/// `release` and `forget` treat the journal.
pub trait JournalStore: Send + Sync {
    /// If `owner` holds `key` with a live lease, writes the journal entry of step `name`
    /// (`value`, or an intent if `None`; a later write of the same name replaces it) and
    /// makes the journal expire `ttl` from now; returns `true`. Otherwise changes
    /// nothing and returns `false` (the claim was lost). One atomic step.
    fn write_step<'a>(
        &'a self,
        key: &'a Key,
        owner: Owner,
        name: &'a str,
        value: Option<Bytes>,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>>;

    /// The live journal of `key` (empty if none), whoever holds the record and whether
    /// or not it exists. One atomic read.
    fn read_journal<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Journal, Error>>;

    /// Journal writes inside a database transaction (transactional steps,
    /// [`step_tx`](crate::step_tx)), if this store keeps its journal in the database
    /// the transaction runs on. Default: `None`, and a transactional step answers
    /// [`Error::Unsupported`].
    #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
    fn in_tx(&self) -> Option<&dyn super::TxJournalStore> {
        None
    }
}

/// Milliseconds since the Unix epoch as a [`SystemTime`].
#[cfg_attr(not(feature = "redis"), allow(dead_code))] // the in-process store keeps `SystemTime`s
pub(crate) fn from_unix_ms(ms: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(ms)
}
