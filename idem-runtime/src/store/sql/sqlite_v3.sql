-- idem step journals, version 3 (SQLite): see postgres_v3.sql.
ALTER TABLE idem_records ADD COLUMN steps BLOB;
ALTER TABLE idem_records ADD COLUMN steps_expires_us INTEGER;
