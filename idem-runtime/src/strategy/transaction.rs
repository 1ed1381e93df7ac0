//! Transactional mode: dedup whose claim and record are written inside a database
//! transaction, so that they commit together with the business writes or not at all.
//!
//! Two ways in, one flow:
//!
//! - **the caller's transaction** (`#[idempotent(transaction = tx)]`): each attempt at
//!   the claim runs behind a savepoint, so that a busy key's attempt is undone without
//!   touching what the caller wrote before; the body writes through the same
//!   transaction, and the result is recorded there ([`tx_begin`], [`tx_end`]);
//! - **a transaction idem opens** ([`SqlStore::begin`], [`SqlStore::transaction`]):
//!   each attempt is a fresh transaction, since a key's holder may need a lock this
//!   transaction holds (SQLite's write lock) before it can finish.
//!
//! Either way the claim waits for a busy key, checks the fingerprint, applies
//! `on_duplicate` and decodes a replay exactly as [`dedup`](super::dedup) does, in the
//! call's `idem` span, with the same metrics. The statements themselves are the store's
//! [`TransactionalStore`] capability.

use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::Instrument;

use super::claiming::{Claimer, claim_with};
use super::dedup::admit;
use crate::codec::{Codec, ReplayOk};
use crate::observe::{self, Outcome};
use crate::store::sql::own_tx::tx_connection;
use crate::store::sql::{Begun, IdemTransaction, SqlStore, TxConn, TxDatabase, TxFuture};
use crate::store::{
    ClaimKind, ClaimOutcome, ClaimRequest, Owner, Savepoint, Store, TransactionalStore,
    TxConnection,
};
use crate::{Error, Fingerprint, Key, Options};

/// While the claim row of a transaction idem opened is uncommitted nobody else can see
/// or take it, so its lease only matters to this transaction's own completion, which
/// must not fail because the business writes outlasted a short lease (MySQL and SQLite
/// check it against the statement's clock).
const TX_LEASE: Duration = Duration::from_secs(7 * 24 * 3600);

/// What a claim's outcome answers without running the body: the key's stored result, or
/// a refusal. `Ok(None)`: claimed, run the body.
fn answer<C, T, E>(
    opts: &Options,
    key: &Key,
    fingerprint: Option<Fingerprint>,
    outcome: Option<ClaimOutcome>,
) -> Result<Option<Result<T, E>>, Error>
where
    C: Codec<T, E>,
{
    match outcome {
        // Transactional mode opens no step frame: its claim is uncommitted until the
        // body's writes commit with it, so a journal written in it would roll back with
        // a failed attempt. A journal a normal-mode attempt left is not replayed here.
        Some(ClaimOutcome::Claimed { .. }) => Ok(None),
        Some(ClaimOutcome::Completed {
            value,
            fingerprint: stored,
        }) => {
            admit(opts, key, fingerprint, stored)?;
            C::decode_shared(key, &value).map(Some)
        }
        Some(ClaimOutcome::Missing) => Err(Error::TokenInvalid { key: *key }),
        Some(ClaimOutcome::OtherPayload { .. }) => Err(Error::PayloadMismatch { key: *key }),
        None | Some(ClaimOutcome::Busy { .. }) => Err(Error::InProgress { key: *key }),
    }
}

/// A key claimed inside the caller's transaction, behind a savepoint: what
/// `tx_begin` hands to `tx_end`.
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

/// What `tx_begin` found.
#[derive(Debug)]
pub enum TxBegun<R> {
    /// The key completed earlier (or while this call waited): its stored result.
    Replayed(R),
    /// This call holds the key in the caller's transaction: run the body, then
    /// `tx_end`.
    Claimed(TxClaim),
}

/// Claims tried in the caller's transaction, each behind the savepoint `name`: a busy
/// attempt is undone before the next, so the transaction stays usable (PostgreSQL
/// aborts it on a failed statement) and keeps the caller's earlier writes.
struct Savepointed<'c> {
    store: &'c dyn TransactionalStore,
    conn: TxConnection<'c>,
    name: String,
    /// Whether the last attempt's savepoint is still set.
    set: bool,
}

impl Savepointed<'_> {
    /// Ends the savepoint still set, if any: `Keep` what was done since, or `Undo` it.
    async fn end(&mut self, op: Savepoint) -> Result<(), Error> {
        if !std::mem::take(&mut self.set) {
            return Ok(());
        }
        self.store
            .savepoint(self.conn.reborrow(), op, &self.name)
            .await
    }
}

impl Claimer for Savepointed<'_> {
    async fn claim(&mut self, key: &Key, req: &ClaimRequest) -> Result<ClaimOutcome, Error> {
        self.end(Savepoint::Undo).await?;
        self.store
            .savepoint(self.conn.reborrow(), Savepoint::Set, &self.name)
            .await?;
        self.set = true;
        match self.store.claim_in(self.conn.reborrow(), key, req).await {
            Ok(outcome) => Ok(outcome),
            Err(e) => {
                // Back to the savepoint, so the caller's transaction is usable again
                // (if its connection still is).
                let _ = self.end(Savepoint::Undo).await;
                Err(e)
            }
        }
    }
}

/// Claims `key` inside the caller's transaction `conn`, on `store`, the current
/// runtime's (which must keep its records in the same database, so that everyone else
/// sees the record once the caller commits).
///
/// The claim row stays invisible to others until the caller commits; a duplicate in
/// another transaction waits on its lock, then replays. A key held by a committed
/// in-progress claim (a call outside any transaction) is waited for up to `opts.wait`
/// (each attempt rolled back to its savepoint), then [`Error::InProgress`].
///
/// The claim's lease is `opts.lease`: it only matters if the caller commits a claim
/// whose body never finished (the call was cancelled), which then frees itself after
/// the lease instead of blocking the key.
pub(crate) async fn tx_begin<C, X, T, E>(
    store: &dyn Store,
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
    let tx = store.transactional().ok_or_else(|| {
        Error::Config(format!(
            "transactional mode needs the current runtime on a store that claims inside \
             database transactions, a SqlStore (it is on {})",
            store.name()
        ))
    })?;
    let owner = Owner::next();
    let req =
        ClaimRequest::new(ClaimKind::Dedup, owner, opts.lease_for()).with_fingerprint(fingerprint);
    let mut attempt = Savepointed {
        store: tx,
        conn: tx_connection::<X::Database>(conn.connection()),
        // Unique per call, so nested calls (a body calling another such function) each
        // have their own; MySQL replaces a savepoint of the same name instead of
        // stacking it.
        name: format!("idem_{:032x}", owner.0),
        set: false,
    };
    let (outcome, _waited) = claim_with(store, &mut attempt, &key, &req, opts.wait_for()).await?;
    match answer::<C, T, E>(opts, &key, fingerprint, outcome) {
        Ok(None) => Ok(TxBegun::Claimed(TxClaim {
            key,
            owner,
            ttl: opts.ttl_for(),
            savepoint: attempt.name,
        })),
        Ok(Some(replay)) => {
            attempt.end(Savepoint::Keep).await?;
            Ok(TxBegun::Replayed(replay))
        }
        Err(e) => {
            attempt.end(Savepoint::Undo).await?;
            Err(e)
        }
    }
}

/// Records the body's `result` in the caller's transaction: a stored result (an `Ok`, or
/// an `Err` the codec keeps) completes the record; anything else (an `Err` that releases
/// the key, or a value that cannot be stored) rolls back to the savepoint, undoing the
/// claim and the body's writes. Nothing is visible to others until the caller commits.
pub(crate) async fn tx_end<C, X, T, E>(
    store: &dyn Store,
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
    let Some(tx) = store.transactional() else {
        return Err(Error::Unsupported("transactional mode on this store"));
    };
    let mut attempt = Savepointed {
        store: tx,
        conn: tx_connection::<X::Database>(conn.connection()),
        name: savepoint,
        set: true,
    };
    let bytes = match C::encode(&key, result) {
        Ok(Some(bytes)) => bytes,
        Ok(None) => return attempt.end(Savepoint::Undo).await,
        Err(e) => {
            let _ = attempt.end(Savepoint::Undo).await;
            return Err(e);
        }
    };
    match tx
        .complete_in(attempt.conn.reborrow(), &key, owner, &bytes, ttl)
        .await
    {
        Ok(true) => attempt.end(Savepoint::Keep).await,
        Ok(false) => {
            // Only a lease that ended inside a very long transaction gets here; undo, so
            // the caller cannot commit business writes without their record.
            attempt.end(Savepoint::Undo).await?;
            Err(Error::LeaseLost { key })
        }
        Err(e) => {
            let _ = attempt.end(Savepoint::Undo).await;
            Err(e)
        }
    }
}

/// Claims tried in transactions idem opens, a fresh one for every attempt: an attempt
/// that must wait gives its transaction (and every lock it holds) back first.
struct Fresh<'s, DB: TxDatabase> {
    store: &'s SqlStore,
    pool: &'s sqlx::Pool<DB>,
    wait: Duration,
    /// The last attempt's transaction, kept when it claimed or found the key done.
    tx: Option<sqlx::Transaction<'static, DB>>,
}

impl<DB: TxDatabase> Claimer for Fresh<'_, DB> {
    async fn claim(&mut self, key: &Key, req: &ClaimRequest) -> Result<ClaimOutcome, Error> {
        // Dropped, the last attempt rolls back.
        self.tx = None;
        let mut tx = DB::begin_tx(self.pool, self.wait).await?;
        let outcome = self
            .store
            .claim_in(DB::tx_connection(tx.as_mut()), key, req)
            .await?;
        if !matches!(outcome, ClaimOutcome::Busy { .. }) {
            self.tx = Some(tx);
        }
        Ok(outcome)
    }
}

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
    /// round: both store the same envelope. The call runs in an `idem` span and counts
    /// in `idem_calls_total`, as every other call does.
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
        let span = observe::span(opts, key);
        let begun = async {
            let pool = DB::pool_of(self).ok_or_else(|| {
                Error::Config(format!(
                    "a transaction on another database than this {} store",
                    self.backend_name()
                ))
            })?;
            let owner = Owner::next();
            let req =
                ClaimRequest::new(ClaimKind::Dedup, owner, TX_LEASE).with_fingerprint(fingerprint);
            let mut attempt = Fresh {
                store: self,
                pool,
                wait: opts.wait_for(),
                tx: None,
            };
            let (outcome, _waited) =
                claim_with(self, &mut attempt, key, &req, opts.wait_for()).await?;
            match (
                answer::<C, T, E>(opts, key, fingerprint, outcome)?,
                attempt.tx,
            ) {
                (Some(replay), _) => {
                    observe::outcome(opts, key, Outcome::Replayed);
                    Ok(Begun::Replayed(replay))
                }
                (None, Some(tx)) => Ok(Begun::Claimed(IdemTransaction {
                    tx,
                    store: self.clone(),
                    key: *key,
                    owner,
                    ttl: opts.ttl_for(),
                    span: tracing::Span::current(),
                })),
                // A claim is only answered by an attempt that kept its transaction.
                (None, None) => Err(Error::InProgress { key: *key }),
            }
        }
        .instrument(span.clone())
        .await;
        if let Err(e) = &begun {
            let _in_span = span.enter();
            observe::failed(opts, key, e);
        }
        begun
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

impl<DB: TxDatabase> IdemTransaction<DB> {
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

    /// Rolls back the business writes and the claim: the key is free again.
    pub async fn rollback(self) -> Result<(), Error> {
        let (span, key) = (self.span.clone(), self.key);
        let rolled = self.tx.rollback().await.map_err(Error::store);
        let _in_span = span.entered();
        match &rolled {
            Ok(()) => observe::outcome_of(&key, Outcome::Ran),
            Err(e) => observe::failed_of(&key, e),
        }
        rolled
    }

    async fn commit_bytes(self, bytes: Result<bytes::Bytes, Error>) -> Result<(), Error> {
        let (span, key) = (self.span.clone(), self.key);
        let committed = self.commit_now(bytes).instrument(span.clone()).await;
        let _in_span = span.entered();
        match &committed {
            Ok(()) => observe::outcome_of(&key, Outcome::Ran),
            Err(e) => observe::failed_of(&key, e),
        }
        committed
    }

    async fn commit_now(mut self, bytes: Result<bytes::Bytes, Error>) -> Result<(), Error> {
        let bytes = match bytes {
            Ok(b) => b,
            // The value cannot be stored: roll back, so nothing happened at all.
            Err(e) => {
                let _ = self.tx.rollback().await;
                return Err(e);
            }
        };
        let done = self
            .store
            .complete_in(
                DB::tx_connection(self.tx.as_mut()),
                &self.key,
                self.owner,
                &bytes,
                self.ttl,
            )
            .await?;
        if !done {
            let _ = self.tx.rollback().await;
            return Err(Error::LeaseLost { key: self.key });
        }
        self.tx.commit().await.map_err(Error::store)?;
        self.store.committed(&self.key);
        Ok(())
    }
}
