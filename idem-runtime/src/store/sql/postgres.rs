//! PostgreSQL statements.
//!
//! Claims are one statement: a CTE reads the row, and only when that snapshot shows the
//! key absent or takeable does it `INSERT … ON CONFLICT DO UPDATE … WHERE <takeable>`.
//! A replay therefore reads the completed row and writes nothing (no row lock, no WAL);
//! a race lost between the snapshot and the insert shows up as an empty answer and the
//! caller runs the statement again. The conditional `DO UPDATE` re-checks the row under
//! its lock, so of any number of concurrent claims exactly one wins.

use std::time::Duration;

use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::postgres::{PgConnection, PgPool, PgRow};
use sqlx::{Row, SqlSafeStr};

use super::{KIND_TOKEN, LOCK_RETENTION, Snapshot, kind_code, owner_bytes, sql_err, us};
use crate::store::{ClaimKind, ClaimRequest, Owner};
use crate::{Error, Key};

/// Microseconds since the epoch by the server's clock. `now()` is fixed for the whole
/// statement (and transaction), so every mention agrees.
macro_rules! now {
    () => {
        "(extract(epoch from now()) * 1000000)::int8"
    };
}

pub(super) fn migrator() -> Migrator {
    let mut m = Migrator::with_migrations(vec![
        Migration::new(
            1,
            "idem records".into(),
            MigrationType::Simple,
            include_str!("postgres_v1.sql").into_sql_str(),
            false,
        ),
        Migration::new(
            2,
            "idem toolbox records".into(),
            MigrationType::Simple,
            include_str!("postgres_v2.sql").into_sql_str(),
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

macro_rules! claim_sql {
    ($($t:tt)*) => { concat!(
    "WITH t AS (SELECT ",
    now!(),
    " AS now", $($t)*, "),
cur AS (SELECT r.* FROM idem_records r WHERE r.id = $1),
ins AS (
    INSERT INTO idem_records AS r
        (id, namespace, scope, kind, state, owner, fence, fingerprint, value,
         expires_us, lease_us, token_expires_us)
    SELECT $1, $2, $3, $4, 2, $5, t.now, $6, NULL, t.now + $7, t.now + $7, NULL FROM t
    WHERE NOT EXISTS (SELECT 1 FROM cur, t WHERE cur.state <> 0 AND cur.expires_us > t.now)
    ON CONFLICT (id) DO UPDATE SET
        namespace = EXCLUDED.namespace, scope = EXCLUDED.scope, kind = EXCLUDED.kind,
        state = 2, owner = EXCLUDED.owner,
        fence = GREATEST(r.fence + 1, EXCLUDED.fence),
        fingerprint = EXCLUDED.fingerprint, value = NULL,
        expires_us = EXCLUDED.expires_us, lease_us = EXCLUDED.lease_us,
        token_expires_us = NULL
    -- EXCLUDED.fence is the statement's now.
    WHERE r.state = 0 OR r.expires_us <= EXCLUDED.fence
    RETURNING r.fence
)
SELECT TRUE AS claimed, ins.fence, 2::int2 AS state, NULL::bytea AS fingerprint,
       NULL::bytea AS value, 1::int8 AS remaining_us, 1::int8 AS lease_left_us
FROM ins
UNION ALL
SELECT FALSE, cur.fence, cur.state, cur.fingerprint, cur.value,
       cur.expires_us - t.now, cur.lease_us - t.now
FROM cur, t WHERE NOT EXISTS (SELECT 1 FROM ins)"
)
    };
}

/// Inside a caller's transaction (transactional mode), which sets its own lock timeout.
const CLAIM_IN_TX: &str = claim_sql!("");
/// On its own (autocommit). A key held by an uncommitted transactional-mode claim
/// blocks the insert on the unique key; `lock_timeout` turns a long wait into error
/// 55P03, answered as `Busy` so the caller waits by its own rules instead of inside the
/// server. `set_config(..., true)` lasts for the statement's implicit transaction only.
const CLAIM: &str = claim_sql!(", set_config('lock_timeout', '1000', true) AS lock_timeout");
/// The same, committed without waiting for the WAL flush (see
/// [`SqlStore::with_async_claim_commit`](super::SqlStore::with_async_claim_commit)).
const CLAIM_ASYNC: &str = claim_sql!(
    ", set_config('lock_timeout', '1000', true) AS lock_timeout, \
     set_config('synchronous_commit', 'off', true) AS async_commit"
);

const CLAIM_TOKEN: &str = concat!(
    "WITH t AS (SELECT ",
    now!(),
    " AS now),
cur AS (SELECT r.* FROM idem_records r WHERE r.id = $1),
upd AS (
    UPDATE idem_records r SET
        state = 2, owner = $2, fingerprint = $3, lease_us = t.now + $4,
        token_expires_us = COALESCE(r.token_expires_us, r.expires_us),
        expires_us = GREATEST(COALESCE(r.token_expires_us, r.expires_us), t.now + $4)
    FROM t
    WHERE r.id = $1 AND r.expires_us > t.now
      AND (r.state = 1 OR (r.state = 2 AND r.lease_us <= t.now))
    RETURNING r.fence
)
SELECT TRUE AS claimed, upd.fence, 2::int2 AS state, NULL::bytea AS fingerprint,
       NULL::bytea AS value, 1::int8 AS remaining_us, 1::int8 AS lease_left_us
FROM upd
UNION ALL
SELECT FALSE, cur.fence, cur.state, cur.fingerprint, cur.value,
       cur.expires_us - t.now, cur.lease_us - t.now
FROM cur, t WHERE NOT EXISTS (SELECT 1 FROM upd)"
);

fn snapshot(key: &Key, row: &PgRow) -> Result<Snapshot, Error> {
    let get = || -> Result<Snapshot, sqlx::Error> {
        Ok(Snapshot {
            claimed: row.try_get("claimed")?,
            state: row.try_get("state")?,
            fence: row.try_get("fence")?,
            fingerprint: row.try_get("fingerprint")?,
            value: row.try_get("value")?,
            remaining_us: row.try_get("remaining_us")?,
            lease_left_us: row.try_get("lease_left_us")?,
        })
    };
    get().map_err(|e| sql_err(Some(key), e))
}

/// `in_tx`: the claim runs inside the caller's transaction, whose settings it must not
/// touch. `async_commit` (never with `in_tx`): commit without waiting for the WAL flush.
pub(super) async fn claim(
    conn: &mut PgConnection,
    key: &Key,
    req: &ClaimRequest,
    in_tx: bool,
    async_commit: bool,
) -> Result<Option<Snapshot>, Error> {
    let owner = owner_bytes(req.owner);
    let fp = req.fingerprint.as_ref().map(|f| &f.0[..]);
    let row = if req.kind == ClaimKind::Token {
        sqlx::query(CLAIM_TOKEN)
            .bind(&key.digest()[..])
            .bind(&owner[..])
            .bind(fp)
            .bind(us(req.lease))
            .fetch_optional(&mut *conn)
            .await
    } else {
        sqlx::query(match (in_tx, async_commit) {
            (true, _) => CLAIM_IN_TX,
            (false, true) => CLAIM_ASYNC,
            (false, false) => CLAIM,
        })
        .bind(&key.digest()[..])
        .bind(key.namespace())
        .bind(key.scope())
        .bind(kind_code(req.kind))
        .bind(&owner[..])
        .bind(fp)
        .bind(us(req.lease))
        .fetch_optional(&mut *conn)
        .await
    }
    .map_err(|e| sql_err(Some(key), e))?;
    row.map(|r| snapshot(key, &r)).transpose()
}

const COMPLETE: &str = concat!(
    "UPDATE idem_records SET state = 3, value = $3, lease_us = NULL, expires_us = ",
    now!(),
    " + $4 WHERE id = $1 AND state = 2 AND owner = $2 AND lease_us > ",
    now!()
);

pub(super) async fn complete(
    conn: &mut PgConnection,
    key: &Key,
    owner: Owner,
    value: &[u8],
    ttl: Duration,
) -> Result<bool, Error> {
    let r = sqlx::query(COMPLETE)
        .bind(&key.digest()[..])
        .bind(&owner_bytes(owner)[..])
        .bind(value)
        .bind(us(ttl))
        .execute(&mut *conn)
        .await
        .map_err(|e| sql_err(Some(key), e))?;
    Ok(r.rows_affected() == 1)
}

const RELEASE: &str = concat!(
    "WITH t AS (SELECT ",
    now!(),
    " AS now)
UPDATE idem_records r SET
    state = CASE WHEN r.token_expires_us > t.now THEN 1 ELSE 0 END,
    expires_us = CASE WHEN r.token_expires_us > t.now THEN r.token_expires_us
                      WHEN r.kind = 1 THEN t.now + $3 ELSE t.now END,
    owner = NULL, fingerprint = NULL, lease_us = NULL
FROM t
WHERE r.id = $1 AND r.state = 2 AND r.owner = $2 AND r.expires_us > t.now"
);

pub(super) async fn release(pool: &PgPool, key: &Key, owner: Owner) -> Result<bool, Error> {
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
    "WITH t AS (SELECT ",
    now!(),
    " AS now)
UPDATE idem_records r SET
    lease_us = t.now + $3,
    expires_us = GREATEST(COALESCE(r.token_expires_us, 0), t.now + $3)
FROM t
WHERE r.id = $1 AND r.state = 2 AND r.owner = $2 AND r.lease_us > t.now"
);

pub(super) async fn renew(
    pool: &PgPool,
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
    "WITH t AS (SELECT ",
    now!(),
    " AS now)
INSERT INTO idem_records AS r
    (id, namespace, scope, kind, state, owner, fence, fingerprint, value,
     expires_us, lease_us, token_expires_us)
SELECT $1, $2, $3, $4, 1, NULL, 0, NULL, NULL, t.now + $5, NULL, t.now + $5 FROM t
ON CONFLICT (id) DO UPDATE SET
    namespace = EXCLUDED.namespace, scope = EXCLUDED.scope, kind = EXCLUDED.kind,
    state = 1, owner = NULL, fingerprint = NULL, value = NULL,
    expires_us = EXCLUDED.expires_us, lease_us = NULL,
    token_expires_us = EXCLUDED.token_expires_us
WHERE r.state = 0 OR r.expires_us <= ",
    now!()
);

pub(super) async fn issue(pool: &PgPool, key: &Key, ttl: Duration) -> Result<bool, Error> {
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
    " ORDER BY expires_us LIMIT $1 FOR UPDATE SKIP LOCKED
) AND expires_us <= ",
    now!()
);

pub(super) async fn purge(pool: &PgPool, batch: i64) -> Result<u64, Error> {
    let r = sqlx::query(PURGE)
        .bind(batch)
        .execute(pool)
        .await
        .map_err(Error::store)?;
    Ok(r.rows_affected())
}
