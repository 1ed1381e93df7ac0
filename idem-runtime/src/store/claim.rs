//! The claim records' vocabulary: who claims ([`Owner`]), what for ([`ClaimKind`]),
//! the request and its answer, and the change notification a waiter sleeps on.

use std::fmt;
use std::future::Future;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;

use super::BoxFuture;
use crate::Fingerprint;

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
    /// A recoverable dedup claim: the call's arguments, recorded with the claim in the
    /// same atomic step (see [`RecoveryStore`](super::RecoveryStore)). Only set for a
    /// store with a recovery index.
    pub recover: Option<super::Recover>,
}

impl ClaimRequest {
    /// A request of `kind` by `owner` for `lease`.
    pub fn new(kind: ClaimKind, owner: Owner, lease: Duration) -> Self {
        ClaimRequest {
            kind,
            owner,
            lease,
            fingerprint: None,
            recover: None,
        }
    }

    /// Recoverable: with the call's arguments (see [`ClaimRequest::recover`]).
    pub fn with_recover(mut self, recover: Option<super::Recover>) -> Self {
        self.recover = recover;
        self
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
    /// The caller now holds the key.
    Claimed {
        /// The key's new fencing token for [`ClaimKind::Lock`] (strictly greater than
        /// every earlier one), 0 otherwise.
        fence: u64,
        /// The step journal earlier attempts left on the record (they released it, were
        /// dropped, or their lease ran out), returned by the claim itself so resuming
        /// costs no extra round trip; `None` if it has no entries. Only a store with a
        /// [`JournalStore`](super::JournalStore) fills it, and only for dedup and token
        /// claims.
        journal: Option<super::Journal>,
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
        /// The stored bytes, exactly as given to [`Store::complete`](super::Store::complete).
        value: Bytes,
        /// The fingerprint of the call that completed it.
        fingerprint: Option<Fingerprint>,
    },
    /// [`ClaimKind::Token`] only: there is no such token (never issued, or expired).
    Missing,
    /// Nothing was claimed: the record is free to take (absent, released, its lease
    /// ended, an issued token), but it has a live step journal written for another
    /// payload. A journal records the effects made for one payload, so a claim whose
    /// fingerprint differs from the journal's must never resume from it: the caller
    /// gets [`Error::PayloadMismatch`](crate::Error::PayloadMismatch), and the original
    /// payload resumes later.
    ///
    /// Only a store with a [`JournalStore`](super::JournalStore) answers it, to dedup
    /// and token claims, and only when both the request and the journal have a
    /// fingerprint and the two differ (a journal or a request without one is accepted,
    /// as [`Completed`](Self::Completed) records are). A journal's fingerprint is the
    /// one of the last claim with a fingerprint that wrote a step to it.
    OtherPayload {
        /// The fingerprint the journal was written under.
        fingerprint: Fingerprint,
    },
}

impl ClaimOutcome {
    /// [`Claimed`](Self::Claimed) with `fence` and no journal: a fresh claim.
    pub fn claimed(fence: u64) -> Self {
        ClaimOutcome::Claimed {
            fence,
            journal: None,
        }
    }

    /// A dedup or token claim that took a record whose step journal is `journal`:
    /// [`Claimed`](Self::Claimed) with fence 0, carrying the journal if it has entries.
    pub fn resuming(journal: super::Journal) -> Self {
        ClaimOutcome::Claimed {
            fence: 0,
            journal: (!journal.is_empty()).then_some(journal),
        }
    }
}

/// A one-shot notification that a record may have changed.
///
/// Returned by [`Store::subscribe`](super::Store::subscribe); resolves at the first change of the record after the
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
