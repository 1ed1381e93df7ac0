//! The runtime handle's type, [`Idem`], and what it holds. Its methods are in three
//! files, by audience: `runtime.rs` (building it and calling the strategies),
//! `operator.rs` (operating) and `toolbox.rs` (the toolbox). The strategies name only
//! this type, so the files that call them make no circle with them.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use crate::key::Digest;
use crate::store::Store;

/// An idem runtime: a [`Store`] and a namespace. Cheap to clone (one `Arc`).
///
/// Functions under `#[idempotent]` use the *current* runtime: the one of an enclosing
/// [`Idem::scope`], else the one given to [`init`](crate::init), else a process-wide
/// default on a [`MemoryStore`](crate::MemoryStore), so that zero configuration still
/// works. A function can also name its runtime (`#[idempotent(key = "...", idem =
/// self.idem)]`), and then needs neither.
///
/// The fallback says so once per process, with a `tracing` warning and a line on stderr: a
/// service that forgot [`init`](crate::init) deduplicates only inside one process. To use
/// the in-process store on purpose, [`init`](crate::init) with a
/// [`MemoryStore`](crate::MemoryStore) (then nothing is said), or set the environment
/// variable `IDEM_QUIET_FALLBACK=1` to keep stderr quiet.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), idem_runtime::Error> {
/// use idem_runtime::{Idem, MemoryStore, Options};
///
/// let idem = Idem::builder().store(MemoryStore::new()).namespace("shop").build();
/// static CHARGE: Options = Options::dedup("shop::charge");
/// let first: u64 = idem.dedup(&CHARGE, "order-42", async { Ok::<_, idem_runtime::Error>(100) }).await?;
/// let again: u64 = idem.dedup(&CHARGE, "order-42", async { Ok::<_, idem_runtime::Error>(999) }).await?;
/// assert_eq!((first, again), (100, 100)); // the second body never ran
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Idem {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) namespace: &'static str,
    /// How records are named: a per-process keyed hash when the store never leaves the
    /// process, the portable digest otherwise.
    pub(crate) digest: Digest,
    pub(crate) lease_lost: AtomicU64,
    pub(crate) store_failures: AtomicU64,
}

impl fmt::Debug for Idem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Idem")
            .field("store", &self.inner.store.name())
            .field("namespace", &self.inner.namespace)
            .finish()
    }
}
