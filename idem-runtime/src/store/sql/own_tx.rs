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

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{BoxFuture, SqlStore, decide, is_lock_wait};
use crate::codec::{Codec, ReplayOk};
use crate::options::OnDuplicate;
use crate::store::{ClaimKind, ClaimOutcome, ClaimRequest, Owner};
use crate::{Error, Fingerprint, Key, Options};

/// While the claim row is uncommitted nobody else can see or take it, so its lease only
/// matters to this transaction's own `complete`, which must not fail because the body
/// outlasted a short lease (MySQL and SQLite check it against the statement's clock).
const TX_LEASE: Duration = Duration::from_secs(7 * 24 * 3600);

/// Waiting, in transactional mode, for a key another caller holds (a committed claim of
/// a call outside any transaction, or a twin's row lock that outlasted the lock
/// timeout): nothing notifies a transaction, so the key is claimed again after a backoff
/// from 2 ms up to 100 ms, never past the holder's lease end or the caller's `wait`.
/// Used by [`SqlStore::begin_with`] and by the attribute's `tx_begin`.
pub(super) struct Backoff {
    deadline: tokio::time::Instant,
    poll: Duration,
}

impl Backoff {
    pub(super) fn new(wait: Duration) -> Self {
        Backoff {
            deadline: tokio::time::Instant::now() + wait,
            poll: Duration::from_millis(2),
        }
    }

    /// Sleeps before the next try (`retry_in`: the holder's lease left), or
    /// [`Error::InProgress`] once `wait` has run out.
    pub(super) async fn nap(&mut self, key: &Key, retry_in: Duration) -> Result<(), Error> {
        let now = tokio::time::Instant::now();
        if now >= self.deadline {
            return Err(Error::InProgress { key: *key });
        }
        self.poll = (self.poll * 2).min(Duration::from_millis(100));
        let nap = self.poll.min(retry_in + Duration::from_millis(1));
        tokio::time::sleep_until((now + nap).min(self.deadline)).await;
        Ok(())
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A database that [`SqlStore::transaction`] runs in: `sqlx::Postgres`, `sqlx::MySql`
/// or `sqlx::Sqlite` (with their cargo features; each exists only with its own).
///
/// Sealed: the methods are idem's internals.
pub trait TxDatabase: sqlx::Database + sealed::Sealed {
    #[doc(hidden)]
    fn __pool(store: &SqlStore) -> Option<&sqlx::Pool<Self>>;

    #[doc(hidden)]
    fn __begin(
        pool: &sqlx::Pool<Self>,
        wait: Duration,
    ) -> BoxFuture<'_, Result<sqlx::Transaction<'static, Self>, Error>>;

    #[doc(hidden)]
    fn __claim<'c>(
        store: &'c SqlStore,
        conn: &'c mut Self::Connection,
        key: &'c Key,
        req: &'c ClaimRequest,
    ) -> BoxFuture<'c, Result<Option<ClaimOutcome>, Error>>;

    #[doc(hidden)]
    fn __complete<'c>(
        conn: &'c mut Self::Connection,
        key: &'c Key,
        owner: Owner,
        value: &'c [u8],
        ttl: Duration,
    ) -> BoxFuture<'c, Result<bool, Error>>;

    /// Runs one statement without parameters (savepoints).
    #[doc(hidden)]
    fn __execute<'c>(
        conn: &'c mut Self::Connection,
        sql: &'c str,
    ) -> BoxFuture<'c, Result<(), Error>>;
}

/// [`TxDatabase::__execute`] for any connection.
fn execute<'c, X: sqlx::Executor<'c> + 'c>(
    conn: X,
    sql: &'c str,
) -> BoxFuture<'c, Result<(), Error>> {
    Box::pin(async move {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(conn)
            .await
            .map(drop)
            .map_err(Error::store)
    })
}

#[cfg(feature = "postgres")]
impl sealed::Sealed for sqlx::Postgres {}

#[cfg(feature = "postgres")]
impl TxDatabase for sqlx::Postgres {
    fn __pool(store: &SqlStore) -> Option<&sqlx::Pool<Self>> {
        store.pg_pool()
    }

    fn __begin(
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

    fn __claim<'c>(
        _store: &'c SqlStore,
        conn: &'c mut Self::Connection,
        key: &'c Key,
        req: &'c ClaimRequest,
    ) -> BoxFuture<'c, Result<Option<ClaimOutcome>, Error>> {
        Box::pin(async move {
            decide(
                key,
                req.kind,
                super::postgres::claim(conn, key, req, true, false).await?,
            )
        })
    }

    fn __complete<'c>(
        conn: &'c mut Self::Connection,
        key: &'c Key,
        owner: Owner,
        value: &'c [u8],
        ttl: Duration,
    ) -> BoxFuture<'c, Result<bool, Error>> {
        Box::pin(super::postgres::complete(conn, key, owner, value, ttl))
    }

    fn __execute<'c>(
        conn: &'c mut Self::Connection,
        sql: &'c str,
    ) -> BoxFuture<'c, Result<(), Error>> {
        execute(conn, sql)
    }
}

#[cfg(feature = "mysql")]
impl sealed::Sealed for sqlx::MySql {}

#[cfg(feature = "mysql")]
impl TxDatabase for sqlx::MySql {
    fn __pool(store: &SqlStore) -> Option<&sqlx::Pool<Self>> {
        store.mysql_pool()
    }

    fn __begin(
        pool: &sqlx::Pool<Self>,
        _wait: Duration,
    ) -> BoxFuture<'_, Result<sqlx::Transaction<'static, Self>, Error>> {
        // The wait on a twin's uncommitted row is bounded by the server's
        // innodb_lock_wait_timeout: changing it would outlive this transaction on the
        // pooled connection.
        Box::pin(async move { pool.begin().await.map_err(Error::store) })
    }

    fn __claim<'c>(
        store: &'c SqlStore,
        conn: &'c mut Self::Connection,
        key: &'c Key,
        req: &'c ClaimRequest,
    ) -> BoxFuture<'c, Result<Option<ClaimOutcome>, Error>> {
        let returning = match &store.backend {
            super::Backend::MySql { returning, .. } => *returning,
            #[allow(unreachable_patterns)]
            _ => false,
        };
        Box::pin(async move {
            decide(
                key,
                req.kind,
                super::mysql::claim(conn, returning, true, key, req).await?,
            )
        })
    }

    fn __complete<'c>(
        conn: &'c mut Self::Connection,
        key: &'c Key,
        owner: Owner,
        value: &'c [u8],
        ttl: Duration,
    ) -> BoxFuture<'c, Result<bool, Error>> {
        Box::pin(super::mysql::complete(conn, key, owner, value, ttl))
    }

    fn __execute<'c>(
        conn: &'c mut Self::Connection,
        sql: &'c str,
    ) -> BoxFuture<'c, Result<(), Error>> {
        execute(conn, sql)
    }
}

#[cfg(feature = "sqlite")]
impl sealed::Sealed for sqlx::Sqlite {}

#[cfg(feature = "sqlite")]
impl TxDatabase for sqlx::Sqlite {
    fn __pool(store: &SqlStore) -> Option<&sqlx::Pool<Self>> {
        store.sqlite_pool()
    }

    fn __begin(
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

    fn __claim<'c>(
        _store: &'c SqlStore,
        conn: &'c mut Self::Connection,
        key: &'c Key,
        req: &'c ClaimRequest,
    ) -> BoxFuture<'c, Result<Option<ClaimOutcome>, Error>> {
        Box::pin(async move { decide(key, req.kind, super::sqlite::claim(conn, key, req).await?) })
    }

    fn __complete<'c>(
        conn: &'c mut Self::Connection,
        key: &'c Key,
        owner: Owner,
        value: &'c [u8],
        ttl: Duration,
    ) -> BoxFuture<'c, Result<bool, Error>> {
        Box::pin(super::sqlite::complete(conn, key, owner, value, ttl))
    }

    fn __execute<'c>(
        conn: &'c mut Self::Connection,
        sql: &'c str,
    ) -> BoxFuture<'c, Result<(), Error>> {
        execute(conn, sql)
    }
}

/// What [`SqlStore::begin`] found.
#[must_use = "a claimed transaction must be committed (or it rolls back when dropped)"]
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
    tx: sqlx::Transaction<'static, DB>,
    store: SqlStore,
    key: Key,
    owner: Owner,
    ttl: Duration,
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

    /// Records `value` as the key's result (replayed to every later call), commits it
    /// together with the business writes, and hands `value` back.
    ///
    /// A commit error means the outcome is unknown (the server may have committed before
    /// the connection failed): retry the whole call, which replays if it did.
    pub async fn commit<T: Serialize + DeserializeOwned>(self, value: T) -> Result<T, Error> {
        let result: Result<T, ()> = Ok(value);
        let bytes = <ReplayOk as Codec<T, ()>>::encode(&self.key, &result)
            .and_then(|b| b.ok_or(Error::Unsupported("a codec that stores no Ok value")));
        self.commit_bytes(bytes).await?;
        result.map_err(|()| Error::Unsupported("unreachable"))
    }

    /// Records `result` through the codec `C` and commits. A result the codec does not
    /// store (an `Err` with [`ReplayOk`]) rolls back instead.
    pub async fn commit_with<C: Codec<T, E>, T, E>(
        self,
        result: &Result<T, E>,
    ) -> Result<(), Error> {
        match C::encode(&self.key, result) {
            Ok(None) => self.rollback().await,
            other => {
                self.commit_bytes(other.map(|b| b.unwrap_or_default()))
                    .await
            }
        }
    }

    async fn commit_bytes(mut self, bytes: Result<bytes::Bytes, Error>) -> Result<(), Error> {
        let bytes = match bytes {
            Ok(b) => b,
            // The value cannot be stored: roll back, so nothing happened at all.
            Err(e) => {
                let _ = self.tx.rollback().await;
                return Err(e);
            }
        };
        if !DB::__complete(self.tx.as_mut(), &self.key, self.owner, &bytes, self.ttl).await? {
            let _ = self.tx.rollback().await;
            return Err(Error::LeaseLost { key: self.key });
        }
        self.tx.commit().await.map_err(Error::store)?;
        self.store.watchers.wake(&self.key);
        Ok(())
    }

    /// Rolls back the business writes and the claim: the key is free again.
    pub async fn rollback(self) -> Result<(), Error> {
        self.tx.rollback().await.map_err(Error::store)
    }
}

/// The future a [`SqlStore::transaction`] body returns: boxed, so that it may borrow the
/// transaction and still be `Send` (an `async` closure's future cannot be proven `Send`
/// across the borrow today).
pub type TxFuture<'c, T, E> = BoxFuture<'c, Result<T, E>>;

impl SqlStore {
    /// Claims `key` inside a new database transaction.
    ///
    /// - [`Begun::Claimed`]: the claim row is written in the (uncommitted) transaction.
    ///   Do the business writes through it, then [`IdemTransaction::commit`] the value:
    ///   record and writes commit together, or neither does (drop, error, crash).
    /// - [`Begun::Replayed`]: the key completed before; its value, decoded.
    ///
    /// A duplicate that arrives while the first transaction is open waits for it on the
    /// row's lock (bounded by `opts.wait` on PostgreSQL, by the server's lock wait
    /// timeout on MySQL and SQLite's busy timeout), then replays. A key held by a normal
    /// (non-transactional) call is waited for up to `opts.wait`, then
    /// [`Error::InProgress`]. Records written here replay through `#[idempotent]` and
    /// [`Idem::dedup`](crate::Idem::dedup) with the same [`Options`], and the other way
    /// round: both store the same envelope.
    ///
    /// ```no_run
    /// use idem_runtime::{Error, Idem, Options, SqlStore};
    /// use idem_runtime::store::sql::{Begun, sqlx::{self, Postgres}};
    ///
    /// static CREATE_ORDER: Options = Options::dedup("shop::create_order");
    ///
    /// # async fn demo(idem: Idem, store: SqlStore, request_id: &str) -> Result<i64, Error> {
    /// let key = idem.key(&CREATE_ORDER, format_args!("order:{request_id}"));
    /// match store.begin::<Postgres, i64>(&CREATE_ORDER, &key).await? {
    ///     Begun::Replayed(order_id) => Ok(order_id),
    ///     Begun::Claimed(mut tx) => {
    ///         let order_id: i64 =
    ///             sqlx::query_scalar("INSERT INTO orders (total) VALUES (100) RETURNING id")
    ///                 .fetch_one(&mut **tx)
    ///                 .await
    ///                 .map_err(Error::store)?;
    ///         tx.commit(order_id).await
    ///     }
    /// }
    /// # }
    /// ```
    pub async fn begin<DB, T>(&self, opts: &Options, key: &Key) -> Result<Begun<DB, T>, Error>
    where
        DB: TxDatabase,
        T: Serialize + DeserializeOwned,
    {
        Ok(
            match self
                .begin_with::<ReplayOk, DB, T, Error>(opts, key, None)
                .await?
            {
                Begun::Claimed(tx) => Begun::Claimed(tx),
                Begun::Replayed(r) => Begun::Replayed(r?),
            },
        )
    }

    /// [`SqlStore::begin`] with an explicit [`Codec`] (what is stored and replayed) and an
    /// optional payload [`Fingerprint`] (a different one is [`Error::PayloadMismatch`]).
    pub async fn begin_with<C, DB, T, E>(
        &self,
        opts: &Options,
        key: &Key,
        fingerprint: Option<Fingerprint>,
    ) -> Result<Begun<DB, Result<T, E>>, Error>
    where
        C: Codec<T, E>,
        DB: TxDatabase,
    {
        let pool = DB::__pool(self).ok_or_else(|| {
            Error::Config(format!(
                "a transaction on another database than this {} store",
                self.backend_name()
            ))
        })?;
        let owner = Owner::next();
        let req =
            ClaimRequest::new(ClaimKind::Dedup, owner, TX_LEASE).with_fingerprint(fingerprint);
        let mut backoff = Backoff::new(opts.wait_for());
        let mismatch = |stored| crate::fingerprint::check_fingerprint(key, fingerprint, stored);
        loop {
            let attempt = async {
                let mut tx = DB::__begin(pool, opts.wait_for()).await?;
                let outcome = DB::__claim(self, tx.as_mut(), key, &req).await?;
                Ok::<_, Error>((tx, outcome))
            }
            .await;
            let retry_in = match attempt {
                Ok((tx, Some(ClaimOutcome::Claimed { .. }))) => {
                    return Ok(Begun::Claimed(IdemTransaction {
                        tx,
                        store: self.clone(),
                        key: *key,
                        owner,
                        ttl: opts.ttl_for(),
                    }));
                }
                Ok((
                    tx,
                    Some(ClaimOutcome::Completed {
                        value,
                        fingerprint: stored,
                    }),
                )) => {
                    drop(tx);
                    mismatch(stored)?;
                    return match opts.duplicate_policy() {
                        OnDuplicate::Reject => Err(Error::Duplicate { key: *key }),
                        OnDuplicate::Replay => Ok(Begun::Replayed(C::decode(key, &value)?)),
                    };
                }
                Ok((
                    _,
                    Some(ClaimOutcome::Busy {
                        retry_in,
                        fingerprint: stored,
                    }),
                )) => {
                    mismatch(stored)?;
                    retry_in
                }
                // The statement kept losing races, or a twin's transaction held the row
                // past the lock timeout: look again shortly.
                Ok((_, None)) => Duration::ZERO,
                Err(e) if is_lock_wait(&e) => Duration::ZERO,
                Ok((_, Some(_))) => {
                    return Err(Error::Unsupported("this claim outcome in a transaction"));
                }
                Err(e) => return Err(e),
            };
            backoff.nap(key, retry_in).await?;
        }
    }

    /// Runs `body` inside a database transaction that holds `key`, and commits its `Ok`
    /// value as the key's record together with the body's writes; later calls replay the
    /// value without running `body`. See [`SqlStore::begin`] for the waiting rules; this
    /// is `begin`, the body, then `commit` (or a rollback on `Err`).
    ///
    /// - `body` gets the open transaction; do every write through it, and do not commit
    ///   or roll back inside. It returns a boxed future ([`TxFuture`]), so the whole call
    ///   stays `Send` and can run in a spawned task or a web handler.
    /// - An `Err` from `body` rolls everything back and is returned; a retry runs again.
    ///   (Errors are not cached in this mode: caching one would commit the writes made
    ///   before it.)
    ///
    /// ```no_run
    /// use idem_runtime::{Error, Idem, Options, SqlStore};
    /// use idem_runtime::store::sql::sqlx::{self, Postgres, Transaction};
    ///
    /// static CREATE_ORDER: Options = Options::dedup("shop::create_order");
    ///
    /// # async fn demo(idem: Idem, store: SqlStore, request_id: &str) -> Result<i64, Error> {
    /// let key = idem.key(&CREATE_ORDER, format_args!("order:{request_id}"));
    /// let order_id = store
    ///     .transaction(&CREATE_ORDER, &key, |tx: &mut Transaction<'static, Postgres>| {
    ///         Box::pin(async move {
    ///             sqlx::query_scalar("INSERT INTO orders (total) VALUES (100) RETURNING id")
    ///                 .fetch_one(&mut **tx)
    ///                 .await
    ///                 .map_err(Error::store)
    ///         })
    ///     })
    ///     .await?;
    /// # let _: i64 = order_id; Ok(order_id) }
    /// ```
    pub async fn transaction<DB, T, E, F>(&self, opts: &Options, key: &Key, body: F) -> Result<T, E>
    where
        DB: TxDatabase,
        T: Serialize + DeserializeOwned + Send,
        E: From<Error> + Send,
        F: for<'c> FnOnce(&'c mut sqlx::Transaction<'static, DB>) -> TxFuture<'c, T, E>,
    {
        let mut itx = match self.begin::<DB, T>(opts, key).await? {
            Begun::Replayed(v) => return Ok(v),
            Begun::Claimed(itx) => itx,
        };
        match body(&mut itx.tx).await {
            Ok(v) => Ok(itx.commit(v).await?),
            Err(e) => {
                let _ = itx.rollback().await;
                Err(e)
            }
        }
    }
}
