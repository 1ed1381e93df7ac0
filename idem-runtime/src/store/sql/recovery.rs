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
