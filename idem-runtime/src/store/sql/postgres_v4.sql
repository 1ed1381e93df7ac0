-- idem step journals, version 4 (PostgreSQL): one row per step in a table of its own,
-- so a step write costs the size of that step, not of the whole journal (version 3 kept
-- the journal in one value of the record's row, rewritten by every step).
-- The record's row keeps what a claim decides on in its one statement: whether the
-- journal lives (`steps_expires_us`, as before), the payload it was written for
-- (`steps_fp`), and a write counter: every step write bumps `steps_n` and its entry
-- takes it as its `seq`; entries at or below `steps_base` are dead (a dropped journal,
-- or one that started afresh). The format is in store/sql/journal.rs.
CREATE TABLE IF NOT EXISTS idem_steps (
    -- The record's id.
    id      BYTEA  NOT NULL,
    -- 16 bytes of BLAKE3 of the step name; X'00' holds a journal carried over from
    -- version 3, as it was.
    name_id BYTEA  NOT NULL,
    seq     BIGINT NOT NULL,
    -- When the entry was written, by the database's clock.
    at_us   BIGINT NOT NULL,
    entry   BYTEA  NOT NULL,
    PRIMARY KEY (id, name_id)
);
ALTER TABLE idem_records ADD COLUMN IF NOT EXISTS steps_n BIGINT NOT NULL DEFAULT 0;
ALTER TABLE idem_records ADD COLUMN IF NOT EXISTS steps_base BIGINT NOT NULL DEFAULT 0;
ALTER TABLE idem_records ADD COLUMN IF NOT EXISTS steps_fp BYTEA;
-- Version 3 journals, carried over whole as one entry row each; the `steps` column is
-- no longer used.
INSERT INTO idem_steps (id, name_id, seq, at_us, entry)
SELECT id, '\x00'::bytea, 1, 0, steps FROM idem_records WHERE steps IS NOT NULL
ON CONFLICT DO NOTHING;
UPDATE idem_records SET steps_n = 1, steps_base = 0, steps = NULL WHERE steps IS NOT NULL;
