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

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;

pub use crate::inspect::{RecordCount, RecordCounts, RecordInfo, RecordState};
use crate::{Error, Fingerprint, Key};

pub mod memory;
mod toolbox;
pub use toolbox::{Settle, TransitionOutcome, TransitionRequest, VersionedBytes};
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

/// A decoded value kept beside a completed record by a [`LocalStore`], so that a replay
/// can hand out a clone of it instead of decoding the stored bytes again.
pub type Memo = std::sync::Arc<dyn Any + Send + Sync>;

/// The fast path of a store whose records live in this process (see [`Store::local`]):
/// answered at once, without a future, and able to keep a decoded value beside a
/// completed record.
///
/// Everything here is an optimisation. The strategies fall back to the [`Store`] methods
/// for anything a local store does not answer, and a store that does not implement this
/// trait loses nothing but speed.
pub trait LocalStore: Send + Sync {
    /// The same atomic step as [`Store::claim`], answered synchronously. A completed
    /// record comes with the memo kept for it by [`memoize`](Self::memoize), if any.
    fn claim_now(
        &self,
        key: &Key,
        req: &ClaimRequest,
    ) -> Result<(ClaimOutcome, Option<Memo>), Error>;

    /// Keeps `memo` beside the completed record under `key`, if that record still holds
    /// exactly `value` (the bytes `claim_now` returned; `memo` was decoded from them).
    /// A record that has changed since is left alone.
    fn memoize(&self, key: &Key, value: &Bytes, memo: Memo);

    /// Calls `read` with the fingerprint and memo of the completed record under `key`
    /// if it is live and has a memo, and returns whether it did; changes nothing. Lets a
    /// replay skip building a claim at all. `read` runs while the record cannot change
    /// (it only clones the value), so the memo's reference count is never touched: on a
    /// hot key that shared counter would cost as much as the lookup.
    fn peek_memo(
        &self,
        key: &Key,
        read: &mut dyn FnMut(Option<Fingerprint>, &(dyn Any + Send + Sync)),
    ) -> bool;
}

/// A boxed, sendable future, as returned by [`Store`] methods (keeps the trait object-safe).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Who holds a claim: unique per call, across processes.
///
/// The high 64 bits are random per process (from the OS RNG), the low 64 bits count calls,
/// so a fresh owner costs one atomic increment and no system call.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Owner(pub u128);

impl Owner {
    /// A new owner id, never returned before by this process.
    pub fn next() -> Owner {
        /// Ids are handed to each thread in blocks, so concurrent callers on different
        /// cores do not contend on one counter.
        const BLOCK: u64 = 1024;
        static PROCESS: OnceLock<u64> = OnceLock::new();
        static COUNTER: AtomicU64 = AtomicU64::new(1);
        thread_local! {
            static RANGE: std::cell::Cell<(u64, u64)> = const { std::cell::Cell::new((0, 0)) };
        }
        let process = *PROCESS.get_or_init(|| {
            let mut b = [0u8; 8];
            // Without an OS RNG, fall back to time and pid: unique enough for owners
            // (they are not secrets, only distinct).
            if getrandom::fill(&mut b).is_err() {
                let t = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(0);
                b = (t ^ u64::from(std::process::id()).rotate_left(32)).to_le_bytes();
            }
            u64::from_le_bytes(b)
        });
        let n = RANGE.with(|r| {
            let (mut next, mut end) = r.get();
            if next == end {
                next = COUNTER.fetch_add(BLOCK, Ordering::Relaxed);
                end = next + BLOCK;
            }
            r.set((next + 1, end));
            next
        });
        Owner((u128::from(process) << 64) | u128::from(n))
    }
}

impl fmt::Debug for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Owner({:032x})", self.0)
    }
}

/// What a claim is for; decides which states it may take over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ClaimKind {
    /// Absent (or an in-progress record whose lease ended) becomes `InProgress`.
    /// A completed record is returned as [`ClaimOutcome::Completed`].
    Dedup,
    /// Like `Dedup`, but never completes: acquiring also bumps the key's fencing counter
    /// and returns it in [`ClaimOutcome::Claimed`].
    Lock,
    /// Only an `Issued` token (or a token claim whose lease ended) can be claimed; an absent
    /// record is [`ClaimOutcome::Missing`]. Releasing returns the token to `Issued`.
    Token,
}

/// A request to claim a key.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ClaimRequest {
    /// What the claim is for.
    pub kind: ClaimKind,
    /// Who claims.
    pub owner: Owner,
    /// How long the claim lasts unless renewed.
    pub lease: Duration,
    /// Stored with a new claim and returned with existing records, so the caller can
    /// detect a payload mismatch.
    pub fingerprint: Option<Fingerprint>,
}

impl ClaimRequest {
    /// A request of `kind` by `owner` for `lease`.
    pub fn new(kind: ClaimKind, owner: Owner, lease: Duration) -> Self {
        ClaimRequest {
            kind,
            owner,
            lease,
            fingerprint: None,
        }
    }

    /// With a payload fingerprint.
    pub fn with_fingerprint(mut self, fingerprint: Option<Fingerprint>) -> Self {
        self.fingerprint = fingerprint;
        self
    }
}

/// The answer to a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClaimOutcome {
    /// The caller now holds the key. `fence` is the key's new fencing token for
    /// [`ClaimKind::Lock`] (strictly greater than every earlier one), 0 otherwise.
    Claimed {
        /// The fencing token.
        fence: u64,
    },
    /// Another owner holds the key; its lease ends in `retry_in` unless renewed.
    Busy {
        /// Time left on the holder's lease, by the store's clock.
        retry_in: Duration,
        /// The fingerprint the holder claimed with.
        fingerprint: Option<Fingerprint>,
    },
    /// The key completed; `value` is what `complete` stored.
    Completed {
        /// The stored bytes, exactly as given to [`Store::complete`].
        value: Bytes,
        /// The fingerprint of the call that completed it.
        fingerprint: Option<Fingerprint>,
    },
    /// [`ClaimKind::Token`] only: there is no such token (never issued, or expired).
    Missing,
}

/// A one-shot notification that a record may have changed.
///
/// Returned by [`Store::subscribe`]; resolves at the first change of the record after the
/// subscription was made (a completion, a release). Spurious wake-ups are allowed: the
/// caller always claims again. A subscription that never fires is allowed too
/// ([`Subscription::never`]): callers then poll on the lease's remaining time.
pub struct Subscription(Option<BoxFuture<'static, ()>>);

impl Subscription {
    /// A subscription that resolves when `fut` does.
    pub fn new(fut: impl Future<Output = ()> + Send + 'static) -> Self {
        Subscription(Some(Box::pin(fut)))
    }

    /// A subscription that never fires, for stores without change notifications.
    pub fn never() -> Self {
        Subscription(None)
    }

    /// A subscription that has already fired (the record changed while subscribing).
    pub fn ready() -> Self {
        Subscription::new(std::future::ready(()))
    }

    /// Whether this subscription can ever fire.
    pub fn is_never(&self) -> bool {
        self.0.is_none()
    }

    /// Waits for the change.
    pub async fn changed(self) {
        match self.0 {
            Some(f) => f.await,
            None => std::future::pending().await,
        }
    }
}

impl fmt::Debug for Subscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "Subscription"
        } else {
            "Subscription(never)"
        })
    }
}

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

    // The toolbox primitives (optimistic versions, state-machine guards, Bloom bitmaps).
    // Each has a default that answers `Error::Unsupported`, so a backend written before
    // them keeps compiling and passes the main conformance suite; a backend that
    // implements them runs `toolbox_conformance_tests!` too.

    /// Reads the versioned value under `key` and its version, or `None` if there is none.
    /// One atomic read.
    fn load_versioned<'a>(
        &'a self,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<Option<VersionedBytes>, Error>> {
        let _ = key;
        unsupported("versioned values (load_versioned)")
    }

    /// Writes `value` under `key` if its current version is `expected` (0: no value
    /// yet), as one atomic step, and returns the new version (`expected + 1`). If the
    /// version differs, changes nothing and returns `None` (a lost race: a conflict).
    ///
    /// `ttl`: the value disappears `ttl` after this write; `None` keeps it without expiry.
    /// After it expires the key is absent again and versions restart at 1, so a ttl must
    /// outlast any read-modify-write cycle that may still hold an old version.
    fn compare_and_set<'a>(
        &'a self,
        key: &'a Key,
        expected: u64,
        value: Bytes,
        ttl: Option<Duration>,
    ) -> BoxFuture<'a, Result<Option<u64>, Error>> {
        let _ = (key, expected, value, ttl);
        unsupported("versioned values (compare_and_set)")
    }

    /// Moves the state record under `key` to `req.to`, as one atomic step:
    ///
    /// - already in `req.to` → [`TransitionOutcome::Already`], nothing written;
    /// - another owner holds a move whose lease has not ended → [`TransitionOutcome::Pending`];
    /// - current state allowed by `req` → moved ([`TransitionOutcome::Moved`]) or, with
    ///   `req.hold`, held for that owner ([`TransitionOutcome::Held`]);
    /// - otherwise [`TransitionOutcome::Refused`] with the current state.
    ///
    /// A hold whose lease ended is ignored (and may be replaced) by every request.
    fn transition<'a>(
        &'a self,
        key: &'a Key,
        req: &'a TransitionRequest<'a>,
    ) -> BoxFuture<'a, Result<TransitionOutcome, Error>> {
        let _ = (key, req);
        unsupported("state machines (transition)")
    }

    /// Commits, aborts or renews the move on `key` held by `owner`, as one atomic step.
    /// Returns `false` (and changes nothing) if `owner` no longer holds it: another
    /// owner replaced the hold after its lease ended, or the record expired. A hold whose
    /// lease ended but that nobody replaced is still the owner's and may be settled.
    fn settle_transition<'a>(
        &'a self,
        key: &'a Key,
        owner: Owner,
        action: Settle,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        let _ = (key, owner, action);
        unsupported("state machines (settle_transition)")
    }

    /// The current state under `key` (`None`: no record). One atomic read; a held move
    /// is not reported (the state is the one before it).
    fn load_state<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Option<String>, Error>> {
        let _ = key;
        unsupported("state machines (load_state)")
    }

    /// Sets the bits at `indexes` in the Bloom bitmap `filter` of `size_bits` bits, as one
    /// atomic step, and returns whether they were **all** set already (the id may have
    /// been inserted before). `false` proves that no earlier insert of the same indexes
    /// happened, and of concurrent inserts of the same indexes exactly one gets `false`.
    ///
    /// A missing bitmap is created empty, to expire `ttl` after its creation (`None`:
    /// never); later inserts do not push that expiry back, so the filter is renewed as a
    /// whole rather than kept alive forever by traffic. Every index is `< size_bits`.
    fn bloom_insert<'a>(
        &'a self,
        filter: &'a Key,
        indexes: &'a [u64],
        size_bits: u64,
        ttl: Option<Duration>,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        let _ = (filter, indexes, size_bits, ttl);
        unsupported("Bloom filters (bloom_insert)")
    }

    /// Whether the bits at `indexes` are all set in the Bloom bitmap `filter` (a missing
    /// bitmap has none set). One atomic read.
    fn bloom_contains<'a>(
        &'a self,
        filter: &'a Key,
        indexes: &'a [u64],
        size_bits: u64,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        let _ = (filter, indexes, size_bits);
        unsupported("Bloom filters (bloom_contains)")
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

    /// The store itself as [`Any`], for code that needs a concrete store behind an
    /// `Arc<dyn Store>` (the attribute's transactional mode needs the `SqlStore`
    /// of the current runtime). Default: `None`.
    fn as_any(&self) -> Option<&dyn Any> {
        None
    }
}

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
    fn load_versioned<'a>(
        &'a self,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<Option<VersionedBytes>, Error>> {
        (**self).load_versioned(key)
    }
    fn compare_and_set<'a>(
        &'a self,
        key: &'a Key,
        expected: u64,
        value: Bytes,
        ttl: Option<Duration>,
    ) -> BoxFuture<'a, Result<Option<u64>, Error>> {
        (**self).compare_and_set(key, expected, value, ttl)
    }
    fn transition<'a>(
        &'a self,
        key: &'a Key,
        req: &'a TransitionRequest<'a>,
    ) -> BoxFuture<'a, Result<TransitionOutcome, Error>> {
        (**self).transition(key, req)
    }
    fn settle_transition<'a>(
        &'a self,
        key: &'a Key,
        owner: Owner,
        action: Settle,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        (**self).settle_transition(key, owner, action)
    }
    fn load_state<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Option<String>, Error>> {
        (**self).load_state(key)
    }
    fn bloom_insert<'a>(
        &'a self,
        filter: &'a Key,
        indexes: &'a [u64],
        size_bits: u64,
        ttl: Option<Duration>,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        (**self).bloom_insert(filter, indexes, size_bits, ttl)
    }
    fn bloom_contains<'a>(
        &'a self,
        filter: &'a Key,
        indexes: &'a [u64],
        size_bits: u64,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        (**self).bloom_contains(filter, indexes, size_bits)
    }
    fn name(&self) -> &'static str {
        (**self).name()
    }
    fn local(&self) -> Option<&dyn LocalStore> {
        (**self).local()
    }
    fn as_any(&self) -> Option<&dyn Any> {
        (**self).as_any()
    }
}

/// The default body of the toolbox primitives.
fn unsupported<'a, T: Send + 'a>(what: &'static str) -> BoxFuture<'a, Result<T, Error>> {
    Box::pin(std::future::ready(Err(Error::Unsupported(what))))
}
