//! SQLite statements of the step journals (see the `journal` module).
//!
//! A step write is one transaction (`BEGIN IMMEDIATE`: it takes the one write lock up
//! front): an `UPDATE` of the record's row, owner-checked (counter, expiry, payload),
//! then the step's own row. SQLite has one writer at a time, so of a step write and a
//! takeover one commits first.

use sqlx::Row;
use sqlx::sqlite::{SqliteConnection, SqlitePool};

use super::super::journal::{Step, StepRow};
use super::{SqliteDialect, owner_bytes, sql_err, us};
use crate::store::Owner;
use crate::{Error, Key};

/// Bumps the counter of the record's journal if the caller holds the record with a live
/// lease (a dedup or token claim). Every assignment reads the row as it was: a journal
/// past its expiry starts afresh (and takes the holder's payload, or keeps its own when
/// the holder claimed without one).
const BUMP: &str = concat!(
    "UPDATE idem_records SET
    steps_base = CASE WHEN steps_expires_us > ",
    now!(),
    " THEN steps_base ELSE steps_n END,
    steps_fp = COALESCE(fingerprint, CASE WHEN steps_expires_us > ",
    now!(),
    " THEN steps_fp END),
    steps_n = steps_n + 1,
    steps_expires_us = ",
    now!(),
    " + ?3
WHERE id = ?1 AND state = 2 AND owner = ?2 AND kind <> 1 AND lease_us > ",
    now!(),
    "
RETURNING steps_n"
);

/// After [`BUMP`], in its transaction: the step's row, numbered by the counter it set.
const PUT: &str = concat!(
    "INSERT INTO idem_steps (id, name_id, seq, at_us, entry) VALUES (?1, ?2, ?3, ",
    now!(),
    ", ?4)
ON CONFLICT (id, name_id) DO UPDATE SET
    seq = excluded.seq, at_us = excluded.at_us, entry = excluded.entry"
);

const READ_STEPS: &str = concat!(
    "SELECT s.name_id, s.at_us, s.entry
FROM idem_steps s JOIN idem_records r ON r.id = s.id
WHERE s.id = ?1 AND r.steps_expires_us > ",
    now!(),
    " AND s.seq > r.steps_base
ORDER BY s.seq"
);

/// The entries of a dropped (or restarted) journal: never a live one, whose `seq` is
/// above the row's `steps_base`.
const DROP_DEAD: &str = "DELETE FROM idem_steps WHERE id = ?1 \
     AND seq <= (SELECT steps_base FROM idem_records WHERE id = ?1)";

/// Dead entries, and those of records the purge deleted (a row inserted anew starts its
/// counter at the clock, above them; one writer at a time, so the statement sees it).
const PURGE_STEPS: &str = "DELETE FROM idem_steps WHERE rowid IN (
    SELECT s.rowid FROM idem_steps s LEFT JOIN idem_records r ON r.id = s.id
    WHERE r.id IS NULL OR s.seq <= r.steps_base LIMIT ?1)";

impl SqliteDialect {
    /// Its own transaction, or statements in the caller's (`in_tx`).
    pub(super) async fn write_step_on(
        &self,
        conn: &mut SqliteConnection,
        in_tx: bool,
        key: &Key,
        owner: Owner,
        step: &Step<'_>,
    ) -> Result<bool, Error> {
        if in_tx {
            return write(conn, key, owner, step).await;
        }
        let mut tx = sqlx::Connection::begin_with(&mut *conn, "BEGIN IMMEDIATE")
            .await
            .map_err(Error::store)?;
        let written = write(&mut tx, key, owner, step).await?;
        // Not written: nothing changed; the rollback on drop is all there is to do.
        if written {
            tx.commit().await.map_err(Error::store)?;
        }
        Ok(written)
    }
}

async fn write(
    conn: &mut SqliteConnection,
    key: &Key,
    owner: Owner,
    step: &Step<'_>,
) -> Result<bool, Error> {
    let seq: Option<i64> = sqlx::query_scalar(BUMP)
        .bind(&key.digest()[..])
        .bind(&owner_bytes(owner)[..])
        .bind(us(step.ttl))
        .fetch_optional(&mut *conn)
        .await
        .map_err(|e| sql_err(Some(key), e))?;
    let Some(seq) = seq else {
        return Ok(false);
    };
    sqlx::query(PUT)
        .bind(&key.digest()[..])
        .bind(&step.name_id[..])
        .bind(seq)
        .bind(step.entry)
        .execute(&mut *conn)
        .await
        .map_err(|e| sql_err(Some(key), e))?;
    Ok(true)
}

/// One writer at a time: a read sees every committed write (`_locking`).
pub(super) async fn read_steps(
    conn: &mut SqliteConnection,
    key: &Key,
    _locking: bool,
) -> Result<Vec<StepRow>, Error> {
    let rows = sqlx::query(READ_STEPS)
        .bind(&key.digest()[..])
        .fetch_all(&mut *conn)
        .await
        .map_err(|e| sql_err(Some(key), e))?;
    rows.iter()
        .map(|r| {
            Ok(StepRow {
                name_id: r.try_get("name_id")?,
                at_us: r.try_get("at_us")?,
                entry: r.try_get("entry")?,
            })
        })
        .collect::<Result<_, sqlx::Error>>()
        .map_err(|e| sql_err(Some(key), e))
}

pub(super) async fn drop_dead_steps(pool: &SqlitePool, key: &Key) -> Result<(), Error> {
    sqlx::query(DROP_DEAD)
        .bind(&key.digest()[..])
        .execute(pool)
        .await
        .map_err(|e| sql_err(Some(key), e))?;
    Ok(())
}

pub(super) async fn purge_steps(pool: &SqlitePool, batch: i64) -> Result<u64, Error> {
    let r = sqlx::query(PURGE_STEPS)
        .bind(batch)
        .execute(pool)
        .await
        .map_err(Error::store)?;
    Ok(r.rows_affected())
}
