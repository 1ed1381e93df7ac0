//! Bloom bitmaps kept in this process: the Bloom capability of the in-process store, and
//! of a `SqlStore`, which has no SQL form for them (so its filter sees only this
//! process' ids).
//!
//! Each operation is one critical section (a `std` mutex never held across an
//! `.await`), and expiry is tokio's monotonic clock, as in the in-process store.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use super::{BloomStore, BoxFuture};
use crate::{Error, Key};

/// The largest bitmap a filter may ask for: 2^32 bits (512 MiB), Redis' string limit, so a
/// filter sized for one store fits every store.
const MAX_BLOOM_BITS: u64 = 1 << 32;

/// Bloom bitmaps: few and large, so one map of individually locked bitmaps.
#[derive(Default)]
pub(crate) struct Blooms(Mutex<Filters>);

/// Keyed by the filter's digest. Filters are few, so the map's default hasher costs
/// nothing that shows.
type Filters = HashMap<[u8; 16], Arc<Mutex<Bitmap>>>;

struct Bitmap {
    words: Vec<u64>,
    size_bits: u64,
    expires_at: Option<Instant>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Blooms {
    fn check_bits(indexes: &[u64], size_bits: u64) -> Result<(), Error> {
        if size_bits == 0 || size_bits > MAX_BLOOM_BITS {
            return Err(Error::Config(format!(
                "a Bloom filter has 1 to 2^32 bits, not {size_bits}"
            )));
        }
        if indexes.iter().any(|&i| i >= size_bits) {
            return Err(Error::Config(
                "a Bloom index is past the filter's size".into(),
            ));
        }
        Ok(())
    }

    /// The live bitmap of `filter`, created empty (expiring `ttl` after now) if `create`.
    fn bitmap(
        &self,
        filter: &Key,
        size_bits: u64,
        create: Option<Option<Duration>>,
    ) -> Option<Arc<Mutex<Bitmap>>> {
        let now = Instant::now();
        let mut filters = lock(&self.0);
        let d = filter.digest();
        // Lock order is always the map, then one bitmap.
        let expired = |b: &Arc<Mutex<Bitmap>>| lock(b).expires_at.is_some_and(|e| e <= now);
        if filters.get(d).is_some_and(expired) {
            filters.remove(d);
        }
        if let Some(b) = filters.get(d) {
            return Some(b.clone());
        }
        let ttl = create?;
        // Filters are few; dropping the expired ones on each creation bounds them.
        filters.retain(|_, b| !expired(b));
        let b = Arc::new(Mutex::new(Bitmap {
            words: vec![0; size_bits.div_ceil(64) as usize],
            size_bits,
            expires_at: ttl.map(|t| now + t),
        }));
        filters.insert(*d, b.clone());
        Some(b)
    }

    fn same_size(filter: &Key, b: &Bitmap, size_bits: u64) -> Result<(), Error> {
        if b.size_bits == size_bits {
            return Ok(());
        }
        Err(Error::Config(format!(
            "Bloom filter {filter} exists with {} bits, not {size_bits}: a filter's \
             capacity and rate must not change while it lives",
            b.size_bits
        )))
    }

    fn insert(
        &self,
        filter: &Key,
        indexes: &[u64],
        size_bits: u64,
        ttl: Option<Duration>,
    ) -> Result<bool, Error> {
        Self::check_bits(indexes, size_bits)?;
        let mut all_set = true;
        if let Some(bitmap) = self.bitmap(filter, size_bits, Some(ttl)) {
            let mut b = lock(&bitmap);
            Self::same_size(filter, &b, size_bits)?;
            for &i in indexes {
                let (w, bit) = ((i / 64) as usize, 1u64 << (i % 64));
                all_set &= b.words[w] & bit != 0;
                b.words[w] |= bit;
            }
        }
        Ok(all_set)
    }

    fn contains(&self, filter: &Key, indexes: &[u64], size_bits: u64) -> Result<bool, Error> {
        Self::check_bits(indexes, size_bits)?;
        let Some(bitmap) = self.bitmap(filter, size_bits, None) else {
            return Ok(false);
        };
        let b = lock(&bitmap);
        Self::same_size(filter, &b, size_bits)?;
        Ok(indexes
            .iter()
            .all(|&i| b.words[(i / 64) as usize] & (1u64 << (i % 64)) != 0))
    }
}

impl BloomStore for Blooms {
    fn bloom_insert<'a>(
        &'a self,
        filter: &'a Key,
        indexes: &'a [u64],
        size_bits: u64,
        ttl: Option<Duration>,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(std::future::ready(
            self.insert(filter, indexes, size_bits, ttl),
        ))
    }

    fn bloom_contains<'a>(
        &'a self,
        filter: &'a Key,
        indexes: &'a [u64],
        size_bits: u64,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(std::future::ready(
            self.contains(filter, indexes, size_bits),
        ))
    }
}
