//! PostgreSQL: the [`Dialect`](super::dialect::Dialect), its migrations and its batch
//! queues here; the statements by concern in `claims` (one statement per claim, or per
//! batch of claims), `records` (complete, release, renew, issue, purge, the operators'
//! statements) and `journal` (durable steps), plus `toolbox`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use sqlx::SqlSafeStr;
use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::postgres::{PgConnection, PgPool};

use super::inspection::Inspected;
use super::{
    BoxFuture, KIND_TOKEN, LOCK_RETENTION, Snapshot, is_lock_wait, kind_code, owner_bytes, sql_err,
    us,
};
use crate::store::{ClaimKind, ClaimRequest, Owner};
use crate::{Error, Key};

/// Microseconds since the epoch by the server's clock. `now()` is fixed for the whole
/// statement (and transaction), so every mention agrees.
macro_rules! now {
    () => {
        "(extract(epoch from now()) * 1000000)::int8"
    };
}

// After `now!`, which their statements use.
mod claims;
mod journal;
mod records;
mod recovery;
mod toolbox;

use self::claims::{Claim, Claims, claim};
use self::journal::{StepWrite, StepWrites, drop_dead_steps, read_steps};
use self::records::{
    Completion, Completions, complete, count, forget, inspect, issue, purge, release, renew,
};

pub(super) fn migrator() -> Migrator {
    let mut m = Migrator::with_migrations(vec![
        Migration::new(
            1,
            "idem records".into(),
            MigrationType::Simple,
            include_str!("../postgres_v1.sql").into_sql_str(),
            false,
        ),
        Migration::new(
            2,
            "idem toolbox records".into(),
            MigrationType::Simple,
            include_str!("../postgres_v2.sql").into_sql_str(),
            false,
        ),
        Migration::new(
            3,
            "idem step journals".into(),
            MigrationType::Simple,
            include_str!("../postgres_v3.sql").into_sql_str(),
            false,
        ),
        Migration::new(
            4,
            "idem step journals, one row per step".into(),
            MigrationType::Simple,
            include_str!("../postgres_v4.sql").into_sql_str(),
            false,
        ),
        Migration::new(
            5,
            "idem recovery".into(),
            MigrationType::Simple,
            include_str!("../postgres_v5.sql").into_sql_str(),
            false,
        ),
    ]);
    m.dangerous_set_table_name("_idem_migrations");
    // A newer idem may have added migrations; an older binary still runs on its table.
    m.set_ignore_missing(true);
    m
}

pub(super) async fn migrate(pool: &PgPool) -> Result<(), Error> {
    // The migrator holds an advisory lock while it applies, so processes starting
    // together apply the migration once.
    migrator()
        .run(pool)
        .await
        .map_err(|e| Error::store(format!("creating idem's table in PostgreSQL failed: {e}")))
}

/// The [`Dialect`](super::dialect::Dialect) of PostgreSQL: the statements above, on one
/// pool; claims, completions and step writes batched when the store is busy (the `batch`
/// module).
pub(super) struct PgDialect {
    pub(super) pool: PgPool,
}

impl PgDialect {
    /// A claim in a batch when the store is busy, else on a connection of its own.
    /// Token claims, and claims of a key that an open transaction held a moment ago,
    /// always run alone.
    async fn claim_batched(
        &self,
        store: &super::SqlStore,
        key: &Key,
        req: &ClaimRequest,
    ) -> Result<Option<Snapshot>, Error> {
        let pool = &self.pool;
        let async_commit = store.async_claim_commit;
        let batches = &store.batches;
        if req.kind != ClaimKind::Token && !batches.recently_held(key) {
            let batcher = if async_commit {
                &batches.async_claims
            } else {
                &batches.claims
            };
            let result = match batcher.alone(pool) {
                Some(mut c) => claim(&mut c, key, req, false, async_commit).await,
                None => match batcher
                    .submit(pool, store.timeout, Claim::new(key, req))
                    .await
                {
                    Ok(snap) => snap.transpose().map_err(|e| sql_err(Some(key), e)),
                    // Its batch waited out a row lock (or deadlocked) on some key: run
                    // this claim alone, so that key answers only for itself.
                    Err(e) if super::batch::rolled_back_for_a_row(&e) => {
                        let mut c = pool.acquire().await.map_err(Error::store)?;
                        claim(&mut c, key, req, false, async_commit).await
                    }
                    Err(e) => Err(e),
                },
            };
            return batches.note_held(key, result);
        }
        let mut c = pool.acquire().await.map_err(Error::store)?;
        let result = claim(&mut c, key, req, false, async_commit).await;
        batches.note_held(key, result)
    }
}

impl super::dialect::Dialect for PgDialect {
    fn name(&self) -> &'static str {
        "postgres"
    }

    fn recovery(&self) -> Option<&dyn super::recovery::RecoveryDialect> {
        Some(self)
    }

    fn store_name(&self) -> &'static str {
        "sql-postgres"
    }

    fn probe(&self, within: Duration) -> BoxFuture<'_, Result<(), crate::store::Unreachable>> {
        Box::pin(async move {
            let o = self.pool.connect_options();
            let server = format!("{}:{}", o.get_host(), o.get_port());
            super::unreachable::probe(&*o, "PostgreSQL", server, within).await
        })
    }

    fn claim<'a>(
        &'a self,
        store: &'a super::SqlStore,
        key: &'a Key,
        req: &'a ClaimRequest,
    ) -> BoxFuture<'a, Result<Option<Snapshot>, Error>> {
        Box::pin(self.claim_batched(store, key, req))
    }

    fn complete<'a>(
        &'a self,
        store: &'a super::SqlStore,
        key: &'a Key,
        owner: Owner,
        value: &'a Bytes,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            let batcher = &store.batches.completions;
            if let Some(mut c) = batcher.alone(&self.pool) {
                return complete(&mut c, key, owner, value, ttl).await;
            }
            let item = Completion {
                id: *key.digest(),
                owner: owner_bytes(owner),
                value: value.clone(),
                ttl_us: us(ttl),
            };
            batcher.submit(&self.pool, store.timeout, item).await
        })
    }

    fn issue<'a>(&'a self, key: &'a Key, ttl: Duration) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(issue(&self.pool, key, ttl))
    }

    fn write_step<'a>(
        &'a self,
        store: &'a super::SqlStore,
        key: &'a Key,
        owner: Owner,
        step: &'a super::journal::Step<'a>,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            let batcher = &store.batches.steps;
            if let Some(mut c) = batcher.alone(&self.pool) {
                return self.write_step_on(&mut c, false, key, owner, step).await;
            }
            let item = StepWrite::new(key, owner, step);
            match batcher.submit(&self.pool, store.timeout, item).await {
                // Its batch waited out a row lock (or deadlocked) on some record and
                // was rolled back: this write runs alone, waiting as it would unbatched.
                Err(e) if super::batch::rolled_back_for_a_row(&e) => {
                    let mut c = self.pool.acquire().await.map_err(Error::store)?;
                    self.write_step_on(&mut c, false, key, owner, step).await
                }
                written => written,
            }
        })
    }

    fn claim_in<'a>(
        &'a self,
        conn: crate::store::TxConnection<'a>,
        key: &'a Key,
        req: &'a ClaimRequest,
    ) -> BoxFuture<'a, Result<Option<Snapshot>, Error>> {
        Box::pin(async move {
            let conn = super::dialect::own_conn::<PgConnection>(self.name(), conn)?;
            claim(conn, key, req, true, false).await
        })
    }

    fn begin(&self) -> BoxFuture<'_, Result<crate::store::StepTransaction, Error>> {
        Box::pin(async move {
            // No lock timeout: the step's own writes wait as the user's would.
            let tx = self.pool.begin().await.map_err(Error::store)?;
            Ok(crate::store::StepTransaction::Postgres(tx))
        })
    }

    super::dialect::pooled_methods! {
        conn: PgConnection,
        release: release,
        renew: renew,
        inspect: inspect,
        forget: forget,
        count: count,
        purge: purge,
        complete: complete,
        write_step_on: Self::write_step_on,
        read_steps: read_steps,
        drop_dead_steps: drop_dead_steps,
        toolbox: toolbox,
    }
}

/// The batch queues of a PostgreSQL store.
pub(super) struct PgBatches {
    pub(super) claims: Arc<super::batch::Batcher<Claims>>,
    pub(super) async_claims: Arc<super::batch::Batcher<Claims>>,
    pub(super) completions: Arc<super::batch::Batcher<Completions>>,
    pub(super) steps: Arc<super::batch::Batcher<StepWrites>>,
    /// Keys whose claim found the row locked by an open transaction (a transactional-mode
    /// twin), and when. Their claims stay out of batches for [`HELD_ALONE`], so one
    /// long-held key does not stall batch after batch of other keys.
    held: Mutex<HashMap<[u8; 16], std::time::Instant>>,
}

/// How long a key whose row was found locked keeps out of batches.
const HELD_ALONE: Duration = Duration::from_secs(2);

impl PgBatches {
    pub(super) fn recently_held(&self, key: &Key) -> bool {
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.get(key.digest())
            .is_some_and(|at| at.elapsed() < HELD_ALONE)
    }

    /// Passes `result` on, remembering its key if it waited out a row lock.
    pub(super) fn note_held<T>(&self, key: &Key, result: Result<T, Error>) -> Result<T, Error> {
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

impl Default for PgBatches {
    fn default() -> Self {
        PgBatches {
            claims: Arc::new(super::batch::Batcher::new(Claims {
                async_commit: false,
            })),
            async_claims: Arc::new(super::batch::Batcher::new(Claims { async_commit: true })),
            completions: Arc::new(super::batch::Batcher::new(Completions)),
            steps: Arc::new(super::batch::Batcher::new(StepWrites)),
            held: Mutex::default(),
        }
    }
}
