//! The [`Store`] trait: the one seam between strategies and backends.
//!
//! A store keeps one record per [`Key`] and moves it through
//! absent → `InProgress{owner, lease}` → `Completed{value}` → absent after its ttl
//! (tokens start at `Issued`). Every method is **one atomic operation** on the backend:
//! one Lua script on Redis, one statement on SQL, one critical section in memory. Expiry
//! is decided by the store's own clock, never by the caller's.
//!
//! Strategies (dedup, lock, token) are written once on top of these primitives, so a
//! third-party backend gets all of them by implementing this trait and passing the
//! conformance suite in `idem_runtime::testing`.
//!
//! Beyond the claim records, a store may offer capabilities, each a trait of its own
//! reached through an accessor of [`Store`] that answers `None` by default:
//!
//! - [`Store::local`] → [`LocalStore`]: the in-process fast path;
//! - [`Store::versioned`] → [`VersionedStore`]: versioned values (optimistic concurrency);
//! - [`Store::states`] → [`StateStore`]: state records (state machines);
//! - [`Store::blooms`] → [`BloomStore`]: Bloom bitmaps;
//! - [`Store::transactional`] → [`TransactionalStore`]: claims inside a database
//!   transaction (transactional mode);
//! - [`Store::journal`] → [`JournalStore`]: step journals (durable steps), see [`journal`];
//! - [`Store::recovery`] → [`RecoveryStore`]: the index of calls a recoverer finishes,
//!   see [`recovery`].
//!
//! A strategy that needs a capability the store lacks answers [`Error::Unsupported`].

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;

use crate::{Error, Key};

mod claim;
mod inspection;
pub mod journal;
mod local;
mod local_blooms;
pub mod memory;
pub mod recovery;
mod toolbox;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod transaction;
mod unreachable;
pub use crate::error::BoxError;
pub use claim::{ClaimKind, ClaimOutcome, ClaimRequest, Owner, Subscription};
pub use inspection::{RecordCount, RecordCounts, RecordInfo, RecordState};
pub use journal::{Journal, JournalEntry, JournalStore, StepInfo};
pub use local::{LocalStore, Memo};
pub use recovery::{Due, Recover, RecoverableCall, RecoveryStore, Taken};
pub use toolbox::{
    BloomStore, Settle, StateStore, TransitionOutcome, TransitionRequest, VersionedBytes,
    VersionedStore,
};
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub use transaction::{
    Savepoint, StepTransaction, TransactionalStore, TxConnection, TxJournalStore,
};
pub use unreachable::{Cause, Unreachable};
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite")))
)]
pub mod sql;
mod url;
pub use url::connect;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;

/// A boxed, sendable future, as returned by [`Store`] methods (keeps the trait object-safe).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A backend that keeps idem's records.
///
/// Each method is one atomic step on the backend; none may be built from two round trips
/// (a read then a write), since two callers could both see "absent" in between. Methods
/// return boxed futures so that `Arc<dyn Store>` works; implementations usually write
/// `Box::pin(async move { ... })`.
///
/// Implement this for a new backend, then run `idem_runtime::testing` against it.
pub trait Store: Send + Sync + 'static {
    /// Claims `key` per `req` (see [`ClaimKind`] for which states each kind may take).
    ///
    /// Must be atomic: of any number of concurrent claims on an absent key, exactly one
    /// gets [`ClaimOutcome::Claimed`].
    fn claim<'a>(
        &'a self,
        key: &'a Key,
        req: &'a ClaimRequest,
    ) -> BoxFuture<'a, Result<ClaimOutcome, Error>>;

    /// If `owner` still holds `key`, stores `value` as its completed result, kept for `ttl`,
    /// wakes subscribers and returns `true`. Otherwise changes nothing and returns `false`.
    fn complete<'a>(
        &'a self,
        key: &'a Key,
        owner: Owner,
        value: Bytes,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>>;

    /// If `owner` still holds `key`, gives it up (absent again, or `Issued` again for a
    /// token), wakes subscribers and returns `true`. Otherwise returns `false`.
    fn release<'a>(&'a self, key: &'a Key, owner: Owner) -> BoxFuture<'a, Result<bool, Error>>;

    /// If `owner` still holds `key`, extends its lease to `lease` from now and returns
    /// `true`. Otherwise returns `false` (the lease was lost).
    fn renew<'a>(
        &'a self,
        key: &'a Key,
        owner: Owner,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>>;

    /// Records `key` as an `Issued` token, valid for `ttl`. Returns `false` if a record
    /// already exists there (it is left unchanged).
    fn issue<'a>(&'a self, key: &'a Key, ttl: Duration) -> BoxFuture<'a, Result<bool, Error>>;

    /// A notification of the next change of `key`; see [`Subscription`].
    ///
    /// The default never fires, and waiters poll. Stores that can push changes (memory,
    /// Redis pub/sub) override it so that a duplicate is woken as soon as its twin ends.
    fn subscribe<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Subscription, Error>> {
        let _ = key;
        Box::pin(std::future::ready(Ok(Subscription::never())))
    }

    /// The record under `key` as it is now, read in one atomic step that changes
    /// nothing: its state, owner, lease and ttl left, whether a fingerprint is stored,
    /// the value's size and a held lock's fence (see [`RecordInfo`]). `None`: no live
    /// record. What [`Idem::inspect`](crate::Idem::inspect) and `idem inspect` show.
    ///
    /// The default answers [`Error::Unsupported`]; every built-in store implements it,
    /// and the conformance suite checks it.
    fn inspect<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Option<RecordInfo>, Error>> {
        let _ = key;
        Box::pin(std::future::ready(Err(Error::Unsupported(
            "inspecting records (inspect)",
        ))))
    }

    /// Removes the record under `key` whoever holds it, in one atomic step, wakes its
    /// waiters, and returns whether there was a live one. Whoever held it can no longer
    /// complete, release or renew it (their completion reads as a lost lease). A lock's
    /// fencing counter survives, so the next holder's fence is still greater.
    ///
    /// The default answers [`Error::Unsupported`]; every built-in store implements it.
    fn forget<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<bool, Error>> {
        let _ = key;
        Box::pin(std::future::ready(Err(Error::Unsupported(
            "forgetting records (forget)",
        ))))
    }

    /// Counting records by namespace, function and state ([`RecordCounts`]), for a
    /// store that names its records by function (Redis, SQL; not the in-process store,
    /// which keeps digests only). Default: `None`.
    fn record_counts(&self) -> Option<&dyn RecordCounts> {
        None
    }

    /// Versioned values with compare-and-set (optimistic concurrency), if this store
    /// keeps them. Default: `None`, and the optimistic strategy answers
    /// [`Error::Unsupported`].
    fn versioned(&self) -> Option<&dyn VersionedStore> {
        None
    }

    /// State records with guarded moves (state machines), if this store keeps them.
    /// Default: `None`, and state machines answer [`Error::Unsupported`].
    fn states(&self) -> Option<&dyn StateStore> {
        None
    }

    /// Bloom bitmaps, if this store keeps them. Default: `None`, and Bloom filters
    /// answer [`Error::Unsupported`].
    fn blooms(&self) -> Option<&dyn BloomStore> {
        None
    }

    /// Step journals (durable steps), if this store keeps them; the contract, which
    /// also concerns `claim`, `complete` and `forget`, is in [`journal`]. Default:
    /// `None`, and [`step`](crate::step) answers [`Error::Unsupported`].
    fn journal(&self) -> Option<&dyn JournalStore> {
        None
    }

    /// A short name for logs ("memory", "redis", ...).
    fn name(&self) -> &'static str {
        "custom"
    }

    /// The in-process fast path, for a store whose records live in this process only.
    ///
    /// Such a store is never shared with another process, so the runtime also names its
    /// records with a per-process keyed hash (SipHash with a random key) instead of the
    /// portable BLAKE3 digest: just as collision-proof against whoever writes the keys,
    /// and several times cheaper. Default: `None` (a shared store).
    fn local(&self) -> Option<&dyn LocalStore> {
        None
    }

    /// Claims inside a database transaction, if this store keeps its records in the
    /// database the transaction runs on. Default: `None`, and transactional mode
    /// answers [`Error::Unsupported`].
    #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
    fn transactional(&self) -> Option<&dyn TransactionalStore> {
        None
    }

    /// The recovery index, if this store keeps the arguments of recoverable calls (see
    /// [`recovery`]). Default: `None`; calls marked `recover` then run as plain calls
    /// and a recoverer refuses to start.
    fn recovery(&self) -> Option<&dyn RecoveryStore> {
        None
    }
}

/// Forwards every method and every capability accessor: a shared store is the same store.
impl<S: Store + ?Sized> Store for std::sync::Arc<S> {
    fn claim<'a>(
        &'a self,
        key: &'a Key,
        req: &'a ClaimRequest,
    ) -> BoxFuture<'a, Result<ClaimOutcome, Error>> {
        (**self).claim(key, req)
    }
    fn complete<'a>(
        &'a self,
        key: &'a Key,
        owner: Owner,
        value: Bytes,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        (**self).complete(key, owner, value, ttl)
    }
    fn release<'a>(&'a self, key: &'a Key, owner: Owner) -> BoxFuture<'a, Result<bool, Error>> {
        (**self).release(key, owner)
    }
    fn renew<'a>(
        &'a self,
        key: &'a Key,
        owner: Owner,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        (**self).renew(key, owner, lease)
    }
    fn issue<'a>(&'a self, key: &'a Key, ttl: Duration) -> BoxFuture<'a, Result<bool, Error>> {
        (**self).issue(key, ttl)
    }
    fn subscribe<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Subscription, Error>> {
        (**self).subscribe(key)
    }
    fn inspect<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Option<RecordInfo>, Error>> {
        (**self).inspect(key)
    }
    fn forget<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<bool, Error>> {
        (**self).forget(key)
    }
    fn record_counts(&self) -> Option<&dyn RecordCounts> {
        (**self).record_counts()
    }
    fn versioned(&self) -> Option<&dyn VersionedStore> {
        (**self).versioned()
    }
    fn states(&self) -> Option<&dyn StateStore> {
        (**self).states()
    }
    fn blooms(&self) -> Option<&dyn BloomStore> {
        (**self).blooms()
    }
    fn journal(&self) -> Option<&dyn JournalStore> {
        (**self).journal()
    }
    fn name(&self) -> &'static str {
        (**self).name()
    }
    fn local(&self) -> Option<&dyn LocalStore> {
        (**self).local()
    }
    #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
    fn transactional(&self) -> Option<&dyn TransactionalStore> {
        (**self).transactional()
    }
    fn recovery(&self) -> Option<&dyn RecoveryStore> {
        (**self).recovery()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::Store;
    use super::memory::MemoryStore;

    /// The forwarding impl must not drop a capability: an `Arc` of a store offers
    /// exactly what the store does.
    #[test]
    fn arc_forwards_every_capability() {
        let store = MemoryStore::new();
        let shared: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let twice = Arc::new(shared.clone());
        for s in [&store as &dyn Store, &shared, &twice] {
            assert!(s.local().is_some());
            assert!(s.versioned().is_some());
            assert!(s.states().is_some());
            assert!(s.blooms().is_some());
            assert!(s.journal().is_some());
            assert!(s.recovery().is_some());
            assert_eq!(s.name(), "memory");
        }
    }
}
