-- idem step journals, version 3 (PostgreSQL). A record's durable steps live in its own
-- row, so the claim that takes the row returns them from the row it locked (no second
-- read that could miss a step written just before the takeover), and a step write is
-- owner-checked under that same row lock.
-- `steps`: the entries, appended in order (the format is in store/sql/journal.rs);
-- `steps_expires_us`: when the journal stops existing (a ttl after its last write), by
-- the database's clock. A row whose record expired is kept while its journal lives.
ALTER TABLE idem_records ADD COLUMN IF NOT EXISTS steps BYTEA;
ALTER TABLE idem_records ADD COLUMN IF NOT EXISTS steps_expires_us BIGINT;
