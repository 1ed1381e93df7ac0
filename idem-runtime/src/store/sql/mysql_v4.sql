-- idem step journals, version 4 (MySQL, MariaDB): see postgres_v4.sql.
CREATE TABLE IF NOT EXISTS idem_steps (
    id      BINARY(16)    NOT NULL,
    name_id VARBINARY(16) NOT NULL,
    seq     BIGINT        NOT NULL,
    at_us   BIGINT        NOT NULL,
    entry   LONGBLOB      NOT NULL,
    PRIMARY KEY (id, name_id)
) ENGINE = InnoDB;
ALTER TABLE idem_records
    ADD COLUMN steps_n BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN steps_base BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN steps_fp VARBINARY(64) NULL;
INSERT IGNORE INTO idem_steps (id, name_id, seq, at_us, entry)
SELECT id, X'00', 1, 0, steps FROM idem_records WHERE steps IS NOT NULL;
UPDATE idem_records SET steps_n = 1, steps_base = 0, steps = NULL WHERE steps IS NOT NULL;
