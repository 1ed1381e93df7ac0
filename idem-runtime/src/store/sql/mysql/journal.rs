//! MySQL and MariaDB statements of the step journals (see the `journal` module).
//!
//! A step write is one transaction: an `UPDATE` of the record's row, owner-checked under
//! that row's lock (counter, expiry, payload), then the step's own row. A claim waits
//! for that lock, so of a step write and a takeover one commits first.
//!
//! A step too large for the server's `max_allowed_packet` is refused with a clear error
//! before it is sent, so nothing is written and the journal stays as it was, whatever
//! the session's `sql_mode`. Version 3 appended each step to one value with `CONCAT`,
//! which past that size yields `NULL` (in every mode) and wiped the journal.

use sqlx::Row;
use sqlx::mysql::{MySqlConnection, MySqlPool};

use super::super::journal::{Step, StepRow};
use super::{MySqlDialect, owner_bytes, sql_err, us};
use crate::store::Owner;
use crate::{Error, Key};

/// Bumps the counter of the record's journal if the caller holds the record with a live
/// lease (a dedup or token claim), under the row's lock. MySQL assigns left to right,
/// each assignment seeing the ones before: `steps_base` and `steps_fp` read the old
/// expiry, so a journal past it starts afresh (and takes the holder's payload, or keeps
/// its own when the holder claimed without one).
const BUMP: &str = concat!(
    "UPDATE idem_records SET
    steps_base = IF(steps_expires_us > ",
    now!(),
    ", steps_base, steps_n),
    steps_fp = COALESCE(fingerprint, IF(steps_expires_us > ",
    now!(),
    ", steps_fp, NULL)),
    steps_n = steps_n + 1,
    steps_expires_us = ",
    now!(),
    " + ?
WHERE id = ? AND state = 2 AND owner = ? AND kind <> 1 AND lease_us > ",
    now!()
);

/// After [`BUMP`], in its transaction: the step's row, numbered by the counter it set.
const PUT: &str = concat!(
    "INSERT INTO idem_steps (id, name_id, seq, at_us, entry)
SELECT id, ?, steps_n, ",
    now!(),
    ", ? FROM idem_records WHERE id = ?
ON DUPLICATE KEY UPDATE seq = VALUES(seq), at_us = VALUES(at_us), entry = VALUES(entry)"
);

macro_rules! read_steps_sql {
    ($($tail:tt)*) => {
        concat!(
            "SELECT s.name_id, s.at_us, s.entry
FROM idem_steps s JOIN idem_records r ON r.id = s.id
WHERE s.id = ? AND r.steps_expires_us > ",
            now!(),
            " AND s.seq > r.steps_base
ORDER BY s.seq", $($tail)*
        )
    };
}

const READ_STEPS: &str = read_steps_sql!("");
/// Inside a caller's transaction, whose snapshot (repeatable read) may predate the last
/// step write: a locking read sees the latest committed rows.
const READ_STEPS_LOCKING: &str = read_steps_sql!(" LOCK IN SHARE MODE");

/// The entries of a dropped (or restarted) journal: never a live one, whose `seq` is
/// above the row's `steps_base`.
const DROP_DEAD: &str = "DELETE FROM idem_steps WHERE id = ? \
     AND seq <= (SELECT steps_base FROM idem_records WHERE id = ?)";

/// Dead entries, and those of records the purge deleted. An entry whose record row is
/// missing is left alone for an hour: a row inserted anew since (its counter starts at
/// the clock) may already have entries that this statement's view of the records, taken
/// first, does not show the row of.
const PURGE_STEPS: &str = concat!(
    "DELETE FROM idem_steps WHERE seq <= COALESCE(
    (SELECT r.steps_base FROM idem_records r WHERE r.id = idem_steps.id),
    ",
    now!(),
    " - 3600000000) LIMIT ?"
);

/// Room for the statement and the other parameters beside a step's entry.
const PACKET_SLACK: u64 = 4096;

/// The server's `max_allowed_packet` (this session's, which a session cannot change).
pub(in super::super) async fn max_packet(pool: &MySqlPool) -> Result<u64, Error> {
    let max: u64 = sqlx::query_scalar("SELECT @@max_allowed_packet")
        .fetch_one(pool)
        .await
        .map_err(Error::store)?;
    Ok(max)
}

fn too_large(key: &Key, name: &str, len: usize, max: u64) -> Error {
    Error::Codec {
        key: *key,
        message: format!(
            "step {name:?} is {len} bytes journaled; the MySQL server takes at most \
             {max} bytes in one statement (max_allowed_packet), so it was not journaled"
        ),
    }
}

/// A statement the server refused as larger than `max_allowed_packet` (1153), or a
/// value that grew past it (1301): the same clear error as the check before sending.
pub(super) fn packet_err(key: &Key, e: sqlx::Error) -> Error {
    if let sqlx::Error::Database(db) = &e
        && matches!(
            db.code().as_deref(),
            Some("08S01" | "HY000" | "1153" | "1301")
        )
        && db.message().contains("max_allowed_packet")
    {
        return Error::Codec {
            key: *key,
            message: format!("the MySQL server refused a value: {}", db.message()),
        };
    }
    sql_err(Some(key), e)
}

impl MySqlDialect {
    /// Its own transaction, or statements in the caller's (`in_tx`).
    pub(super) async fn write_step_on(
        &self,
        conn: &mut MySqlConnection,
        in_tx: bool,
        key: &Key,
        owner: Owner,
        step: &Step<'_>,
    ) -> Result<bool, Error> {
        if step.entry.len() as u64 + PACKET_SLACK > self.max_packet {
            return Err(too_large(key, step.name, step.entry.len(), self.max_packet));
        }
        if in_tx {
            return write(conn, key, owner, step).await;
        }
        let mut tx = sqlx::Connection::begin(&mut *conn)
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
    conn: &mut MySqlConnection,
    key: &Key,
    owner: Owner,
    step: &Step<'_>,
) -> Result<bool, Error> {
    // The connection reports rows *matched* (CLIENT_FOUND_ROWS): 1 means "the holder".
    let bumped = sqlx::query(BUMP)
        .bind(us(step.ttl))
        .bind(&key.digest()[..])
        .bind(&owner_bytes(owner)[..])
        .execute(&mut *conn)
        .await
        .map_err(|e| sql_err(Some(key), e))?;
    if bumped.rows_affected() != 1 {
        return Ok(false);
    }
    sqlx::query(PUT)
        .bind(&step.name_id[..])
        .bind(step.entry)
        .bind(&key.digest()[..])
        .execute(&mut *conn)
        .await
        .map_err(|e| packet_err(key, e))?;
    Ok(true)
}

pub(super) async fn read_steps(
    conn: &mut MySqlConnection,
    key: &Key,
    locking: bool,
) -> Result<Vec<StepRow>, Error> {
    let rows = sqlx::query(if locking {
        READ_STEPS_LOCKING
    } else {
        READ_STEPS
    })
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

pub(super) async fn drop_dead_steps(pool: &MySqlPool, key: &Key) -> Result<(), Error> {
    sqlx::query(DROP_DEAD)
        .bind(&key.digest()[..])
        .bind(&key.digest()[..])
        .execute(pool)
        .await
        .map_err(|e| sql_err(Some(key), e))?;
    Ok(())
}

pub(super) async fn purge_steps(pool: &MySqlPool, batch: i64) -> Result<u64, Error> {
    let r = sqlx::query(PURGE_STEPS)
        .bind(batch)
        .execute(pool)
        .await
        .map_err(Error::store)?;
    Ok(r.rows_affected())
}
