//! PostgreSQL statements.
//!
//! Claims are one statement: a CTE reads the row, and only when that snapshot shows the
//! key absent or takeable does it `INSERT … ON CONFLICT DO UPDATE … WHERE <takeable>`.
//! A replay therefore reads the completed row and writes nothing (no row lock, no WAL);
//! a race lost between the snapshot and the insert shows up as an empty answer and the
//! caller runs the statement again. The conditional `DO UPDATE` re-checks the row under
//! its lock, so of any number of concurrent claims exactly one wins.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::postgres::{PgConnection, PgPool, PgRow};
use sqlx::{Row, SqlSafeStr};

use super::batch::Job;
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

// After `now!`, which its statements use.
mod toolbox;

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
    RETURNING r.fence, r.steps, r.steps_expires_us
)
SELECT TRUE AS claimed, ins.fence, 2::int2 AS state, NULL::bytea AS fingerprint,
       NULL::bytea AS value, 1::int8 AS remaining_us, 1::int8 AS lease_left_us,
       CASE WHEN ins.steps_expires_us > t.now THEN ins.steps END AS steps
FROM ins, t
UNION ALL
SELECT FALSE, cur.fence, cur.state, cur.fingerprint, cur.value,
       cur.expires_us - t.now, cur.lease_us - t.now, NULL::bytea
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
    RETURNING r.fence, r.steps, r.steps_expires_us
)
SELECT TRUE AS claimed, upd.fence, 2::int2 AS state, NULL::bytea AS fingerprint,
       NULL::bytea AS value, 1::int8 AS remaining_us, 1::int8 AS lease_left_us,
       CASE WHEN upd.steps_expires_us > t.now THEN upd.steps END AS steps
FROM upd, t
UNION ALL
SELECT FALSE, cur.fence, cur.state, cur.fingerprint, cur.value,
       cur.expires_us - t.now, cur.lease_us - t.now, NULL::bytea
FROM cur, t WHERE NOT EXISTS (SELECT 1 FROM upd)"
);

/// Many dedup or lock claims in one statement (see the `batch` module): per key, the
/// same decision as [`CLAIM`], on the same clock. Rows are inserted in id order (the
/// batch is sorted), and existing ones are read by `id = ANY($1)` (see
/// [`COMPLETE_BATCH`]). Answers one row per key that the statement took or found, with
/// its id first. A row lock is waited for 100 ms, not a second: long enough for another
/// process' claim of the same key to commit, short enough that a key held by an open
/// transaction holds up its batch only briefly (its calls are then run alone).
macro_rules! claim_batch_sql {
    ($($t:tt)*) => { concat!(
    "WITH t AS (SELECT ",
    now!(),
    " AS now, set_config('lock_timeout', '100', true) AS lock_timeout", $($t)*, "),
v AS (
    SELECT * FROM unnest($1::bytea[], $2::text[], $3::text[], $4::int2[], $5::bytea[],
                         $6::bytea[], $7::int8[])
        AS v(id, namespace, scope, kind, owner, fingerprint, lease_us)
),
cur AS (SELECT r.* FROM idem_records r WHERE r.id = ANY($1::bytea[])),
ins AS (
    INSERT INTO idem_records AS r
        (id, namespace, scope, kind, state, owner, fence, fingerprint, value,
         expires_us, lease_us, token_expires_us)
    SELECT v.id, v.namespace, v.scope, v.kind, 2, v.owner, t.now, v.fingerprint, NULL,
           t.now + v.lease_us, t.now + v.lease_us, NULL
    FROM v, t
    WHERE NOT EXISTS (
        SELECT 1 FROM cur WHERE cur.id = v.id AND cur.state <> 0 AND cur.expires_us > t.now
    )
    ORDER BY v.id
    ON CONFLICT (id) DO UPDATE SET
        namespace = EXCLUDED.namespace, scope = EXCLUDED.scope, kind = EXCLUDED.kind,
        state = 2, owner = EXCLUDED.owner,
        fence = GREATEST(r.fence + 1, EXCLUDED.fence),
        fingerprint = EXCLUDED.fingerprint, value = NULL,
        expires_us = EXCLUDED.expires_us, lease_us = EXCLUDED.lease_us,
        token_expires_us = NULL
    -- EXCLUDED.fence is the statement's now.
    WHERE r.state = 0 OR r.expires_us <= EXCLUDED.fence
    RETURNING r.id, r.fence, r.steps, r.steps_expires_us
)
SELECT ins.id, TRUE AS claimed, ins.fence, 2::int2 AS state, NULL::bytea AS fingerprint,
       NULL::bytea AS value, 1::int8 AS remaining_us, 1::int8 AS lease_left_us,
       CASE WHEN ins.steps_expires_us > t.now THEN ins.steps END AS steps
FROM ins, t
UNION ALL
SELECT cur.id, FALSE, cur.fence, cur.state, cur.fingerprint, cur.value,
       cur.expires_us - t.now, cur.lease_us - t.now, NULL::bytea
FROM cur, t WHERE NOT EXISTS (SELECT 1 FROM ins WHERE ins.id = cur.id)"
)
    };
}

const CLAIM_BATCH: &str = claim_batch_sql!("");
const CLAIM_BATCH_ASYNC: &str =
    claim_batch_sql!(", set_config('synchronous_commit', 'off', true) AS async_commit");

/// One dedup or lock claim in a batch.
pub(super) struct Claim {
    pub(super) id: [u8; 16],
    pub(super) namespace: &'static str,
    pub(super) scope: &'static str,
    pub(super) kind: i16,
    pub(super) owner: [u8; 16],
    pub(super) fingerprint: Option<[u8; 16]>,
    pub(super) lease_us: i64,
}

impl Claim {
    pub(super) fn new(key: &Key, req: &ClaimRequest) -> Claim {
        Claim {
            id: *key.digest(),
            namespace: key.namespace(),
            scope: key.scope(),
            kind: kind_code(req.kind),
            owner: owner_bytes(req.owner),
            fingerprint: req.fingerprint.as_ref().map(|f| f.0),
            lease_us: us(req.lease),
        }
    }
}

/// Dedup and lock claims, many per statement; `async_commit` as in [`claim`].
pub(super) struct Claims {
    pub(super) async_commit: bool,
}

impl Job for Claims {
    type Item = Claim;
    /// What the statement saw of the key (`None` as from [`claim`]), or why its row
    /// does not decode.
    type Answer = Option<Result<Snapshot, sqlx::Error>>;
    const DROP_ABANDONED: bool = true;

    fn id(item: &Claim) -> [u8; 16] {
        item.id
    }

    fn run<'c>(
        &'c self,
        conn: &'c mut PgConnection,
        items: &'c [Claim],
    ) -> BoxFuture<'c, Result<Vec<Self::Answer>, Error>> {
        Box::pin(async move {
            let ids: Vec<[u8; 16]> = items.iter().map(|c| c.id).collect();
            let namespaces: Vec<&str> = items.iter().map(|c| c.namespace).collect();
            let scopes: Vec<&str> = items.iter().map(|c| c.scope).collect();
            let kinds: Vec<i16> = items.iter().map(|c| c.kind).collect();
            let owners: Vec<[u8; 16]> = items.iter().map(|c| c.owner).collect();
            let fingerprints: Vec<Option<[u8; 16]>> = items.iter().map(|c| c.fingerprint).collect();
            let leases: Vec<i64> = items.iter().map(|c| c.lease_us).collect();
            let rows = sqlx::query(if self.async_commit {
                CLAIM_BATCH_ASYNC
            } else {
                CLAIM_BATCH
            })
            .bind(&ids)
            .bind(&namespaces)
            .bind(&scopes)
            .bind(&kinds)
            .bind(&owners)
            .bind(&fingerprints)
            .bind(&leases)
            .fetch_all(&mut *conn)
            .await
            .map_err(|e| sql_err(None, e))?;
            let mut answers: Vec<Self::Answer> = items.iter().map(|_| None).collect();
            for row in &rows {
                let id: Vec<u8> = row.try_get("id").map_err(|e| sql_err(None, e))?;
                let Ok(i) = ids.binary_search_by(|probe| probe[..].cmp(&id[..])) else {
                    continue;
                };
                answers[i] = Some(read_snapshot(row));
            }
            Ok(answers)
        })
    }
}

fn read_snapshot(row: &PgRow) -> Result<Snapshot, sqlx::Error> {
    Ok(Snapshot {
        claimed: row.try_get("claimed")?,
        state: row.try_get("state")?,
        fence: row.try_get("fence")?,
        fingerprint: row.try_get("fingerprint")?,
        value: row.try_get("value")?,
        remaining_us: row.try_get("remaining_us")?,
        lease_left_us: row.try_get("lease_left_us")?,
        steps: row.try_get("steps")?,
    })
}

fn snapshot(key: &Key, row: &PgRow) -> Result<Snapshot, Error> {
    read_snapshot(row).map_err(|e| sql_err(Some(key), e))
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
    "UPDATE idem_records SET state = 3, value = $3, lease_us = NULL, steps = NULL, \
     steps_expires_us = NULL, expires_us = ",
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
    owner_checked(COMPLETE, conn, key, owner, value, ttl).await
}

/// Runs `sql`, a statement that changes `key`'s row only if `owner` holds it with a live
/// lease ([`COMPLETE`], `WRITE_STEP`), with `bytes` and `ttl`; `true` if it did.
async fn owner_checked(
    sql: &'static str,
    conn: &mut PgConnection,
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

/// Many completions in one statement (see the `batch` module): per row, the conditions
/// of [`COMPLETE`]. Answers the ids of the records it completed. Rows are found by
/// `id = ANY($1)` rather than by a join with the arrays, which a plan made while the
/// table was small (and kept by the connection) could answer with a scan of the table.
const COMPLETE_BATCH: &str = concat!(
    "WITH t AS (SELECT ",
    now!(),
    " AS now)
UPDATE idem_records r SET
    state = 3, value = ($3::bytea[])[array_position($1::bytea[], r.id)], lease_us = NULL,
    steps = NULL, steps_expires_us = NULL,
    expires_us = t.now + ($4::int8[])[array_position($1::bytea[], r.id)]
FROM t
WHERE r.id = ANY($1::bytea[]) AND r.state = 2
  AND r.owner = ($2::bytea[])[array_position($1::bytea[], r.id)] AND r.lease_us > t.now
RETURNING r.id"
);

/// One completion in a batch.
pub(super) struct Completion {
    pub(super) id: [u8; 16],
    pub(super) owner: [u8; 16],
    pub(super) value: Bytes,
    pub(super) ttl_us: i64,
}

/// Completions, many per statement.
pub(super) struct Completions;

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
            Ok(ids
                .iter()
                .map(|id| done.iter().any(|d| d[..] == id[..]))
                .collect())
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
    "WITH t AS (SELECT ",
    now!(),
    " AS now)
DELETE FROM idem_records WHERE id IN (
    SELECT id FROM idem_records, t WHERE expires_us <= t.now
        AND (steps_expires_us IS NULL OR steps_expires_us <= t.now)
    ORDER BY expires_us LIMIT $1 FOR UPDATE SKIP LOCKED
) AND expires_us <= (SELECT now FROM t)
  AND (steps_expires_us IS NULL OR steps_expires_us <= (SELECT now FROM t))"
);

pub(super) async fn purge(pool: &PgPool, batch: i64) -> Result<u64, Error> {
    let r = sqlx::query(PURGE)
        .bind(batch)
        .execute(pool)
        .await
        .map_err(Error::store)?;
    Ok(r.rows_affected())
}

// ---- Step journals (the `journal` module): in the record's row. ----

/// Appends a step entry if `$2` holds the record with a live lease (a dedup or token
/// claim): the row's lock orders it against any takeover. A journal past its expiry
/// starts afresh.
const WRITE_STEP: &str = concat!(
    "WITH t AS (SELECT ",
    now!(),
    " AS now)
UPDATE idem_records r SET
    steps = CASE WHEN r.steps_expires_us > t.now THEN r.steps ELSE ''::bytea END
        || convert_to(lpad(t.now::text, 16, '0'), 'UTF8') || $3,
    steps_expires_us = t.now + $4
FROM t
WHERE r.id = $1 AND r.state = 2 AND r.owner = $2 AND r.kind <> 1 AND r.lease_us > t.now"
);

const READ_JOURNAL: &str = concat!(
    "SELECT steps FROM idem_records WHERE id = $1 AND steps_expires_us > ",
    now!()
);

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

pub(super) async fn inspect(pool: &PgPool, key: &Key) -> Result<Option<Inspected>, Error> {
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
    "WITH t AS (SELECT ",
    now!(),
    " AS now)
UPDATE idem_records r SET
    state = 0, owner = NULL, fingerprint = NULL, value = NULL, lease_us = NULL,
    token_expires_us = NULL, steps = NULL, steps_expires_us = NULL,
    expires_us = CASE WHEN r.kind = 1 THEN t.now + $2 ELSE t.now END
FROM t, (SELECT state, expires_us FROM idem_records WHERE id = $1) old
WHERE r.id = $1 AND ((r.state <> 0 AND r.expires_us > t.now) OR r.steps_expires_us > t.now)
-- Whether a record was removed (a live journal alone is dropped, and answers false).
RETURNING old.state <> 0 AND old.expires_us > t.now"
);

pub(super) async fn forget(pool: &PgPool, key: &Key) -> Result<bool, Error> {
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

pub(super) async fn count(
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

/// The [`Dialect`](super::dialect::Dialect) of PostgreSQL: the statements above, on one
/// pool; claims and completions batched when the store is busy (the `batch` module).
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

    fn claim_in<'a>(
        &'a self,
        conn: &'a mut crate::store::TxConnection,
        key: &'a Key,
        req: &'a ClaimRequest,
    ) -> BoxFuture<'a, Result<Option<Snapshot>, Error>> {
        Box::pin(async move {
            let conn = super::dialect::own_conn::<PgConnection>(self.name(), conn)?;
            claim(conn, key, req, true, false).await
        })
    }

    fn begin(&self) -> BoxFuture<'_, Result<Box<dyn std::any::Any + Send>, Error>> {
        Box::pin(async move {
            // No lock timeout: the step's own writes wait as the user's would.
            let tx = self.pool.begin().await.map_err(Error::store)?;
            Ok(Box::new(tx) as Box<dyn std::any::Any + Send>)
        })
    }

    super::dialect::pooled_methods!(PgConnection);
}

/// The batch queues of a PostgreSQL store.
pub(super) struct PgBatches {
    pub(super) claims: Arc<super::batch::Batcher<Claims>>,
    pub(super) async_claims: Arc<super::batch::Batcher<Claims>>,
    pub(super) completions: Arc<super::batch::Batcher<Completions>>,
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
            held: Mutex::default(),
        }
    }
}
