//! Claims inside a database transaction: the capability behind transactional mode
//! (`#[idempotent(transaction = tx)]`, [`SqlStore::begin`](crate::SqlStore)), reached
//! through [`Store::transactional`](super::Store::transactional); and journal writes
//! inside one, behind transactional steps ([`step_tx`](crate::step_tx)), reached through
//! [`JournalStore::in_tx`](super::JournalStore::in_tx).
//!
//! The claim row is written in the caller's (uncommitted) transaction, so the record
//! and the business writes commit together or not at all. The flow around these
//! statements (waiting for a busy key, the fingerprint, `on_duplicate`, decoding, the
//! span and the metrics) is written once, in the strategies, like every other path; a
//! store only runs the statements, each one atomic step inside the transaction.

use std::time::Duration;

use super::{BoxFuture, ClaimOutcome, ClaimRequest, Owner};
use crate::{Error, Key};

/// The connection that carries an open transaction, by database: what a store's
/// statements run on. A store given a connection of another database than its own
/// answers [`Error::Config`].
#[derive(Debug)]
#[non_exhaustive]
pub enum TxConnection<'c> {
    /// A PostgreSQL connection.
    #[cfg(feature = "postgres")]
    Postgres(&'c mut sqlx::PgConnection),
    /// A MySQL or MariaDB connection.
    #[cfg(feature = "mysql")]
    MySql(&'c mut sqlx::MySqlConnection),
    /// An SQLite connection.
    #[cfg(feature = "sqlite")]
    Sqlite(&'c mut sqlx::SqliteConnection),
}

impl TxConnection<'_> {
    /// The same connection for a shorter borrow, so one can run several statements.
    pub fn reborrow(&mut self) -> TxConnection<'_> {
        match self {
            #[cfg(feature = "postgres")]
            TxConnection::Postgres(c) => TxConnection::Postgres(c),
            #[cfg(feature = "mysql")]
            TxConnection::MySql(c) => TxConnection::MySql(c),
            #[cfg(feature = "sqlite")]
            TxConnection::Sqlite(c) => TxConnection::Sqlite(c),
        }
    }
}

/// A transaction a store opened for a transactional step, by database.
#[derive(Debug)]
#[non_exhaustive]
pub enum StepTransaction {
    /// On PostgreSQL.
    #[cfg(feature = "postgres")]
    Postgres(sqlx::Transaction<'static, sqlx::Postgres>),
    /// On MySQL or MariaDB.
    #[cfg(feature = "mysql")]
    MySql(sqlx::Transaction<'static, sqlx::MySql>),
    /// On SQLite.
    #[cfg(feature = "sqlite")]
    Sqlite(sqlx::Transaction<'static, sqlx::Sqlite>),
}

/// What a savepoint statement does; see [`TransactionalStore::savepoint`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Savepoint {
    /// `SAVEPOINT name`: marks where an attempt starts.
    Set,
    /// `RELEASE SAVEPOINT name`: keeps what was done since.
    Keep,
    /// `ROLLBACK TO SAVEPOINT name`, then releases it: undoes what was done since.
    Undo,
}

/// Claim records written inside a transaction: reached through
/// [`Store::transactional`](super::Store::transactional).
pub trait TransactionalStore: Send + Sync {
    /// Claims `key` per `req` with one statement inside the transaction on `conn`.
    ///
    /// A row held by another open transaction past the database's lock timeout, or a
    /// statement that kept losing races, answers [`ClaimOutcome::Busy`] with no time
    /// left (`retry_in` zero): the caller undoes the attempt and tries again. Such an
    /// error may have aborted the attempt (PostgreSQL), so a caller always undoes a busy
    /// attempt before its next statement.
    fn claim_in<'a>(
        &'a self,
        conn: TxConnection<'a>,
        key: &'a Key,
        req: &'a ClaimRequest,
    ) -> BoxFuture<'a, Result<ClaimOutcome, Error>>;

    /// If `owner` still holds `key`, stores `value` as its completed result (kept for
    /// `ttl` after the commit) inside the transaction and returns `true`; otherwise
    /// changes nothing and returns `false`.
    fn complete_in<'a>(
        &'a self,
        conn: TxConnection<'a>,
        key: &'a Key,
        owner: Owner,
        value: &'a [u8],
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>>;

    /// Runs a savepoint statement named `name` on `conn`.
    fn savepoint<'a>(
        &'a self,
        conn: TxConnection<'a>,
        op: Savepoint,
        name: &'a str,
    ) -> BoxFuture<'a, Result<(), Error>>;

    /// The transaction that completed `key` has committed: wake whoever waits on it.
    fn committed(&self, key: &Key);
}

/// Journal writes inside a database transaction, for transactional steps
/// ([`step_tx`](crate::step_tx)): reached through
/// [`JournalStore::in_tx`](super::JournalStore::in_tx).
pub trait TxJournalStore: Send + Sync {
    /// Begins a transaction on one of the store's pooled connections.
    fn begin(&self) -> BoxFuture<'_, Result<StepTransaction, Error>>;

    /// If `owner` holds `key` with a live lease, journals step `name` with `value` inside
    /// the transaction on `conn` (under the record's row lock, so it commits with the
    /// step's writes) and makes the journal expire `ttl` from now; returns `true`.
    /// Otherwise changes nothing and returns `false`. The same contract as
    /// [`JournalStore::write_step`](super::JournalStore::write_step), in a transaction.
    fn write_step_in<'a>(
        &'a self,
        conn: TxConnection<'a>,
        key: &'a Key,
        owner: Owner,
        name: &'a str,
        value: &'a [u8],
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>>;
}
