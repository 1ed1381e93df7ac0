//! MySQL and MariaDB statements of the operators: inspect one record, forget one (and
//! its step journal), count them by function and state.

use sqlx::Row;
use sqlx::mysql::MySqlPool;

use super::super::inspection::Inspected;
use super::journal::drop_dead_steps;
use super::{LOCK_RETENTION, sql_err, us};
use crate::{Error, Key};

const INSPECT: &str = concat!(
    "SELECT kind, state, owner, fence,
    (fingerprint IS NOT NULL) AS has_fingerprint, LENGTH(value) AS value_len,
    expires_us - ",
    now!(),
    " AS ttl_left_us, lease_us - ",
    now!(),
    " AS lease_left_us
FROM idem_records WHERE id = ? AND state <> 0 AND expires_us > ",
    now!()
);

pub(super) async fn inspect(pool: &MySqlPool, key: &Key) -> Result<Option<Inspected>, Error> {
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
    " + ? ELSE ",
    now!(),
    " END,
    state = 0, owner = NULL, fingerprint = NULL, value = NULL, lease_us = NULL,
    token_expires_us = NULL, steps_base = steps_n, steps_expires_us = NULL, steps_fp = NULL
WHERE id = ? AND state <> 0 AND expires_us > ",
    now!()
);

/// After [`FORGET`]: the journal a released or expired record left (nobody holds it, so
/// no step write can come between; a holder that took the row meanwhile keeps its own).
const FORGET_JOURNAL: &str = concat!(
    "UPDATE idem_records SET steps_base = steps_n, steps_expires_us = NULL, steps_fp = NULL
WHERE id = ? AND steps_expires_us IS NOT NULL AND NOT (state = 2 AND lease_us > ",
    now!(),
    ")"
);

pub(super) async fn forget(pool: &MySqlPool, key: &Key) -> Result<bool, Error> {
    let r = sqlx::query(FORGET)
        .bind(us(LOCK_RETENTION))
        .bind(&key.digest()[..])
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
    sqlx::query("DELETE FROM idem_recovery WHERE id = ?")
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
    " AND (? IS NULL OR namespace = ?)
GROUP BY namespace, scope, state"
);

pub(super) async fn count(
    pool: &MySqlPool,
    namespace: Option<&str>,
) -> Result<Vec<(String, String, i16, i64)>, Error> {
    let rows = sqlx::query(COUNT)
        .bind(namespace)
        .bind(namespace)
        .fetch_all(pool)
        .await
        .map_err(Error::store)?;
    rows.iter()
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?, r.try_get(3)?)))
        .collect::<Result<_, sqlx::Error>>()
        .map_err(Error::store)
}
