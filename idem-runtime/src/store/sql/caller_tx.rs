//! Transactional mode inside the caller's own transaction: what
//! `#[idempotent(transaction = tx)]` expands to.
//!
//! The caller opens the transaction and commits it; idem claims the key inside it (behind
//! a savepoint), lets the body write through the same transaction, and records the result
//! there too. The record and the business writes therefore commit together or not at all,
//! whoever commits: a crash or a rollback anywhere before the caller's commit leaves the
//! key free and no business row, so the retry runs once.
//!
//! An `Err` from the body rolls back to the savepoint: the claim and every write the body
//! made are undone, while the caller's earlier writes in the transaction stay, so a retry
//! does not meet half of a failed attempt.
//!
//! This module holds what the caller's transaction is ([`TxConn`]); the flow is the
//! transactional strategy's, and the statements are [`SqlStore`]'s
//! [`TransactionalStore`](crate::store::TransactionalStore) capability.

use super::own_tx::TxDatabase;

/// What a function in transactional mode receives: the caller's open transaction,
/// `&mut sqlx::Transaction<'_, DB>`, or the connection it runs on (`&mut PgConnection`,
/// `&mut MySqlConnection`, `&mut SqliteConnection`) after the caller's `BEGIN`.
///
/// ```no_run
/// use idem_runtime::store::sql::sqlx::{self, Postgres, Transaction};
/// use idem_runtime::{Error, Idem, SqlStore, idempotent};
///
/// #[idempotent(key = "order:{request_id}", transaction = tx)]
/// async fn create_order(
///     tx: &mut Transaction<'static, Postgres>,
///     request_id: &str,
///     cents: i64,
/// ) -> Result<i64, Error> {
///     sqlx::query_scalar("INSERT INTO orders (cents) VALUES ($1) RETURNING id")
///         .bind(cents)
///         .fetch_one(&mut **tx)
///         .await
///         .map_err(Error::store)
/// }
///
/// # async fn demo() -> Result<(), Error> {
/// let store = SqlStore::connect("postgres://postgres@127.0.0.1:5432/test").await?;
/// let pool = store.pg_pool().expect("a PostgreSQL store").clone();
/// let idem = Idem::builder().store(store).namespace("shop").build();
/// idem.scope(async {
///     let mut tx = pool.begin().await.map_err(Error::store)?;
///     let id = create_order(&mut tx, "req-7", 1999).await?; // runs once, or replays
///     tx.commit().await.map_err(Error::store)?;
///     Ok::<_, Error>(id)
/// })
/// .await?;
/// # Ok(()) }
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an open SQL transaction",
    label = "`transaction = ...` must name a `&mut sqlx::Transaction<'_, DB>` parameter",
    note = "the connection of a transaction (`&mut PgConnection`, `&mut MySqlConnection`, \
            `&mut SqliteConnection`) works too"
)]
pub trait TxConn: Send {
    /// The database the transaction runs on.
    type Database: TxDatabase;

    /// The connection that carries the transaction.
    fn connection(&mut self) -> &mut <Self::Database as sqlx::Database>::Connection;
}

impl<DB: TxDatabase> TxConn for sqlx::Transaction<'_, DB> {
    type Database = DB;
    fn connection(&mut self) -> &mut DB::Connection {
        self
    }
}

#[cfg(feature = "postgres")]
impl TxConn for sqlx::PgConnection {
    type Database = sqlx::Postgres;
    fn connection(&mut self) -> &mut Self {
        self
    }
}

#[cfg(feature = "mysql")]
impl TxConn for sqlx::MySqlConnection {
    type Database = sqlx::MySql;
    fn connection(&mut self) -> &mut Self {
        self
    }
}

#[cfg(feature = "sqlite")]
impl TxConn for sqlx::SqliteConnection {
    type Database = sqlx::Sqlite;
    fn connection(&mut self) -> &mut Self {
        self
    }
}
