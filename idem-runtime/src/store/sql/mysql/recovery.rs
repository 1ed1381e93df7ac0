//! MySQL and MariaDB statements of the recovery index (see `store/sql/recovery.rs`).
//! One statement cannot write two tables here, so each change that touches the record
//! and its recovery row is one transaction: the claim (or completion, or release) and
//! the recovery row's write commit together or not at all. A take locks the recovery
//! row (`FOR UPDATE`), so of two recoverers one counts the attempt and the other finds
//! the row no longer due. Times are the database's clock.

use std::time::Duration;

use bytes::Bytes;
use sqlx::Row;
use sqlx::mysql::MySqlConnection;

use super::super::record::Snapshot;
use super::super::recovery::{
    DROP_ROW, HOLD, RecoveryDialect, TAKE, TakeRead, TakeStep, digest, listed,
};
use super::{
    BoxFuture, COMPLETE, LOCK_RETENTION, MySqlDialect, RELEASE, claim, owner_bytes, sql_err, us,
};
use crate::store::{ClaimRequest, Due, Owner, Recover, RecoverableCall, Taken};
use crate::{Error, Key};

const RECORD: &str = concat!(
    "INSERT INTO idem_recovery (id, namespace, scope, args, attempts, parked, due_us, expires_us)
VALUES (?, ?, ?, ?, 0, NULL, ",
    now!(),
    " + ?, ",
    now!(),
    " + ?)
ON DUPLICATE KEY UPDATE namespace = VALUES(namespace), scope = VALUES(scope),
    args = VALUES(args), parked = NULL, due_us = VALUES(due_us),
    expires_us = GREATEST(expires_us, VALUES(expires_us))"
);

const DUE_NOW: &str = concat!(
    "UPDATE idem_recovery SET due_us = ",
    now!(),
    " WHERE id = ? AND parked IS NULL"
);

const DUE: &str = concat!(
    "SELECT scope, id FROM idem_recovery WHERE namespace = ? AND due_us <= ",
    now!(),
    " AND expires_us > ",
    now!(),
    " ORDER BY due_us LIMIT ?"
);

const TAKE_READ: &str = concat!(
    "SELECT x.args, x.attempts, x.due_us, x.expires_us, x.parked, r.state, r.lease_us,
    r.expires_us AS rec_expires_us, ",
    now!(),
    " AS now
FROM idem_recovery x LEFT JOIN idem_records r ON r.id = x.id
WHERE x.id = ? FOR UPDATE"
);

const PARK: &str = concat!(
    "UPDATE idem_recovery SET parked = ?, due_us = NULL WHERE id = ? AND expires_us > ",
    now!()
);

const LIST: &str = concat!(
    "SELECT x.namespace, x.scope, x.id, x.attempts, x.parked,
    GREATEST(COALESCE(t.now - x.due_us, 0), 0) AS overdue_us,
    NOT EXISTS (SELECT 1 FROM idem_records r
                WHERE r.id = x.id AND r.state = 2 AND r.lease_us > t.now) AS abandoned,
    (SELECT COUNT(*) FROM idem_steps s JOIN idem_records r ON r.id = s.id
     WHERE s.id = x.id AND s.seq > r.steps_base AND r.steps_expires_us > t.now) AS steps
FROM idem_recovery x, (SELECT ",
    now!(),
    " AS now) t
WHERE (? IS NULL OR x.namespace = ?) AND (? IS NULL OR x.id = ?) AND x.expires_us > t.now
ORDER BY x.due_us IS NULL, x.due_us LIMIT ?"
);

/// How many times a transaction InnoDB chose as a deadlock's victim runs again.
const DEADLOCK_RETRIES: u32 = 5;

/// Runs the transaction `run` until it is not a deadlock's victim, a bounded number of
/// times. A take locks the recovery row before the record's, while a claim or
/// completion locks the record's first (each statement locks rows as it reads them), so
/// two of them can wait on each other; InnoDB then rolls one back whole, so running it
/// again is safe and nothing of it is left.
async fn retry_deadlocked<T, F, Fut>(mut run: F) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Error>>,
{
    let mut tries = 1;
    loop {
        match run().await {
            Err(e) if tries < DEADLOCK_RETRIES && is_deadlock(&e) => tries += 1,
            other => return other,
        }
    }
}

/// InnoDB's "Deadlock found when trying to get lock" (ER_LOCK_DEADLOCK, SQLSTATE 40001).
fn is_deadlock(e: &Error) -> bool {
    let Error::Store(source) = e else {
        return false;
    };
    matches!(
        source.downcast_ref::<sqlx::Error>(),
        Some(sqlx::Error::Database(db)) if db.code().as_deref() == Some("40001")
    )
}

async fn begin(dialect: &MySqlDialect) -> Result<sqlx::Transaction<'_, sqlx::MySql>, Error> {
    dialect.pool.begin().await.map_err(Error::store)
}

async fn commit(tx: sqlx::Transaction<'_, sqlx::MySql>) -> Result<(), Error> {
    tx.commit().await.map_err(Error::store)
}

impl RecoveryDialect for MySqlDialect {
    fn claim<'a>(
        &'a self,
        key: &'a Key,
        req: &'a ClaimRequest,
        recover: &'a Recover,
    ) -> BoxFuture<'a, Result<Option<Snapshot>, Error>> {
        Box::pin(retry_deadlocked(move || async move {
            let mut tx = begin(self).await?;
            let conn: &mut MySqlConnection = &mut tx;
            let snap = claim(conn, self.returning, true, key, req).await?;
            if snap.as_ref().is_some_and(|s| s.claimed) {
                sqlx::query(RECORD)
                    .bind(&key.digest()[..])
                    .bind(key.namespace())
                    .bind(key.scope())
                    .bind(recover.args.as_ref())
                    .bind(us(req.lease))
                    .bind(us(recover.ttl.max(req.lease)))
                    .execute(&mut *conn)
                    .await
                    .map_err(|e| super::journal::packet_err(key, e))?;
            }
            commit(tx).await?;
            Ok(snap)
        }))
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
            let ended = retry_deadlocked(|| async {
                let mut tx = begin(self).await?;
                let ended = match settle {
                    Some((value, ttl)) => sqlx::query(COMPLETE)
                        .bind(value.as_ref())
                        .bind(us(ttl))
                        .bind(&key.digest()[..])
                        .bind(&owner[..]),
                    None => sqlx::query(RELEASE)
                        .bind(us(LOCK_RETENTION))
                        .bind(&key.digest()[..])
                        .bind(&owner[..]),
                }
                .execute(&mut *tx)
                .await
                .map_err(|e| super::journal::packet_err(key, e))?
                .rows_affected()
                    == 1;
                if ended {
                    sqlx::query(if abandon { DUE_NOW } else { DROP_ROW })
                        .bind(&key.digest()[..])
                        .execute(&mut *tx)
                        .await
                        .map_err(|e| sql_err(Some(key), e))?;
                }
                commit(tx).await?;
                Ok(ended)
            })
            .await?;
            if ended && settle.is_some() {
                // The completed journal's entries, dead already: this only frees space.
                super::drop_dead_steps(&self.pool, key).await?;
            }
            Ok(ended)
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
        Box::pin(retry_deadlocked(move || async move {
            let id = &key.digest()[..];
            let mut tx = begin(self).await?;
            let Some(row) = sqlx::query(TAKE_READ)
                .bind(id)
                .fetch_optional(&mut *tx)
                .await
                .map_err(|e| sql_err(Some(key), e))?
            else {
                return Ok(None);
            };
            let get = |e: sqlx::Error| sql_err(Some(key), e);
            let read = TakeRead {
                now: row.try_get("now").map_err(get)?,
                due: row.try_get("due_us").map_err(get)?,
                expires: row.try_get("expires_us").map_err(get)?,
                state: row.try_get("state").map_err(get)?,
                lease: row.try_get("lease_us").map_err(get)?,
                record_expires: row.try_get("rec_expires_us").map_err(get)?,
            };
            let (sql, at) = match read.step() {
                TakeStep::Held(lease) => (HOLD, Some(lease)),
                TakeStep::Finished => (DROP_ROW, None),
                TakeStep::Take => (TAKE, Some(read.now + us(backoff))),
                TakeStep::Leave => return Ok(None),
            };
            let q = sqlx::query(sql);
            let q = match at {
                Some(at) => q.bind(at),
                None => q,
            };
            q.bind(id).execute(&mut *tx).await.map_err(get)?;
            let taken = match read.step() {
                TakeStep::Take => {
                    let attempts: i32 = row.try_get("attempts").map_err(get)?;
                    let args: Vec<u8> = row.try_get("args").map_err(get)?;
                    Some(Taken::new(
                        args.into(),
                        u32::try_from(attempts + 1).unwrap_or(0),
                    ))
                }
                _ => None,
            };
            commit(tx).await?;
            Ok(taken)
        }))
    }

    fn park<'a>(&'a self, key: &'a Key, error: &'a str) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            let r = sqlx::query(PARK)
                .bind(error)
                .bind(&key.digest()[..])
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
            let id = only.map(|k| &k.digest()[..]);
            let rows = sqlx::query(LIST)
                .bind(namespace)
                .bind(namespace)
                .bind(id)
                .bind(id)
                .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                .fetch_all(&self.pool)
                .await
                .map_err(Error::store)?;
            rows.into_iter()
                .map(|row| {
                    let get = |e: sqlx::Error| Error::store(e);
                    let abandoned: i64 = row.try_get("abandoned").map_err(get)?;
                    listed(
                        row.try_get("namespace").map_err(get)?,
                        row.try_get("scope").map_err(get)?,
                        row.try_get("id").map_err(get)?,
                        row.try_get::<i64, _>("attempts").map_err(get)?,
                        row.try_get("parked").map_err(get)?,
                        row.try_get("overdue_us").map_err(get)?,
                        abandoned != 0,
                        row.try_get("steps").map_err(get)?,
                    )
                })
                .collect()
        })
    }
}
