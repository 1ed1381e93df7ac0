//! The [`Store`] impl: each method one conditional statement on the primary key, claims
//! on PostgreSQL batched when the store is busy, and in-process wake-ups for waiters.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;

use super::SqlStore;
use super::record::{CLAIM_ATTEMPTS, CROSS_PROCESS_POLL, LOCK_WAIT_RETRY, decide, is_lock_wait};
use crate::store::{
    BloomStore, BoxFuture, ClaimOutcome, ClaimRequest, Owner, Savepoint, StateStore,
    StepTransaction, Store, Subscription, TransactionalStore, TxConnection, TxJournalStore,
    VersionedStore,
};
use crate::{Error, Key};

impl SqlStore {
    /// Bounds a store call by the timeout; a call with no answer after a moment looks
    /// at the server itself, so a database that refuses connections is reported at once
    /// with its address and the cause (see [`Unreachable`](super::Unreachable)).
    pub(super) async fn bounded<T>(
        &self,
        fut: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        super::unreachable::bounded(self.timeout, self.backend_name(), fut, |within| {
            self.probe(within)
        })
        .await
    }

    /// One connection attempt beside the pool, to name why the server is unreachable;
    /// shared by the store's slow calls (see [`ProbeGate`](super::unreachable::ProbeGate)).
    async fn probe(&self, within: Duration) -> Result<(), super::Unreachable> {
        self.probes.probe(|| self.probe_once(within)).await
    }

    async fn probe_once(&self, within: Duration) -> Result<(), super::Unreachable> {
        self.dialect.probe(within).await
    }

    async fn claim_now(&self, key: &Key, req: &ClaimRequest) -> Result<ClaimOutcome, Error> {
        for _ in 0..CLAIM_ATTEMPTS {
            // A plain claim does not even ask the dialect for its recovery statements.
            let recovering = req
                .recover
                .as_ref()
                .and_then(|r| Some((r, self.dialect.recovery()?)));
            let claimed = match recovering {
                Some((recover, d)) => d.claim(key, req, recover).await,
                None => self.dialect.claim(self, key, req).await,
            };
            let mut snap = match claimed {
                // A transactional-mode twin holds the key uncommitted: busy, not broken.
                Err(e) if is_lock_wait(&e) => {
                    return Ok(ClaimOutcome::Busy {
                        retry_in: LOCK_WAIT_RETRY,
                        fingerprint: None,
                    });
                }
                other => other?,
            };
            if let Some(s) = &mut snap
                && s.resumes(req.kind)
            {
                s.journal = Some(self.dialect.read_journal(key).await?);
                self.journaled.note(key);
            }
            if let Some(outcome) = decide(key, req, snap)? {
                return Ok(outcome);
            }
        }
        // Lost the race every time: someone else keeps taking the key. Report it busy,
        // so the caller waits and tries again rather than failing.
        Ok(ClaimOutcome::Busy {
            retry_in: Duration::from_millis(1),
            fingerprint: None,
        })
    }
}

/// In-process wake-ups: a waiter on a busy key is woken the moment a call of this process
/// completes or releases it. Twins in other processes are caught by polling.
#[derive(Default)]
pub(super) struct Watchers(Mutex<HashMap<[u8; 16], watch::Sender<()>>>);

impl Watchers {
    fn subscribe(&self, key: &Key) -> watch::Receiver<()> {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        // Keys whose waiters are gone (their twin ran elsewhere) are dropped here, so the
        // map holds about as many keys as there are waiters.
        if map.len() >= 1024 {
            map.retain(|_, tx| tx.receiver_count() > 0);
        }
        map.entry(*key.digest())
            .or_insert_with(|| watch::channel(()).0)
            .subscribe()
    }

    pub(super) fn wake(&self, key: &Key) {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(tx) = map.remove(key.digest()) {
            let _ = tx.send(());
        }
    }
}

impl SqlStore {
    /// Deletes the rows of a journal the completion dropped (MySQL, SQLite; see the
    /// `journal` module). A failure leaves them to the purge: they are dead already.
    async fn drop_dead_steps(&self, key: &Key) {
        if let Err(e) = self.bounded(self.dialect.drop_dead_steps(key)).await {
            tracing::debug!(error = %e, key = %key, "deleting a dropped step journal failed");
        }
    }
}

impl Store for SqlStore {
    fn claim<'a>(
        &'a self,
        key: &'a Key,
        req: &'a ClaimRequest,
    ) -> BoxFuture<'a, Result<ClaimOutcome, Error>> {
        Box::pin(self.bounded(self.claim_now(key, req)))
    }

    fn complete<'a>(
        &'a self,
        key: &'a Key,
        owner: Owner,
        value: Bytes,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            let done = self
                .bounded(async { self.dialect.complete(self, key, owner, &value, ttl).await })
                .await?;
            if done {
                self.watchers.wake(key);
                if self.journaled.take(key) {
                    self.drop_dead_steps(key).await;
                }
            }
            Ok(done)
        })
    }

    fn release<'a>(&'a self, key: &'a Key, owner: Owner) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            let done = self
                .bounded(async { self.dialect.release(key, owner).await })
                .await?;
            if done {
                self.watchers.wake(key);
            }
            Ok(done)
        })
    }

    fn renew<'a>(
        &'a self,
        key: &'a Key,
        owner: Owner,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.bounded(async move { self.dialect.renew(key, owner, lease).await }))
    }

    fn issue<'a>(&'a self, key: &'a Key, ttl: Duration) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.bounded(async move { self.dialect.issue(key, ttl).await }))
    }

    fn inspect<'a>(
        &'a self,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<Option<crate::store::RecordInfo>, Error>> {
        Box::pin(self.bounded(async move {
            let row = self.dialect.inspect(key).await?;
            row.map(|r| r.into_info(key)).transpose()
        }))
    }

    fn forget<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            let done = self
                .bounded(async { self.dialect.forget(key).await })
                .await?;
            // Waiters in this process claim again at once; others poll.
            self.watchers.wake(key);
            Ok(done)
        })
    }

    fn record_counts(&self) -> Option<&dyn crate::store::RecordCounts> {
        Some(self)
    }

    fn subscribe<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Subscription, Error>> {
        let mut rx = self.watchers.subscribe(key);
        Box::pin(std::future::ready(Ok(Subscription::new(async move {
            // Fires on an in-process completion or release, or after a short poll
            // interval for twins in other processes (a spurious wake-up is allowed:
            // the caller claims again).
            tokio::select! {
                _ = rx.changed() => {}
                _ = tokio::time::sleep(CROSS_PROCESS_POLL) => {}
            }
        }))))
    }

    fn versioned(&self) -> Option<&dyn VersionedStore> {
        Some(self)
    }

    fn states(&self) -> Option<&dyn StateStore> {
        Some(self)
    }

    /// SQL has no bitmap here: the filter lives in this store's memory (see the
    /// `toolbox` module), so it sees only this process' ids.
    fn blooms(&self) -> Option<&dyn BloomStore> {
        Some(&*self.blooms)
    }

    fn transactional(&self) -> Option<&dyn TransactionalStore> {
        Some(self)
    }

    /// One row per step beside the record's row: see the `journal` module.
    fn recovery(&self) -> Option<&dyn crate::store::RecoveryStore> {
        self.dialect
            .recovery()
            .map(|_| self as &dyn crate::store::RecoveryStore)
    }

    fn journal(&self) -> Option<&dyn crate::store::JournalStore> {
        Some(self)
    }

    fn name(&self) -> &'static str {
        self.dialect.store_name()
    }
}

/// A claim that must be tried again at once: its row was held by another open
/// transaction past the lock timeout, or the statement kept losing races.
const BUSY_NOW: ClaimOutcome = ClaimOutcome::Busy {
    retry_in: Duration::ZERO,
    fingerprint: None,
};

impl TransactionalStore for SqlStore {
    fn claim_in<'a>(
        &'a self,
        mut conn: TxConnection<'a>,
        key: &'a Key,
        req: &'a ClaimRequest,
    ) -> BoxFuture<'a, Result<ClaimOutcome, Error>> {
        Box::pin(async move {
            let snap = self.dialect.claim_in(conn.reborrow(), key, req).await;
            match snap {
                Ok(mut snap) => {
                    if let Some(s) = &mut snap
                        && s.resumes(req.kind)
                    {
                        s.journal = Some(self.dialect.read_journal_in(conn, key).await?);
                    }
                    Ok(decide(key, req, snap)?.unwrap_or(BUSY_NOW))
                }
                Err(e) if is_lock_wait(&e) => Ok(BUSY_NOW),
                Err(e) => Err(e),
            }
        })
    }

    fn complete_in<'a>(
        &'a self,
        conn: TxConnection<'a>,
        key: &'a Key,
        owner: Owner,
        value: &'a [u8],
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move { self.dialect.complete_in(conn, key, owner, value, ttl).await })
    }

    fn savepoint<'a>(
        &'a self,
        mut conn: TxConnection<'a>,
        op: Savepoint,
        name: &'a str,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            let undo = format!("ROLLBACK TO SAVEPOINT {name}");
            let statements = match op {
                Savepoint::Set => [Some(format!("SAVEPOINT {name}")), None],
                Savepoint::Keep => [None, Some(format!("RELEASE SAVEPOINT {name}"))],
                Savepoint::Undo => [Some(undo), Some(format!("RELEASE SAVEPOINT {name}"))],
            };
            for sql in statements.into_iter().flatten() {
                self.dialect.execute_in(conn.reborrow(), &sql).await?;
            }
            Ok(())
        })
    }

    fn committed(&self, key: &Key) {
        self.watchers.wake(key);
    }
}

impl TxJournalStore for SqlStore {
    fn begin(&self) -> BoxFuture<'_, Result<StepTransaction, Error>> {
        Box::pin(self.bounded(self.dialect.begin()))
    }

    fn write_step_in<'a>(
        &'a self,
        conn: TxConnection<'a>,
        key: &'a Key,
        owner: Owner,
        name: &'a str,
        value: &'a [u8],
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            let entry = super::journal::entry(key, name, Some(value))?;
            let step = super::journal::Step {
                name,
                name_id: super::journal::name_id(name),
                entry: &entry,
                ttl,
            };
            let written = self.dialect.write_step_in(conn, key, owner, &step).await?;
            if written {
                self.journaled.note(key);
            }
            Ok(written)
        })
    }
}

impl crate::store::RecordCounts for SqlStore {
    fn count_records<'a>(
        &'a self,
        namespace: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<crate::store::RecordCount>, Error>> {
        Box::pin(self.bounded(async move {
            let rows = self.dialect.count(namespace).await?;
            Ok(super::inspection::counts(rows))
        }))
    }
}
