-- idem recovery, version 5 (SQLite): see postgres_v5.sql.
CREATE TABLE IF NOT EXISTS idem_recovery (
    id          BLOB    NOT NULL PRIMARY KEY,
    namespace   TEXT    NOT NULL,
    scope       TEXT    NOT NULL,
    args        BLOB    NOT NULL,
    attempts    INTEGER NOT NULL DEFAULT 0,
    parked      TEXT,
    due_us      INTEGER,
    expires_us  INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS idem_recovery_due ON idem_recovery (namespace, due_us)
    WHERE due_us IS NOT NULL;
CREATE INDEX IF NOT EXISTS idem_recovery_expires ON idem_recovery (expires_us);
