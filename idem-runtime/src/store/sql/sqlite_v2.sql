-- idem toolbox records, version 2 (SQLite). Same layout as postgres_v2.sql; see there.
CREATE TABLE IF NOT EXISTS idem_values (
    id          BLOB    NOT NULL PRIMARY KEY,
    version     INTEGER NOT NULL,
    value       BLOB    NOT NULL,
    expires_us  INTEGER
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS idem_values_expires ON idem_values (expires_us);
CREATE TABLE IF NOT EXISTS idem_states (
    id          BLOB    NOT NULL PRIMARY KEY,
    state       TEXT,
    pending     TEXT,
    owner       BLOB,
    lease_us    INTEGER,
    expires_us  INTEGER
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS idem_states_expires ON idem_states (expires_us);
