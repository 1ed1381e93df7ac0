-- idem toolbox records, version 2 (PostgreSQL). Times as in version 1: microseconds since
-- the Unix epoch by the database's clock; a NULL expiry means "kept until changed".
-- Versioned values (optimistic concurrency): one row per key, version >= 1.
CREATE TABLE IF NOT EXISTS idem_values (
    id          BYTEA  PRIMARY KEY,
    version     BIGINT NOT NULL,
    value       BYTEA  NOT NULL,
    expires_us  BIGINT
);
CREATE INDEX IF NOT EXISTS idem_values_expires ON idem_values (expires_us);
-- State-machine records: the state (NULL only while a move out of "no state" is held)
-- and a held move: its target, owner and lease deadline.
CREATE TABLE IF NOT EXISTS idem_states (
    id          BYTEA  PRIMARY KEY,
    state       TEXT,
    pending     TEXT,
    owner       BYTEA,
    lease_us    BIGINT,
    expires_us  BIGINT
);
CREATE INDEX IF NOT EXISTS idem_states_expires ON idem_states (expires_us);
