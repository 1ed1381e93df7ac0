-- idem step journals, version 3 (MySQL, MariaDB): see postgres_v3.sql.
ALTER TABLE idem_records ADD COLUMN steps LONGBLOB NULL, ADD COLUMN steps_expires_us BIGINT NULL;
