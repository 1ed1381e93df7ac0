//! MySQL and MariaDB statements.
//!
//! A claim is `INSERT … ON DUPLICATE KEY UPDATE` whose assignments are all conditional.
//! MySQL evaluates the assignments left to right, each seeing the columns already
//! assigned, so the first one decides: `owner` becomes the caller's only if the row is
//! takeable, and every later column changes only `IF(owner = VALUES(owner), …)`. The
//! decision and the write happen under the row's lock, in one statement.
//!
//! MariaDB (10.5+) returns the resulting row with `RETURNING`, so a claim, a takeover and
//! a replay are each one round trip. MySQL has no `RETURNING`: a second statement reads
//! the row (claimed iff it now names the caller as owner).
//!
//! A dedup or token claim never takes a record whose live step journal was written for
//! another payload: the first assignment's condition (or the token claim's `WHERE`)
//! refuses it, and the answer carries the journal's fingerprint. Step journals are in
//! `journal`.

use std::time::Duration;

use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::mysql::{MySqlConnection, MySqlPool, MySqlRow};
use sqlx::{Row, SqlSafeStr};

use super::inspection::Inspected;
use super::{
    BoxFuture, IN_PROGRESS, KIND_TOKEN, LOCK_RETENTION, Snapshot, kind_code, owner_bytes, sql_err,
    us,
};
use crate::store::{ClaimKind, ClaimRequest, Owner};
use crate::{Error, Key};

/// Microseconds since the epoch by the server's clock. `UTC_TIMESTAMP(6)` is fixed for
/// the statement and, unlike `UNIX_TIMESTAMP(NOW(6))`, does not depend on the session's
/// time zone (no ambiguous hour when daylight saving time ends).
macro_rules! now {
    () => {
        "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))"
    };
}

// After `now!`, which their statements use.
mod journal;
mod operators;
mod recovery;
mod toolbox;

pub(super) use self::journal::max_packet;
use self::journal::{drop_dead_steps, read_steps};
use self::operators::{count, forget, inspect};

pub(super) fn migrator() -> Migrator {
    let mut m = Migrator::with_migrations(vec![
        Migration::new(
            1,
            "idem records".into(),
            MigrationType::Simple,
            include_str!("../mysql_v1.sql").into_sql_str(),
            false,
        ),
        Migration::new(
            2,
            "idem toolbox records".into(),
            MigrationType::Simple,
            include_str!("../mysql_v2.sql").into_sql_str(),
            false,
        ),
        Migration::new(
            3,
            "idem step journals".into(),
            MigrationType::Simple,
            include_str!("../mysql_v3.sql").into_sql_str(),
            false,
        ),
        Migration::new(
            4,
            "idem step journals, one row per step".into(),
            MigrationType::Simple,
            include_str!("../mysql_v4.sql").into_sql_str(),
            false,
        ),
        Migration::new(
            5,
            "idem recovery".into(),
            MigrationType::Simple,
            include_str!("../mysql_v5.sql").into_sql_str(),
            false,
        ),
    ]);
    m.dangerous_set_table_name("_idem_migrations");
    m.set_ignore_missing(true);
    m
}

pub(super) async fn migrate(pool: &MySqlPool) -> Result<(), Error> {
    let fail = |e: &dyn std::fmt::Display| {
        Error::store(format!("creating idem's table in MySQL failed: {e}"))
    };
    let mut conn = pool.acquire().await.map_err(|e| fail(&e))?;
    // Processes starting together apply the migration once: they queue on a named lock.
    // sqlx's own lock asks `GET_LOCK(…, -1)`, which MariaDB answers with NULL (no lock),
    // hence this one, with a finite timeout.
    let locked: Option<i64> =
        sqlx::query_scalar("SELECT GET_LOCK(CONCAT('idem_migrations:', DATABASE()), 60)")
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| fail(&e))?;
    if locked != Some(1) {
        return Err(fail(&"timed out waiting for another process's migration"));
    }
    let mut m = migrator();
    m.set_locking(false);
    let result = m.run_direct(None, &mut *conn, false).await;
    let _ = sqlx::query("DO RELEASE_LOCK(CONCAT('idem_migrations:', DATABASE()))")
        .execute(&mut *conn)
        .await;
    result.map_err(|e| fail(&e))
}

/// MariaDB 10.5 and later accept `INSERT … RETURNING`.
pub(super) async fn supports_returning(pool: &MySqlPool) -> Result<bool, Error> {
    let version: String = sqlx::query_scalar("SELECT VERSION()")
        .fetch_one(pool)
        .await
        .map_err(Error::store)?;
    if !version.contains("MariaDB") {
        return Ok(false);
    }
    let mut parts = version.split(|c: char| !c.is_ascii_digit());
    let major: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let minor: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    Ok((major, minor) >= (10, 5))
}

/// `IF(owner = VALUES(owner), a, b)`: after the first assignment, whether this statement
/// took the row.
macro_rules! took {
    ($col:literal, $new:literal) => {
        concat!(
            $col,
            " = IF(owner <=> VALUES(owner), ",
            $new,
            ", ",
            $col,
            ")"
        )
    };
}

/// A record's live step journal was written for another payload than the claim's
/// (`$fp`): the claim must not take it (see `ClaimOutcome::OtherPayload`).
macro_rules! other_payload {
    ($now:expr, $fp:literal) => {
        concat!(
            "COALESCE(steps_expires_us > ",
            $now,
            " AND steps_fp <> ",
            $fp,
            ", FALSE)"
        )
    };
}

macro_rules! claim_sql {
    ($($tail:tt)*) => {
        concat!(
            "INSERT INTO idem_records
    (id, namespace, scope, kind, state, owner, fence, fingerprint, value,
     expires_us, lease_us, token_expires_us, steps_n, steps_base)
VALUES (?, ?, ?, ?, 2, ?, ",
            now!(),
            ", ?, NULL, ",
            now!(),
            " + ?, ",
            now!(),
            " + ?, NULL, ",
            now!(),
            ", ",
            now!(),
            ")
ON DUPLICATE KEY UPDATE
    owner = IF((state = 0 OR expires_us <= VALUES(fence)) AND NOT ",
            other_payload!("VALUES(fence)", "VALUES(fingerprint)"),
            ", VALUES(owner), owner),
    ",
            took!("namespace", "VALUES(namespace)"),
            ", ",
            took!("scope", "VALUES(scope)"),
            ", ",
            took!("kind", "VALUES(kind)"),
            ", ",
            took!("state", "2"),
            ", ",
            took!("fence", "GREATEST(fence + 1, VALUES(fence))"),
            ", ",
            took!("fingerprint", "VALUES(fingerprint)"),
            ", ",
            took!("value", "NULL"),
            ", ",
            took!("lease_us", "VALUES(lease_us)"),
            ", ",
            took!("token_expires_us", "NULL"),
            ", ",
            took!("expires_us", "VALUES(expires_us)"),
            $($tail)*
        )
    };
}

/// What a claim answers (`RETURNING` on MariaDB, else a second statement).
macro_rules! answer {
    () => {
        concat!(
            "owner, state, fence, fingerprint, value, expires_us - ",
            now!(),
            " AS remaining_us, lease_us - ",
            now!(),
            " AS lease_left_us, COALESCE(steps_expires_us > ",
            now!(),
            ", FALSE) AS journal_live, IF(steps_expires_us > ",
            now!(),
            ", steps_fp, NULL) AS journal_fp"
        )
    };
}

const CLAIM_RETURNING: &str = claim_sql!(concat!("\nRETURNING ", answer!()));
const CLAIM_PLAIN: &str = claim_sql!("");
/// MariaDB, on its own (autocommit): a key held by an uncommitted transactional-mode
/// claim blocks the insert on the unique key; give up after 1 s (error 1205, answered as
/// `Busy`) so the caller waits by its own rules instead of inside the server.
const CLAIM_RETURNING_BOUNDED: &str = concat!(
    "SET STATEMENT innodb_lock_wait_timeout = 1 FOR ",
    claim_sql!(concat!("\nRETURNING ", answer!()))
);

const SELECT: &str = concat!("SELECT ", answer!(), " FROM idem_records WHERE id = ?");

const CLAIM_TOKEN: &str = concat!(
    "UPDATE idem_records SET
    token_expires_us = COALESCE(token_expires_us, expires_us),
    expires_us = GREATEST(token_expires_us, ",
    now!(),
    " + ?),
    state = 2, owner = ?, fingerprint = ?, lease_us = ",
    now!(),
    " + ?
WHERE id = ? AND expires_us > ",
    now!(),
    " AND (state = 1 OR (state = 2 AND lease_us <= ",
    now!(),
    ")) AND NOT ",
    other_payload!(now!(), "?")
);

fn snapshot(key: &Key, row: &MySqlRow, owner: &[u8; 16]) -> Result<Snapshot, Error> {
    let get = || -> Result<Snapshot, sqlx::Error> {
        let row_owner: Option<Vec<u8>> = row.try_get("owner")?;
        let state: i16 = row.try_get("state")?;
        let lease_left_us: Option<i64> = row.try_get("lease_left_us")?;
        Ok(Snapshot {
            // Owners are unique per call, so the row naming the caller, in progress with
            // a live lease, means this claim took it.
            claimed: row_owner.as_deref() == Some(&owner[..])
                && state == IN_PROGRESS
                && lease_left_us.is_some_and(|l| l > 0),
            state,
            fence: row.try_get("fence")?,
            fingerprint: row.try_get("fingerprint")?,
            value: row.try_get("value")?,
            remaining_us: row.try_get("remaining_us")?,
            lease_left_us,
            journal_live: row.try_get::<i64, _>("journal_live")? != 0,
            journal_fp: row.try_get("journal_fp")?,
            journal: None,
        })
    };
    get().map_err(|e| sql_err(Some(key), e))
}

async fn read(
    conn: &mut MySqlConnection,
    key: &Key,
    owner: &[u8; 16],
) -> Result<Option<Snapshot>, Error> {
    let row = sqlx::query(SELECT)
        .bind(&key.digest()[..])
        .fetch_optional(&mut *conn)
        .await
        .map_err(|e| sql_err(Some(key), e))?;
    row.map(|r| snapshot(key, &r, owner)).transpose()
}

pub(super) async fn claim(
    conn: &mut MySqlConnection,
    returning: bool,
    in_tx: bool,
    key: &Key,
    req: &ClaimRequest,
) -> Result<Option<Snapshot>, Error> {
    let owner = owner_bytes(req.owner);
    let fp = req.fingerprint.as_ref().map(|f| &f.0[..]);
    let lease = us(req.lease);
    if req.kind == ClaimKind::Token {
        sqlx::query(CLAIM_TOKEN)
            .bind(lease)
            .bind(&owner[..])
            .bind(fp)
            .bind(lease)
            .bind(&key.digest()[..])
            .bind(fp)
            .execute(&mut *conn)
            .await
            .map_err(|e| sql_err(Some(key), e))?;
        // Taken or not, the row says so (it names this owner), and carries the journal
        // a takeover resumes: `UPDATE` has no `RETURNING` here.
        return read(conn, key, &owner).await;
    }
    let q = sqlx::query(match (returning, in_tx) {
        (true, false) => CLAIM_RETURNING_BOUNDED,
        (true, true) => CLAIM_RETURNING,
        (false, _) => CLAIM_PLAIN,
    })
    .bind(&key.digest()[..])
    .bind(key.namespace())
    .bind(key.scope())
    .bind(kind_code(req.kind))
    .bind(&owner[..])
    .bind(fp)
    .bind(lease)
    .bind(lease);
    if returning {
        let row = q
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| sql_err(Some(key), e))?;
        row.map(|r| snapshot(key, &r, &owner)).transpose()
    } else {
        q.execute(&mut *conn)
            .await
            .map_err(|e| sql_err(Some(key), e))?;
        read(conn, key, &owner).await
    }
}

pub(super) const COMPLETE: &str = concat!(
    "UPDATE idem_records SET state = 3, value = ?, lease_us = NULL, \
     steps_base = steps_n, steps_expires_us = NULL, steps_fp = NULL, expires_us = ",
    now!(),
    " + ? WHERE id = ? AND state = 2 AND owner = ? AND lease_us > ",
    now!()
);

pub(super) async fn complete(
    conn: &mut MySqlConnection,
    key: &Key,
    owner: Owner,
    value: &[u8],
    ttl: Duration,
) -> Result<bool, Error> {
    owner_checked(COMPLETE, conn, key, owner, value, ttl).await
}

/// Runs `sql`, a statement that changes `key`'s row only if `owner` holds it with a live
/// lease ([`COMPLETE`]), with `bytes` and `ttl`; `true` if it did.
async fn owner_checked(
    sql: &'static str,
    conn: &mut MySqlConnection,
    key: &Key,
    owner: Owner,
    bytes: &[u8],
    ttl: Duration,
) -> Result<bool, Error> {
    // The connection reports rows *matched* (CLIENT_FOUND_ROWS), so 1 means "was the
    // holder" even if nothing changed.
    let r = sqlx::query(sql)
        .bind(bytes)
        .bind(us(ttl))
        .bind(&key.digest()[..])
        .bind(&owner_bytes(owner)[..])
        .execute(&mut *conn)
        .await
        .map_err(|e| journal::packet_err(key, e))?;
    Ok(r.rows_affected() == 1)
}

pub(super) const RELEASE: &str = concat!(
    "UPDATE idem_records SET
    expires_us = CASE WHEN token_expires_us > ",
    now!(),
    " THEN token_expires_us WHEN kind = 1 THEN ",
    now!(),
    " + ? ELSE ",
    now!(),
    " END,
    state = CASE WHEN token_expires_us > ",
    now!(),
    " THEN 1 ELSE 0 END,
    owner = NULL, fingerprint = NULL, lease_us = NULL
WHERE id = ? AND state = 2 AND owner = ? AND expires_us > ",
    now!()
);

pub(super) async fn release(pool: &MySqlPool, key: &Key, owner: Owner) -> Result<bool, Error> {
    let r = sqlx::query(RELEASE)
        .bind(us(LOCK_RETENTION))
        .bind(&key.digest()[..])
        .bind(&owner_bytes(owner)[..])
        .execute(pool)
        .await
        .map_err(|e| sql_err(Some(key), e))?;
    Ok(r.rows_affected() == 1)
}

const RENEW: &str = concat!(
    "UPDATE idem_records SET
    lease_us = ",
    now!(),
    " + ?,
    expires_us = GREATEST(COALESCE(token_expires_us, 0), lease_us)
WHERE id = ? AND state = 2 AND owner = ? AND lease_us > ",
    now!()
);

pub(super) async fn renew(
    pool: &MySqlPool,
    key: &Key,
    owner: Owner,
    lease: Duration,
) -> Result<bool, Error> {
    let r = sqlx::query(RENEW)
        .bind(us(lease))
        .bind(&key.digest()[..])
        .bind(&owner_bytes(owner)[..])
        .execute(pool)
        .await
        .map_err(|e| sql_err(Some(key), e))?;
    Ok(r.rows_affected() == 1)
}

macro_rules! issue_sql {
    ($($tail:tt)*) => {
        concat!(
            "INSERT INTO idem_records
    (id, namespace, scope, kind, state, owner, fence, fingerprint, value,
     expires_us, lease_us, token_expires_us, steps_n, steps_base)
VALUES (?, ?, ?, ?, 1, ?, 0, NULL, NULL, ",
            now!(),
            " + ?, NULL, ",
            now!(),
            " + ?, ",
            now!(),
            ", ",
            now!(),
            ")
ON DUPLICATE KEY UPDATE
    owner = IF(state = 0 OR expires_us <= ",
            now!(),
            ", VALUES(owner), owner),
    ",
            took!("namespace", "VALUES(namespace)"),
            ", ",
            took!("scope", "VALUES(scope)"),
            ", ",
            took!("kind", "VALUES(kind)"),
            ", ",
            took!("state", "1"),
            ", ",
            took!("fingerprint", "NULL"),
            ", ",
            took!("value", "NULL"),
            ", ",
            took!("lease_us", "NULL"),
            ", ",
            took!("token_expires_us", "VALUES(token_expires_us)"),
            ", ",
            took!("expires_us", "VALUES(expires_us)"),
            $($tail)*
        )
    };
}

const ISSUE_RETURNING: &str = issue_sql!("\nRETURNING owner");
const ISSUE_PLAIN: &str = issue_sql!("");

pub(super) async fn issue(
    conn: &mut MySqlConnection,
    returning: bool,
    key: &Key,
    ttl: Duration,
) -> Result<bool, Error> {
    // "Inserted or overwrote an expired row" cannot be told from "left an existing row
    // alone" by the affected-row count (found rows count as affected), so the issue
    // writes a one-off nonce as the owner and checks that it is there.
    let nonce = owner_bytes(Owner::next());
    let ttl = us(ttl);
    let q = sqlx::query(if returning {
        ISSUE_RETURNING
    } else {
        ISSUE_PLAIN
    })
    .bind(&key.digest()[..])
    .bind(key.namespace())
    .bind(key.scope())
    .bind(KIND_TOKEN)
    .bind(&nonce[..])
    .bind(ttl)
    .bind(ttl);
    let owner: Option<Vec<u8>> = if returning {
        let row = q
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| sql_err(Some(key), e))?;
        match row {
            Some(r) => r.try_get("owner").map_err(|e| sql_err(Some(key), e))?,
            None => None,
        }
    } else {
        q.execute(&mut *conn)
            .await
            .map_err(|e| sql_err(Some(key), e))?;
        sqlx::query_scalar("SELECT owner FROM idem_records WHERE id = ?")
            .bind(&key.digest()[..])
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| sql_err(Some(key), e))?
            .flatten()
    };
    Ok(owner.as_deref() == Some(&nonce[..]))
}

const PURGE: &str = concat!(
    "DELETE FROM idem_records WHERE expires_us <= ",
    now!(),
    " AND (steps_expires_us IS NULL OR steps_expires_us <= ",
    now!(),
    ") ORDER BY expires_us LIMIT ?"
);

/// Deletes up to `batch` expired records, then up to `batch` dead journal entries.
pub(super) async fn purge(pool: &MySqlPool, batch: i64) -> Result<u64, Error> {
    let r = sqlx::query(PURGE)
        .bind(batch)
        .execute(pool)
        .await
        .map_err(Error::store)?;
    journal::purge_steps(pool, batch).await?;
    // Recovery arguments past their ttl.
    sqlx::query(concat!(
        "DELETE FROM idem_recovery WHERE expires_us <= ",
        now!(),
        " ORDER BY expires_us LIMIT ?"
    ))
    .bind(batch)
    .execute(pool)
    .await
    .map_err(Error::store)?;
    Ok(r.rows_affected())
}

/// The [`Dialect`](super::dialect::Dialect) of MySQL and MariaDB: the statements above,
/// on one pool.
pub(super) struct MySqlDialect {
    pub(super) pool: MySqlPool,
    /// MariaDB ≥ 10.5 answers `INSERT … ON DUPLICATE KEY UPDATE … RETURNING`, so a claim
    /// and its replay take one round trip; MySQL needs a second statement to read.
    pub(super) returning: bool,
    /// The server's `max_allowed_packet`: a step entry that cannot fit in one statement
    /// is refused before it is sent (see the `journal` module).
    pub(super) max_packet: u64,
}

impl super::dialect::Dialect for MySqlDialect {
    fn name(&self) -> &'static str {
        "mysql"
    }

    fn recovery(&self) -> Option<&dyn super::recovery::RecoveryDialect> {
        Some(self)
    }

    fn store_name(&self) -> &'static str {
        "sql-mysql"
    }

    fn probe(&self, within: Duration) -> BoxFuture<'_, Result<(), crate::store::Unreachable>> {
        Box::pin(async move {
            let o = self.pool.connect_options();
            let server = format!("{}:{}", o.get_host(), o.get_port());
            super::unreachable::probe(&*o, "MySQL", server, within).await
        })
    }

    fn claim<'a>(
        &'a self,
        _store: &'a super::SqlStore,
        key: &'a Key,
        req: &'a ClaimRequest,
    ) -> BoxFuture<'a, Result<Option<Snapshot>, Error>> {
        Box::pin(async move {
            let mut c = self.pool.acquire().await.map_err(Error::store)?;
            claim(&mut c, self.returning, false, key, req).await
        })
    }

    fn complete<'a>(
        &'a self,
        _store: &'a super::SqlStore,
        key: &'a Key,
        owner: Owner,
        value: &'a bytes::Bytes,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            let mut c = self.pool.acquire().await.map_err(Error::store)?;
            complete(&mut c, key, owner, value, ttl).await
        })
    }

    fn issue<'a>(&'a self, key: &'a Key, ttl: Duration) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            let mut c = self.pool.acquire().await.map_err(Error::store)?;
            issue(&mut c, self.returning, key, ttl).await
        })
    }

    fn claim_in<'a>(
        &'a self,
        conn: crate::store::TxConnection<'a>,
        key: &'a Key,
        req: &'a ClaimRequest,
    ) -> BoxFuture<'a, Result<Option<Snapshot>, Error>> {
        Box::pin(async move {
            let conn = super::dialect::own_conn::<MySqlConnection>(self.name(), conn)?;
            claim(conn, self.returning, true, key, req).await
        })
    }

    fn begin(&self) -> BoxFuture<'_, Result<crate::store::StepTransaction, Error>> {
        Box::pin(async move {
            let tx = self.pool.begin().await.map_err(Error::store)?;
            Ok(crate::store::StepTransaction::MySql(tx))
        })
    }

    fn without_returning(&self) -> Option<std::sync::Arc<dyn super::dialect::Dialect>> {
        Some(std::sync::Arc::new(MySqlDialect {
            pool: self.pool.clone(),
            returning: false,
            max_packet: self.max_packet,
        }))
    }

    super::dialect::pooled_methods! {
        conn: MySqlConnection,
        release: release,
        renew: renew,
        inspect: inspect,
        forget: forget,
        count: count,
        purge: purge,
        complete: complete,
        write_step_on: Self::write_step_on,
        read_steps: read_steps,
        drop_dead_steps: drop_dead_steps,
        toolbox: toolbox,
    }
}
