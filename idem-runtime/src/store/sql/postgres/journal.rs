//! PostgreSQL statements of the step journals (see the `journal` module): a step write
//! is one statement that updates the record's row under its lock (owner check, counter,
//! expiry, payload) and writes that step's own row; under load, one statement writes the
//! steps of many calls (see the `batch` module).

use sqlx::Row;
use sqlx::postgres::{PgConnection, PgPool};

use super::super::batch::{Job, changed};
use super::super::journal::{Step, StepRow};
use super::{BoxFuture, PgDialect, owner_bytes, sql_err, us};
use crate::store::Owner;
use crate::{Error, Key};

/// Journals `$3`/`$4` if `$2` holds the record with a live lease (a dedup or token
/// claim). A journal past its expiry starts afresh: `steps_base` moves up to the
/// counter, and the dead entries are deleted (but the one this write replaces). The
/// journal's payload is the holder's, or stays the journal's when the holder claimed
/// without one.
const WRITE_STEP: &str = concat!(
    "WITH t AS (SELECT ",
    now!(),
    " AS now),
upd AS (
    UPDATE idem_records r SET
        steps_base = CASE WHEN r.steps_expires_us > t.now THEN r.steps_base ELSE r.steps_n END,
        steps_n = r.steps_n + 1,
        steps_fp = COALESCE(r.fingerprint,
                            CASE WHEN r.steps_expires_us > t.now THEN r.steps_fp END),
        steps_expires_us = t.now + $5
    FROM t
    WHERE r.id = $1 AND r.state = 2 AND r.owner = $2 AND r.kind <> 1 AND r.lease_us > t.now
    RETURNING r.id, r.steps_n, r.steps_base
),
dead AS (
    DELETE FROM idem_steps s USING upd
    WHERE s.id = upd.id AND upd.steps_base = upd.steps_n - 1 AND s.seq <= upd.steps_base
      AND s.name_id <> $3
),
ins AS (
    INSERT INTO idem_steps AS s (id, name_id, seq, at_us, entry)
    SELECT upd.id, $3, upd.steps_n, t.now, $4 FROM upd, t
    ON CONFLICT (id, name_id) DO UPDATE SET
        seq = EXCLUDED.seq, at_us = EXCLUDED.at_us, entry = EXCLUDED.entry
)
SELECT COUNT(*)::int8 FROM upd"
);

/// Many step writes in one statement, each for its own record: per row, what
/// [`WRITE_STEP`] does. Rows are found by `id = ANY($1)` (see the completions' batch),
/// and each row's own arguments by its place in `$1`. Answers the ids of the records it
/// journaled. A row lock is waited for 100 ms, as in a batch of claims: a row held by an
/// open transaction holds up the batch only briefly, and its write then runs alone.
const WRITE_STEP_BATCH: &str = concat!(
    "WITH t AS (SELECT ",
    now!(),
    " AS now, set_config('lock_timeout', '100', true) AS lock_timeout),
upd AS (
    UPDATE idem_records r SET
        steps_base = CASE WHEN r.steps_expires_us > t.now THEN r.steps_base ELSE r.steps_n END,
        steps_n = r.steps_n + 1,
        steps_fp = COALESCE(r.fingerprint,
                            CASE WHEN r.steps_expires_us > t.now THEN r.steps_fp END),
        steps_expires_us = t.now + ($5::int8[])[array_position($1::bytea[], r.id)]
    FROM t
    WHERE r.id = ANY($1::bytea[]) AND r.state = 2
      AND r.owner = ($2::bytea[])[array_position($1::bytea[], r.id)]
      AND r.kind <> 1 AND r.lease_us > t.now
    RETURNING r.id, r.steps_n, r.steps_base, array_position($1::bytea[], r.id) AS i
),
dead AS (
    DELETE FROM idem_steps s USING upd
    WHERE s.id = upd.id AND upd.steps_base = upd.steps_n - 1 AND s.seq <= upd.steps_base
      AND s.name_id <> ($3::bytea[])[upd.i]
),
ins AS (
    INSERT INTO idem_steps AS s (id, name_id, seq, at_us, entry)
    SELECT upd.id, ($3::bytea[])[upd.i], upd.steps_n, t.now, ($4::bytea[])[upd.i]
    FROM upd, t
    ORDER BY upd.id
    ON CONFLICT (id, name_id) DO UPDATE SET
        seq = EXCLUDED.seq, at_us = EXCLUDED.at_us, entry = EXCLUDED.entry
)
SELECT id FROM upd"
);

/// One step write in a batch.
pub(in super::super) struct StepWrite {
    id: [u8; 16],
    owner: [u8; 16],
    name_id: [u8; 16],
    entry: Vec<u8>,
    ttl_us: i64,
}

impl StepWrite {
    pub(super) fn new(key: &Key, owner: Owner, step: &Step<'_>) -> StepWrite {
        StepWrite {
            id: *key.digest(),
            owner: owner_bytes(owner),
            name_id: step.name_id,
            entry: step.entry.to_vec(),
            ttl_us: us(step.ttl),
        }
    }
}

/// Step writes, many per statement.
pub(in super::super) struct StepWrites;

impl Job for StepWrites {
    type Item = StepWrite;
    /// Whether the step was journaled.
    type Answer = bool;
    /// The step's effect happened: its entry goes out even if the call was dropped.
    const DROP_ABANDONED: bool = false;

    fn id(item: &StepWrite) -> [u8; 16] {
        item.id
    }

    fn run<'c>(
        &'c self,
        conn: &'c mut PgConnection,
        items: &'c [StepWrite],
    ) -> BoxFuture<'c, Result<Vec<bool>, Error>> {
        Box::pin(async move {
            let ids: Vec<[u8; 16]> = items.iter().map(|w| w.id).collect();
            let owners: Vec<[u8; 16]> = items.iter().map(|w| w.owner).collect();
            let names: Vec<[u8; 16]> = items.iter().map(|w| w.name_id).collect();
            let entries: Vec<&[u8]> = items.iter().map(|w| &w.entry[..]).collect();
            let ttls: Vec<i64> = items.iter().map(|w| w.ttl_us).collect();
            let written: Vec<Vec<u8>> = sqlx::query_scalar(WRITE_STEP_BATCH)
                .bind(&ids)
                .bind(&owners)
                .bind(&names)
                .bind(&entries)
                .bind(&ttls)
                .fetch_all(&mut *conn)
                .await
                .map_err(|e| sql_err(None, e))?;
            Ok(changed(&ids, &written))
        })
    }
}

/// The live entries of a record, in the order of their last write.
const READ_STEPS: &str = concat!(
    "SELECT s.name_id, s.at_us, s.entry
FROM idem_steps s JOIN idem_records r ON r.id = s.id
WHERE s.id = $1 AND r.steps_expires_us > ",
    now!(),
    " AND s.seq > r.steps_base
ORDER BY s.seq"
);

impl PgDialect {
    /// One statement, whether in a transaction of the caller's (`in_tx`) or not.
    pub(super) async fn write_step_on(
        &self,
        conn: &mut PgConnection,
        _in_tx: bool,
        key: &Key,
        owner: Owner,
        step: &Step<'_>,
    ) -> Result<bool, Error> {
        let written: i64 = sqlx::query_scalar(WRITE_STEP)
            .bind(&key.digest()[..])
            .bind(&owner_bytes(owner)[..])
            .bind(&step.name_id[..])
            .bind(step.entry)
            .bind(us(step.ttl))
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| sql_err(Some(key), e))?;
        Ok(written == 1)
    }
}

/// The live entry rows of `key`. Each statement reads what had committed when it
/// started (read committed), so no lock is needed (`_locking`).
pub(super) async fn read_steps(
    conn: &mut PgConnection,
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

/// Nothing to do: completion, forget and a journal started afresh delete the dead
/// entries in their own statement.
pub(super) async fn drop_dead_steps(_pool: &PgPool, _key: &Key) -> Result<(), Error> {
    Ok(())
}
