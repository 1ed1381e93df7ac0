//! PostgreSQL claim statements: one statement per claim, or per batch of claims.
//!
//! A CTE reads the row, and only when that snapshot shows the key absent or takeable
//! does it `INSERT … ON CONFLICT DO UPDATE … WHERE <takeable>`. A replay therefore reads
//! the completed row and writes nothing (no row lock, no WAL); a race lost between the
//! snapshot and the insert shows up as an empty answer and the caller runs the statement
//! again. The conditional `DO UPDATE` re-checks the row under its lock, so of any number
//! of concurrent claims exactly one wins.
//!
//! A dedup or token claim never takes a record whose live step journal was written for
//! another payload (both fingerprints known and different): the same `WHERE` refuses it,
//! and the answer carries the journal's fingerprint (`ClaimOutcome::OtherPayload`).

use sqlx::Row;
use sqlx::postgres::{PgConnection, PgRow};

use super::super::batch::Job;
use super::{BoxFuture, Snapshot, kind_code, owner_bytes, sql_err, us};
use crate::store::{ClaimKind, ClaimRequest};
use crate::{Error, Key};

/// The answer's columns for a row a claim took (`$t`: the CTE that took it).
macro_rules! taken {
    ($t:literal) => {
        concat!(
            "TRUE AS claimed, ",
            $t,
            ".fence, 2::int2 AS state, NULL::bytea AS fingerprint, NULL::bytea AS value, \
             1::int8 AS remaining_us, 1::int8 AS lease_left_us, \
             COALESCE(",
            $t,
            ".steps_expires_us > t.now, FALSE) AS journal_live, NULL::bytea AS journal_fp"
        )
    };
}

/// The answer's columns for a row `cur` a claim found and did not take; a live journal's
/// fingerprint with it.
macro_rules! found {
    () => {
        "FALSE, cur.fence, cur.state, cur.fingerprint, cur.value, \
         cur.expires_us - t.now, cur.lease_us - t.now, FALSE, \
         CASE WHEN cur.steps_expires_us > t.now THEN cur.steps_fp END"
    };
}

macro_rules! claim_sql {
    // `$c`: one more CTE (with its leading comma), after the claim's.
    (@with [$($t:tt)*] [$($c:tt)*]) => { concat!(
    "WITH t AS (SELECT ",
    now!(),
    " AS now", $($t)*, "),
cur AS (SELECT r.* FROM idem_records r WHERE r.id = $1),
ins AS (
    INSERT INTO idem_records AS r
        (id, namespace, scope, kind, state, owner, fence, fingerprint, value,
         expires_us, lease_us, token_expires_us, steps_n, steps_base)
    SELECT $1, $2, $3, $4, 2, $5, t.now, $6, NULL, t.now + $7, t.now + $7, NULL, t.now, t.now
    FROM t
    WHERE NOT EXISTS (
        SELECT 1 FROM cur, t WHERE (cur.state <> 0 AND cur.expires_us > t.now)
           OR COALESCE(cur.steps_expires_us > t.now AND cur.steps_fp <> $6, FALSE)
    )
    ON CONFLICT (id) DO UPDATE SET
        namespace = EXCLUDED.namespace, scope = EXCLUDED.scope, kind = EXCLUDED.kind,
        state = 2, owner = EXCLUDED.owner,
        fence = GREATEST(r.fence + 1, EXCLUDED.fence),
        fingerprint = EXCLUDED.fingerprint, value = NULL,
        expires_us = EXCLUDED.expires_us, lease_us = EXCLUDED.lease_us,
        token_expires_us = NULL
    -- EXCLUDED.fence is the statement's now.
    WHERE (r.state = 0 OR r.expires_us <= EXCLUDED.fence)
      AND NOT COALESCE(r.steps_expires_us > EXCLUDED.fence
                       AND r.steps_fp <> EXCLUDED.fingerprint, FALSE)
    RETURNING r.fence, r.steps_expires_us
)", $($c)*, "
SELECT ", taken!("ins"), " FROM ins, t
UNION ALL
SELECT ", found!(), " FROM cur, t WHERE NOT EXISTS (SELECT 1 FROM ins)"
)
    };
    ($($t:tt)*) => { claim_sql!(@with [$($t)*] [""]) };
}

/// Inside a caller's transaction (transactional mode), which sets its own lock timeout.
const CLAIM_IN_TX: &str = claim_sql!("");
/// On its own (autocommit). A key held by an uncommitted transactional-mode claim
/// blocks the insert on the unique key; `lock_timeout` turns a long wait into error
/// 55P03, answered as `Busy` so the caller waits by its own rules instead of inside the
/// server. `set_config(..., true)` lasts for the statement's implicit transaction only.
const CLAIM: &str = claim_sql!(", set_config('lock_timeout', '1000', true) AS lock_timeout");
/// The same, committed without waiting for the WAL flush (see
/// [`SqlStore::with_async_claim_commit`](crate::SqlStore::with_async_claim_commit)).
const CLAIM_ASYNC: &str = claim_sql!(
    ", set_config('lock_timeout', '1000', true) AS lock_timeout, \
     set_config('synchronous_commit', 'off', true) AS async_commit"
);

/// A recoverable claim ([`CLAIM`] on its own, never batched): when it takes the key, the
/// same statement records the call's arguments (`$8`, kept `$9` µs) in `idem_recovery`,
/// due at the lease deadline; attempts made so far are kept, a parking is lifted.
pub(super) const CLAIM_RECOVER: &str = claim_sql!(@with
    [", set_config('lock_timeout', '1000', true) AS lock_timeout"]
    [",
rec AS (
    INSERT INTO idem_recovery AS x (id, namespace, scope, args, attempts, parked, due_us,
                                    expires_us)
    SELECT $1, $2, $3, $8, 0, NULL, t.now + $7, t.now + GREATEST($9, $7) FROM ins, t
    ON CONFLICT (id) DO UPDATE SET
        namespace = EXCLUDED.namespace, scope = EXCLUDED.scope, args = EXCLUDED.args,
        parked = NULL, due_us = EXCLUDED.due_us,
        expires_us = GREATEST(x.expires_us, EXCLUDED.expires_us)
)"]
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
      AND NOT COALESCE(r.steps_expires_us > t.now AND r.steps_fp <> $3, FALSE)
    RETURNING r.fence, r.steps_expires_us
)
SELECT ",
    taken!("upd"),
    " FROM upd, t
UNION ALL
SELECT ",
    found!(),
    " FROM cur, t WHERE NOT EXISTS (SELECT 1 FROM upd)"
);

/// Many dedup or lock claims in one statement (see the `batch` module): per key, the
/// same decision as [`CLAIM`], on the same clock. Rows are inserted in id order (the
/// batch is sorted), and existing ones are read by `id = ANY($1)` (see the completions'
/// batch). Answers one row per key that the statement took or found, with its id first.
/// A row lock is waited for 100 ms, not a second: long enough for another process'
/// claim of the same key to commit, short enough that a key held by an open transaction
/// holds up its batch only briefly (its calls are then run alone).
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
         expires_us, lease_us, token_expires_us, steps_n, steps_base)
    SELECT v.id, v.namespace, v.scope, v.kind, 2, v.owner, t.now, v.fingerprint, NULL,
           t.now + v.lease_us, t.now + v.lease_us, NULL, t.now, t.now
    FROM v, t
    WHERE NOT EXISTS (
        SELECT 1 FROM cur WHERE cur.id = v.id
           AND ((cur.state <> 0 AND cur.expires_us > t.now)
                OR COALESCE(cur.steps_expires_us > t.now AND cur.steps_fp <> v.fingerprint,
                            FALSE))
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
    WHERE (r.state = 0 OR r.expires_us <= EXCLUDED.fence)
      AND NOT COALESCE(r.steps_expires_us > EXCLUDED.fence
                       AND r.steps_fp <> EXCLUDED.fingerprint, FALSE)
    RETURNING r.id, r.fence, r.steps_expires_us
)
SELECT ins.id, ", taken!("ins"), " FROM ins, t
UNION ALL
SELECT cur.id, ", found!(), "
FROM cur, t WHERE NOT EXISTS (SELECT 1 FROM ins WHERE ins.id = cur.id)"
)
    };
}

const CLAIM_BATCH: &str = claim_batch_sql!("");
const CLAIM_BATCH_ASYNC: &str =
    claim_batch_sql!(", set_config('synchronous_commit', 'off', true) AS async_commit");

/// One dedup or lock claim in a batch.
pub(in super::super) struct Claim {
    pub(in super::super) id: [u8; 16],
    pub(in super::super) namespace: &'static str,
    pub(in super::super) scope: &'static str,
    pub(in super::super) kind: i16,
    pub(in super::super) owner: [u8; 16],
    pub(in super::super) fingerprint: Option<[u8; 16]>,
    pub(in super::super) lease_us: i64,
}

impl Claim {
    pub(in super::super) fn new(key: &Key, req: &ClaimRequest) -> Claim {
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
pub(in super::super) struct Claims {
    pub(in super::super) async_commit: bool,
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
        journal_live: row.try_get("journal_live")?,
        journal_fp: row.try_get("journal_fp")?,
        journal: None,
    })
}

pub(super) fn snapshot(key: &Key, row: &PgRow) -> Result<Snapshot, Error> {
    read_snapshot(row).map_err(|e| sql_err(Some(key), e))
}

/// `in_tx`: the claim runs inside the caller's transaction, whose settings it must not
/// touch. `async_commit` (never with `in_tx`): commit without waiting for the WAL flush.
pub(in super::super) async fn claim(
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
