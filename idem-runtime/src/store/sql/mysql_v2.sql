-- idem toolbox records, version 2 (MySQL / MariaDB). Same layout as postgres_v2.sql; see
-- there. States are VARBINARY so they compare byte for byte, not by a collation that
-- would take 'Paid' for 'paid'.
CREATE TABLE IF NOT EXISTS idem_values (
    id          BINARY(16)     NOT NULL PRIMARY KEY,
    version     BIGINT         NOT NULL,
    value       LONGBLOB       NOT NULL,
    expires_us  BIGINT         NULL,
    KEY idem_values_expires (expires_us)
) ENGINE = InnoDB;
CREATE TABLE IF NOT EXISTS idem_states (
    id          BINARY(16)     NOT NULL PRIMARY KEY,
    state       VARBINARY(255) NULL,
    pending     VARBINARY(255) NULL,
    owner       BINARY(16)     NULL,
    lease_us    BIGINT         NULL,
    expires_us  BIGINT         NULL,
    KEY idem_states_expires (expires_us)
) ENGINE = InnoDB;
