//! Claims inside a database transaction: the capability behind transactional mode
//! (`#[idempotent(transaction = tx)]`, [`SqlStore::begin`](crate::SqlStore)), reached
//! through [`Store::transactional`](super::Store::transactional).
//!
//! The claim row is written in the caller's (uncommitted) transaction, so the record
//! and the business writes commit together or not at all. The flow around these
//! statements (waiting for a busy key, the fingerprint, `on_duplicate`, decoding, the
//! span and the metrics) is written once, in the strategies, like every other path; a
//! store only runs the statements, each one atomic step inside the transaction.

use std::any::Any;
use std::time::Duration;

use super::{BoxFuture, ClaimOutcome, ClaimRequest, Owner};
use crate::{Error, Key};

/// The connection that carries an open transaction (`sqlx::PgConnection`, ...), as
/// the store that runs statements on it sees it: it downcasts to its own connection
/// type, and a connection of another database is [`Error::Config`].
pub type TxConnection = dyn Any + Send;

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
        conn: &'a mut TxConnection,
        key: &'a Key,
        req: &'a ClaimRequest,
    ) -> BoxFuture<'a, Result<ClaimOutcome, Error>>;

    /// If `owner` still holds `key`, stores `value` as its completed result (kept for
    /// `ttl` after the commit) inside the transaction and returns `true`; otherwise
    /// changes nothing and returns `false`.
    fn complete_in<'a>(
        &'a self,
        conn: &'a mut TxConnection,
        key: &'a Key,
        owner: Owner,
        value: &'a [u8],
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>>;

    /// Runs a savepoint statement named `name` on `conn`.
    fn savepoint<'a>(
        &'a self,
        conn: &'a mut TxConnection,
        op: Savepoint,
        name: &'a str,
    ) -> BoxFuture<'a, Result<(), Error>>;

    /// The transaction that completed `key` has committed: wake whoever waits on it.
    fn committed(&self, key: &Key);

    /// Begins a transaction of the store's database for a transactional step
    /// ([`step_tx`](crate::step_tx)): a boxed `sqlx::Transaction<'static, DB>` of the
    /// store's own database (`DB` the sqlx database type), on one of its pooled
    /// connections.
    fn begin_step(&self) -> BoxFuture<'_, Result<Box<TxConnection>, Error>> {
        Box::pin(std::future::ready(Err(Error::Unsupported(
            "transactional steps",
        ))))
    }

    /// If `owner` holds `key` with a live lease, journals step `name` with `value` inside
    /// the transaction on `conn` (under the record's row lock, so it commits with the
    /// step's writes) and makes the journal expire `ttl` from now; returns `true`.
    /// Otherwise changes nothing and returns `false`. The same contract as
    /// [`JournalStore::write_step`](super::JournalStore::write_step), in a transaction.
    fn write_step_in<'a>(
        &'a self,
        conn: &'a mut TxConnection,
        key: &'a Key,
        owner: Owner,
        name: &'a str,
        value: &'a [u8],
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        let _ = (conn, key, owner, name, value, ttl);
        Box::pin(std::future::ready(Err(Error::Unsupported(
            "transactional steps",
        ))))
    }
}
