-- idem step journals, version 4 (SQLite): see postgres_v4.sql.
CREATE TABLE IF NOT EXISTS idem_steps (
    id      BLOB    NOT NULL,
    name_id BLOB    NOT NULL,
    seq     INTEGER NOT NULL,
    at_us   INTEGER NOT NULL,
    entry   BLOB    NOT NULL,
    PRIMARY KEY (id, name_id)
);
ALTER TABLE idem_records ADD COLUMN steps_n INTEGER NOT NULL DEFAULT 0;
ALTER TABLE idem_records ADD COLUMN steps_base INTEGER NOT NULL DEFAULT 0;
ALTER TABLE idem_records ADD COLUMN steps_fp BLOB;
INSERT OR IGNORE INTO idem_steps (id, name_id, seq, at_us, entry)
SELECT id, X'00', 1, 0, steps FROM idem_records WHERE steps IS NOT NULL;
UPDATE idem_records SET steps_n = 1, steps_base = 0, steps = NULL WHERE steps IS NOT NULL;
