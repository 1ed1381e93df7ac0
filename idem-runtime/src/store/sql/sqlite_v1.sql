-- idem records, version 1 (SQLite). Same layout as postgres_v1.sql; see there.
CREATE TABLE IF NOT EXISTS idem_records (
    id               BLOB    NOT NULL PRIMARY KEY,
    namespace        TEXT    NOT NULL,
    scope            TEXT    NOT NULL,
    kind             INTEGER NOT NULL,
    state            INTEGER NOT NULL,
    owner            BLOB,
    fence            INTEGER NOT NULL DEFAULT 0,
    fingerprint      BLOB,
    value            BLOB,
    expires_us       INTEGER NOT NULL,
    lease_us         INTEGER,
    token_expires_us INTEGER
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS idem_records_expires ON idem_records (expires_us);
