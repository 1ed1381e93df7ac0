//! The recovery index on SQL (see [`crate::store::recovery`]): a table of its own,
//! `idem_recovery`, one row per recoverable record with the call's arguments, attempts,
//! parking error and due time, and a partial index on (namespace, due time) over the
//! rows not parked. The recoverable claim writes its row in the claim's own statement,
//! and [`RecoveryStore::settle`] drops it in the completion's (or the release's), so a
//! call without `recover` runs exactly the statements it ran before.
//!
//! PostgreSQL writes the row in the claim's own statement (a data-modifying CTE); MySQL,
//! MariaDB and SQLite, which cannot write two tables in one statement, in one
//! transaction with it.

use std::time::Duration;

use bytes::Bytes;

use super::SqlStore;
use super::record::Snapshot;
use crate::store::{
    BoxFuture, ClaimRequest, Due, Owner, Recover, RecoverableCall, RecoveryStore, Taken,
};
use crate::{Error, Key};

/// One database's statements for the recovery index.
pub(super) trait RecoveryDialect: Send + Sync {
    /// A recoverable claim: the claim's statement, recording `recover` when it takes the
    /// key. `None`: it lost a race, claim again.
    fn claim<'a>(
        &'a self,
        key: &'a Key,
        req: &'a ClaimRequest,
        recover: &'a Recover,
    ) -> BoxFuture<'a, Result<Option<Snapshot>, Error>>;

    /// Completes (`Some`) or releases (`None`) `owner`'s claim and, in the same
    /// statement, drops its recovery row; `abandon` (a release only): keeps the row,
    /// due now.
    fn settle<'a>(
        &'a self,
        key: &'a Key,
        owner: Owner,
        settle: Option<(&'a Bytes, Duration)>,
        abandon: bool,
    ) -> BoxFuture<'a, Result<bool, Error>>;

    fn due<'a>(
        &'a self,
        namespace: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<Due>, Error>>;

    fn take<'a>(
        &'a self,
        key: &'a Key,
        backoff: Duration,
    ) -> BoxFuture<'a, Result<Option<Taken>, Error>>;

    fn park<'a>(&'a self, key: &'a Key, error: &'a str) -> BoxFuture<'a, Result<bool, Error>>;

    /// Up to `limit` calls of `namespace` (or of all), or only the one under `only`.
    fn list<'a>(
        &'a self,
        namespace: Option<&'a str>,
        limit: usize,
        only: Option<&'a Key>,
    ) -> BoxFuture<'a, Result<Vec<RecoverableCall>, Error>>;
}

#[cfg(any(feature = "mysql", feature = "sqlite"))]
/// Statements MySQL and SQLite share (positional `?`, no clock: `now` is bound).
pub(super) const HOLD: &str =
    "UPDATE idem_recovery SET due_us = ? WHERE id = ? AND due_us IS NOT NULL";
#[cfg(any(feature = "mysql", feature = "sqlite"))]
pub(super) const DROP_ROW: &str = "DELETE FROM idem_recovery WHERE id = ?";
#[cfg(any(feature = "mysql", feature = "sqlite"))]
pub(super) const TAKE: &str =
    "UPDATE idem_recovery SET attempts = attempts + 1, due_us = ? WHERE id = ?";

#[cfg(any(feature = "mysql", feature = "sqlite"))]
/// A due call's recovery row and its record, as a take's transaction read them
/// (MySQL, SQLite; PostgreSQL decides in its statement), by the database's clock.
pub(super) struct TakeRead {
    pub(super) now: i64,
    pub(super) due: Option<i64>,
    pub(super) expires: i64,
    pub(super) state: Option<i16>,
    pub(super) lease: Option<i64>,
    pub(super) record_expires: Option<i64>,
}

#[cfg(any(feature = "mysql", feature = "sqlite"))]
/// What a take does with what it read.
pub(super) enum TakeStep {
    /// Still held: due again at its lease deadline ([`HOLD`]).
    Held(i64),
    /// Completed: it leaves the index ([`DROP_ROW`]).
    Finished,
    /// Abandoned and due: count the attempt ([`TAKE`]).
    Take,
    /// Parked, not due, or past its ttl.
    Leave,
}

#[cfg(any(feature = "mysql", feature = "sqlite"))]
impl TakeRead {
    pub(super) fn step(&self) -> TakeStep {
        match (self.state, self.lease, self.record_expires) {
            (Some(2), Some(l), _) if l > self.now => TakeStep::Held(l),
            (Some(3), _, Some(e)) if e > self.now => TakeStep::Finished,
            _ if self.due.is_some_and(|d| d <= self.now) && self.expires > self.now => {
                TakeStep::Take
            }
            _ => TakeStep::Leave,
        }
    }
}

/// A listed call from its row's columns (each database reads them its own way).
#[allow(clippy::too_many_arguments)] // one per column
pub(super) fn listed(
    namespace: String,
    scope: String,
    id: Vec<u8>,
    attempts: i64,
    parked: Option<String>,
    overdue_us: i64,
    abandoned: bool,
    steps: i64,
) -> Result<RecoverableCall, Error> {
    Ok(RecoverableCall {
        namespace,
        scope,
        digest: digest(id)?,
        attempts: u32::try_from(attempts).unwrap_or(0),
        parked,
        overdue: Duration::from_micros(u64::try_from(overdue_us).unwrap_or(0)),
        abandoned,
        steps: u32::try_from(steps).unwrap_or(0),
    })
}

/// A recovery row's id as a digest.
pub(super) fn digest(id: Vec<u8>) -> Result<[u8; 16], Error> {
    id.try_into()
        .map_err(|_| Error::store(std::io::Error::other("a recovery row's id is not 16 bytes")))
}

impl SqlStore {
    fn recovery_dialect(&self) -> Result<&dyn RecoveryDialect, Error> {
        self.dialect
            .recovery()
            .ok_or(Error::Unsupported("recovery on this database"))
    }

    /// Ends `owner`'s recoverable claim (see [`RecoveryDialect::settle`]), and wakes the
    /// key's waiters here as a completion or release does.
    async fn end(
        &self,
        key: &Key,
        owner: Owner,
        settle: Option<(Bytes, Duration)>,
        abandon: bool,
    ) -> Result<bool, Error> {
        let dialect = self.recovery_dialect()?;
        let settle = settle.as_ref().map(|(v, ttl)| (v, *ttl));
        let done = self
            .bounded(dialect.settle(key, owner, settle, abandon))
            .await?;
        if done {
            self.watchers.wake(key);
        }
        Ok(done)
    }
}

impl RecoveryStore for SqlStore {
    fn settle<'a>(
        &'a self,
        key: &'a Key,
        owner: Owner,
        settle: Option<(Bytes, Duration)>,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.end(key, owner, settle, false))
    }

    fn abandon<'a>(&'a self, key: &'a Key, owner: Owner) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.end(key, owner, None, true))
    }

    fn due<'a>(
        &'a self,
        namespace: &'a str,
        limit: usize,
        _cursor: u64,
    ) -> BoxFuture<'a, Result<(Vec<Due>, u64), Error>> {
        Box::pin(async move {
            let d = self.recovery_dialect()?;
            Ok((self.bounded(d.due(namespace, limit)).await?, 0))
        })
    }

    fn take<'a>(
        &'a self,
        key: &'a Key,
        backoff: Duration,
    ) -> BoxFuture<'a, Result<Option<Taken>, Error>> {
        Box::pin(async move {
            self.bounded(self.recovery_dialect()?.take(key, backoff))
                .await
        })
    }

    fn park<'a>(&'a self, key: &'a Key, error: &'a str) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            self.bounded(self.recovery_dialect()?.park(key, error))
                .await
        })
    }

    fn list<'a>(
        &'a self,
        namespace: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<RecoverableCall>, Error>> {
        Box::pin(async move {
            let d = self.recovery_dialect()?;
            self.bounded(d.list(namespace, limit, None)).await
        })
    }

    fn call<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Option<RecoverableCall>, Error>> {
        Box::pin(async move {
            let d = self.recovery_dialect()?;
            let mut rows = self
                .bounded(d.list(Some(key.namespace()), 1, Some(key)))
                .await?;
            Ok(rows.pop())
        })
    }
}
