//! Per-function options: what `#[idempotent(...)]` compiles to, and what the direct API takes.

use std::sync::OnceLock;
use std::time::Duration;

/// Which strategy a function uses; each one's module in [`strategy`](crate::strategy) is its guide.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Strategy {
    /// Run once per key; later calls replay (or reject) the stored result.
    Dedup,
    /// Mutual exclusion per key with a fencing token; nothing is stored.
    Lock,
    /// The key is a one-time token from `issue_token`; it can be consumed once.
    Token,
}

/// What a call gets when its key already completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OnDuplicate {
    /// Return the stored result.
    Replay,
    /// Return [`Error::Duplicate`](crate::Error::Duplicate).
    Reject,
}

/// The options of one idempotent function.
///
/// Built in `const` context, so the macro emits them as a `static`; the direct API takes
/// them the same way:
///
/// ```
/// use std::time::Duration;
/// use idem_runtime::Options;
///
/// static CHARGE: Options = Options::dedup("shop::charge")
///     .ttl(Duration::from_secs(24 * 3600))
///     .wait(Duration::from_secs(5));
/// assert_eq!(CHARGE.wait_for(), Duration::from_secs(5));
/// ```
#[derive(Debug, Clone)]
pub struct Options {
    pub(crate) name: &'static str,
    pub(crate) strategy: Strategy,
    pub(crate) ttl: Duration,
    pub(crate) lease: Duration,
    pub(crate) wait: Duration,
    pub(crate) on_duplicate: OnDuplicate,
    /// The local digest of (namespace, scope) for the first namespace these options were
    /// used in (see [`Key`](crate::Key)): options live in a `static` per function, so
    /// the framing of every key of that function is hashed once, not per call.
    pub(crate) local_prefix: OnceLock<(&'static str, [u8; 16])>,
    /// This function's `idem_calls_total` keys, built on its first call.
    #[cfg(feature = "metrics")]
    pub(crate) metric_keys: OnceLock<&'static CallKeys>,
}

/// `idem_calls_total` of one function, one series per outcome: built by `observe` on
/// the function's first call and kept in its options, so later calls find them in one
/// load. Defined here so that options do not depend on the module that fills them.
#[cfg(feature = "metrics")]
#[derive(Debug)]
pub(crate) struct CallKeys(pub(crate) [metrics::Key; 8]);

/// Default time a completed record (or an issued token) is kept.
pub const DEFAULT_TTL: Duration = Duration::from_secs(24 * 3600);
/// Default in-progress lease; renewed while the body runs.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// The shortest in-progress lease a call accepts: 100 ms.
///
/// While the body runs, its lease is renewed every third of it, from a timer polled
/// with the body. Below about a tenth of a second that heartbeat cannot keep up: a
/// timer tick, a store round trip and a busy executor take a good part of the period,
/// the lease ends between two renewals, a twin takes the key over, and the body runs
/// twice at once. So a shorter lease is refused rather than silently turning
/// deduplication off: `#[idempotent(lease = "...")]` refuses it at compile time, and
/// a call whose [`Options`] were given one (the direct API, options built at run time)
/// fails with [`Error::Config`](crate::Error::Config) before it claims anything.
///
/// The lease only decides how soon the key of a crashed holder is taken over, so the
/// floor costs nothing in normal operation.
///
/// ```
/// use std::time::Duration;
/// use idem_runtime::{Error, Idem, Options};
/// use idem_runtime::options::MIN_LEASE;
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// assert_eq!(MIN_LEASE, Duration::from_millis(100));
/// static TOO_SHORT: Options = Options::dedup("shop::charge").lease(Duration::from_millis(1));
/// let idem = Idem::builder().build();
/// let r = idem.dedup(&TOO_SHORT, "order-1", async { Ok::<u8, Error>(1) }).await;
/// assert!(matches!(r, Err(Error::Config(_))));
/// # }
/// ```
pub const MIN_LEASE: Duration = Duration::from_millis(100);
/// Default time a duplicate waits for its in-flight twin (or for the lock).
pub const DEFAULT_WAIT: Duration = Duration::from_secs(10);

impl Options {
    const fn new(name: &'static str, strategy: Strategy, on_duplicate: OnDuplicate) -> Self {
        Options {
            name,
            strategy,
            ttl: DEFAULT_TTL,
            lease: DEFAULT_LEASE,
            wait: DEFAULT_WAIT,
            on_duplicate,
            local_prefix: OnceLock::new(),
            #[cfg(feature = "metrics")]
            metric_keys: OnceLock::new(),
        }
    }

    /// The local-digest prefix of `namespace` and these options' scope, hashed once.
    pub(crate) fn local_prefix(&self, namespace: &'static str) -> [u8; 16] {
        match self.local_prefix.get() {
            // Interned namespaces compare by address.
            Some((ns, prefix)) if std::ptr::eq(*ns, namespace) => *prefix,
            _ => {
                let prefix = crate::key::local_prefix(namespace, self.scope());
                let _ = self.local_prefix.set((namespace, prefix));
                prefix
            }
        }
    }

    /// Dedup options for the function (or operation) called `name`. `name` is part of
    /// every key, so two operations never share records.
    pub const fn dedup(name: &'static str) -> Self {
        Self::new(name, Strategy::Dedup, OnDuplicate::Replay)
    }

    /// Lock options for `name`.
    pub const fn lock(name: &'static str) -> Self {
        Self::new(name, Strategy::Lock, OnDuplicate::Reject)
    }

    /// Token options; `name` is only used in logs, since a token is valid for every
    /// token-strategy function of its namespace.
    pub const fn token(name: &'static str) -> Self {
        Self::new(name, Strategy::Token, OnDuplicate::Reject)
    }

    /// How long a completed record is kept (dedup, token).
    pub const fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// The in-progress lease. Renewed every third of it while an async body runs, so it
    /// only decides how soon a crashed holder's key is taken over.
    ///
    /// At least [`MIN_LEASE`] (100 ms): a call with a shorter lease (zero included)
    /// fails with [`Error::Config`](crate::Error::Config) before it claims anything,
    /// since its heartbeat could not keep it. Kept as given here, so that options built
    /// in a `static` stay a `const` expression.
    pub const fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// [`Error::Config`](crate::Error::Config) if the lease is below [`MIN_LEASE`].
    /// Checked by every call before it claims: one comparison.
    #[inline]
    pub(crate) fn check_lease(&self) -> Result<(), crate::Error> {
        if self.lease >= MIN_LEASE {
            return Ok(());
        }
        Err(crate::Error::Config(format!(
            "{}: a lease of {:?} is below idem_runtime::options::MIN_LEASE ({:?}); the heartbeat \
             that renews it every third of it could not keep it, and duplicates would run \
             at once",
            self.name, self.lease, MIN_LEASE
        )))
    }

    /// How long a duplicate waits for its twin (dedup, token) or for the lock; zero fails
    /// at once.
    pub const fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// Replay or reject a completed key.
    pub const fn on_duplicate(mut self, on_duplicate: OnDuplicate) -> Self {
        self.on_duplicate = on_duplicate;
        self
    }

    /// The operation's name.
    pub const fn name(&self) -> &'static str {
        self.name
    }
    /// The strategy.
    pub const fn strategy(&self) -> Strategy {
        self.strategy
    }
    /// The completed-record ttl.
    pub const fn ttl_for(&self) -> Duration {
        self.ttl
    }
    /// The lease.
    pub const fn lease_for(&self) -> Duration {
        self.lease
    }
    /// The wait.
    pub const fn wait_for(&self) -> Duration {
        self.wait
    }
    /// The duplicate policy.
    pub const fn duplicate_policy(&self) -> OnDuplicate {
        self.on_duplicate
    }

    /// The scope these options' records are stored under, which errors, logs and
    /// [`RecordCount::function`](crate::inspect::RecordCount::function) print as the function:
    /// the name, or for tokens the scope every token of a namespace shares.
    ///
    /// ```
    /// use idem_runtime::Options;
    /// assert_eq!(Options::dedup("shop::charge").scope(), "shop::charge");
    /// assert_eq!(Options::token("shop::pay").scope(), Options::token("other").scope());
    /// ```
    pub fn scope(&self) -> &'static str {
        match self.strategy {
            Strategy::Token => crate::key::TOKEN_SCOPE,
            _ => self.name,
        }
    }
}

/// The namespace used when none is given.
pub const DEFAULT_NAMESPACE: &str = "idem";
