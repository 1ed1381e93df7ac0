//! SQLite statements.
//!
//! SQLite has one writer at a time, so a claim first *reads* the row: a replay or a busy
//! key is answered without taking the write lock, and readers never queue behind
//! writers (WAL). Only an absent or takeable key goes on to the one-statement
//! `INSERT … ON CONFLICT DO UPDATE … WHERE <takeable> RETURNING`, which re-checks the row
//! under the write lock; if it returns nothing, another claimer won in between and the
//! caller reads again.
//!
//! A dedup or token claim never takes a record whose live step journal was written for
//! another payload: the read answers it, and the write's `WHERE` re-checks it. Step
//! journals are in `journal`.

use std::time::Duration;

use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::sqlite::{SqliteConnection, SqlitePool, SqliteRow};
use sqlx::{Row, SqlSafeStr};

use super::inspection::Inspected;
use super::record::takeable;
use super::{BoxFuture, KIND_TOKEN, LOCK_RETENTION, Snapshot, kind_code, owner_bytes, sql_err, us};
use crate::store::{ClaimKind, ClaimRequest, Owner};
use crate::{Error, Key};

/// Microseconds since the epoch. SQLite's `'now'` is fixed for one statement step, so
/// every mention in a statement agrees; `julianday` keeps the clock's milliseconds.
macro_rules! now {
    () => {
        "CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER)"
    };
}

// After `now!`, which their statements use.
mod journal;
mod recovery;
mod toolbox;

use self::journal::{drop_dead_steps, read_steps};

pub(super) fn migrator() -> Migrator {
    let mut m = Migrator::with_migrations(vec![
        Migration::new(
            1,
            "idem records".into(),
            MigrationType::Simple,
            include_str!("../sqlite_v1.sql").into_sql_str(),
            false,
        ),
        Migration::new(
            2,
            "idem toolbox records".into(),
            MigrationType::Simple,
            include_str!("../sqlite_v2.sql").into_sql_str(),
            false,
        ),
        Migration::new(
            3,
            "idem step journals".into(),
            MigrationType::Simple,
            include_str!("../sqlite_v3.sql").into_sql_str(),
            false,
        ),
        Migration::new(
            4,
            "idem step journals, one row per step".into(),
            MigrationType::Simple,
            include_str!("../sqlite_v4.sql").into_sql_str(),
            false,
        ),
        Migration::new(
            5,
            "idem recovery".into(),
            MigrationType::Simple,
            include_str!("../sqlite_v5.sql").into_sql_str(),
            false,
        ),
    ]);
    m.dangerous_set_table_name("_idem_migrations");
    m.set_ignore_missing(true);
    m
}

pub(super) async fn migrate(pool: &SqlitePool) -> Result<(), Error> {
    // SQLite has no advisory lock: two processes opening a new file together may both
    // try to apply a version. The loser's DDL or bookkeeping insert fails (a column
    // already added, the version's primary key), and the next attempt sees it applied.
    // Each attempt gets at least one version further, so one per version suffices;
    // two more leave room for a slow start.
    let versions = migrator().iter().count();
    let mut last = None;
    for _ in 0..versions + 2 {
        match migrator().run(pool).await {
            Ok(()) => return Ok(()),
            Err(e) => last = Some(e),
        }
    }
    Err(Error::store(format!(
        "creating idem's table in SQLite failed: {}",
        last.map(|e| e.to_string()).unwrap_or_default()
    )))
}

const SELECT: &str = concat!(
    "SELECT owner, state, fence, fingerprint, value, expires_us - ",
    now!(),
    " AS remaining_us, lease_us - ",
    now!(),
    " AS lease_left_us, COALESCE(steps_expires_us > ",
    now!(),
    ", 0) AS journal_live, CASE WHEN steps_expires_us > ",
    now!(),
    " THEN steps_fp END AS journal_fp FROM idem_records WHERE id = ?"
);

const CLAIM: &str = concat!(
    "INSERT INTO idem_records
    (id, namespace, scope, kind, state, owner, fence, fingerprint, value,
     expires_us, lease_us, token_expires_us, steps_n, steps_base)
VALUES (?1, ?2, ?3, ?4, 2, ?5, ",
    now!(),
    ", ?6, NULL, ",
    now!(),
    " + ?7, ",
    now!(),
    " + ?7, NULL, ",
    now!(),
    ", ",
    now!(),
    ")
ON CONFLICT (id) DO UPDATE SET
    namespace = excluded.namespace, scope = excluded.scope, kind = excluded.kind,
    state = 2, owner = excluded.owner, fence = MAX(fence + 1, excluded.fence),
    fingerprint = excluded.fingerprint, value = NULL,
    expires_us = excluded.expires_us, lease_us = excluded.lease_us, token_expires_us = NULL
WHERE (state = 0 OR expires_us <= excluded.fence)
  AND NOT COALESCE(steps_expires_us > excluded.fence AND steps_fp <> excluded.fingerprint, 0)
RETURNING fence, COALESCE(steps_expires_us > ",
    now!(),
    ", 0) AS journal_live"
);

const CLAIM_TOKEN: &str = concat!(
    "UPDATE idem_records SET
    state = 2, owner = ?2, fingerprint = ?3, lease_us = ",
    now!(),
    " + ?4,
    token_expires_us = COALESCE(token_expires_us, expires_us),
    expires_us = MAX(COALESCE(token_expires_us, expires_us), ",
    now!(),
    " + ?4)
WHERE id = ?1 AND expires_us > ",
    now!(),
    " AND (state = 1 OR (state = 2 AND lease_us <= ",
    now!(),
    "))
  AND NOT COALESCE(steps_expires_us > ",
    now!(),
    " AND steps_fp <> ?3, 0)
RETURNING fence, COALESCE(steps_expires_us > ",
    now!(),
    ", 0) AS journal_live"
);

fn snapshot(key: &Key, row: &SqliteRow) -> Result<Snapshot, Error> {
    let get = || -> Result<Snapshot, sqlx::Error> {
        Ok(Snapshot {
            claimed: false,
            state: row.try_get("state")?,
            fence: row.try_get("fence")?,
            fingerprint: row.try_get("fingerprint")?,
            value: row.try_get("value")?,
            remaining_us: row.try_get("remaining_us")?,
            lease_left_us: row.try_get("lease_left_us")?,
            journal_live: row.try_get("journal_live")?,
            journal_fp: row.try_get("journal_fp")?,
            journal: None,
        })
    };
    get().map_err(|e| sql_err(Some(key), e))
}

async fn read(conn: &mut SqliteConnection, key: &Key) -> Result<Option<Snapshot>, Error> {
    let row = sqlx::query(SELECT)
        .bind(&key.digest()[..])
        .fetch_optional(&mut *conn)
        .await
        .map_err(|e| sql_err(Some(key), e))?;
    row.map(|r| snapshot(key, &r)).transpose()
}

/// Whether a record's live journal was written for another payload than the claim's
/// (both known): the claim must not take it.
fn other_payload(req: &ClaimRequest, s: &Snapshot) -> bool {
    req.kind != ClaimKind::Lock
        && matches!((&req.fingerprint, &s.journal_fp), (Some(ours), Some(theirs)) if ours.0[..] != theirs[..])
}

pub(super) async fn claim(
    conn: &mut SqliteConnection,
    key: &Key,
    req: &ClaimRequest,
) -> Result<Option<Snapshot>, Error> {
    let seen = read(conn, key).await?;
    match &seen {
        // Not takeable, or its live journal is another payload's (the statement's
        // `WHERE` would refuse it): answered from the read, without the write lock.
        Some(s) if !takeable(req.kind, s) || other_payload(req, s) => return Ok(seen),
        None if req.kind == ClaimKind::Token => return Ok(None),
        _ => {}
    }
    let owner = owner_bytes(req.owner);
    let fp = req.fingerprint.as_ref().map(|f| &f.0[..]);
    let q = if req.kind == ClaimKind::Token {
        sqlx::query(CLAIM_TOKEN)
            .bind(&key.digest()[..])
            .bind(&owner[..])
            .bind(fp)
            .bind(us(req.lease))
    } else {
        sqlx::query(CLAIM)
            .bind(&key.digest()[..])
            .bind(key.namespace())
            .bind(key.scope())
            .bind(kind_code(req.kind))
            .bind(&owner[..])
            .bind(fp)
            .bind(us(req.lease))
    };
    let row = q
        .fetch_optional(&mut *conn)
        .await
        .map_err(|e| sql_err(Some(key), e))?;
    match row {
        Some(r) => Ok(Some(Snapshot {
            claimed: true,
            fence: r.try_get("fence").map_err(|e| sql_err(Some(key), e))?,
            journal_live: r
                .try_get("journal_live")
                .map_err(|e| sql_err(Some(key), e))?,
            ..Snapshot::default()
        })),
        // Lost a race after the read: read again (the caller decides from it).
        None => read(conn, key).await,
    }
}

pub(super) const COMPLETE: &str = concat!(
    "UPDATE idem_records SET state = 3, value = ?3, lease_us = NULL, \
     steps_base = steps_n, steps_expires_us = NULL, steps_fp = NULL, expires_us = ",
    now!(),
    " + ?4 WHERE id = ?1 AND state = 2 AND owner = ?2 AND lease_us > ",
    now!()
);

pub(super) async fn complete(
    conn: &mut SqliteConnection,
    key: &Key,
    owner: Owner,
    value: &[u8],
    ttl: Duration,
) -> Result<bool, Error> {
    owner_checked(COMPLETE, conn, key, owner, value, ttl).await
}

/// Runs `sql`, a statement that changes `key`'s row only if `owner` holds it with a live
/// lease ([`COMPLETE`]), with `bytes` and `ttl`; `true` if it did.
async fn owner_checked(
    sql: &'static str,
    conn: &mut SqliteConnection,
    key: &Key,
    owner: Owner,
    bytes: &[u8],
    ttl: Duration,
) -> Result<bool, Error> {
    let r = sqlx::query(sql)
        .bind(&key.digest()[..])
        .bind(&owner_bytes(owner)[..])
        .bind(bytes)
        .bind(us(ttl))
        .execute(&mut *conn)
        .await
        .map_err(|e| sql_err(Some(key), e))?;
    Ok(r.rows_affected() == 1)
}

pub(super) const RELEASE: &str = concat!(
    "UPDATE idem_records SET
    state = CASE WHEN token_expires_us > ",
    now!(),
    " THEN 1 ELSE 0 END,
    expires_us = CASE WHEN token_expires_us > ",
    now!(),
    " THEN token_expires_us WHEN kind = 1 THEN ",
    now!(),
    " + ?3 ELSE ",
    now!(),
    " END,
    owner = NULL, fingerprint = NULL, lease_us = NULL
WHERE id = ?1 AND state = 2 AND owner = ?2 AND expires_us > ",
    now!()
);

pub(super) async fn release(pool: &SqlitePool, key: &Key, owner: Owner) -> Result<bool, Error> {
    let r = sqlx::query(RELEASE)
        .bind(&key.digest()[..])
        .bind(&owner_bytes(owner)[..])
        .bind(us(LOCK_RETENTION))
        .execute(pool)
        .await
        .map_err(|e| sql_err(Some(key), e))?;
    Ok(r.rows_affected() == 1)
}

const RENEW: &str = concat!(
    "UPDATE idem_records SET
    lease_us = ",
    now!(),
    " + ?3,
    expires_us = MAX(COALESCE(token_expires_us, 0), ",
    now!(),
    " + ?3)
WHERE id = ?1 AND state = 2 AND owner = ?2 AND lease_us > ",
    now!()
);

pub(super) async fn renew(
    pool: &SqlitePool,
    key: &Key,
    owner: Owner,
    lease: Duration,
) -> Result<bool, Error> {
    let r = sqlx::query(RENEW)
        .bind(&key.digest()[..])
        .bind(&owner_bytes(owner)[..])
        .bind(us(lease))
        .execute(pool)
        .await
        .map_err(|e| sql_err(Some(key), e))?;
    Ok(r.rows_affected() == 1)
}

const ISSUE: &str = concat!(
    "INSERT INTO idem_records
    (id, namespace, scope, kind, state, owner, fence, fingerprint, value,
     expires_us, lease_us, token_expires_us, steps_n, steps_base)
VALUES (?1, ?2, ?3, ?4, 1, NULL, 0, NULL, NULL, ",
    now!(),
    " + ?5, NULL, ",
    now!(),
    " + ?5, ",
    now!(),
    ", ",
    now!(),
    ")
ON CONFLICT (id) DO UPDATE SET
    namespace = excluded.namespace, scope = excluded.scope, kind = excluded.kind,
    state = 1, owner = NULL, fingerprint = NULL, value = NULL,
    expires_us = excluded.expires_us, lease_us = NULL,
    token_expires_us = excluded.token_expires_us
WHERE state = 0 OR expires_us <= ",
    now!()
);

pub(super) async fn issue(pool: &SqlitePool, key: &Key, ttl: Duration) -> Result<bool, Error> {
    let r = sqlx::query(ISSUE)
        .bind(&key.digest()[..])
        .bind(key.namespace())
        .bind(key.scope())
        .bind(KIND_TOKEN)
        .bind(us(ttl))
        .execute(pool)
        .await
        .map_err(|e| sql_err(Some(key), e))?;
    Ok(r.rows_affected() == 1)
}

const PURGE: &str = concat!(
    "DELETE FROM idem_records WHERE id IN (
    SELECT id FROM idem_records WHERE expires_us <= ",
    now!(),
    " AND (steps_expires_us IS NULL OR steps_expires_us <= ",
    now!(),
    ") ORDER BY expires_us LIMIT ?1)"
);

/// Deletes up to `batch` expired records, then up to `batch` dead journal entries.
pub(super) async fn purge(pool: &SqlitePool, batch: i64) -> Result<u64, Error> {
    let r = sqlx::query(PURGE)
        .bind(batch)
        .execute(pool)
        .await
        .map_err(Error::store)?;
    journal::purge_steps(pool, batch).await?;
    // Recovery arguments past their ttl.
    sqlx::query(concat!(
        "DELETE FROM idem_recovery WHERE id IN (SELECT id FROM idem_recovery WHERE expires_us <= ",
        now!(),
        " ORDER BY expires_us LIMIT ?1)"
    ))
    .bind(batch)
    .execute(pool)
    .await
    .map_err(Error::store)?;
    Ok(r.rows_affected())
}

// ---- Operator statements (inspect, forget, stats): one statement each. ----

const INSPECT: &str = concat!(
    "SELECT kind, state, owner, fence,
    (fingerprint IS NOT NULL) AS has_fingerprint, length(value) AS value_len,
    expires_us - ",
    now!(),
    " AS ttl_left_us, lease_us - ",
    now!(),
    " AS lease_left_us
FROM idem_records WHERE id = ?1 AND state <> 0 AND expires_us > ",
    now!()
);

pub(super) async fn inspect(pool: &SqlitePool, key: &Key) -> Result<Option<Inspected>, Error> {
    let row = sqlx::query(INSPECT)
        .bind(&key.digest()[..])
        .fetch_optional(pool)
        .await
        .map_err(|e| sql_err(Some(key), e))?;
    row.map(|r| Inspected::from_row(key, &r)).transpose()
}

/// Frees the row whoever holds it, and drops its step journal: a lock keeps its row
/// (and so its fence) for `LOCK_RETENTION`; anything else is left to expire now.
const FORGET: &str = concat!(
    "UPDATE idem_records SET
    expires_us = CASE WHEN kind = 1 THEN ",
    now!(),
    " + ?2 ELSE ",
    now!(),
    " END,
    state = 0, owner = NULL, fingerprint = NULL, value = NULL, lease_us = NULL,
    token_expires_us = NULL, steps_base = steps_n, steps_expires_us = NULL, steps_fp = NULL
WHERE id = ?1 AND state <> 0 AND expires_us > ",
    now!()
);

/// After [`FORGET`] found no record: the journal a released or expired record left
/// (a holder that took the row meanwhile keeps its own).
const FORGET_JOURNAL: &str = concat!(
    "UPDATE idem_records SET steps_base = steps_n, steps_expires_us = NULL, steps_fp = NULL
WHERE id = ?1 AND steps_expires_us IS NOT NULL AND NOT (state = 2 AND lease_us > ",
    now!(),
    ")"
);

pub(super) async fn forget(pool: &SqlitePool, key: &Key) -> Result<bool, Error> {
    let r = sqlx::query(FORGET)
        .bind(&key.digest()[..])
        .bind(us(LOCK_RETENTION))
        .execute(pool)
        .await
        .map_err(|e| sql_err(Some(key), e))?;
    if r.rows_affected() == 0 {
        sqlx::query(FORGET_JOURNAL)
            .bind(&key.digest()[..])
            .execute(pool)
            .await
            .map_err(|e| sql_err(Some(key), e))?;
    }
    // The entries of the journal dropped above (dead already: this only frees space).
    drop_dead_steps(pool, key).await?;
    // A forgotten call is not recovered either.
    sqlx::query("DELETE FROM idem_recovery WHERE id = ?1")
        .bind(&key.digest()[..])
        .execute(pool)
        .await
        .map_err(|e| sql_err(Some(key), e))?;
    Ok(r.rows_affected() == 1)
}

const COUNT: &str = concat!(
    "SELECT namespace, scope, state, COUNT(*) AS n FROM idem_records
WHERE state <> 0 AND expires_us > ",
    now!(),
    " AND (?1 IS NULL OR namespace = ?1)
GROUP BY namespace, scope, state"
);

pub(super) async fn count(
    pool: &SqlitePool,
    namespace: Option<&str>,
) -> Result<Vec<(String, String, i16, i64)>, Error> {
    let rows = sqlx::query(COUNT)
        .bind(namespace)
        .fetch_all(pool)
        .await
        .map_err(Error::store)?;
    rows.iter()
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?, r.try_get(3)?)))
        .collect::<Result<_, sqlx::Error>>()
        .map_err(Error::store)
}

/// The [`Dialect`](super::dialect::Dialect) of SQLite: the statements above, on one pool.
pub(super) struct SqliteDialect {
    pub(super) pool: SqlitePool,
}

impl super::dialect::Dialect for SqliteDialect {
    fn name(&self) -> &'static str {
        "sqlite"
    }

    fn recovery(&self) -> Option<&dyn super::recovery::RecoveryDialect> {
        Some(self)
    }

    fn store_name(&self) -> &'static str {
        "sql-sqlite"
    }

    /// A file: the pool fails at once with the file's own error.
    fn probe(&self, _within: Duration) -> BoxFuture<'_, Result<(), crate::store::Unreachable>> {
        Box::pin(std::future::ready(Ok(())))
    }

    fn claim<'a>(
        &'a self,
        _store: &'a super::SqlStore,
        key: &'a Key,
        req: &'a ClaimRequest,
    ) -> BoxFuture<'a, Result<Option<Snapshot>, Error>> {
        Box::pin(async move {
            let mut c = self.pool.acquire().await.map_err(Error::store)?;
            claim(&mut c, key, req).await
        })
    }

    fn complete<'a>(
        &'a self,
        _store: &'a super::SqlStore,
        key: &'a Key,
        owner: Owner,
        value: &'a bytes::Bytes,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            let mut c = self.pool.acquire().await.map_err(Error::store)?;
            complete(&mut c, key, owner, value, ttl).await
        })
    }

    fn issue<'a>(&'a self, key: &'a Key, ttl: Duration) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(issue(&self.pool, key, ttl))
    }

    fn claim_in<'a>(
        &'a self,
        conn: crate::store::TxConnection<'a>,
        key: &'a Key,
        req: &'a ClaimRequest,
    ) -> BoxFuture<'a, Result<Option<Snapshot>, Error>> {
        Box::pin(async move {
            let conn = super::dialect::own_conn::<SqliteConnection>(self.name(), conn)?;
            claim(conn, key, req).await
        })
    }

    fn begin(&self) -> BoxFuture<'_, Result<crate::store::StepTransaction, Error>> {
        // IMMEDIATE: the step's writes and its journal entry take the write lock up
        // front, rather than failing with SQLITE_BUSY on the first write.
        Box::pin(async move {
            let tx = self
                .pool
                .begin_with("BEGIN IMMEDIATE")
                .await
                .map_err(Error::store)?;
            Ok(crate::store::StepTransaction::Sqlite(tx))
        })
    }

    super::dialect::pooled_methods! {
        conn: SqliteConnection,
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
