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

use std::time::Duration;

use super::SqlStore;
use super::own_tx::{Backoff, TxDatabase};
use crate::codec::Codec;
use crate::options::OnDuplicate;
use crate::store::{ClaimKind, ClaimOutcome, ClaimRequest, Owner, Store};
use crate::{Error, Fingerprint, Key, Options};

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

/// A key claimed inside the caller's transaction, behind a savepoint.
#[doc(hidden)]
#[derive(Debug)]
pub struct TxClaim {
    key: Key,
    owner: Owner,
    ttl: Duration,
    savepoint: String,
}

impl TxClaim {
    /// The key claimed (for the call's span and logs).
    pub fn key(&self) -> Key {
        self.key
    }
}

/// What [`tx_begin`] found.
#[doc(hidden)]
#[derive(Debug)]
pub enum TxBegun<R> {
    /// The key completed earlier (or while this call waited): its stored result.
    Replayed(R),
    /// This call holds the key in the caller's transaction: run the body, then
    /// [`tx_end`].
    Claimed(TxClaim),
}

/// Claims `key` inside the caller's transaction `conn`, on `runtime_store`, the current
/// runtime's `SqlStore` (which must be on the same database, so that everyone else sees the
/// record once the caller commits).
///
/// The claim row stays invisible to others until the caller commits; a duplicate in
/// another transaction waits on its lock, then replays. A key held by a committed
/// in-progress claim (a call outside any transaction) is waited for up to `opts.wait`
/// (each try rolled back to the savepoint), then [`Error::InProgress`].
///
/// The claim's lease is `opts.lease`: it only matters if the caller commits a claim
/// whose body never finished (the call was cancelled), which then frees itself after
/// the lease instead of blocking the key.
#[doc(hidden)]
pub async fn tx_begin<C, X, T, E>(
    runtime_store: &dyn Store,
    opts: &Options,
    conn: &mut X,
    key: Key,
    fingerprint: Option<Fingerprint>,
) -> Result<TxBegun<Result<T, E>>, Error>
where
    C: Codec<T, E>,
    X: TxConn + ?Sized,
{
    opts.check_lease()?;
    let store = runtime_store
        .as_any()
        .and_then(|s| s.downcast_ref::<SqlStore>())
        .ok_or_else(|| {
            Error::Config(format!(
                "transactional mode needs the current runtime on a SqlStore (it is on {})",
                runtime_store.name()
            ))
        })?;
    if X::Database::__pool(store).is_none() {
        return Err(Error::Config(format!(
            "the transaction is on another database than the runtime's {} store",
            store.name()
        )));
    }
    let owner = Owner::next();
    let req =
        ClaimRequest::new(ClaimKind::Dedup, owner, opts.lease_for()).with_fingerprint(fingerprint);
    // Unique per call, so nested calls (a body calling another such function) each have
    // their own; MySQL replaces a savepoint of the same name instead of stacking it.
    let savepoint = format!("idem_{:032x}", owner.0);
    let mut backoff = Backoff::new(opts.wait_for());
    loop {
        X::Database::__execute(conn.connection(), &format!("SAVEPOINT {savepoint}")).await?;
        let claimed = X::Database::__claim(store, conn.connection(), &key, &req).await;
        let retry_in = match claimed {
            Ok(Some(ClaimOutcome::Claimed { .. })) => {
                return Ok(TxBegun::Claimed(TxClaim {
                    key,
                    owner,
                    ttl: opts.ttl_for(),
                    savepoint,
                }));
            }
            Ok(Some(ClaimOutcome::Completed {
                value,
                fingerprint: stored,
            })) => {
                release(conn, &savepoint).await?;
                crate::fingerprint::check_fingerprint(&key, fingerprint, stored)?;
                return match opts.duplicate_policy() {
                    OnDuplicate::Reject => Err(Error::Duplicate { key }),
                    OnDuplicate::Replay => Ok(TxBegun::Replayed(C::decode(&key, &value)?)),
                };
            }
            Ok(Some(ClaimOutcome::Busy {
                retry_in,
                fingerprint: stored,
            })) => {
                undo(conn, &savepoint).await?;
                crate::fingerprint::check_fingerprint(&key, fingerprint, stored)?;
                retry_in
            }
            // The statement kept losing races, or a twin's transaction held the row past
            // the lock timeout: look again shortly.
            Ok(None) => {
                undo(conn, &savepoint).await?;
                Duration::ZERO
            }
            Err(e) if super::is_lock_wait(&e) => {
                undo(conn, &savepoint).await?;
                Duration::ZERO
            }
            Ok(Some(_)) => {
                undo(conn, &savepoint).await?;
                return Err(Error::Unsupported("this claim outcome in a transaction"));
            }
            Err(e) => {
                // An error may have aborted the transaction (PostgreSQL): going back to
                // the savepoint makes it usable again, if the connection still is.
                let _ = undo(conn, &savepoint).await;
                return Err(e);
            }
        };
        backoff.nap(&key, retry_in).await?;
    }
}

/// Records the body's `result` in the caller's transaction: a stored result (an `Ok`, or
/// an `Err` the codec keeps) completes the record; anything else (an `Err` that releases
/// the key, or a value that cannot be stored) rolls back to the savepoint, undoing the
/// claim and the body's writes. Nothing is visible to others until the caller commits.
#[doc(hidden)]
pub async fn tx_end<C, X, T, E>(
    claim: TxClaim,
    conn: &mut X,
    result: &Result<T, E>,
) -> Result<(), Error>
where
    C: Codec<T, E>,
    X: TxConn + ?Sized,
{
    let TxClaim {
        key,
        owner,
        ttl,
        savepoint,
    } = claim;
    let bytes = match C::encode(&key, result) {
        Ok(Some(bytes)) => bytes,
        Ok(None) => return undo(conn, &savepoint).await,
        Err(e) => {
            let _ = undo(conn, &savepoint).await;
            return Err(e);
        }
    };
    match X::Database::__complete(conn.connection(), &key, owner, &bytes, ttl).await {
        Ok(true) => release(conn, &savepoint).await,
        Ok(false) => {
            // Only a lease that ended inside a very long transaction gets here; undo, so
            // the caller cannot commit business writes without their record.
            undo(conn, &savepoint).await?;
            Err(Error::LeaseLost { key })
        }
        Err(e) => {
            let _ = undo(conn, &savepoint).await;
            Err(e)
        }
    }
}

/// Keeps what was done since the savepoint.
async fn release<X: TxConn + ?Sized>(conn: &mut X, savepoint: &str) -> Result<(), Error> {
    X::Database::__execute(conn.connection(), &format!("RELEASE SAVEPOINT {savepoint}")).await
}

/// Undoes what was done since the savepoint, and drops it.
async fn undo<X: TxConn + ?Sized>(conn: &mut X, savepoint: &str) -> Result<(), Error> {
    X::Database::__execute(
        conn.connection(),
        &format!("ROLLBACK TO SAVEPOINT {savepoint}"),
    )
    .await?;
    release(conn, savepoint).await
}
