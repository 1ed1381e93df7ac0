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

crate::store::sql::toolbox::runners!(MySqlPool);
