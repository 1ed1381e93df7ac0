-- idem recovery, version 5 (MySQL, MariaDB): see postgres_v5.sql. No partial indexes
-- here: parked rows (due_us NULL) sit at the index's start, below every due time.
CREATE TABLE IF NOT EXISTS idem_recovery (
    id          BINARY(16)    NOT NULL PRIMARY KEY,
    namespace   VARCHAR(255)  NOT NULL,
    scope       VARCHAR(512)  NOT NULL,
    args        LONGBLOB      NOT NULL,
    attempts    INT           NOT NULL DEFAULT 0,
    parked      TEXT          NULL,
    due_us      BIGINT        NULL,
    expires_us  BIGINT        NOT NULL,
    KEY idem_recovery_due (namespace, due_us),
    KEY idem_recovery_expires (expires_us)
) ENGINE = InnoDB;
