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
//!   this process' ids (see [`BloomFilter`](crate::toolbox::BloomFilter)). For a filter shared by every process, put it on
//!   Redis with [`BloomFilter::on_store`](crate::toolbox::BloomFilter::on_store).
//!
//! Expiry is the database's clock, as for the claim records; expired rows are ignored and
//! replaced when touched, and deleted by [`SqlStore::purge_expired`](super::SqlStore::purge_expired)'s
//! companion [`SqlStore::purge_expired_toolbox`](super::SqlStore::purge_expired_toolbox).
//!
//! This module decides; each database's `toolbox` module (`postgres/toolbox.rs`, ...)
//! spells the statements, one per [`ValueWrite`] and [`StateWrite`], behind the
//! [`Dialect`](super::dialect::Dialect) methods.

use std::time::Duration;

use bytes::Bytes;

use super::{SqlStore, owner_bytes, sql_err, us};
use crate::store::{
    BoxFuture, Owner, Settle, StateStore, TransitionOutcome, TransitionRequest, VersionedBytes,
    VersionedStore,
};
use crate::{Error, Key};

/// A move that lost its re-check to another mover is decided again, at most this often.
const MOVE_ATTEMPTS: usize = 16;

/// A live versioned value as stored: its bytes and its version.
pub(super) type ValueRow = (Vec<u8>, i64);

/// One conditional statement on a key's row in `idem_values`, answered by the rows it
/// changed. Times are microseconds; a `None` ttl keeps the row without expiry.
pub(super) enum ValueWrite<'a> {
    /// Deletes the row if it has expired by the database's clock.
    ClearExpired,
    /// Inserts version 1, unless a row is there (which is left as it is).
    Insert {
        value: &'a [u8],
        ttl_us: Option<i64>,
    },
    /// Writes version `expected + 1` over a live row at version `expected`.
    Update {
        expected: i64,
        value: &'a [u8],
        ttl_us: Option<i64>,
    },
}

/// One conditional statement on a key's row in `idem_states`, answered by the rows it
/// changed. "Free" below means no live hold: no pending move, or its lease has lapsed.
/// `owner` is the holder's 16 bytes; times are microseconds, a `None` ttl keeps the row
/// without expiry.
pub(super) enum StateWrite<'a> {
    /// Deletes the row if it has expired by the database's clock.
    ClearExpired,
    /// Creates the record at `to`, unless a row is there.
    Create { to: &'a str, ttl_us: Option<i64> },
    /// Creates a record with no state and a move to `to` held by `owner`, living as long
    /// as the hold (so a lapsed hold leaves nothing), unless a row is there.
    CreateHeld {
        to: &'a str,
        owner: &'a [u8],
        lease_us: i64,
    },
    /// Moves a live, free record from `from` to `to`.
    Move {
        from: &'a str,
        to: &'a str,
        ttl_us: Option<i64>,
    },
    /// Holds a move from `from` to `to` for `owner` on a live, free record; the record
    /// lives at least as long as the hold.
    Hold {
        from: &'a str,
        to: &'a str,
        owner: &'a [u8],
        lease_us: i64,
    },
    /// Performs `owner`'s held move on a live record.
    Commit {
        owner: &'a [u8],
        ttl_us: Option<i64>,
    },
    /// Deletes the record of `owner`'s held move out of "no record" (its state is `NULL`).
    DropHeldCreation { owner: &'a [u8] },
    /// Gives up `owner`'s held move on a live record, which keeps its state.
    ClearHold { owner: &'a [u8] },
    /// Extends `owner`'s hold on a live record to `lease_us` from now; a record created by
    /// the hold lives as long as it, any other at least as long.
    RenewHold { owner: &'a [u8], lease_us: i64 },
}

/// What a state row looked like, by the database's clock.
pub(super) struct StateRow {
    state: Option<String>,
    pending: Option<String>,
    /// `lease_us - now` of a held move.
    lease_left_us: Option<i64>,
}

impl StateRow {
    /// Reads the row of each database's read statement, which returns the same columns
    /// (`state`, `pending`, `lease_left_us`) on every database.
    pub(super) fn from_row<R>(key: &Key, row: &R) -> Result<StateRow, Error>
    where
        R: sqlx::Row,
        &'static str: sqlx::ColumnIndex<R>,
        i64: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
        String: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
        Vec<u8>: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    {
        let get = || -> Result<StateRow, sqlx::Error> {
            Ok(StateRow {
                state: text_col(row, "state")?,
                pending: text_col(row, "pending")?,
                lease_left_us: row.try_get("lease_left_us")?,
            })
        };
        get().map_err(|e| sql_err(Some(key), e))
    }
}

/// Reads a text column that MySQL keeps as bytes (binary comparison, no collation).
fn text_col<R>(row: &R, col: &'static str) -> Result<Option<String>, sqlx::Error>
where
    R: sqlx::Row,
    &'static str: sqlx::ColumnIndex<R>,
    String: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Vec<u8>: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    let raw: Option<Vec<u8>> = match row.try_get::<Option<String>, _>(col) {
        Ok(s) => Ok(s.map(String::into_bytes)),
        Err(_) => row.try_get::<Option<Vec<u8>>, _>(col),
    }?;
    raw.map(|b| String::from_utf8(b).map_err(|e| sqlx::Error::Decode(Box::new(e))))
        .transpose()
}

/// A write's ttl in microseconds: `None` keeps the row without expiry (the statements'
/// `now + NULL` is `NULL`).
fn ttl_us(ttl: Option<Duration>) -> Option<i64> {
    ttl.map(|t| us(t).max(1))
}

impl SqlStore {
    pub(super) async fn tb_load_versioned(
        &self,
        key: &Key,
    ) -> Result<Option<VersionedBytes>, Error> {
        self.bounded(self.dialect.load_value(key))
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
        let ttl_us = ttl_us(ttl);
        let Ok(expected_i) = i64::try_from(expected) else {
            return Ok(None);
        };
        let value = &value[..];
        self.bounded(async {
            if expected == 0 {
                // An expired value is absent: clear it, then insert unless someone is there.
                self.dialect
                    .write_value(key, ValueWrite::ClearExpired)
                    .await?;
                let n = self
                    .dialect
                    .write_value(key, ValueWrite::Insert { value, ttl_us })
                    .await?;
                return Ok((n == 1).then_some(1));
            }
            let write = ValueWrite::Update {
                expected: expected_i,
                value,
                ttl_us,
            };
            let n = self.dialect.write_value(key, write).await?;
            Ok((n == 1).then_some(expected + 1))
        })
        .await
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
        let row = self.dialect.read_state(key).await?;
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
        let ttl_us = ttl_us(req.ttl);
        let owner = req.hold.map(|(o, _)| owner_bytes(o));
        let hold = owner.as_ref().zip(req.hold.map(|(_, l)| us(l).max(1)));
        let to = req.to;
        let write = match (&current, hold) {
            (Some(from), None) => StateWrite::Move { from, to, ttl_us },
            (Some(from), Some((owner, lease_us))) => StateWrite::Hold {
                from,
                to,
                owner,
                lease_us,
            },
            (None, hold) => {
                // No live record: clear an expired one, then create, unless someone did.
                self.dialect
                    .write_state(key, StateWrite::ClearExpired)
                    .await?;
                match hold {
                    None => StateWrite::Create { to, ttl_us },
                    Some((owner, lease_us)) => StateWrite::CreateHeld {
                        to,
                        owner,
                        lease_us,
                    },
                }
            }
        };
        if self.dialect.write_state(key, write).await? != 1 {
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
        let owner = owner_bytes(owner);
        let owner = &owner[..];
        self.bounded(async {
            let n = match action {
                Settle::Commit { ttl } => {
                    let ttl_us = ttl_us(ttl);
                    self.dialect
                        .write_state(key, StateWrite::Commit { owner, ttl_us })
                        .await?
                }
                Settle::Abort => {
                    // A held move out of "no record" leaves no record behind.
                    let n = self
                        .dialect
                        .write_state(key, StateWrite::DropHeldCreation { owner })
                        .await?;
                    if n == 1 {
                        1
                    } else {
                        self.dialect
                            .write_state(key, StateWrite::ClearHold { owner })
                            .await?
                    }
                }
                Settle::Renew(lease) => {
                    let lease_us = us(lease).max(1);
                    self.dialect
                        .write_state(key, StateWrite::RenewHold { owner, lease_us })
                        .await?
                }
            };
            Ok(n == 1)
        })
        .await
    }

    pub(super) async fn tb_load_state(&self, key: &Key) -> Result<Option<String>, Error> {
        self.bounded(async { Ok(self.dialect.read_state(key).await?.and_then(|r| r.state)) })
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
        // One bounded statement per table.
        let values = self.bounded(self.dialect.purge_values(batch)).await?;
        let states = self.bounded(self.dialect.purge_states(batch)).await?;
        Ok(values + states)
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

/// The functions that run a database's toolbox statements (`load_value`, `write_value`,
/// `read_state`, `write_state`, `purge`): the same binds and decoding on every database,
/// so written once here and expanded in each `<database>/toolbox.rs` on its pool type,
/// beside that database's statements (`LOAD_VALUE`, `MOVE_STATE`, ...), which differ.
macro_rules! runners {
    ($pool:ty) => {
        pub(super) async fn load_value(pool: &$pool, key: &Key) -> Result<Option<ValueRow>, Error> {
            sqlx::query_as(LOAD_VALUE)
                .bind(&key.digest()[..])
                .fetch_optional(pool)
                .await
                .map_err(|e| sql_err(Some(key), e))
        }

        pub(super) async fn write_value(
            pool: &$pool,
            key: &Key,
            write: ValueWrite<'_>,
        ) -> Result<u64, Error> {
            let id = &key.digest()[..];
            match write {
                ValueWrite::ClearExpired => sqlx::query(CLEAR_EXPIRED_VALUE).bind(id),
                ValueWrite::Insert { value, ttl_us } => {
                    sqlx::query(INSERT_VALUE).bind(id).bind(value).bind(ttl_us)
                }
                ValueWrite::Update {
                    expected,
                    value,
                    ttl_us,
                } => sqlx::query(UPDATE_VALUE)
                    .bind(value)
                    .bind(ttl_us)
                    .bind(id)
                    .bind(expected),
            }
            .execute(pool)
            .await
            .map(|r| r.rows_affected())
            .map_err(|e| sql_err(Some(key), e))
        }

        pub(super) async fn read_state(pool: &$pool, key: &Key) -> Result<Option<StateRow>, Error> {
            let row = sqlx::query(READ_STATE)
                .bind(&key.digest()[..])
                .fetch_optional(pool)
                .await
                .map_err(|e| sql_err(Some(key), e))?;
            row.map(|r| StateRow::from_row(key, &r)).transpose()
        }

        pub(super) async fn write_state(
            pool: &$pool,
            key: &Key,
            write: StateWrite<'_>,
        ) -> Result<u64, Error> {
            let id = &key.digest()[..];
            match write {
                StateWrite::ClearExpired => sqlx::query(CLEAR_EXPIRED_STATE).bind(id),
                StateWrite::Create { to, ttl_us } => {
                    sqlx::query(CREATE_STATE).bind(id).bind(to).bind(ttl_us)
                }
                StateWrite::CreateHeld {
                    to,
                    owner,
                    lease_us,
                } => sqlx::query(CREATE_HELD_STATE)
                    .bind(id)
                    .bind(to)
                    .bind(owner)
                    .bind(lease_us)
                    .bind(lease_us),
                StateWrite::Move { from, to, ttl_us } => sqlx::query(MOVE_STATE)
                    .bind(to)
                    .bind(ttl_us)
                    .bind(id)
                    .bind(from),
                StateWrite::Hold {
                    from,
                    to,
                    owner,
                    lease_us,
                } => sqlx::query(HOLD_STATE)
                    .bind(to)
                    .bind(owner)
                    .bind(lease_us)
                    .bind(lease_us)
                    .bind(id)
                    .bind(from),
                StateWrite::Commit { owner, ttl_us } => {
                    sqlx::query(COMMIT_HOLD).bind(ttl_us).bind(id).bind(owner)
                }
                StateWrite::DropHeldCreation { owner } => {
                    sqlx::query(DROP_HELD_CREATION).bind(id).bind(owner)
                }
                StateWrite::ClearHold { owner } => sqlx::query(CLEAR_HOLD).bind(id).bind(owner),
                StateWrite::RenewHold { owner, lease_us } => sqlx::query(RENEW_HOLD)
                    .bind(lease_us)
                    .bind(lease_us)
                    .bind(lease_us)
                    .bind(id)
                    .bind(owner),
            }
            .execute(pool)
            .await
            .map(|r| r.rows_affected())
            .map_err(|e| sql_err(Some(key), e))
        }

        /// Runs [`PURGE_VALUES`] or [`PURGE_STATES`]: the rows it deleted.
        pub(super) async fn purge(
            pool: &$pool,
            statement: &'static str,
            batch: i64,
        ) -> Result<u64, Error> {
            sqlx::query(statement)
                .bind(batch)
                .execute(pool)
                .await
                .map(|r| r.rows_affected())
                .map_err(Error::store)
        }
    };
}
pub(super) use runners;
