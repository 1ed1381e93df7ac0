//! The toolbox primitives on SQL: versioned values in `idem_values`, state records in
//! `idem_states` (both created by migration 2), and Bloom filters in process memory.
//!
//! - **Compare-and-set** is the classic version column: `UPDATE idem_values SET version =
//!   version + 1, value = ? WHERE id = ? AND version = ?`; no row updated is a conflict.
//!   The first write (expected version 0) is an insert that does nothing on a conflict.
//! - **A state move** reads the row, decides against the table (already there, a live
//!   hold, not allowed), then performs the move with one conditional statement that
//!   re-checks what it read (`WHERE state = <read> AND <no live hold>`); if another mover
//!   got in between, no row is updated and the move is decided again. So a move costs two
//!   statements, and of concurrent movers exactly one performs it.
//! - **Bloom bitmaps** have no SQL form here: each `SqlStore` keeps them in process
//!   memory of its own (shared with its clones), so a filter on a `SqlStore` sees only
//!   this process' ids (see [`BloomFilter`](crate::BloomFilter)). For a filter shared by every process, put it on
//!   Redis with [`BloomFilter::on_store`](crate::BloomFilter::on_store).
//!
//! Expiry is the database's clock, as for the claim records; expired rows are ignored and
//! replaced when touched, and deleted by [`SqlStore::purge_expired`](super::SqlStore::purge_expired)'s
//! companion [`SqlStore::purge_expired_toolbox`](super::SqlStore::purge_expired_toolbox).

use std::time::Duration;

use bytes::Bytes;
use sqlx::{AssertSqlSafe, Row};

use super::{SqlStore, owner_bytes, sql_err, us};
use crate::store::{
    BoxFuture, Owner, Settle, StateStore, TransitionOutcome, TransitionRequest, VersionedBytes,
    VersionedStore,
};
use crate::{Error, Key};

/// A move that lost its re-check to another mover is decided again, at most this often.
const MOVE_ATTEMPTS: usize = 16;

/// What a state row looked like, by the database's clock.
struct StateRow {
    state: Option<String>,
    pending: Option<String>,
    /// `lease_us - now` of a held move.
    lease_left_us: Option<i64>,
}

/// The few spellings of the toolbox's statements that differ between databases (the
/// claim records' statements are each database's [`Dialect`](super::dialect::Dialect)). Statements are written with `?`
/// placeholders, renumbered to `$n` for PostgreSQL.
struct Spelling {
    now: &'static str,
    numbered: bool,
    greatest: &'static str,
    insert_ignore: &'static str,
    on_conflict_ignore: &'static str,
}

impl Spelling {
    fn sql(&self, text: &str) -> String {
        let text = text
            .replace("{now}", self.now)
            .replace("{greatest}", self.greatest);
        let text = text
            .replace("{insert_ignore}", self.insert_ignore)
            .replace("{on_conflict_ignore}", self.on_conflict_ignore);
        if !self.numbered {
            return text;
        }
        let mut out = String::with_capacity(text.len() + 16);
        let mut n = 0;
        for c in text.chars() {
            if c == '?' {
                n += 1;
                out.push('$');
                out.push_str(&n.to_string());
            } else {
                out.push(c);
            }
        }
        out
    }
}

#[cfg(feature = "postgres")]
const POSTGRES: Spelling = Spelling {
    now: "(extract(epoch from now()) * 1000000)::int8",
    numbered: true,
    greatest: "GREATEST",
    insert_ignore: "INSERT INTO",
    on_conflict_ignore: "ON CONFLICT (id) DO NOTHING",
};
#[cfg(feature = "mysql")]
const MYSQL: Spelling = Spelling {
    now: "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))",
    numbered: false,
    greatest: "GREATEST",
    insert_ignore: "INSERT IGNORE INTO",
    on_conflict_ignore: "",
};
#[cfg(feature = "sqlite")]
const SQLITE: Spelling = Spelling {
    now: "CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER)",
    numbered: false,
    greatest: "MAX",
    insert_ignore: "INSERT OR IGNORE INTO",
    on_conflict_ignore: "",
};

const LIVE: &str = "(expires_us IS NULL OR expires_us > {now})";

/// `expires_us` after a write with `ttl`, and its parameter: a `NULL` parameter makes the
/// sum `NULL`, which keeps the row without expiry.
fn expiry(ttl: Option<Duration>) -> (&'static str, Option<i64>) {
    ("{now} + ?", ttl.map(|t| us(t).max(1)))
}

/// Runs the same statement on whichever backend the store has. `$bind` is applied to
/// the query builder; `$run` receives the built query and the executor.
macro_rules! on_backend {
    ($store:expr, $text:expr, |$q:ident| $bind:expr, |$b:ident, $pool:ident| $run:expr) => {{
        #[allow(clippy::never_loop)]
        loop {
            #[cfg(feature = "postgres")]
            if let Some($pool) = $store.pg_pool() {
                let sql = POSTGRES.sql($text);
                let $q = sqlx::query(AssertSqlSafe(sql));
                let $b = $bind;
                break $run;
            }
            #[cfg(feature = "mysql")]
            if let Some($pool) = $store.mysql_pool() {
                let sql = MYSQL.sql($text);
                let $q = sqlx::query(AssertSqlSafe(sql));
                let $b = $bind;
                break $run;
            }
            #[cfg(feature = "sqlite")]
            if let Some($pool) = $store.sqlite_pool() {
                let sql = SQLITE.sql($text);
                let $q = sqlx::query(AssertSqlSafe(sql));
                let $b = $bind;
                break $run;
            }
            break Err(Error::Unsupported(
                "a SQL database without its cargo feature",
            ));
        }
    }};
}

/// Executes a statement and returns the rows it changed.
macro_rules! execute {
    ($store:expr, $key:expr, $text:expr, |$q:ident| $bind:expr) => {
        on_backend!($store, $text, |$q| $bind, |b, pool| b
            .execute(pool)
            .await
            .map(|r| r.rows_affected())
            .map_err(|e| sql_err(Some($key), e)))
    };
}

/// Fetches at most one row and maps it with `$map` (which gets `&Row`).
macro_rules! fetch_one {
    ($store:expr, $key:expr, $text:expr, |$q:ident| $bind:expr, |$row:ident| $map:expr) => {
        on_backend!($store, $text, |$q| $bind, |b, pool| {
            match b.fetch_optional(pool).await {
                Ok(Some($row)) => (|| $map)().map(Some).map_err(|e| sql_err(Some($key), e)),
                Ok(None) => Ok(None),
                Err(e) => Err(sql_err(Some($key), e)),
            }
        })
    };
}

/// Reads a text column that MySQL keeps as bytes (binary comparison, no collation).
macro_rules! text_col {
    ($row:expr, $col:literal) => {{
        let raw: Option<Vec<u8>> = match $row.try_get::<Option<String>, _>($col) {
            Ok(s) => Ok(s.map(String::into_bytes)),
            Err(_) => $row.try_get::<Option<Vec<u8>>, _>($col),
        }?;
        raw.map(|b| String::from_utf8(b).map_err(|e| sqlx::Error::Decode(Box::new(e))))
            .transpose()
    }};
}

impl SqlStore {
    pub(super) async fn tb_load_versioned(
        &self,
        key: &Key,
    ) -> Result<Option<VersionedBytes>, Error> {
        let text = format!("SELECT value, version FROM idem_values WHERE id = ? AND {LIVE}");
        self.bounded(async {
            fetch_one!(self, key, &text, |q| q.bind(&key.digest()[..]), |row| {
                let value: Vec<u8> = row.try_get("value")?;
                let version: i64 = row.try_get("version")?;
                Ok::<_, sqlx::Error>((value, version))
            })
        })
        .await?
        .map(|(value, version)| {
            u64::try_from(version)
                .map(|v| VersionedBytes::new(Bytes::from(value), v))
                .map_err(|_| super::corrupt(key, "negative version"))
        })
        .transpose()
    }

    pub(super) async fn tb_compare_and_set(
        &self,
        key: &Key,
        expected: u64,
        value: Bytes,
        ttl: Option<Duration>,
    ) -> Result<Option<u64>, Error> {
        let (exp, ttl_us) = expiry(ttl);
        let id = &key.digest()[..];
        let Ok(expected_i) = i64::try_from(expected) else {
            return Ok(None);
        };
        self.bounded(async {
            if expected == 0 {
                // An expired value is absent: clear it, then insert unless someone is there.
                execute!(self, key, "DELETE FROM idem_values WHERE id = ? AND expires_us <= {now}", |q| q.bind(id))?;
                let text = format!(
                    "{{insert_ignore}} idem_values (id, version, value, expires_us) VALUES (?, 1, ?, {exp}) {{on_conflict_ignore}}"
                );
                let n = execute!(self, key, &text, |q| q.bind(id).bind(&value[..]).bind(ttl_us))?;
                return Ok((n == 1).then_some(1));
            }
            let text = format!(
                "UPDATE idem_values SET version = version + 1, value = ?, expires_us = {exp} \
                 WHERE id = ? AND version = ? AND {LIVE}"
            );
            let n = execute!(self, key, &text, |q| q
                .bind(&value[..])
                .bind(ttl_us)
                .bind(id)
                .bind(expected_i))?;
            Ok((n == 1).then_some(expected + 1))
        })
        .await
    }

    async fn read_state(&self, key: &Key) -> Result<Option<StateRow>, Error> {
        let text = format!(
            "SELECT state, pending, lease_us - {{now}} AS lease_left_us FROM idem_states \
             WHERE id = ? AND {LIVE}"
        );
        fetch_one!(self, key, &text, |q| q.bind(&key.digest()[..]), |row| {
            Ok::<_, sqlx::Error>(StateRow {
                state: text_col!(row, "state")?,
                pending: text_col!(row, "pending")?,
                lease_left_us: row.try_get("lease_left_us")?,
            })
        })
    }

    pub(super) async fn tb_transition(
        &self,
        key: &Key,
        req: &TransitionRequest<'_>,
    ) -> Result<TransitionOutcome, Error> {
        self.bounded(async {
            for _ in 0..MOVE_ATTEMPTS {
                if let Some(outcome) = self.transition_once(key, req).await? {
                    return Ok(outcome);
                }
            }
            // Other movers kept winning the re-check: report a hold, so the caller waits
            // and decides again.
            Ok(TransitionOutcome::Pending {
                to: req.to.to_owned(),
                retry_in: Duration::from_millis(1),
            })
        })
        .await
    }

    /// One decision and one conditional write; `None` if the write's re-check failed.
    async fn transition_once(
        &self,
        key: &Key,
        req: &TransitionRequest<'_>,
    ) -> Result<Option<TransitionOutcome>, Error> {
        let id = &key.digest()[..];
        let row = self.read_state(key).await?;
        let (current, held) = match &row {
            Some(r) => (
                r.state.clone(),
                r.pending.as_ref().zip(r.lease_left_us.filter(|l| *l > 0)),
            ),
            None => (None, None),
        };
        if current.as_deref() == Some(req.to) {
            return Ok(Some(TransitionOutcome::Already));
        }
        if let Some((to, left)) = held {
            return Ok(Some(TransitionOutcome::Pending {
                to: to.clone(),
                retry_in: Duration::from_micros(u64::try_from(left).unwrap_or(0)),
            }));
        }
        if !req.allows(current.as_deref()) {
            return Ok(Some(TransitionOutcome::Refused { current }));
        }
        let (exp, ttl_us) = expiry(req.ttl);
        let owner = req.hold.map(|(o, _)| owner_bytes(o));
        let lease_us = req.hold.map(|(_, l)| us(l).max(1));
        let free = "(pending IS NULL OR lease_us <= {now})";
        let n = match (&current, req.hold) {
            (Some(from), None) => {
                let text = format!(
                    "UPDATE idem_states SET state = ?, pending = NULL, owner = NULL, \
                     lease_us = NULL, expires_us = {exp} WHERE id = ? AND state = ? AND {free} AND {LIVE}"
                );
                execute!(self, key, &text, |q| q
                    .bind(req.to)
                    .bind(ttl_us)
                    .bind(id)
                    .bind(from.as_str()))?
            }
            (Some(from), Some(_)) => {
                let text = "UPDATE idem_states SET pending = ?, owner = ?, lease_us = {now} + ?, \
                     expires_us = CASE WHEN expires_us IS NULL THEN NULL \
                     ELSE {greatest}(expires_us, {now} + ?) END \
                     WHERE id = ? AND state = ? AND (pending IS NULL OR lease_us <= {now}) \
                     AND (expires_us IS NULL OR expires_us > {now})";
                execute!(self, key, text, |q| q
                    .bind(req.to)
                    .bind(owner.as_ref().map(|o| &o[..]))
                    .bind(lease_us)
                    .bind(lease_us)
                    .bind(id)
                    .bind(from.as_str()))?
            }
            (None, hold) => {
                // No live record: clear an expired one, then create, unless someone did.
                execute!(
                    self,
                    key,
                    "DELETE FROM idem_states WHERE id = ? AND expires_us <= {now}",
                    |q| q.bind(id)
                )?;
                if hold.is_none() {
                    let text = format!(
                        "{{insert_ignore}} idem_states (id, state, pending, owner, lease_us, expires_us) \
                         VALUES (?, ?, NULL, NULL, NULL, {exp}) {{on_conflict_ignore}}"
                    );
                    execute!(self, key, &text, |q| q.bind(id).bind(req.to).bind(ttl_us))?
                } else {
                    // The record lives as long as the hold, so a lapsed hold leaves nothing.
                    let text = "{insert_ignore} idem_states (id, state, pending, owner, lease_us, expires_us) \
                         VALUES (?, NULL, ?, ?, {now} + ?, {now} + ?) {on_conflict_ignore}";
                    execute!(self, key, text, |q| q
                        .bind(id)
                        .bind(req.to)
                        .bind(owner.as_ref().map(|o| &o[..]))
                        .bind(lease_us)
                        .bind(lease_us))?
                }
            }
        };
        if n != 1 {
            return Ok(None);
        }
        Ok(Some(match req.hold {
            None => TransitionOutcome::Moved { from: current },
            Some(_) => TransitionOutcome::Held { from: current },
        }))
    }

    pub(super) async fn tb_settle_transition(
        &self,
        key: &Key,
        owner: Owner,
        action: Settle,
    ) -> Result<bool, Error> {
        let id = &key.digest()[..];
        let owner = owner_bytes(owner);
        let owner = &owner[..];
        let mine = "id = ? AND owner = ? AND pending IS NOT NULL";
        self.bounded(async {
            let n = match action {
                Settle::Commit { ttl } => {
                    let (exp, ttl_us) = expiry(ttl);
                    let text = format!(
                        "UPDATE idem_states SET state = pending, pending = NULL, owner = NULL, \
                         lease_us = NULL, expires_us = {exp} WHERE {mine} AND {LIVE}"
                    );
                    execute!(self, key, &text, |q| q.bind(ttl_us).bind(id).bind(owner))?
                }
                Settle::Abort => {
                    // A held move out of "no record" leaves no record behind.
                    let text = format!("DELETE FROM idem_states WHERE {mine} AND state IS NULL");
                    let n = execute!(self, key, &text, |q| q.bind(id).bind(owner))?;
                    if n == 1 {
                        1
                    } else {
                        let text = format!(
                            "UPDATE idem_states SET pending = NULL, owner = NULL, lease_us = NULL \
                             WHERE {mine} AND {LIVE}"
                        );
                        execute!(self, key, &text, |q| q.bind(id).bind(owner))?
                    }
                }
                Settle::Renew(lease) => {
                    let lease = us(lease).max(1);
                    let text = format!(
                        "UPDATE idem_states SET lease_us = {{now}} + ?, expires_us = CASE \
                         WHEN state IS NULL THEN {{now}} + ? WHEN expires_us IS NULL THEN NULL \
                         ELSE {{greatest}}(expires_us, {{now}} + ?) END WHERE {mine} AND {LIVE}"
                    );
                    execute!(self, key, &text, |q| q
                        .bind(lease)
                        .bind(lease)
                        .bind(lease)
                        .bind(id)
                        .bind(owner))?
                }
            };
            Ok(n == 1)
        })
        .await
    }

    pub(super) async fn tb_load_state(&self, key: &Key) -> Result<Option<String>, Error> {
        self.bounded(async { Ok(self.read_state(key).await?.and_then(|r| r.state)) })
            .await
    }

    /// Deletes up to `batch` expired versioned values and state records and returns how
    /// many it deleted; the toolbox companion of [`SqlStore::purge_expired`].
    ///
    /// ```no_run
    /// # async fn demo(store: idem_runtime::SqlStore) -> Result<(), idem_runtime::Error> {
    /// while store.purge_expired_toolbox(1000).await? == 1000 {}
    /// # Ok(()) }
    /// ```
    pub async fn purge_expired_toolbox(&self, batch: u32) -> Result<u64, Error> {
        let batch = i64::from(batch.max(1));
        let mut deleted = 0;
        for table in ["idem_values", "idem_states"] {
            // The subquery keeps each statement bounded; MySQL cannot LIMIT a subquery on
            // the table it deletes from, but can LIMIT a DELETE itself.
            let text = if self.backend_name() == "mysql" {
                format!(
                    "DELETE FROM {table} WHERE expires_us <= {{now}} ORDER BY expires_us LIMIT ?"
                )
            } else {
                format!(
                    "DELETE FROM {table} WHERE id IN (SELECT id FROM {table} \
                     WHERE expires_us <= {{now}} LIMIT ?) AND expires_us <= {{now}}"
                )
            };
            deleted += self
                .bounded(async {
                    on_backend!(self, &text, |q| q.bind(batch), |b, pool| b
                        .execute(pool)
                        .await
                        .map(|r| r.rows_affected())
                        .map_err(Error::store))
                })
                .await?;
        }
        Ok(deleted)
    }
}

impl VersionedStore for SqlStore {
    fn load_versioned<'a>(
        &'a self,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<Option<VersionedBytes>, Error>> {
        Box::pin(self.tb_load_versioned(key))
    }

    fn compare_and_set<'a>(
        &'a self,
        key: &'a Key,
        expected: u64,
        value: Bytes,
        ttl: Option<Duration>,
    ) -> BoxFuture<'a, Result<Option<u64>, Error>> {
        Box::pin(self.tb_compare_and_set(key, expected, value, ttl))
    }
}

impl StateStore for SqlStore {
    fn transition<'a>(
        &'a self,
        key: &'a Key,
        req: &'a TransitionRequest<'a>,
    ) -> BoxFuture<'a, Result<TransitionOutcome, Error>> {
        Box::pin(self.tb_transition(key, req))
    }

    fn settle_transition<'a>(
        &'a self,
        key: &'a Key,
        owner: Owner,
        action: Settle,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.tb_settle_transition(key, owner, action))
    }

    fn load_state<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Option<String>, Error>> {
        Box::pin(self.tb_load_state(key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_numbered_for_postgres_only() {
        let d = Spelling {
            now: "NOW",
            numbered: true,
            greatest: "G",
            insert_ignore: "II",
            on_conflict_ignore: "OC",
        };
        assert_eq!(
            d.sql("{insert_ignore} t VALUES (?, ?) {on_conflict_ignore} WHERE x > {now} AND {greatest}(?)"),
            "II t VALUES ($1, $2) OC WHERE x > NOW AND G($3)"
        );
        let d = Spelling {
            numbered: false,
            ..d
        };
        assert_eq!(d.sql("a = ? AND b = ?"), "a = ? AND b = ?");
    }
}
