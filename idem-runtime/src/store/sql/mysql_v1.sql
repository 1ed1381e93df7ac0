-- idem records, version 1 (MySQL / MariaDB). Same layout as postgres_v1.sql; see there.
CREATE TABLE IF NOT EXISTS idem_records (
    id               BINARY(16)     NOT NULL PRIMARY KEY,
    namespace        TEXT           NOT NULL,
    scope            TEXT           NOT NULL,
    kind             SMALLINT       NOT NULL,
    state            SMALLINT       NOT NULL,
    owner            BINARY(16)     NULL,
    fence            BIGINT         NOT NULL DEFAULT 0,
    fingerprint      VARBINARY(64)  NULL,
    value            LONGBLOB       NULL,
    expires_us       BIGINT         NOT NULL,
    lease_us         BIGINT         NULL,
    token_expires_us BIGINT         NULL,
    KEY idem_records_expires (expires_us)
) ENGINE = InnoDB;
