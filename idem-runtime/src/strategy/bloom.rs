//! A Bloom filter of ids kept in a store, and dedup with it as a pre-filter.
//!
//! A filter answers "definitely never inserted" or "maybe inserted" from a few bits per
//! id, never "definitely inserted". So in [`Idem::dedup_filtered`] it never decides on
//! its own: every call still goes through the exact dedup record, which is what makes
//! processing exactly-once; a "maybe" that turns out new (a false positive) runs like
//! any new id. What the filter adds is knowledge the exact record cannot give cheaply:
//! whether an id was *ever* seen within the filter's lifetime, which may be far longer
//! than the exact records are kept (see [`Verdict`]).
//!
#![doc = include_str!("guide/bloom.md")]

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::time::Instant;

use super::dedup;
use crate::codec::ReplayOk;
use crate::store::{BloomStore, ClaimKind, Store};
use crate::{Error, Idem, Key, Options};

/// Largest bitmap: 2^32 bits (512 MiB), Redis' string limit, so a filter fits every store.
const MAX_BITS: u64 = 1 << 32;
const MAX_HASHES: u32 = 32;

/// A Bloom filter of ids, sized from an expected capacity and a false-positive rate, with
/// its bits in a [`Store`] (memory: in process; Redis: one bitmap updated by one script
/// per insert, no module needed).
///
/// `m = ⌈-n·ln p / (ln 2)²⌉` bits and `k = round(m/n · ln 2)` hashes for `n` ids at rate
/// `p`: 10,000,000 ids at 1% take 95,850,584 bits (11.4 MiB) and 7 hashes. The `k` bit
/// positions of an id come from its 128-bit BLAKE3 digest by double hashing
/// (`h1 + i·h2 mod m`), so an id costs one digest, whatever `k`.
///
/// Past its capacity the rate climbs (about 5% at twice the capacity for `p` = 1%):
/// size for the ids inserted during the filter's lifetime ([`BloomFilter::ttl`]).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), idem_runtime::Error> {
/// use idem_runtime::Idem;
/// use idem_runtime::toolbox::BloomFilter;
/// let idem = Idem::builder().build();
/// let seen = BloomFilter::new(&idem, "orders::events", 1_000_000, 0.01)?;
/// assert_eq!((seen.size_bits(), seen.hashes()), (9_585_059, 7));
/// assert!(!seen.insert("evt-1").await?); // definitely new
/// assert!(seen.insert("evt-1").await?); // maybe seen (here: yes)
/// assert!(seen.contains("evt-1").await?);
/// # Ok(()) }
/// ```
pub struct BloomFilter {
    store: Arc<dyn Store>,
    /// Ids are digested as keys of this runtime under the filter's name.
    idem: Idem,
    ids: Options,
    key: Key,
    size_bits: u64,
    hashes: u32,
    ttl: Option<Duration>,
    stats: Counters,
}

#[derive(Default)]
struct Counters {
    new: AtomicU64,
    maybe: AtomicU64,
    errors: AtomicU64,
}

impl fmt::Debug for BloomFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BloomFilter")
            .field("key", &self.key)
            .field("store", &self.store.name())
            .field("size_bits", &self.size_bits)
            .field("hashes", &self.hashes)
            .field("ttl", &self.ttl)
            .finish()
    }
}

/// What a [`BloomFilter`] said, counted since it was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct BloomStats {
    /// Inserts that found the id definitely new.
    pub new: u64,
    /// Inserts that found every bit set already: seen before, or a false positive.
    pub maybe: u64,
    /// Filter calls that failed (the store was down); treated as "maybe".
    pub errors: u64,
}

/// The bitmap size and hash count for `capacity` ids at false-positive rate `fp_rate`.
fn dimensions(capacity: u64, fp_rate: f64) -> Result<(u64, u32), Error> {
    if capacity == 0 || !(fp_rate > 0.0 && fp_rate < 1.0) {
        return Err(Error::Config(format!(
            "a Bloom filter needs a capacity ≥ 1 and a rate in (0, 1), not {capacity} at {fp_rate}"
        )));
    }
    let ln2 = std::f64::consts::LN_2;
    let bits = (-(capacity as f64) * fp_rate.ln() / (ln2 * ln2)).ceil();
    if bits > MAX_BITS as f64 {
        return Err(Error::Config(format!(
            "a Bloom filter for {capacity} ids at {fp_rate} needs {bits} bits, over the 2^32 limit; \
             use several filters (e.g. one per day) or a higher rate"
        )));
    }
    let bits = (bits as u64).max(64);
    let hashes = ((bits as f64 / capacity as f64) * ln2).round() as u32;
    Ok((bits, hashes.clamp(1, MAX_HASHES)))
}

impl BloomFilter {
    /// A filter named `name` in `idem`'s store and namespace, for `capacity` ids at
    /// false-positive rate `fp_rate` (e.g. `0.01`). Nothing is written until the first
    /// insert. Filters with the same name share their bits, so every process must use
    /// the same capacity and rate (a mismatch is an [`Error::Config`] on use).
    pub fn new(
        idem: &Idem,
        name: &'static str,
        capacity: u64,
        fp_rate: f64,
    ) -> Result<Self, Error> {
        let (size_bits, hashes) = dimensions(capacity, fp_rate)?;
        Ok(BloomFilter {
            store: idem.store().clone(),
            key: idem.key(&Options::dedup("idem::bloom"), format_args!("{name}")),
            idem: idem.clone(),
            ids: Options::dedup(name),
            size_bits,
            hashes,
            ttl: None,
            stats: Counters::default(),
        })
    }

    /// Keeps the bits in `store` instead of the runtime's, e.g. a [`MemoryStore`](crate::MemoryStore)
    /// or Redis filter in front of SQL records (SQL stores have no bitmap of their own).
    /// An in-process filter sees only this process' ids; that is still safe, since the
    /// exact record decides.
    pub fn on_store(mut self, store: Arc<dyn Store>) -> Self {
        self.store = store;
        self
    }

    /// The whole filter expires `ttl` after its first insert and starts again empty
    /// (default: never). Inserts do not push the expiry back, so steady traffic cannot
    /// keep a filter alive past its capacity; to remember ids for a window, use one
    /// filter per window (e.g. name it by the day).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// The number of bits (`m`).
    pub fn size_bits(&self) -> u64 {
        self.size_bits
    }

    /// The number of hashes (`k`).
    pub fn hashes(&self) -> u32 {
        self.hashes
    }

    /// The filter's record key in the store.
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// Counts of what this filter answered.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), idem_runtime::Error> {
    /// use idem_runtime::Idem;
    /// use idem_runtime::toolbox::BloomFilter;
    /// let f = BloomFilter::new(&Idem::builder().build(), "ids", 1000, 0.01)?;
    /// f.insert("a").await?;
    /// f.insert("a").await?;
    /// assert_eq!((f.stats().new, f.stats().maybe), (1, 1));
    /// # Ok(()) }
    /// ```
    pub fn stats(&self) -> BloomStats {
        BloomStats {
            new: self.stats.new.load(Ordering::Relaxed),
            maybe: self.stats.maybe.load(Ordering::Relaxed),
            errors: self.stats.errors.load(Ordering::Relaxed),
        }
    }

    /// The `k` bit positions of `id` in `[0, m)`: pure math, no store.
    ///
    /// ```
    /// # fn main() -> Result<(), idem_runtime::Error> {
    /// use idem_runtime::Idem;
    /// use idem_runtime::toolbox::BloomFilter;
    /// let f = BloomFilter::new(&Idem::builder().build(), "ids", 1000, 0.01)?;
    /// let idx = f.indexes("evt-1");
    /// assert_eq!(idx.len(), f.hashes() as usize);
    /// assert!(idx.iter().all(|&i| i < f.size_bits()));
    /// assert_eq!(idx, f.indexes("evt-1")); // deterministic
    /// # Ok(()) }
    /// ```
    pub fn indexes(&self, id: impl fmt::Display) -> Vec<u64> {
        let key = self.idem.key(&self.ids, format_args!("{id}"));
        self.indexes_of(key.digest())
    }

    fn indexes_of(&self, d: &[u8; 16]) -> Vec<u64> {
        let mut h1 = [0u8; 8];
        let mut h2 = [0u8; 8];
        h1.copy_from_slice(&d[..8]);
        h2.copy_from_slice(&d[8..]);
        let (h1, h2) = (u64::from_le_bytes(h1), u64::from_le_bytes(h2) | 1);
        // Kirsch–Mitzenmacher: two independent hashes give k as good as independent ones.
        (0..u64::from(self.hashes))
            .map(|i| h1.wrapping_add(i.wrapping_mul(h2)) % self.size_bits)
            .collect()
    }

    /// Inserts `id`; returns `true` if it **may** have been inserted before (every bit
    /// was set), `false` if it definitely was not. One atomic store step: of concurrent
    /// inserts of one new id, exactly one gets `false`.
    ///
    /// The id is digested before the returned future is first polled, so an id type that
    /// is not `Send` does not make the future `!Send`.
    pub fn insert(
        &self,
        id: impl fmt::Display,
    ) -> impl Future<Output = Result<bool, Error>> + Send + '_ {
        let idx = self.indexes(id);
        async move {
            let maybe = blooms(&*self.store)?
                .bloom_insert(&self.key, &idx, self.size_bits, self.ttl)
                .await?;
            let counter = if maybe {
                &self.stats.maybe
            } else {
                &self.stats.new
            };
            counter.fetch_add(1, Ordering::Relaxed);
            Ok(maybe)
        }
    }

    /// Whether `id` may have been inserted (`false`: definitely not). One atomic read.
    pub fn contains(
        &self,
        id: impl fmt::Display,
    ) -> impl Future<Output = Result<bool, Error>> + Send + '_ {
        let idx = self.indexes(id);
        async move {
            blooms(&*self.store)?
                .bloom_contains(&self.key, &idx, self.size_bits)
                .await
        }
    }
}

/// The store's Bloom bitmaps, or [`Error::Unsupported`] for a store without them.
fn blooms(store: &dyn Store) -> Result<&dyn BloomStore, Error> {
    store.blooms().ok_or(Error::Unsupported("Bloom filters"))
}

/// What the filter said about an id in [`Idem::dedup_filtered`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Verdict {
    /// Definitely never seen by the filter before this call, and no twin of this call
    /// can have processed the id (see [`Idem::dedup_filtered`]).
    New,
    /// Maybe seen (or the filter could not be asked, or too long passed between the
    /// filter's answer and the body for "new" to still hold); the exact record decided.
    Maybe,
}

/// The result of [`Idem::dedup_filtered`]: the value, whether this call ran the body, and
/// what the filter said.
///
/// | verdict | ran | meaning |
/// |---|---|---|
/// | `New` | yes | a new id, processed |
/// | `Maybe` | no | a duplicate, confirmed by the exact record, skipped (value replayed) |
/// | `Maybe` | yes | a false positive, **or** an id seen before whose exact record has expired (the filter remembers longer): processed, never dropped; the body was told `Maybe` and can check its own data |
/// | `New` | no | a concurrent twin got to the exact record first |
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub struct Filtered<T> {
    /// The body's value, or the replayed one.
    pub value: T,
    /// Whether this call ran the body.
    pub ran: bool,
    /// What the filter said.
    pub verdict: Verdict,
}

/// [`Idem::dedup_filtered`]'s flow.
pub(crate) fn dedup_filtered<'a, T, E, B, F>(
    idem: &'a Idem,
    opts: &'a Options,
    filter: &'a BloomFilter,
    key: impl fmt::Display,
    body: B,
) -> impl Future<Output = Result<Filtered<T>, E>> + 'a
where
    T: Serialize + DeserializeOwned + 'a,
    E: From<Error> + 'a,
    B: FnOnce(Verdict) -> F + 'a,
    F: Future<Output = Result<T, E>> + 'a,
{
    let rendered = format!("{key}");
    let key = idem.key(opts, format_args!("{rendered}"));
    async move {
        let verdict = match filter.insert(&rendered).await {
            Ok(false) => Verdict::New,
            Ok(true) => Verdict::Maybe,
            Err(e) => {
                filter.stats.errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(filter = %filter.key, error = %e, "Bloom filter unavailable; checking the exact record");
                Verdict::Maybe
            }
        };
        let answered = Instant::now();
        let ran = AtomicBool::new(false);
        let downgraded = AtomicBool::new(false);
        let body = async {
            ran.store(true, Ordering::Relaxed);
            // A twin that inserted after us ("maybe") may have claimed first, run, and
            // had its record expire before our claim found the key free. Its record
            // lives `ttl` from its completion, which came after our insert: so only a
            // body reached well within `ttl` of our insert can trust "new".
            let verdict = if verdict == Verdict::New && answered.elapsed() >= opts.ttl_for() / 2 {
                downgraded.store(true, Ordering::Relaxed);
                Verdict::Maybe
            } else {
                verdict
            };
            body(verdict).await
        };
        let value = dedup::run::<ReplayOk, T, E, _>(
            idem,
            opts,
            ClaimKind::Dedup,
            key,
            None,
            None,
            None,
            body,
        )
        .await?;
        Ok(Filtered {
            value,
            ran: ran.load(Ordering::Relaxed),
            verdict: if downgraded.load(Ordering::Relaxed) {
                Verdict::Maybe
            } else {
                verdict
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dimensions_match_the_formulas() {
        assert_eq!(dimensions(10_000_000, 0.01).unwrap(), (95_850_584, 7));
        assert_eq!(dimensions(1_000_000, 0.001).unwrap().1, 10);
        assert!(dimensions(0, 0.01).is_err());
        assert!(dimensions(10, 1.0).is_err());
        assert!(dimensions(10, f64::NAN).is_err());
        assert!(dimensions(u64::MAX / 2, 0.01).is_err());
        // 10,000,000 ids at 1% stay under 12 MiB.
        assert!(95_850_584u64.div_ceil(8) <= 12 * 1024 * 1024);
    }

    /// The filter math alone: insert `capacity` ids, probe 1,000,000 others, and the
    /// false-positive rate is the configured one within ±50%.
    #[test]
    fn false_positive_rate_is_as_configured() {
        let idem = Idem::builder().build();
        for (capacity, rate) in [(100_000u64, 0.01), (20_000, 0.05)] {
            let f = BloomFilter::new(&idem, "fp-math", capacity, rate).unwrap();
            let mut bits = vec![0u64; f.size_bits().div_ceil(64) as usize];
            for i in 0..capacity {
                for x in f.indexes(format_args!("in-{i}")) {
                    bits[(x / 64) as usize] |= 1 << (x % 64);
                }
            }
            let probes = 1_000_000u64;
            let fp = (0..probes)
                .filter(|i| {
                    f.indexes(format_args!("out-{i}"))
                        .iter()
                        .all(|&x| bits[(x / 64) as usize] & (1 << (x % 64)) != 0)
                })
                .count();
            let measured = fp as f64 / probes as f64;
            println!("capacity {capacity} at {rate}: measured {measured}");
            assert!(
                (rate * 0.5..=rate * 1.5).contains(&measured),
                "configured {rate}, measured {measured}"
            );
        }
    }
}
