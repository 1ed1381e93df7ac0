-- idem records, version 1 (PostgreSQL).
-- One row per key. Times are microseconds since the Unix epoch by the database's clock,
-- so every process agrees on expiry whatever its own clock says.
CREATE TABLE IF NOT EXISTS idem_records (
    -- The key's 128-bit digest; it already covers namespace and function, so it alone
    -- identifies the record and raw key text never reaches the database.
    id               BYTEA    PRIMARY KEY,
    namespace        TEXT     NOT NULL,
    scope            TEXT     NOT NULL,
    -- 0 dedup, 1 lock, 2 token: how the row was created (release differs per kind).
    kind             SMALLINT NOT NULL,
    -- 0 free (released lock, kept for its fence), 1 issued token, 2 in progress, 3 completed.
    state            SMALLINT NOT NULL,
    owner            BYTEA,
    fence            BIGINT   NOT NULL DEFAULT 0,
    fingerprint      BYTEA,
    value            BYTEA,
    -- When the record stops existing (lease end, ttl end, token expiry).
    expires_us       BIGINT   NOT NULL,
    -- In progress: when the holder's lease ends.
    lease_us         BIGINT,
    -- Tokens: when the token itself expires; restored when a consumer releases it.
    token_expires_us BIGINT
);
-- Serves purge_expired: the oldest expired rows first, in bounded batches.
CREATE INDEX IF NOT EXISTS idem_records_expires ON idem_records (expires_us);
