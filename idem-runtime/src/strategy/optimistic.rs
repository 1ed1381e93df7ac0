//! Optimistic concurrency: versioned values, compare-and-set, and retry on conflict.
//!
//! For low-conflict read-modify-write (a profile, loyalty points, a balance): read the
//! value with its version, compute the new value, write it only if the version is
//! unchanged. A lost race is [`Error::Conflict`]; [`retry_on_conflict`] (or
//! [`Idem::update`]) re-runs the whole read-compute-write with bounded attempts and
//! jittered backoff. No lock is held while computing, so a slow or crashed writer never
//! blocks the others; under heavy contention on one key, prefer a lock.
//!
#![doc = include_str!("guide/optimistic.md")]

use std::fmt;
use std::future::Future;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::codec::{Codec, ReplayOk};
use crate::store::{Store, VersionedStore};
use crate::{Error, Idem, Key};

/// How [`retry_on_conflict`] retries: at most `attempts` runs in all, sleeping between
/// them a random time in `[0, min(max, base · 2^n)]` ("full jitter"), so contenders that
/// collided once spread out instead of colliding again in lockstep.
///
/// ```
/// use std::time::Duration;
/// use idem_runtime::toolbox::Retry;
/// static PATIENT: Retry = Retry::new(50).backoff(Duration::from_millis(1), Duration::from_millis(50));
/// assert_eq!(PATIENT.attempts(), 50);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    attempts: u32,
    base: Duration,
    max: Duration,
}

impl Default for Retry {
    fn default() -> Self {
        Retry::DEFAULT
    }
}

impl Retry {
    /// 10 attempts, backoff from 2 ms up to 100 ms.
    pub const DEFAULT: Retry = Retry {
        attempts: 10,
        base: Duration::from_millis(2),
        max: Duration::from_millis(100),
    };

    /// At most `attempts` runs in all (0 is treated as 1), with the default backoff.
    pub const fn new(attempts: u32) -> Self {
        Retry {
            attempts: if attempts == 0 { 1 } else { attempts },
            ..Retry::DEFAULT
        }
    }

    /// The backoff: the n-th retry sleeps a random time up to `min(max, base · 2^n)`.
    pub const fn backoff(mut self, base: Duration, max: Duration) -> Self {
        self.base = base;
        self.max = max;
        self
    }

    /// The maximum number of runs.
    pub const fn attempts(&self) -> u32 {
        self.attempts
    }

    /// The sleep before retry number `retry` (0-based): uniform in `[0, cap]`.
    fn delay(&self, retry: u32) -> Duration {
        let cap = self
            .base
            .saturating_mul(1u32 << retry.min(20))
            .min(self.max);
        let nanos = u64::try_from(cap.as_nanos()).unwrap_or(u64::MAX);
        if nanos == 0 {
            return Duration::ZERO;
        }
        Duration::from_nanos(random_u64() % (nanos + 1))
    }
}

/// The policy of `#[retry_on_conflict(...)]`: each option left out keeps its value from
/// [`Retry::DEFAULT`], except that a `backoff` above the default cap raises the cap to it
/// and a `max_backoff` below the default base lowers the base to it (the macro refuses
/// both given the wrong way round).
pub(crate) const fn attribute_policy(
    attempts: Option<u32>,
    base: Option<Duration>,
    max: Option<Duration>,
) -> Retry {
    let mut retry = match attempts {
        Some(attempts) => Retry::new(attempts),
        None => Retry::DEFAULT,
    };
    match (base, max) {
        (Some(base), Some(max)) => retry = retry.backoff(base, max),
        (Some(base), None) => {
            retry.base = base;
            if base.as_nanos() > retry.max.as_nanos() {
                retry.max = base;
            }
        }
        (None, Some(max)) => {
            retry.max = max;
            if max.as_nanos() < retry.base.as_nanos() {
                retry.base = max;
            }
        }
        (None, None) => {}
    }
    retry
}

fn random_u64() -> u64 {
    // Jitter needs spread, not secrecy: without an OS RNG, mix the clock and a counter.
    getrandom::u64().unwrap_or_else(|_| {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos() as u64);
        (t ^ N.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed))
            .wrapping_mul(0xbf58_476d_1ce4_e5b9)
    })
}

/// Errors that can say "this was a lost optimistic race; running again may succeed".
///
/// Implemented for [`Error`] (true for [`Error::Conflict`]); implement it for your error
/// type to use [`retry_on_conflict`] with functions that return it.
///
/// ```
/// use idem_runtime::IsConflict;
/// enum ShopError { Idem(idem_runtime::Error), SoldOut }
/// impl IsConflict for ShopError {
///     fn is_conflict(&self) -> bool {
///         matches!(self, ShopError::Idem(e) if e.is_conflict())
///     }
/// }
/// assert!(!ShopError::SoldOut.is_conflict());
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot tell a lost optimistic race from other errors",
    label = "retrying on conflict needs `{Self}: idem_runtime::IsConflict`",
    note = "implement `idem_runtime::IsConflict` for `{Self}`: `is_conflict` is true for the \
            variant that carries `idem_runtime::Error::Conflict` (see `Error::is_conflict`)"
)]
pub trait IsConflict {
    /// True if the operation lost a compare-and-set race.
    fn is_conflict(&self) -> bool;
}

impl IsConflict for Error {
    fn is_conflict(&self) -> bool {
        matches!(self, Error::Conflict { .. })
    }
}

/// Runs `op` until it returns anything but a conflict, at most `policy.attempts()` times,
/// with jittered backoff between runs; the last conflict is returned if all runs lose.
///
/// `op` must redo the whole read-compute-write each time (load again, then write with
/// the new version): retrying only the write would fail forever.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), idem_runtime::Error> {
/// use idem_runtime::{Idem, retry_on_conflict};
/// use idem_runtime::toolbox::{Optimistic, Retry};
/// static POINTS: Optimistic = Optimistic::new("loyalty::points");
/// let idem = Idem::builder().build();
/// let version = retry_on_conflict(&Retry::DEFAULT, || async {
///     let current = idem.load::<u64>(&POINTS, "alice").await?;
///     let (points, version) = current.map_or((0, 0), |v| (v.value, v.version));
///     idem.compare_and_set(&POINTS, "alice", version, points + 10).await
/// })
/// .await?;
/// assert_eq!(version, 1);
/// # Ok(()) }
/// ```
pub async fn retry_on_conflict<T, E, F, Fut>(policy: &Retry, mut op: F) -> Result<T, E>
where
    E: IsConflict,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut retry = 0;
    loop {
        match op().await {
            Err(e) if e.is_conflict() && retry + 1 < policy.attempts => {
                tokio::time::sleep(policy.delay(retry)).await;
                retry += 1;
            }
            other => return other,
        }
    }
}

/// A family of versioned values: its name (part of every key, as a function's path is
/// for dedup), how long a value lives, and how [`Idem::update`] retries.
///
/// ```
/// use std::time::Duration;
/// use idem_runtime::toolbox::{Optimistic, Retry};
/// static BALANCE: Optimistic = Optimistic::new("bank::balance").retry(Retry::new(100));
/// static SESSION: Optimistic = Optimistic::new("web::session").ttl(Duration::from_secs(3600));
/// # let _ = (&BALANCE, &SESSION);
/// ```
#[derive(Debug, Clone)]
pub struct Optimistic {
    name: &'static str,
    ttl: Option<Duration>,
    retry: Retry,
}

impl Optimistic {
    /// Values named `name`, kept without expiry, retried with [`Retry::DEFAULT`].
    pub const fn new(name: &'static str) -> Self {
        Optimistic {
            name,
            ttl: None,
            retry: Retry::DEFAULT,
        }
    }

    /// Each write lives `ttl` from when it is made (default: no expiry). After a value
    /// expires its versions restart at 1, so `ttl` must outlast any read-modify-write.
    pub const fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// How [`Idem::update`] retries on conflict.
    pub const fn retry(mut self, retry: Retry) -> Self {
        self.retry = retry;
        self
    }

    /// The name.
    pub const fn name(&self) -> &'static str {
        self.name
    }

    /// The retry policy.
    pub const fn retry_policy(&self) -> &Retry {
        &self.retry
    }
}

/// A value read with its version. Write it back with the version to detect a race.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Versioned<T> {
    /// The value.
    pub value: T,
    /// Its version: 1 for the first write, one more for each later write.
    pub version: u64,
}

/// [`Idem::load`]'s flow.
pub(crate) async fn load<T: Serialize + DeserializeOwned>(
    idem: &Idem,
    family: &Optimistic,
    key: impl fmt::Display,
) -> Result<Option<Versioned<T>>, Error> {
    let key = idem.versioned_key(family, key);
    let Some(stored) = versioned(&**idem.store())?.load_versioned(&key).await? else {
        return Ok(None);
    };
    let value =
        <ReplayOk as Codec<T, ()>>::decode(&key, &stored.value)?.map_err(|()| Error::Corrupt {
            key,
            reason: "a versioned value holds an error result".into(),
        })?;
    Ok(Some(Versioned {
        value,
        version: stored.version,
    }))
}

/// [`Idem::compare_and_set`]'s flow.
pub(crate) async fn compare_and_set<T: Serialize + DeserializeOwned>(
    idem: &Idem,
    family: &Optimistic,
    key: impl fmt::Display,
    expected: u64,
    value: T,
) -> Result<u64, Error> {
    let key = idem.versioned_key(family, key);
    let (bytes, _) = encode(&key, value)?;
    cas_bytes(idem, family, key, expected, bytes).await
}

/// Writes the encoded `bytes` if the version is still `expected`.
async fn cas_bytes(
    idem: &Idem,
    family: &Optimistic,
    key: Key,
    expected: u64,
    bytes: bytes::Bytes,
) -> Result<u64, Error> {
    match versioned(&**idem.store())?
        .compare_and_set(&key, expected, bytes, family.ttl)
        .await?
    {
        Some(version) => Ok(version),
        None => Err(Error::Conflict { key }),
    }
}

/// [`Idem::update`]'s flow.
pub(crate) async fn update<T, E, F>(
    idem: &Idem,
    family: &Optimistic,
    key: impl fmt::Display,
    mut f: F,
) -> Result<Versioned<T>, E>
where
    T: Serialize + DeserializeOwned,
    E: From<Error>,
    F: FnMut(Option<T>) -> Result<T, E>,
{
    let key = format!("{key}");
    let record = idem.versioned_key(family, &key);
    let mut retry = 0;
    loop {
        let current = load::<T>(idem, family, &key).await?;
        let expected = current.as_ref().map_or(0, |v| v.version);
        let (bytes, value) = encode(&record, f(current.map(|v| v.value))?)?;
        match cas_bytes(idem, family, record, expected, bytes).await {
            Ok(version) => return Ok(Versioned { value, version }),
            Err(e) if e.is_conflict() && retry + 1 < family.retry.attempts => {
                tokio::time::sleep(family.retry.delay(retry)).await;
                retry += 1;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// The stored envelope of `value` (the same checksummed layout as dedup records), and
/// the value back.
/// The store's versioned values, or [`Error::Unsupported`] for a store without them.
fn versioned(store: &dyn Store) -> Result<&dyn VersionedStore, Error> {
    store
        .versioned()
        .ok_or(Error::Unsupported("versioned values"))
}

fn encode<T: Serialize + DeserializeOwned>(
    key: &Key,
    value: T,
) -> Result<(bytes::Bytes, T), Error> {
    let result: Result<T, ()> = Ok(value);
    let bytes = <ReplayOk as Codec<T, ()>>::encode(key, &result)?;
    match (bytes, result) {
        (Some(b), Ok(v)) => Ok((b, v)),
        _ => Err(Error::Codec {
            key: *key,
            message: "the value was not encoded".into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attribute_policies_fill_in_the_defaults() {
        let ms = Duration::from_millis;
        assert_eq!(attribute_policy(None, None, None), Retry::DEFAULT);
        assert_eq!(attribute_policy(Some(50), None, None), Retry::new(50));
        assert_eq!(
            attribute_policy(Some(50), Some(ms(1)), Some(ms(50))),
            Retry::new(50).backoff(ms(1), ms(50))
        );
        // One bound given: the other keeps its default unless that would invert them.
        assert_eq!(
            attribute_policy(None, Some(ms(5)), None),
            Retry::DEFAULT.backoff(ms(5), ms(100))
        );
        assert_eq!(
            attribute_policy(None, Some(ms(500)), None),
            Retry::DEFAULT.backoff(ms(500), ms(500))
        );
        assert_eq!(
            attribute_policy(None, None, Some(ms(1))),
            Retry::DEFAULT.backoff(ms(1), ms(1))
        );
        assert_eq!(
            attribute_policy(Some(0), None, None).attempts(),
            1,
            "the macro refuses 0; the policy still runs once"
        );
    }

    #[test]
    fn delay_is_capped_and_grows() {
        let r = Retry::new(5).backoff(Duration::from_millis(1), Duration::from_millis(8));
        for n in 0..30 {
            let cap = Duration::from_millis(1 << n.min(3));
            for _ in 0..50 {
                assert!(r.delay(n) <= cap, "retry {n}");
            }
        }
        assert_eq!(Retry::new(0).attempts(), 1);
    }
}
