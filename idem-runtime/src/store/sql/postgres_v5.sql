-- idem recovery, version 5 (PostgreSQL): the arguments of calls marked `recover`, one
-- row per record that has them, written by the claim's own statement and dropped by the
-- completion's (see store/sql/recovery.rs). Times as in version 1.
CREATE TABLE IF NOT EXISTS idem_recovery (
    id          BYTEA   PRIMARY KEY,
    namespace   TEXT    NOT NULL,
    scope       TEXT    NOT NULL,
    args        BYTEA   NOT NULL,
    -- Recovery attempts made; the call's claims do not count.
    attempts    INT4    NOT NULL DEFAULT 0,
    -- Why the call was parked: never taken again.
    parked      TEXT,
    -- When the call may be abandoned (its lease deadline, or now once a dropped call
    -- gave it back); NULL once parked.
    due_us      BIGINT,
    -- When the arguments are dropped whatever happened (the call's ttl).
    expires_us  BIGINT  NOT NULL
);
-- What a recoverer asks for: a namespace's calls due by now, the longest due first.
-- Parked calls are not in it.
CREATE INDEX IF NOT EXISTS idem_recovery_due ON idem_recovery (namespace, due_us)
    WHERE due_us IS NOT NULL;
CREATE INDEX IF NOT EXISTS idem_recovery_expires ON idem_recovery (expires_us);
