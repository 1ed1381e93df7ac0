//! PostgreSQL statements of the recovery index (see `store/sql/recovery.rs`): one
//! statement each, decided by the database's clock. A recoverable claim is
//! [`CLAIM_RECOVER`](super::claims::CLAIM_RECOVER).

use std::time::Duration;

use bytes::Bytes;
use sqlx::Row;

use super::claims::{CLAIM_RECOVER, snapshot};
use super::{BoxFuture, LOCK_RETENTION, PgDialect, kind_code, owner_bytes, sql_err, us};
use crate::store::sql::record::Snapshot;
use crate::store::sql::recovery::{RecoveryDialect, digest, listed};
use crate::store::{ClaimRequest, Due, Owner, Recover, RecoverableCall, Taken};
use crate::{Error, Key};

/// [`COMPLETE`](super::records) that also drops the call's recovery row.
const SETTLE_COMPLETE: &str = super::records::complete_sql!(
    ",
rec AS (DELETE FROM idem_recovery x USING done WHERE x.id = done.id)"
);

/// The release of a claim (as `RELEASE`), and what happens to its recovery row: `$4`
/// true, a dropped call's (due now); false, an `Err`'s (dropped: not recovered).
const GIVE_BACK: &str = concat!(
    "WITH t AS (SELECT ",
    now!(),
    " AS now),
rel AS (
    UPDATE idem_records r SET
        state = CASE WHEN r.token_expires_us > t.now THEN 1 ELSE 0 END,
        expires_us = CASE WHEN r.token_expires_us > t.now THEN r.token_expires_us
                          WHEN r.kind = 1 THEN t.now + $3 ELSE t.now END,
        owner = NULL, fingerprint = NULL, lease_us = NULL
    FROM t
    WHERE r.id = $1 AND r.state = 2 AND r.owner = $2 AND r.expires_us > t.now
    RETURNING r.id
),
due AS (
    UPDATE idem_recovery x SET due_us = t.now FROM rel, t
    WHERE $4 AND x.id = rel.id AND x.parked IS NULL
),
gone AS (DELETE FROM idem_recovery x USING rel WHERE NOT $4 AND x.id = rel.id)
SELECT COUNT(*)::int8 FROM rel"
);

const DUE: &str = concat!(
    "SELECT x.scope, x.id FROM idem_recovery x
WHERE x.namespace = $1 AND x.due_us <= ",
    now!(),
    " AND x.expires_us > ",
    now!(),
    "
ORDER BY x.due_us LIMIT $2"
);

/// Takes a due call if nobody holds its record and it has not finished; a call still
/// held moves to its lease deadline, a finished one leaves. `due_us <= now` makes a
/// second taker, which waited on the row lock, find the first one's new due time.
const TAKE: &str = concat!(
    "WITH t AS (SELECT ",
    now!(),
    " AS now),
r AS (SELECT state, lease_us, expires_us FROM idem_records WHERE id = $1),
held AS (
    UPDATE idem_recovery x SET due_us = r.lease_us FROM r, t
    WHERE x.id = $1 AND x.due_us IS NOT NULL AND r.state = 2 AND r.lease_us > t.now
),
done AS (
    DELETE FROM idem_recovery x USING r, t
    WHERE x.id = $1 AND r.state = 3 AND r.expires_us > t.now
),
took AS (
    UPDATE idem_recovery x SET attempts = x.attempts + 1, due_us = t.now + $2 FROM t
    WHERE x.id = $1 AND x.due_us <= t.now AND x.expires_us > t.now
      AND NOT EXISTS (SELECT 1 FROM r WHERE (r.state = 2 AND r.lease_us > t.now)
                                        OR (r.state = 3 AND r.expires_us > t.now))
    RETURNING x.args, x.attempts
)
SELECT args, attempts FROM took"
);

const PARK: &str = concat!(
    "UPDATE idem_recovery SET parked = $2, due_us = NULL WHERE id = $1 AND expires_us > ",
    now!()
);

const LIST: &str = concat!(
    "WITH t AS (SELECT ",
    now!(),
    " AS now)
SELECT x.namespace, x.scope, x.id, x.attempts, x.parked,
    GREATEST(COALESCE(t.now - x.due_us, 0), 0) AS overdue_us,
    NOT EXISTS (SELECT 1 FROM idem_records r
                WHERE r.id = x.id AND r.state = 2 AND r.lease_us > t.now) AS abandoned,
    (SELECT count(*) FROM idem_steps s JOIN idem_records r ON r.id = s.id
     WHERE s.id = x.id AND s.seq > r.steps_base AND r.steps_expires_us > t.now)::int4 AS steps
FROM idem_recovery x, t
WHERE ($1::text IS NULL OR x.namespace = $1) AND ($3::bytea IS NULL OR x.id = $3)
  AND x.expires_us > t.now
ORDER BY x.due_us NULLS LAST LIMIT $2"
);

impl RecoveryDialect for PgDialect {
    fn claim<'a>(
        &'a self,
        key: &'a Key,
        req: &'a ClaimRequest,
        recover: &'a Recover,
    ) -> BoxFuture<'a, Result<Option<Snapshot>, Error>> {
        Box::pin(async move {
            let owner = owner_bytes(req.owner);
            let row = sqlx::query(CLAIM_RECOVER)
                .bind(&key.digest()[..])
                .bind(key.namespace())
                .bind(key.scope())
                .bind(kind_code(req.kind))
                .bind(&owner[..])
                .bind(req.fingerprint.as_ref().map(|f| &f.0[..]))
                .bind(us(req.lease))
                .bind(recover.args.as_ref())
                .bind(us(recover.ttl))
                .fetch_optional(&self.pool)
                .await
                .map_err(|e| sql_err(Some(key), e))?;
            row.map(|r| snapshot(key, &r)).transpose()
        })
    }

    fn settle<'a>(
        &'a self,
        key: &'a Key,
        owner: Owner,
        settle: Option<(&'a Bytes, Duration)>,
        abandon: bool,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            let owner = owner_bytes(owner);
            let n: i64 = match settle {
                Some((value, ttl)) => sqlx::query_scalar(SETTLE_COMPLETE)
                    .bind(&key.digest()[..])
                    .bind(&owner[..])
                    .bind(value.as_ref())
                    .bind(us(ttl)),
                None => sqlx::query_scalar(GIVE_BACK)
                    .bind(&key.digest()[..])
                    .bind(&owner[..])
                    .bind(us(LOCK_RETENTION))
                    .bind(abandon),
            }
            .fetch_one(&self.pool)
            .await
            .map_err(|e| sql_err(Some(key), e))?;
            Ok(n == 1)
        })
    }

    fn due<'a>(
        &'a self,
        namespace: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<Due>, Error>> {
        Box::pin(async move {
            let rows: Vec<(String, Vec<u8>)> = sqlx::query_as(DUE)
                .bind(namespace)
                .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                .fetch_all(&self.pool)
                .await
                .map_err(Error::store)?;
            rows.into_iter()
                .map(|(scope, id)| Ok(Due::new(scope, digest(id)?)))
                .collect()
        })
    }

    fn take<'a>(
        &'a self,
        key: &'a Key,
        backoff: Duration,
    ) -> BoxFuture<'a, Result<Option<Taken>, Error>> {
        Box::pin(async move {
            let row: Option<(Vec<u8>, i32)> = sqlx::query_as(TAKE)
                .bind(&key.digest()[..])
                .bind(us(backoff))
                .fetch_optional(&self.pool)
                .await
                .map_err(|e| sql_err(Some(key), e))?;
            Ok(row.map(|(args, n)| Taken::new(args.into(), u32::try_from(n).unwrap_or(0))))
        })
    }

    fn park<'a>(&'a self, key: &'a Key, error: &'a str) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            let r = sqlx::query(PARK)
                .bind(&key.digest()[..])
                .bind(error)
                .execute(&self.pool)
                .await
                .map_err(|e| sql_err(Some(key), e))?;
            Ok(r.rows_affected() == 1)
        })
    }

    fn list<'a>(
        &'a self,
        namespace: Option<&'a str>,
        limit: usize,
        only: Option<&'a Key>,
    ) -> BoxFuture<'a, Result<Vec<RecoverableCall>, Error>> {
        Box::pin(async move {
            let rows = sqlx::query(LIST)
                .bind(namespace)
                .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                .bind(only.map(|k| &k.digest()[..]))
                .fetch_all(&self.pool)
                .await
                .map_err(Error::store)?;
            rows.into_iter()
                .map(|row| {
                    let get = |e: sqlx::Error| Error::store(e);
                    listed(
                        row.try_get("namespace").map_err(get)?,
                        row.try_get("scope").map_err(get)?,
                        row.try_get("id").map_err(get)?,
                        row.try_get::<i32, _>("attempts").map_err(get)?.into(),
                        row.try_get("parked").map_err(get)?,
                        row.try_get("overdue_us").map_err(get)?,
                        row.try_get("abandoned").map_err(get)?,
                        row.try_get::<i32, _>("steps").map_err(get)?.into(),
                    )
                })
                .collect()
        })
    }
}
