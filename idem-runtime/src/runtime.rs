//! Building the runtime handle ([`Idem`], defined in `handle.rs`), the current runtime,
//! and `Idem`'s methods for calling: the three strategies without the macro. Its other
//! methods are in `operator.rs` (operating) and `toolbox.rs` (the toolbox).

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde::de::DeserializeOwned;

use crate::codec::{Codec, ReplayOk};
use crate::handle::{Idem, Inner};
use crate::key::{Digest, KeyWriter};
use crate::options::DEFAULT_NAMESPACE;
use crate::store::memory::MemoryStore;
use crate::store::{ClaimKind, Store};
use crate::{Error, Fingerprint, Key, Options};

/// Builds an [`Idem`]; see [`Idem::builder`].
#[derive(Default)]
#[must_use]
pub struct IdemBuilder {
    store: Option<Arc<dyn Store>>,
    namespace: Option<String>,
}

impl fmt::Debug for IdemBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdemBuilder")
            .field("store", &self.store.as_ref().map(|s| s.name()))
            .field("namespace", &self.namespace)
            .finish()
    }
}

impl IdemBuilder {
    /// The store to keep records in (default: a new [`MemoryStore`]).
    pub fn store(mut self, store: impl Store) -> Self {
        self.store = Some(Arc::new(store));
        self
    }

    /// A store already shared as a trait object.
    pub fn shared_store(mut self, store: Arc<dyn Store>) -> Self {
        self.store = Some(store);
        self
    }

    /// The namespace: part of every key, so services (or environments) sharing one
    /// store never see each other's records. Default: `"idem"`. A process keeps each
    /// distinct namespace for its life (see [`Key::intern`](crate::Key::intern)), so make
    /// them from configuration, not per tenant or per request.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// The runtime.
    ///
    /// # Panics
    ///
    /// If the namespace is new and the process already keeps as many names as
    /// [`Key::intern`](crate::Key::intern) allows; [`IdemBuilder::try_build`] returns that
    /// as an error instead.
    pub fn build(self) -> Idem {
        self.try_build().unwrap_or_else(|e| panic!("{e}"))
    }

    /// The runtime, or [`Error::Config`](crate::Error::Config) if its namespace cannot be
    /// kept (see [`Key::intern`](crate::Key::intern)).
    pub fn try_build(self) -> Result<Idem, crate::Error> {
        let namespace =
            crate::intern::intern(self.namespace.as_deref().unwrap_or(DEFAULT_NAMESPACE))?;
        let store = self.store.unwrap_or_else(|| Arc::new(MemoryStore::new()));
        let digest = if store.local().is_some() {
            Digest::Local
        } else {
            Digest::Portable
        };
        Ok(Idem {
            inner: Arc::new(Inner {
                store,
                namespace,
                digest,
                lease_lost: AtomicU64::new(0),
                store_failures: AtomicU64::new(0),
            }),
        })
    }
}

/// Counters of rare events a service should alert on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Calls whose claim was lost while the body ran (their result was returned but not
    /// recorded; another owner may have run too). Non-zero means leases are too short
    /// for the bodies' pauses.
    pub lease_lost: u64,
    /// Calls whose body ran but whose result could not be recorded (store down).
    pub store_failures: u64,
}

tokio::task_local! {
    static SCOPED: Idem;
}

static GLOBAL: OnceLock<Idem> = OnceLock::new();
static FALLBACK: OnceLock<Idem> = OnceLock::new();

/// Sets the process-wide runtime. Call once at start-up; a second call is
/// [`Error::AlreadyInitialized`].
///
/// ```
/// let idem = idem_runtime::Idem::builder().namespace("shop").build();
/// idem_runtime::init(idem.clone()).unwrap();
/// assert!(matches!(idem_runtime::init(idem), Err(idem_runtime::Error::AlreadyInitialized)));
/// ```
pub fn init(idem: Idem) -> Result<(), Error> {
    GLOBAL.set(idem).map_err(|_| Error::AlreadyInitialized)
}

/// The current runtime: the enclosing [`Idem::scope`], else [`init`]'s, else the
/// process-wide default on a [`MemoryStore`].
pub fn current() -> Idem {
    Current::get().clone()
}

/// The current runtime, borrowed when it is process-wide: the hot path of every call
/// under `#[idempotent]` then touches no shared reference count.
#[doc(hidden)]
pub enum Current {
    /// [`init`]'s runtime or the fallback.
    Static(&'static Idem),
    /// A scoped runtime.
    Scoped(Idem),
}

impl std::ops::Deref for Current {
    type Target = Idem;
    fn deref(&self) -> &Idem {
        match self {
            Current::Static(idem) => idem,
            Current::Scoped(idem) => idem,
        }
    }
}

impl Current {
    /// The record key of a key template written part by part: the attribute's
    /// expansion calls it on the runtime it resolved, so [`Idem`] itself has no such
    /// public method (`Idem::key_parts` is the crate's).
    #[inline]
    pub fn key_parts(&self, opts: &Options, render: impl FnOnce(&mut KeyWriter)) -> Key {
        (**self).key_parts(opts, render)
    }

    /// Resolves the current runtime.
    pub fn get() -> Current {
        if let Ok(idem) = SCOPED.try_with(Idem::clone) {
            return Current::Scoped(idem);
        }
        if let Some(idem) = GLOBAL.get() {
            return Current::Static(idem);
        }
        Current::Static(FALLBACK.get_or_init(|| {
            warn_fallback();
            Idem::builder().build()
        }))
    }
}

/// The environment variable that, set to `1`, keeps the fallback to a process-local
/// [`MemoryStore`] quiet on stderr (the `tracing` warning is still emitted).
const QUIET_FALLBACK_ENV: &str = "IDEM_QUIET_FALLBACK";

const FALLBACK_MESSAGE: &str = "idem: no runtime configured (idem_runtime::init, Idem::scope \
     or `idem = ...` on the attribute); using a process-local MemoryStore, which does not \
     deduplicate across processes";

/// Says, once per process (the caller runs inside the fallback's `OnceLock`), that the
/// fallback is in use. A service that forgot `init` would otherwise deduplicate only
/// inside one process and nobody would know: many apps install no `tracing` subscriber,
/// so the warning also goes to stderr unless the user opted into the fallback.
fn warn_fallback() {
    tracing::warn!("{FALLBACK_MESSAGE}");
    if std::env::var_os(QUIET_FALLBACK_ENV).is_some_and(|v| v == "1") {
        return;
    }
    eprintln!(
        "{FALLBACK_MESSAGE}.\n\
         idem: call idem_runtime::init(Idem::builder().store(...).build()) at start-up; \
         to keep the in-process store on purpose, init it with a MemoryStore, \
         or set {QUIET_FALLBACK_ENV}=1"
    );
}

impl Idem {
    /// A builder.
    pub fn builder() -> IdemBuilder {
        IdemBuilder::default()
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    /// The namespace.
    pub fn namespace(&self) -> &'static str {
        self.inner.namespace
    }

    /// Counters of rare events (lost leases, unrecorded results).
    pub fn stats(&self) -> Stats {
        Stats {
            lease_lost: self.inner.lease_lost.load(Ordering::Relaxed),
            store_failures: self.inner.store_failures.load(Ordering::Relaxed),
        }
    }

    /// Runs `fut` with this runtime as the current one (for functions under
    /// `#[idempotent]` called inside it, on this task). Tasks spawned inside do not
    /// inherit it: scope them too.
    pub async fn scope<F: Future>(&self, fut: F) -> F::Output {
        SCOPED.scope(self.clone(), fut).await
    }

    /// The record key for `key` rendered under `opts` in this runtime's namespace.
    /// Nothing is allocated for the rendering: it streams into the digest.
    pub fn key(&self, opts: &Options, key: fmt::Arguments<'_>) -> Key {
        // Writing into the digest cannot fail (see `Key::new`).
        self.key_parts(opts, |w| {
            let _ = fmt::Write::write_fmt(w, key);
        })
    }

    /// The record key of a key template written part by part (see [`KeyWriter`]). The
    /// same key as [`Idem::key`] with the rendered text.
    #[inline]
    pub(crate) fn key_parts(&self, opts: &Options, render: impl FnOnce(&mut KeyWriter)) -> Key {
        let ns = self.inner.namespace;
        let prefix = match self.inner.digest {
            Digest::Local => Some(opts.local_prefix(ns)),
            Digest::Portable => None,
        };
        KeyWriter::key(self.inner.digest, prefix, ns, opts.scope(), render)
    }

    /// The record key of a token.
    pub(crate) fn token_key(&self, token: &str) -> Key {
        let ns = self.inner.namespace;
        KeyWriter::key(self.inner.digest, None, ns, crate::key::TOKEN_SCOPE, |w| {
            w.text(token)
        })
    }

    pub(crate) fn lease_lost(&self, key: &Key, observed: bool) {
        self.inner.lease_lost.fetch_add(1, Ordering::Relaxed);
        crate::observe::lease_lost();
        tracing::warn!(
            %key,
            renewal_failed = observed,
            "the claim was lost before the result was recorded; the result is returned \
             but not stored, and another owner may have run too (lease too short?)"
        );
    }

    pub(crate) fn count_store_failure(&self) {
        self.inner.store_failures.fetch_add(1, Ordering::Relaxed);
    }
}

/// Calling: the entry points of the strategies without the macro.
impl Idem {
    /// Dedup without the macro: runs `body` once per `key` and replays its `Ok` value to
    /// every later or concurrent call with the same key (an `Err` releases the key so a
    /// retry runs). `opts` must be dedup options.
    pub fn dedup<'a, T, E, F>(
        &'a self,
        opts: &'a Options,
        key: impl fmt::Display,
        body: F,
    ) -> impl Future<Output = Result<T, E>>
    where
        T: serde::Serialize + serde::de::DeserializeOwned,
        E: From<Error>,
        F: Future<Output = Result<T, E>>,
    {
        self.dedup_with::<ReplayOk, T, E, F>(opts, key, None, body)
    }

    /// Dedup with an explicit [`Codec`] (what is stored and replayed) and an optional
    /// payload [`Fingerprint`].
    ///
    /// The key is rendered before the returned future is first polled, so a key type
    /// that is not `Send` does not make the future `!Send`.
    pub fn dedup_with<'a, C, T, E, F>(
        &'a self,
        opts: &'a Options,
        key: impl fmt::Display,
        fingerprint: Option<Fingerprint>,
        body: F,
    ) -> impl Future<Output = Result<T, E>>
    where
        C: Codec<T, E>,
        E: From<Error>,
        F: Future<Output = Result<T, E>>,
    {
        let key = self.key(opts, format_args!("{key}"));
        crate::strategy::dedup::run::<C, T, E, F>(
            self,
            opts,
            ClaimKind::Dedup,
            key,
            fingerprint,
            None,
            None,
            body,
        )
    }

    /// Lock without the macro: runs `body` while holding the lock on `key`, waiting up to
    /// `opts.wait` for it. Inside, [`fence`](crate::fence) returns the fencing token.
    pub fn lock<'a, T, E, F>(
        &'a self,
        opts: &'a Options,
        key: impl fmt::Display,
        body: F,
    ) -> impl Future<Output = Result<T, E>>
    where
        E: From<Error>,
        F: Future<Output = Result<T, E>>,
    {
        let key = self.key(opts, format_args!("{key}"));
        crate::strategy::lock::run(self, opts, key, body)
    }

    /// Issues a one-time token valid for `ttl`: at least 128 random bits from the OS
    /// RNG. Consume it with a `strategy = "token"` function (or [`Idem::consume_token`]);
    /// it is valid for every token-strategy function of this namespace.
    pub async fn issue_token(&self, ttl: Duration) -> Result<String, Error> {
        crate::strategy::token::issue(self, ttl).await
    }

    /// Consumes `token` (from [`Idem::issue_token`]) by running `body` once. A second
    /// consumption is rejected (or replayed, with a replaying codec); an unknown or
    /// expired token is [`Error::TokenInvalid`]; an `Err` from the body (not cached)
    /// returns the token to its issued state, so it can be used again.
    pub async fn consume_token<C, T, E, F>(
        &self,
        opts: &Options,
        token: &str,
        body: F,
    ) -> Result<T, E>
    where
        C: Codec<T, E>,
        E: From<Error>,
        F: Future<Output = Result<T, E>>,
    {
        let key = self.token_key(token);
        crate::strategy::dedup::run::<C, T, E, F>(
            self,
            opts,
            ClaimKind::Token,
            key,
            None,
            None,
            None,
            body,
        )
        .await
    }

    /// [`Idem::dedup`], recoverable: `args` are recorded with the claim, and a
    /// [`Recoverer`](crate::recover::Recoverer) on which the same `opts` were
    /// [registered](crate::recover::Recoverer::register) finishes the call if its caller
    /// never does.
    pub fn dedup_recoverable<'a, A, T, E, F>(
        &'a self,
        opts: &'a Options,
        key: impl fmt::Display,
        args: &A,
        body: F,
    ) -> impl Future<Output = Result<T, E>> + 'a
    where
        A: serde::Serialize + ?Sized,
        T: serde::Serialize + DeserializeOwned + 'a,
        E: From<Error> + 'a,
        F: Future<Output = Result<T, E>> + 'a,
    {
        let key = self.key(opts, format_args!("{key}"));
        let args = crate::recover::encode_args(&key, args);
        async move {
            let args = args.map_err(E::from)?;
            let kind = crate::store::ClaimKind::Dedup;
            crate::strategy::dedup::run::<crate::codec::ReplayOk, T, E, F>(
                self,
                opts,
                kind,
                key,
                None,
                Some(args),
                None,
                body,
            )
            .await
        }
    }
}
