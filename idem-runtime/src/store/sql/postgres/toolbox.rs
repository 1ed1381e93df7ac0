//! PostgreSQL statements for the toolbox records: versioned values in `idem_values`,
//! state records in `idem_states`. The `toolbox` module decides which one runs when.
//! Each is one statement, decided by the database's clock (`now()`, fixed for the
//! statement).

use sqlx::postgres::PgPool;

use crate::store::sql::record::sql_err;
use crate::store::sql::toolbox::{StateRow, StateWrite, ValueRow, ValueWrite};
use crate::{Error, Key};

// ---- Versioned values ----

const LOAD_VALUE: &str = concat!(
    "SELECT value, version FROM idem_values WHERE id = $1 AND (expires_us IS NULL OR expires_us > ",
    now!(),
    ")"
);

const CLEAR_EXPIRED_VALUE: &str = concat!(
    "DELETE FROM idem_values WHERE id = $1 AND expires_us <= ",
    now!()
);

const INSERT_VALUE: &str = concat!(
    "INSERT INTO idem_values (id, version, value, expires_us) VALUES ($1, 1, $2, ",
    now!(),
    " + $3) ON CONFLICT (id) DO NOTHING"
);

const UPDATE_VALUE: &str = concat!(
    "UPDATE idem_values SET version = version + 1, value = $1, expires_us = ",
    now!(),
    " + $2 WHERE id = $3 AND version = $4 AND (expires_us IS NULL OR expires_us > ",
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
    " AS lease_left_us FROM idem_states WHERE id = $1 AND ",
    live!()
);

const CLEAR_EXPIRED_STATE: &str = concat!(
    "DELETE FROM idem_states WHERE id = $1 AND expires_us <= ",
    now!()
);

const CREATE_STATE: &str = concat!(
    "INSERT INTO idem_states (id, state, pending, owner, lease_us, expires_us) \
     VALUES ($1, $2, NULL, NULL, NULL, ",
    now!(),
    " + $3) ON CONFLICT (id) DO NOTHING"
);

const CREATE_HELD_STATE: &str = concat!(
    "INSERT INTO idem_states (id, state, pending, owner, lease_us, expires_us) \
     VALUES ($1, NULL, $2, $3, ",
    now!(),
    " + $4, ",
    now!(),
    " + $5) ON CONFLICT (id) DO NOTHING"
);

const MOVE_STATE: &str = concat!(
    "UPDATE idem_states SET state = $1, pending = NULL, owner = NULL, lease_us = NULL, \
     expires_us = ",
    now!(),
    " + $2 WHERE id = $3 AND state = $4 AND ",
    free!(),
    " AND ",
    live!()
);

const HOLD_STATE: &str = concat!(
    "UPDATE idem_states SET pending = $1, owner = $2, lease_us = ",
    now!(),
    " + $3, expires_us = CASE WHEN expires_us IS NULL THEN NULL ELSE GREATEST(expires_us, ",
    now!(),
    " + $4) END WHERE id = $5 AND state = $6 AND ",
    free!(),
    " AND ",
    live!()
);

const COMMIT_HOLD: &str = concat!(
    "UPDATE idem_states SET state = pending, pending = NULL, owner = NULL, lease_us = NULL, \
     expires_us = ",
    now!(),
    " + $1 WHERE id = $2 AND owner = $3 AND pending IS NOT NULL AND ",
    live!()
);

const DROP_HELD_CREATION: &str = "DELETE FROM idem_states \
     WHERE id = $1 AND owner = $2 AND pending IS NOT NULL AND state IS NULL";

const CLEAR_HOLD: &str = concat!(
    "UPDATE idem_states SET pending = NULL, owner = NULL, lease_us = NULL \
     WHERE id = $1 AND owner = $2 AND pending IS NOT NULL AND ",
    live!()
);

const RENEW_HOLD: &str = concat!(
    "UPDATE idem_states SET lease_us = ",
    now!(),
    " + $1, expires_us = CASE WHEN state IS NULL THEN ",
    now!(),
    " + $2 WHEN expires_us IS NULL THEN NULL ELSE GREATEST(expires_us, ",
    now!(),
    " + $3) END WHERE id = $4 AND owner = $5 AND pending IS NOT NULL AND ",
    live!()
);

// ---- Purging: bounded by a subquery's LIMIT, re-checked on the rows it names ----

pub(super) const PURGE_VALUES: &str = concat!(
    "DELETE FROM idem_values WHERE id IN (SELECT id FROM idem_values WHERE expires_us <= ",
    now!(),
    " LIMIT $1) AND expires_us <= ",
    now!()
);

pub(super) const PURGE_STATES: &str = concat!(
    "DELETE FROM idem_states WHERE id IN (SELECT id FROM idem_states WHERE expires_us <= ",
    now!(),
    " LIMIT $1) AND expires_us <= ",
    now!()
);

crate::store::sql::toolbox::runners!(PgPool);
