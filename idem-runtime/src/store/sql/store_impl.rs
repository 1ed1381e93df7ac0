//! The [`Store`] impl: each method one conditional statement on the primary key, claims
//! on PostgreSQL batched when the store is busy, and in-process wake-ups for waiters.

use std::collections::HashMap;
use std::future::Future;
#[cfg(feature = "postgres")]
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;

#[cfg(feature = "mysql")]
use super::mysql;
use super::record::{
    CLAIM_ATTEMPTS, CROSS_PROCESS_POLL, LOCK_WAIT_RETRY, Snapshot, decide, is_lock_wait,
};
// What only the batched PostgreSQL claims use.
#[cfg(feature = "postgres")]
use super::record::{owner_bytes, sql_err, us};
#[cfg(feature = "sqlite")]
use super::sqlite;
use super::{Backend, SqlStore};
#[cfg(feature = "postgres")]
use super::{batch, postgres};
#[cfg(feature = "postgres")]
use crate::store::ClaimKind;
use crate::store::{
    BloomStore, BoxFuture, ClaimOutcome, ClaimRequest, Owner, Savepoint, StateStore, Store,
    Subscription, TransactionalStore, TxConnection, VersionedStore,
};
use crate::{Error, Key};

/// The batch queues of a PostgreSQL store.
#[cfg(feature = "postgres")]
pub(super) struct PgBatches {
    claims: Arc<batch::Batcher<postgres::Claims>>,
    async_claims: Arc<batch::Batcher<postgres::Claims>>,
    completions: Arc<batch::Batcher<postgres::Completions>>,
    /// Keys whose claim found the row locked by an open transaction (a transactional-mode
    /// twin), and when. Their claims stay out of batches for [`HELD_ALONE`], so one
    /// long-held key does not stall batch after batch of other keys.
    held: Mutex<HashMap<[u8; 16], std::time::Instant>>,
}

/// How long a key whose row was found locked keeps out of batches.
#[cfg(feature = "postgres")]
const HELD_ALONE: Duration = Duration::from_secs(2);

#[cfg(feature = "postgres")]
impl PgBatches {
    fn recently_held(&self, key: &Key) -> bool {
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.get(key.digest())
            .is_some_and(|at| at.elapsed() < HELD_ALONE)
    }

    /// Passes `result` on, remembering its key if it waited out a row lock.
    fn note_held<T>(&self, key: &Key, result: Result<T, Error>) -> Result<T, Error> {
        if let Err(e) = &result
            && is_lock_wait(e)
        {
            let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
            if held.len() >= 1024 {
                held.retain(|_, at| at.elapsed() < HELD_ALONE);
            }
            held.insert(*key.digest(), std::time::Instant::now());
        }
        result
    }
}

#[cfg(feature = "postgres")]
impl Default for PgBatches {
    fn default() -> Self {
        PgBatches {
            claims: Arc::new(batch::Batcher::new(postgres::Claims {
                async_commit: false,
            })),
            async_claims: Arc::new(batch::Batcher::new(postgres::Claims { async_commit: true })),
            completions: Arc::new(batch::Batcher::new(postgres::Completions)),
            held: Mutex::default(),
        }
    }
}

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
        match &self.backend {
            #[cfg(feature = "postgres")]
            Backend::Postgres(p) => {
                let o = p.connect_options();
                let server = format!("{}:{}", o.get_host(), o.get_port());
                super::unreachable::probe(&*o, "PostgreSQL", server, within).await
            }
            #[cfg(feature = "mysql")]
            Backend::MySql { pool, .. } => {
                let o = pool.connect_options();
                let server = format!("{}:{}", o.get_host(), o.get_port());
                super::unreachable::probe(&*o, "MySQL", server, within).await
            }
            // A file: the pool fails at once with the file's own error.
            #[cfg(feature = "sqlite")]
            Backend::Sqlite(_) => {
                let _ = within;
                Ok(())
            }
        }
    }

    async fn claim_once(&self, key: &Key, req: &ClaimRequest) -> Result<Option<Snapshot>, Error> {
        match &self.backend {
            #[cfg(feature = "postgres")]
            Backend::Postgres(p) => self.claim_pg(p, key, req).await,
            #[cfg(feature = "mysql")]
            Backend::MySql { pool, returning } => {
                let mut c = pool.acquire().await.map_err(Error::store)?;
                mysql::claim(&mut c, *returning, false, key, req).await
            }
            #[cfg(feature = "sqlite")]
            Backend::Sqlite(p) => {
                let mut c = p.acquire().await.map_err(Error::store)?;
                sqlite::claim(&mut c, key, req).await
            }
        }
    }

    /// A PostgreSQL claim: in a batch when the store is busy (see the `batch` module),
    /// else on a connection of its own. Token claims, and claims of a key that an open
    /// transaction held a moment ago, always run alone.
    #[cfg(feature = "postgres")]
    async fn claim_pg(
        &self,
        pool: &sqlx::PgPool,
        key: &Key,
        req: &ClaimRequest,
    ) -> Result<Option<Snapshot>, Error> {
        let async_commit = self.async_claim_commit;
        let batches = &self.batches;
        if req.kind != ClaimKind::Token && !batches.recently_held(key) {
            let batcher = if async_commit {
                &batches.async_claims
            } else {
                &batches.claims
            };
            let alone = batcher.alone(pool);
            let result = match alone {
                Some(mut c) => postgres::claim(&mut c, key, req, false, async_commit).await,
                None => match batcher
                    .submit(pool, self.timeout, postgres::Claim::new(key, req))
                    .await
                {
                    Ok(snap) => snap.transpose().map_err(|e| sql_err(Some(key), e)),
                    // Its batch waited out a row lock (or deadlocked) on some key: run
                    // this claim alone, so that key answers only for itself.
                    Err(e) if batch::rolled_back_for_a_row(&e) => {
                        let mut c = pool.acquire().await.map_err(Error::store)?;
                        postgres::claim(&mut c, key, req, false, async_commit).await
                    }
                    Err(e) => Err(e),
                },
            };
            return batches.note_held(key, result);
        }
        let mut c = pool.acquire().await.map_err(Error::store)?;
        let result = postgres::claim(&mut c, key, req, false, async_commit).await;
        batches.note_held(key, result)
    }

    async fn claim_now(&self, key: &Key, req: &ClaimRequest) -> Result<ClaimOutcome, Error> {
        for _ in 0..CLAIM_ATTEMPTS {
            let snap = match self.claim_once(key, req).await {
                // A transactional-mode twin holds the key uncommitted: busy, not broken.
                Err(e) if is_lock_wait(&e) => {
                    return Ok(ClaimOutcome::Busy {
                        retry_in: LOCK_WAIT_RETRY,
                        fingerprint: None,
                    });
                }
                other => other?,
            };
            if let Some(outcome) = decide(key, req.kind, snap)? {
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
                .bounded(async {
                    match &self.backend {
                        #[cfg(feature = "postgres")]
                        Backend::Postgres(p) => {
                            let batcher = &self.batches.completions;
                            if let Some(mut c) = batcher.alone(p) {
                                return postgres::complete(&mut c, key, owner, &value, ttl).await;
                            }
                            let item = postgres::Completion {
                                id: *key.digest(),
                                owner: owner_bytes(owner),
                                value: value.clone(),
                                ttl_us: us(ttl),
                            };
                            batcher.submit(p, self.timeout, item).await
                        }
                        #[cfg(feature = "mysql")]
                        Backend::MySql { pool, .. } => {
                            let mut c = pool.acquire().await.map_err(Error::store)?;
                            mysql::complete(&mut c, key, owner, &value, ttl).await
                        }
                        #[cfg(feature = "sqlite")]
                        Backend::Sqlite(p) => {
                            let mut c = p.acquire().await.map_err(Error::store)?;
                            sqlite::complete(&mut c, key, owner, &value, ttl).await
                        }
                    }
                })
                .await?;
            if done {
                self.watchers.wake(key);
            }
            Ok(done)
        })
    }

    fn release<'a>(&'a self, key: &'a Key, owner: Owner) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            let done = self
                .bounded(async {
                    match &self.backend {
                        #[cfg(feature = "postgres")]
                        Backend::Postgres(p) => postgres::release(p, key, owner).await,
                        #[cfg(feature = "mysql")]
                        Backend::MySql { pool, .. } => mysql::release(pool, key, owner).await,
                        #[cfg(feature = "sqlite")]
                        Backend::Sqlite(p) => sqlite::release(p, key, owner).await,
                    }
                })
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
        Box::pin(self.bounded(async move {
            match &self.backend {
                #[cfg(feature = "postgres")]
                Backend::Postgres(p) => postgres::renew(p, key, owner, lease).await,
                #[cfg(feature = "mysql")]
                Backend::MySql { pool, .. } => mysql::renew(pool, key, owner, lease).await,
                #[cfg(feature = "sqlite")]
                Backend::Sqlite(p) => sqlite::renew(p, key, owner, lease).await,
            }
        }))
    }

    fn issue<'a>(&'a self, key: &'a Key, ttl: Duration) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.bounded(async move {
            match &self.backend {
                #[cfg(feature = "postgres")]
                Backend::Postgres(p) => postgres::issue(p, key, ttl).await,
                #[cfg(feature = "mysql")]
                Backend::MySql { pool, returning } => {
                    let mut c = pool.acquire().await.map_err(Error::store)?;
                    mysql::issue(&mut c, *returning, key, ttl).await
                }
                #[cfg(feature = "sqlite")]
                Backend::Sqlite(p) => sqlite::issue(p, key, ttl).await,
            }
        }))
    }

    fn inspect<'a>(
        &'a self,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<Option<crate::RecordInfo>, Error>> {
        Box::pin(self.bounded(async move {
            let row = match &self.backend {
                #[cfg(feature = "postgres")]
                Backend::Postgres(p) => postgres::inspect(p, key).await?,
                #[cfg(feature = "mysql")]
                Backend::MySql { pool, .. } => mysql::inspect(pool, key).await?,
                #[cfg(feature = "sqlite")]
                Backend::Sqlite(p) => sqlite::inspect(p, key).await?,
            };
            row.map(|r| r.into_info(key)).transpose()
        }))
    }

    fn forget<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            let done = self
                .bounded(async {
                    match &self.backend {
                        #[cfg(feature = "postgres")]
                        Backend::Postgres(p) => postgres::forget(p, key).await,
                        #[cfg(feature = "mysql")]
                        Backend::MySql { pool, .. } => mysql::forget(pool, key).await,
                        #[cfg(feature = "sqlite")]
                        Backend::Sqlite(p) => sqlite::forget(p, key).await,
                    }
                })
                .await?;
            // Waiters in this process claim again at once; others poll.
            self.watchers.wake(key);
            Ok(done)
        })
    }

    fn record_counts(&self) -> Option<&dyn crate::RecordCounts> {
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

    fn name(&self) -> &'static str {
        match &self.backend {
            #[cfg(feature = "postgres")]
            Backend::Postgres(_) => "sql-postgres",
            #[cfg(feature = "mysql")]
            Backend::MySql { .. } => "sql-mysql",
            #[cfg(feature = "sqlite")]
            Backend::Sqlite(_) => "sql-sqlite",
        }
    }
}

/// The connection of a transaction on this store's database, or the error a
/// transaction on another database is.
fn own_conn<'c, C: 'static>(
    store: &SqlStore,
    conn: &'c mut TxConnection,
) -> Result<&'c mut C, Error> {
    conn.downcast_mut::<C>().ok_or_else(|| {
        Error::Config(format!(
            "the transaction is on another database than the runtime's {} store",
            store.name()
        ))
    })
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
        conn: &'a mut TxConnection,
        key: &'a Key,
        req: &'a ClaimRequest,
    ) -> BoxFuture<'a, Result<ClaimOutcome, Error>> {
        Box::pin(async move {
            let snap = match &self.backend {
                #[cfg(feature = "postgres")]
                Backend::Postgres(_) => {
                    postgres::claim(own_conn(self, conn)?, key, req, true, false).await
                }
                #[cfg(feature = "mysql")]
                Backend::MySql { returning, .. } => {
                    mysql::claim(own_conn(self, conn)?, *returning, true, key, req).await
                }
                #[cfg(feature = "sqlite")]
                Backend::Sqlite(_) => sqlite::claim(own_conn(self, conn)?, key, req).await,
            };
            match snap {
                Ok(snap) => Ok(decide(key, req.kind, snap)?.unwrap_or(BUSY_NOW)),
                Err(e) if is_lock_wait(&e) => Ok(BUSY_NOW),
                Err(e) => Err(e),
            }
        })
    }

    fn complete_in<'a>(
        &'a self,
        conn: &'a mut TxConnection,
        key: &'a Key,
        owner: Owner,
        value: &'a [u8],
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            match &self.backend {
                #[cfg(feature = "postgres")]
                Backend::Postgres(_) => {
                    postgres::complete(own_conn(self, conn)?, key, owner, value, ttl).await
                }
                #[cfg(feature = "mysql")]
                Backend::MySql { .. } => {
                    mysql::complete(own_conn(self, conn)?, key, owner, value, ttl).await
                }
                #[cfg(feature = "sqlite")]
                Backend::Sqlite(_) => {
                    sqlite::complete(own_conn(self, conn)?, key, owner, value, ttl).await
                }
            }
        })
    }

    fn savepoint<'a>(
        &'a self,
        conn: &'a mut TxConnection,
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
                let sql = sqlx::raw_sql(sqlx::AssertSqlSafe(sql));
                let done = match &self.backend {
                    #[cfg(feature = "postgres")]
                    Backend::Postgres(_) => sql
                        .execute(own_conn::<sqlx::PgConnection>(self, conn)?)
                        .await
                        .map(drop),
                    #[cfg(feature = "mysql")]
                    Backend::MySql { .. } => sql
                        .execute(own_conn::<sqlx::MySqlConnection>(self, conn)?)
                        .await
                        .map(drop),
                    #[cfg(feature = "sqlite")]
                    Backend::Sqlite(_) => sql
                        .execute(own_conn::<sqlx::SqliteConnection>(self, conn)?)
                        .await
                        .map(drop),
                };
                done.map_err(Error::store)?;
            }
            Ok(())
        })
    }

    fn committed(&self, key: &Key) {
        self.watchers.wake(key);
    }
}

impl crate::RecordCounts for SqlStore {
    fn count_records<'a>(
        &'a self,
        namespace: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<crate::RecordCount>, Error>> {
        Box::pin(self.bounded(async move {
            let rows = match &self.backend {
                #[cfg(feature = "postgres")]
                Backend::Postgres(p) => postgres::count(p, namespace).await?,
                #[cfg(feature = "mysql")]
                Backend::MySql { pool, .. } => mysql::count(pool, namespace).await?,
                #[cfg(feature = "sqlite")]
                Backend::Sqlite(p) => sqlite::count(p, namespace).await?,
            };
            Ok(super::inspection::counts(rows))
        }))
    }
}
