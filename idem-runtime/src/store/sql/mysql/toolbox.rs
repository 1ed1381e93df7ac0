//! MySQL and MariaDB statements for the toolbox records: versioned values in `idem_values`,
//! state records in `idem_states`. The `toolbox` module decides which one runs when.
//! Each is one statement, decided by the database's clock (`UTC_TIMESTAMP(6)`, fixed for the
//! statement).

use sqlx::mysql::MySqlPool;

use crate::store::sql::record::sql_err;
use crate::store::sql::toolbox::{StateRow, StateWrite, ValueRow, ValueWrite};
use crate::{Error, Key};

// ---- Versioned values ----

const LOAD_VALUE: &str = concat!(
    "SELECT value, version FROM idem_values WHERE id = ? AND (expires_us IS NULL OR expires_us > ",
    now!(),
    ")"
);

const CLEAR_EXPIRED_VALUE: &str = concat!(
    "DELETE FROM idem_values WHERE id = ? AND expires_us <= ",
    now!()
);

const INSERT_VALUE: &str = concat!(
    "INSERT IGNORE INTO idem_values (id, version, value, expires_us) VALUES (?, 1, ?, ",
    now!(),
    " + ?)"
);

const UPDATE_VALUE: &str = concat!(
    "UPDATE idem_values SET version = version + 1, value = ?, expires_us = ",
    now!(),
    " + ? WHERE id = ? AND version = ? AND (expires_us IS NULL OR expires_us > ",
    now!(),
    ")"
);

pub(super) async fn load_value(pool: &MySqlPool, key: &Key) -> Result<Option<ValueRow>, Error> {
    sqlx::query_as(LOAD_VALUE)
        .bind(&key.digest()[..])
        .fetch_optional(pool)
        .await
        .map_err(|e| sql_err(Some(key), e))
}

pub(super) async fn write_value(
    pool: &MySqlPool,
    key: &Key,
    write: ValueWrite<'_>,
) -> Result<u64, Error> {
    let id = &key.digest()[..];
    match write {
        ValueWrite::ClearExpired => sqlx::query(CLEAR_EXPIRED_VALUE).bind(id),
        ValueWrite::Insert { value, ttl_us } => {
            sqlx::query(INSERT_VALUE).bind(id).bind(value).bind(ttl_us)
        }
        ValueWrite::Update {
            expected,
            value,
            ttl_us,
        } => sqlx::query(UPDATE_VALUE)
            .bind(value)
            .bind(ttl_us)
            .bind(id)
            .bind(expected),
    }
    .execute(pool)
    .await
    .map(|r| r.rows_affected())
    .map_err(|e| sql_err(Some(key), e))
}

// ---- State records ----

/// A live row: no expiry, or one still ahead.
macro_rules! live {
    () => {
        concat!("(expires_us IS NULL OR expires_us > ", now!(), ")")
    };
}

/// No live hold: no pending move, or its lease has lapsed.
macro_rules! free {
    () => {
        concat!("(pending IS NULL OR lease_us <= ", now!(), ")")
    };
}

const READ_STATE: &str = concat!(
    "SELECT state, pending, lease_us - ",
    now!(),
    " AS lease_left_us FROM idem_states WHERE id = ? AND ",
    live!()
);

const CLEAR_EXPIRED_STATE: &str = concat!(
    "DELETE FROM idem_states WHERE id = ? AND expires_us <= ",
    now!()
);

const CREATE_STATE: &str = concat!(
    "INSERT IGNORE INTO idem_states (id, state, pending, owner, lease_us, expires_us) \
     VALUES (?, ?, NULL, NULL, NULL, ",
    now!(),
    " + ?)"
);

const CREATE_HELD_STATE: &str = concat!(
    "INSERT IGNORE INTO idem_states (id, state, pending, owner, lease_us, expires_us) \
     VALUES (?, NULL, ?, ?, ",
    now!(),
    " + ?, ",
    now!(),
    " + ?)"
);

const MOVE_STATE: &str = concat!(
    "UPDATE idem_states SET state = ?, pending = NULL, owner = NULL, lease_us = NULL, \
     expires_us = ",
    now!(),
    " + ? WHERE id = ? AND state = ? AND ",
    free!(),
    " AND ",
    live!()
);

const HOLD_STATE: &str = concat!(
    "UPDATE idem_states SET pending = ?, owner = ?, lease_us = ",
    now!(),
    " + ?, expires_us = CASE WHEN expires_us IS NULL THEN NULL ELSE GREATEST(expires_us, ",
    now!(),
    " + ?) END WHERE id = ? AND state = ? AND ",
    free!(),
    " AND ",
    live!()
);

const COMMIT_HOLD: &str = concat!(
    "UPDATE idem_states SET state = pending, pending = NULL, owner = NULL, lease_us = NULL, \
     expires_us = ",
    now!(),
    " + ? WHERE id = ? AND owner = ? AND pending IS NOT NULL AND ",
    live!()
);

const DROP_HELD_CREATION: &str = "DELETE FROM idem_states \
     WHERE id = ? AND owner = ? AND pending IS NOT NULL AND state IS NULL";

const CLEAR_HOLD: &str = concat!(
    "UPDATE idem_states SET pending = NULL, owner = NULL, lease_us = NULL \
     WHERE id = ? AND owner = ? AND pending IS NOT NULL AND ",
    live!()
);

const RENEW_HOLD: &str = concat!(
    "UPDATE idem_states SET lease_us = ",
    now!(),
    " + ?, expires_us = CASE WHEN state IS NULL THEN ",
    now!(),
    " + ? WHEN expires_us IS NULL THEN NULL ELSE GREATEST(expires_us, ",
    now!(),
    " + ?) END WHERE id = ? AND owner = ? AND pending IS NOT NULL AND ",
    live!()
);

pub(super) async fn read_state(pool: &MySqlPool, key: &Key) -> Result<Option<StateRow>, Error> {
    let row = sqlx::query(READ_STATE)
        .bind(&key.digest()[..])
        .fetch_optional(pool)
        .await
        .map_err(|e| sql_err(Some(key), e))?;
    row.map(|r| StateRow::from_row(key, &r)).transpose()
}

pub(super) async fn write_state(
    pool: &MySqlPool,
    key: &Key,
    write: StateWrite<'_>,
) -> Result<u64, Error> {
    let id = &key.digest()[..];
    match write {
        StateWrite::ClearExpired => sqlx::query(CLEAR_EXPIRED_STATE).bind(id),
        StateWrite::Create { to, ttl_us } => {
            sqlx::query(CREATE_STATE).bind(id).bind(to).bind(ttl_us)
        }
        StateWrite::CreateHeld {
            to,
            owner,
            lease_us,
        } => sqlx::query(CREATE_HELD_STATE)
            .bind(id)
            .bind(to)
            .bind(owner)
            .bind(lease_us)
            .bind(lease_us),
        StateWrite::Move { from, to, ttl_us } => sqlx::query(MOVE_STATE)
            .bind(to)
            .bind(ttl_us)
            .bind(id)
            .bind(from),
        StateWrite::Hold {
            from,
            to,
            owner,
            lease_us,
        } => sqlx::query(HOLD_STATE)
            .bind(to)
            .bind(owner)
            .bind(lease_us)
            .bind(lease_us)
            .bind(id)
            .bind(from),
        StateWrite::Commit { owner, ttl_us } => {
            sqlx::query(COMMIT_HOLD).bind(ttl_us).bind(id).bind(owner)
        }
        StateWrite::DropHeldCreation { owner } => {
            sqlx::query(DROP_HELD_CREATION).bind(id).bind(owner)
        }
        StateWrite::ClearHold { owner } => sqlx::query(CLEAR_HOLD).bind(id).bind(owner),
        StateWrite::RenewHold { owner, lease_us } => sqlx::query(RENEW_HOLD)
            .bind(lease_us)
            .bind(lease_us)
            .bind(lease_us)
            .bind(id)
            .bind(owner),
    }
    .execute(pool)
    .await
    .map(|r| r.rows_affected())
    .map_err(|e| sql_err(Some(key), e))
}

// ---- Purging: bounded by the DELETE's own LIMIT (MySQL cannot LIMIT a subquery on ----
// ---- the table it deletes from) ----

pub(super) const PURGE_VALUES: &str = concat!(
    "DELETE FROM idem_values WHERE expires_us <= ",
    now!(),
    " ORDER BY expires_us LIMIT ?"
);

pub(super) const PURGE_STATES: &str = concat!(
    "DELETE FROM idem_states WHERE expires_us <= ",
    now!(),
    " ORDER BY expires_us LIMIT ?"
);

/// Runs [`PURGE_VALUES`] or [`PURGE_STATES`]: the rows it deleted.
pub(super) async fn purge(
    pool: &MySqlPool,
    statement: &'static str,
    batch: i64,
) -> Result<u64, Error> {
    sqlx::query(statement)
        .bind(batch)
        .execute(pool)
        .await
        .map(|r| r.rows_affected())
        .map_err(Error::store)
}
