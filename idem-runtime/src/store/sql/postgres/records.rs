//! PostgreSQL statements on the record itself: complete (alone or many at once),
//! release, renew, issue, purge, and the operators' inspect, forget and counts. One
//! statement each, decided by the database's clock. Completion, forget and purge drop
//! the record's step journal (its `idem_steps` rows) in the same statement.

use std::time::Duration;

use bytes::Bytes;
use sqlx::Row;
use sqlx::postgres::{PgConnection, PgPool};

use super::super::batch::{Job, changed};
use super::super::inspection::Inspected;
use super::{BoxFuture, KIND_TOKEN, LOCK_RETENTION, owner_bytes, sql_err, us};
use crate::store::Owner;
use crate::{Error, Key};

/// Completes the row if `$2` holds it with a live lease, and drops its step journal:
/// the counter moves past every entry (so none is read again), and the entries are
/// deleted.
const COMPLETE: &str = complete_sql!("");

/// [`COMPLETE`] with one more CTE after its own (with its leading comma), which may read
/// `done`, the completed row.
macro_rules! complete_sql {
    ($($c:tt)*) => { concat!(
    "WITH t AS (SELECT ",
    now!(),
    " AS now),
done AS (
    UPDATE idem_records r SET state = 3, value = $3, lease_us = NULL,
        expires_us = t.now + $4,
        steps_base = r.steps_n, steps_expires_us = NULL, steps_fp = NULL
    FROM t
    WHERE r.id = $1 AND r.state = 2 AND r.owner = $2 AND r.lease_us > t.now
    RETURNING r.id, r.steps_n
),
gone AS (DELETE FROM idem_steps s USING done WHERE s.id = done.id AND s.seq <= done.steps_n)",
    $($c)*,
    "
SELECT COUNT(*)::int8 FROM done"
    )};
}
pub(super) use complete_sql;

pub(in super::super) async fn complete(
    conn: &mut PgConnection,
    key: &Key,
    owner: Owner,
    value: &[u8],
    ttl: Duration,
) -> Result<bool, Error> {
    let done: i64 = sqlx::query_scalar(COMPLETE)
        .bind(&key.digest()[..])
        .bind(&owner_bytes(owner)[..])
        .bind(value)
        .bind(us(ttl))
        .fetch_one(&mut *conn)
        .await
        .map_err(|e| sql_err(Some(key), e))?;
    Ok(done == 1)
}

/// Many completions in one statement (see the `batch` module): per row, what
/// [`COMPLETE`] does. Answers the ids of the records it completed. Rows are found by
/// `id = ANY($1)` rather than by a join with the arrays, which a plan made while the
/// table was small (and kept by the connection) could answer with a scan of the table.
const COMPLETE_BATCH: &str = concat!(
    "WITH t AS (SELECT ",
    now!(),
    " AS now),
done AS (
    UPDATE idem_records r SET
        state = 3, value = ($3::bytea[])[array_position($1::bytea[], r.id)], lease_us = NULL,
        steps_base = r.steps_n, steps_expires_us = NULL, steps_fp = NULL,
        expires_us = t.now + ($4::int8[])[array_position($1::bytea[], r.id)]
    FROM t
    WHERE r.id = ANY($1::bytea[]) AND r.state = 2
      AND r.owner = ($2::bytea[])[array_position($1::bytea[], r.id)] AND r.lease_us > t.now
    RETURNING r.id, r.steps_n
),
gone AS (DELETE FROM idem_steps s USING done WHERE s.id = done.id AND s.seq <= done.steps_n)
SELECT id FROM done"
);

/// One completion in a batch.
pub(in super::super) struct Completion {
    pub(in super::super) id: [u8; 16],
    pub(in super::super) owner: [u8; 16],
    pub(in super::super) value: Bytes,
    pub(in super::super) ttl_us: i64,
}

/// Completions, many per statement.
pub(in super::super) struct Completions;

impl Job for Completions {
    type Item = Completion;
    /// Whether the record was completed.
    type Answer = bool;
    const DROP_ABANDONED: bool = false;

    fn id(item: &Completion) -> [u8; 16] {
        item.id
    }

    fn run<'c>(
        &'c self,
        conn: &'c mut PgConnection,
        items: &'c [Completion],
    ) -> BoxFuture<'c, Result<Vec<bool>, Error>> {
        Box::pin(async move {
            let ids: Vec<[u8; 16]> = items.iter().map(|c| c.id).collect();
            let owners: Vec<[u8; 16]> = items.iter().map(|c| c.owner).collect();
            let values: Vec<&[u8]> = items.iter().map(|c| &c.value[..]).collect();
            let ttls: Vec<i64> = items.iter().map(|c| c.ttl_us).collect();
            let done: Vec<Vec<u8>> = sqlx::query_scalar(COMPLETE_BATCH)
                .bind(&ids)
                .bind(&owners)
                .bind(&values)
                .bind(&ttls)
                .fetch_all(&mut *conn)
                .await
                .map_err(|e| sql_err(None, e))?;
            Ok(changed(&ids, &done))
        })
    }
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

pub(in super::super) async fn release(
    pool: &PgPool,
    key: &Key,
    owner: Owner,
) -> Result<bool, Error> {
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

pub(in super::super) async fn renew(
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
     expires_us, lease_us, token_expires_us, steps_n, steps_base)
SELECT $1, $2, $3, $4, 1, NULL, 0, NULL, NULL, t.now + $5, NULL, t.now + $5, t.now, t.now
FROM t
ON CONFLICT (id) DO UPDATE SET
    namespace = EXCLUDED.namespace, scope = EXCLUDED.scope, kind = EXCLUDED.kind,
    state = 1, owner = NULL, fingerprint = NULL, value = NULL,
    expires_us = EXCLUDED.expires_us, lease_us = NULL,
    token_expires_us = EXCLUDED.token_expires_us
WHERE r.state = 0 OR r.expires_us <= ",
    now!()
);

pub(in super::super) async fn issue(
    pool: &PgPool,
    key: &Key,
    ttl: Duration,
) -> Result<bool, Error> {
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

/// Deletes expired rows whose journal is dead too, with their journal's entries, and
/// entries left without a record.
const PURGE: &str = concat!(
    "WITH t AS (SELECT ",
    now!(),
    " AS now),
gone AS (
    DELETE FROM idem_records WHERE id IN (
        SELECT id FROM idem_records, t WHERE expires_us <= t.now
            AND (steps_expires_us IS NULL OR steps_expires_us <= t.now)
        ORDER BY expires_us LIMIT $1 FOR UPDATE SKIP LOCKED
    ) AND expires_us <= (SELECT now FROM t)
      AND (steps_expires_us IS NULL OR steps_expires_us <= (SELECT now FROM t))
    RETURNING id
),
steps AS (DELETE FROM idem_steps s USING gone WHERE s.id = gone.id),
-- Recovery arguments past their ttl.
rec AS (
    DELETE FROM idem_recovery WHERE id IN (
        SELECT id FROM idem_recovery, t WHERE expires_us <= t.now
        ORDER BY expires_us LIMIT $1 FOR UPDATE SKIP LOCKED
    )
),
-- Entries whose record row was deleted by hand (an operator's `DELETE`), once an hour
-- old: a row inserted anew since starts its counter at the clock, above them.
orphans AS (
    DELETE FROM idem_steps WHERE (id, name_id) IN (
        SELECT s.id, s.name_id FROM idem_steps s, t
        WHERE s.seq < t.now - 3600000000
          AND NOT EXISTS (SELECT 1 FROM idem_records r WHERE r.id = s.id)
        LIMIT $1
    )
)
SELECT COUNT(*)::int8 FROM gone"
);

pub(in super::super) async fn purge(pool: &PgPool, batch: i64) -> Result<u64, Error> {
    let n: i64 = sqlx::query_scalar(PURGE)
        .bind(batch)
        .fetch_one(pool)
        .await
        .map_err(Error::store)?;
    Ok(u64::try_from(n).unwrap_or(0))
}

// ---- Operator statements (inspect, forget, stats): one statement each. ----

const INSPECT: &str = concat!(
    "WITH t AS (SELECT ",
    now!(),
    " AS now)
SELECT r.kind, r.state, r.owner, r.fence,
    (r.fingerprint IS NOT NULL)::int4::int8 AS has_fingerprint,
    octet_length(r.value)::int8 AS value_len,
    r.expires_us - t.now AS ttl_left_us, r.lease_us - t.now AS lease_left_us
FROM idem_records r, t
WHERE r.id = $1 AND r.state <> 0 AND r.expires_us > t.now"
);

pub(in super::super) async fn inspect(
    pool: &PgPool,
    key: &Key,
) -> Result<Option<Inspected>, Error> {
    let row = sqlx::query(INSPECT)
        .bind(&key.digest()[..])
        .fetch_optional(pool)
        .await
        .map_err(|e| sql_err(Some(key), e))?;
    row.map(|r| Inspected::from_row(key, &r)).transpose()
}

/// Frees the row whoever holds it, and drops its step journal (as [`COMPLETE`] does): a
/// lock keeps its row (and so its fence) for `LOCK_RETENTION`; anything else is left to
/// expire now.
const FORGET: &str = concat!(
    "WITH t AS (SELECT ",
    now!(),
    " AS now),
upd AS (
    UPDATE idem_records r SET
        state = 0, owner = NULL, fingerprint = NULL, value = NULL, lease_us = NULL,
        token_expires_us = NULL,
        steps_base = r.steps_n, steps_expires_us = NULL, steps_fp = NULL,
        expires_us = CASE WHEN r.kind = 1 THEN t.now + $2 ELSE t.now END
    FROM t, (SELECT state, expires_us FROM idem_records WHERE id = $1) old
    WHERE r.id = $1
      AND ((r.state <> 0 AND r.expires_us > t.now) OR r.steps_expires_us > t.now)
    -- Whether a record was removed (a live journal alone is dropped, and answers false).
    RETURNING r.id, r.steps_n, old.state <> 0 AND old.expires_us > t.now AS removed
),
gone AS (DELETE FROM idem_steps s USING upd WHERE s.id = upd.id AND s.seq <= upd.steps_n),
-- A forgotten call is not recovered either.
rec AS (DELETE FROM idem_recovery WHERE id = $1)
SELECT removed FROM upd"
);

pub(in super::super) async fn forget(pool: &PgPool, key: &Key) -> Result<bool, Error> {
    let removed: Option<bool> = sqlx::query_scalar(FORGET)
        .bind(&key.digest()[..])
        .bind(us(LOCK_RETENTION))
        .fetch_optional(pool)
        .await
        .map_err(|e| sql_err(Some(key), e))?;
    Ok(removed == Some(true))
}

const COUNT: &str = concat!(
    "SELECT namespace, scope, state, COUNT(*)::int8 AS n FROM idem_records
WHERE state <> 0 AND expires_us > ",
    now!(),
    " AND ($1::text IS NULL OR namespace = $1)
GROUP BY namespace, scope, state"
);

pub(in super::super) async fn count(
    pool: &PgPool,
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
