//! Transactional mode in a transaction idem opens ([`SqlStore::begin`],
//! [`SqlStore::transaction`]): the idem record commits in the same transaction as the
//! business writes. (The caller's own transaction, `#[idempotent(transaction = tx)]`, is
//! the `caller_tx` module.)
//!
//! The claim row is inserted inside the transaction, so it is invisible to everyone else
//! until the commit: a concurrent duplicate (in this mode or the normal one) blocks on
//! the row's unique key, then sees the completed record and replays it. If the process
//! dies anywhere before the commit, the database rolls back both the business writes
//! and the claim; the retry finds the key absent and runs once. Nothing is left
//! "in progress" to wait out.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::time::Duration;

use super::{BoxFuture, SqlStore};
use crate::store::{Owner, StepTransaction, TxConnection};
use crate::{Error, Key};

/// What idem does with a [`TxDatabase`], out of users' reach: the supertrait is public
/// (so the bound is) but cannot be named outside this module, so no other type can
/// implement it and its items are nobody's API.
mod sealed {
    use std::time::Duration;

    use super::{BoxFuture, SqlStore};
    use crate::Error;
    use crate::store::{StepTransaction, TxConnection};

    pub trait Sealed: sqlx::Database {
        /// A connection of this database, as a store's statements take it.
        fn tx_connection(conn: &mut Self::Connection) -> TxConnection<'_>;

        /// The transaction a store opened for a step, if it is on this database.
        fn from_step(tx: StepTransaction) -> Option<sqlx::Transaction<'static, Self>>;

        /// `store`'s pool, if it runs on this database.
        fn pool_of(store: &SqlStore) -> Option<&sqlx::Pool<Self>>;

        /// Begins a transaction for transactional mode; a duplicate's wait on a twin's
        /// uncommitted row is bounded by `wait` where the database allows it.
        fn begin_tx(
            pool: &sqlx::Pool<Self>,
            wait: Duration,
        ) -> BoxFuture<'_, Result<sqlx::Transaction<'static, Self>, Error>>;
    }
}

/// A database that [`SqlStore::transaction`] runs in: `sqlx::Postgres`, `sqlx::MySql`
/// or `sqlx::Sqlite` (with their cargo features; each exists only with its own).
///
/// Sealed: what idem does with it is internal.
pub trait TxDatabase: sqlx::Database<Connection: Send + 'static> + sealed::Sealed {}

#[cfg(feature = "postgres")]
impl TxDatabase for sqlx::Postgres {}

#[cfg(feature = "postgres")]
impl sealed::Sealed for sqlx::Postgres {
    fn tx_connection(conn: &mut sqlx::PgConnection) -> TxConnection<'_> {
        TxConnection::Postgres(conn)
    }

    fn from_step(tx: StepTransaction) -> Option<sqlx::Transaction<'static, Self>> {
        match tx {
            StepTransaction::Postgres(tx) => Some(tx),
            #[allow(unreachable_patterns)] // with one SQL feature, the only variant
            _ => None,
        }
    }

    fn pool_of(store: &SqlStore) -> Option<&sqlx::Pool<Self>> {
        store.pg_pool()
    }

    fn begin_tx(
        pool: &sqlx::Pool<Self>,
        wait: Duration,
    ) -> BoxFuture<'_, Result<sqlx::Transaction<'static, Self>, Error>> {
        Box::pin(async move {
            let mut tx = pool.begin().await.map_err(Error::store)?;
            // A duplicate blocks on the twin's uncommitted row; bound that by `wait`
            // (0 would mean "no limit" to PostgreSQL, hence at least 1 ms).
            let ms = wait.as_millis().clamp(1, i32::MAX as u128);
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "SET LOCAL lock_timeout = {ms}"
            )))
            .execute(&mut *tx)
            .await
            .map_err(Error::store)?;
            Ok(tx)
        })
    }
}

#[cfg(feature = "mysql")]
impl TxDatabase for sqlx::MySql {}

#[cfg(feature = "mysql")]
impl sealed::Sealed for sqlx::MySql {
    fn tx_connection(conn: &mut sqlx::MySqlConnection) -> TxConnection<'_> {
        TxConnection::MySql(conn)
    }

    fn from_step(tx: StepTransaction) -> Option<sqlx::Transaction<'static, Self>> {
        match tx {
            StepTransaction::MySql(tx) => Some(tx),
            #[allow(unreachable_patterns)] // with one SQL feature, the only variant
            _ => None,
        }
    }

    fn pool_of(store: &SqlStore) -> Option<&sqlx::Pool<Self>> {
        store.mysql_pool()
    }

    fn begin_tx(
        pool: &sqlx::Pool<Self>,
        _wait: Duration,
    ) -> BoxFuture<'_, Result<sqlx::Transaction<'static, Self>, Error>> {
        // The wait on a twin's uncommitted row is bounded by the server's
        // innodb_lock_wait_timeout: changing it would outlive this transaction on the
        // pooled connection.
        Box::pin(async move { pool.begin().await.map_err(Error::store) })
    }
}

#[cfg(feature = "sqlite")]
impl TxDatabase for sqlx::Sqlite {}

#[cfg(feature = "sqlite")]
impl sealed::Sealed for sqlx::Sqlite {
    fn tx_connection(conn: &mut sqlx::SqliteConnection) -> TxConnection<'_> {
        TxConnection::Sqlite(conn)
    }

    fn from_step(tx: StepTransaction) -> Option<sqlx::Transaction<'static, Self>> {
        match tx {
            StepTransaction::Sqlite(tx) => Some(tx),
            #[allow(unreachable_patterns)] // with one SQL feature, the only variant
            _ => None,
        }
    }

    fn pool_of(store: &SqlStore) -> Option<&sqlx::Pool<Self>> {
        store.sqlite_pool()
    }

    fn begin_tx(
        pool: &sqlx::Pool<Self>,
        _wait: Duration,
    ) -> BoxFuture<'_, Result<sqlx::Transaction<'static, Self>, Error>> {
        // IMMEDIATE takes the write lock up front: a deferred transaction that reads
        // first and writes later can fail with SQLITE_BUSY instead of waiting.
        Box::pin(async move {
            pool.begin_with("BEGIN IMMEDIATE")
                .await
                .map_err(Error::store)
        })
    }
}

/// A connection of `DB`, as a store's statements take it.
pub(crate) fn tx_connection<DB: TxDatabase>(conn: &mut DB::Connection) -> TxConnection<'_> {
    DB::tx_connection(conn)
}

/// What [`SqlStore::begin`] found.
#[must_use = "a claimed transaction must be committed (or it rolls back when dropped)"]
// `Claimed` is the usual answer and is moved once, to the caller: boxing it would cost
// an allocation per transaction to save bytes on the rare replay.
#[allow(clippy::large_enum_variant)]
pub enum Begun<DB: TxDatabase, R> {
    /// The key completed earlier (or while this call waited): its stored result.
    Replayed(R),
    /// This call holds the key: do the business writes through the transaction, then
    /// [`IdemTransaction::commit`].
    Claimed(IdemTransaction<DB>),
}

impl<DB: TxDatabase, R: fmt::Debug> fmt::Debug for Begun<DB, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Begun::Replayed(r) => f.debug_tuple("Replayed").field(r).finish(),
            Begun::Claimed(t) => f.debug_tuple("Claimed").field(t).finish(),
        }
    }
}

/// An open database transaction that holds an idem key; see [`SqlStore::begin`].
///
/// Derefs to the [`sqlx::Transaction`], so `&mut **itx` is the connection to run the
/// business statements on. [`commit`](IdemTransaction::commit) records the value and
/// commits everything; dropping it (or an error, or a crash) rolls everything back.
pub struct IdemTransaction<DB: TxDatabase> {
    pub(crate) tx: sqlx::Transaction<'static, DB>,
    pub(crate) store: SqlStore,
    pub(crate) key: Key,
    pub(crate) owner: Owner,
    pub(crate) ttl: Duration,
    /// The call's `idem` span, which the commit's outcome is recorded in.
    pub(crate) span: tracing::Span,
}

impl<DB: TxDatabase> fmt::Debug for IdemTransaction<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdemTransaction")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl<DB: TxDatabase> Deref for IdemTransaction<DB> {
    type Target = sqlx::Transaction<'static, DB>;
    fn deref(&self) -> &Self::Target {
        &self.tx
    }
}

impl<DB: TxDatabase> DerefMut for IdemTransaction<DB> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.tx
    }
}

impl<DB: TxDatabase> IdemTransaction<DB> {
    /// The transaction, for the business writes.
    pub fn tx(&mut self) -> &mut sqlx::Transaction<'static, DB> {
        &mut self.tx
    }

    /// The key this transaction holds.
    pub fn key(&self) -> &Key {
        &self.key
    }
}

/// The future a [`SqlStore::transaction`] body returns: boxed, so that it may borrow the
/// transaction and still be `Send` (an `async` closure's future cannot be proven `Send`
/// across the borrow today).
pub type TxFuture<'c, T, E> = BoxFuture<'c, Result<T, E>>;
