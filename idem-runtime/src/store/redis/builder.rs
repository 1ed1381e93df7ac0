//! [`RedisStoreBuilder`]: a store's options, and the ways to connect it (a URL, a pool,
//! Sentinel). A Cluster's are in the `cluster` module.

use std::sync::Arc;
use std::time::Duration;

use super::connect::{Connections, Source};
use super::notify::Notifier;
use super::record::millis;
use super::replicas::Wait;
use super::unreachable::Target;
use super::{
    DEFAULT_CONNECTIONS, DEFAULT_FENCE_TTL, DEFAULT_PREFIX, DEFAULT_TIMEOUT, Inner, RedisStore,
};
use crate::Error;

/// Options of a [`RedisStore`]; made by [`RedisStore::builder`].
#[derive(Debug, Clone)]
#[must_use]
pub struct RedisStoreBuilder {
    pub(super) timeout: Duration,
    prefix: String,
    pub(super) connections: usize,
    fence_ttl: Duration,
    pub(super) pubsub_urls: Vec<String>,
    wait: Option<Wait>,
}

impl Default for RedisStoreBuilder {
    fn default() -> Self {
        RedisStoreBuilder {
            timeout: DEFAULT_TIMEOUT,
            prefix: DEFAULT_PREFIX.to_owned(),
            connections: DEFAULT_CONNECTIONS,
            fence_ttl: DEFAULT_FENCE_TTL,
            pubsub_urls: Vec::new(),
            wait: None,
        }
    }
}

impl RedisStoreBuilder {
    /// Bounds every store call (checkout, connect and command); past it the call fails
    /// with [`Error::Store`]. Default [`DEFAULT_TIMEOUT`].
    ///
    /// ```
    /// let b = idem_runtime::RedisStore::builder().timeout(std::time::Duration::from_secs(1));
    /// # let _ = b;
    /// ```
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// The prefix of every key written (default [`DEFAULT_PREFIX`]); stores that should
    /// see each other's records use the same prefix.
    ///
    /// ```
    /// let b = idem_runtime::RedisStore::builder().prefix("app1:idem:");
    /// # let _ = b;
    /// ```
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How many multiplexed connections calls are spread over, round-robin (default
    /// [`DEFAULT_CONNECTIONS`]). Each pipelines any number of concurrent calls; more than
    /// one spreads the socket work over the executor's threads.
    ///
    /// ```
    /// let b = idem_runtime::RedisStore::builder().connections(2);
    /// # let _ = b;
    /// ```
    pub fn connections(mut self, n: usize) -> Self {
        self.connections = n.max(1);
        self
    }

    /// How long a lock's fencing counter is kept from its first use (default 30 days, and
    /// never less than a lease). Fences stay strictly increasing after it expires (a new
    /// counter starts at the Redis clock in microseconds, above anything the old one
    /// reached); the ttl only bounds memory for lock keys that are no longer used.
    ///
    /// ```
    /// let b = idem_runtime::RedisStore::builder().fence_ttl(std::time::Duration::from_secs(86_400));
    /// # let _ = b;
    /// ```
    pub fn fence_ttl(mut self, ttl: Duration) -> Self {
        self.fence_ttl = ttl;
        self
    }

    /// A server to subscribe on for wake-ups, for stores built from a pool (whose
    /// address a pool does not reveal). Without it such a store's waiters poll.
    /// [`connect`](Self::connect) and `connect_cluster` (feature `redis-cluster`) set it
    /// themselves.
    ///
    /// ```
    /// let b = idem_runtime::RedisStore::builder().pubsub_url("redis://127.0.0.1:6379");
    /// # let _ = b;
    /// ```
    pub fn pubsub_url(mut self, url: impl Into<String>) -> Self {
        self.pubsub_urls.push(url.into());
        self
    }

    /// Claims, completions and token issues succeed only once `replicas` replicas have
    /// them, as `WAIT replicas timeout` confirms in the same round trip as the write; so
    /// a failover to a replica does not lose them. Fewer replicas in time is
    /// [`Error::Store`] holding a [`NotReplicated`](super::NotReplicated), never a
    /// silent success. `0` (the default) does not wait. Such a call may take up to
    /// `timeout` more than the store's [`timeout`](Self::timeout). Releases, renewals
    /// and the toolbox's operations do not wait. On a Cluster the `WAIT` goes to the
    /// key's primary with the write. The README's failure model says what each setting
    /// keeps.
    ///
    /// ```
    /// use std::time::Duration;
    /// let b = idem_runtime::RedisStore::builder().wait_for_replicas(1, Duration::from_millis(500));
    /// # let _ = b;
    /// ```
    pub fn wait_for_replicas(mut self, replicas: usize, timeout: Duration) -> Self {
        self.wait = (replicas > 0).then_some(Wait { replicas, timeout });
        self
    }

    /// A store on the standalone server at `url` (`redis://[user:password@]host:port[/db]`,
    /// or `rediss://` with the `tls` feature). Does not connect yet; fails only on a
    /// malformed URL.
    ///
    /// ```no_run
    /// let store = idem_runtime::RedisStore::builder().connect("redis://127.0.0.1:6379")?;
    /// # Ok::<(), idem_runtime::Error>(())
    /// ```
    pub fn connect(mut self, url: &str) -> Result<RedisStore, Error> {
        if url.starts_with("redis+sentinel:") {
            return self.connect_sentinel_url(url);
        }
        install_tls_provider(url);
        let bad = |e: redis::RedisError| Error::Config(format!("redis URL: {e}"));
        let conf = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.call_bound()));
        let manager = deadpool_redis::Manager::new_with_config(url, conf).map_err(bad)?;
        let pool = deadpool_redis::Pool::builder(manager)
            .max_size(self.connections.max(DEFAULT_CONNECTIONS) * 2)
            .runtime(deadpool_redis::Runtime::Tokio1)
            .wait_timeout(Some(self.timeout))
            .create_timeout(Some(self.timeout))
            .recycle_timeout(Some(self.timeout))
            .build()
            .map_err(|e| Error::Config(format!("redis pool: {e}")))?;
        self.pubsub_urls.insert(0, url.to_owned());
        self.build(Source::Single(pool), Target::single(url))
    }

    /// A store on connections from `pool`, which the application may keep using.
    ///
    /// ```no_run
    /// use idem_runtime::store::redis::deadpool_redis::{Config, Runtime};
    /// let pool = Config::from_url("redis://127.0.0.1:6379").create_pool(Some(Runtime::Tokio1)).unwrap();
    /// let store = idem_runtime::RedisStore::builder()
    ///     .pubsub_url("redis://127.0.0.1:6379")
    ///     .from_pool(pool);
    /// # let _ = store;
    /// ```
    pub fn from_pool(self, pool: deadpool_redis::Pool) -> RedisStore {
        let clients = self.clients().unwrap_or_else(|e| {
            // A malformed pub/sub URL: keep the store, its waiters poll.
            tracing::warn!(error = %e, "idem: redis pub/sub disabled; waiters poll");
            Vec::new()
        });
        let target = Target::pool(self.pubsub_urls.first().map(String::as_str));
        self.assemble(Source::Single(pool), target, clients)
    }

    /// A store on the primary of `service` as the sentinels at `sentinels`
    /// (`host:port` each) name it (feature `redis-sentinel`); after a failover, calls
    /// go to the new primary. The URL form `redis+sentinel://h1:p1,h2:p2/SERVICE[/db]`
    /// (through [`connect`](Self::connect)) also takes a database and the data nodes'
    /// `user:password@`. Waiters poll rather than subscribe, since the primary moves.
    ///
    /// ```no_run
    /// let store = idem_runtime::RedisStore::builder()
    ///     .wait_for_replicas(1, std::time::Duration::from_millis(500))
    ///     .connect_sentinel(["10.0.0.1:26379", "10.0.0.2:26379", "10.0.0.3:26379"], "payments")?;
    /// # Ok::<(), idem_runtime::Error>(())
    /// ```
    #[cfg(feature = "redis-sentinel")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis-sentinel")))]
    pub fn connect_sentinel<S: AsRef<str>>(
        self,
        sentinels: impl IntoIterator<Item = S>,
        service: &str,
    ) -> Result<RedisStore, Error> {
        let hosts: Vec<String> = sentinels
            .into_iter()
            .map(|s| s.as_ref().to_owned())
            .collect();
        self.connect_sentinel_url(&format!("redis+sentinel://{}/{service}", hosts.join(",")))
    }

    #[cfg(feature = "redis-sentinel")]
    fn connect_sentinel_url(self, url: &str) -> Result<RedisStore, Error> {
        let parsed = super::sentinel::SentinelUrl::parse(url)?;
        let source =
            super::sentinel::SentinelSource::new(&parsed, self.timeout, self.call_bound())?;
        let target = Target::sentinel(&parsed.sentinels, &parsed.service);
        self.build(Source::Sentinel(Arc::new(source)), target)
    }

    #[cfg(not(feature = "redis-sentinel"))]
    fn connect_sentinel_url(self, _url: &str) -> Result<RedisStore, Error> {
        Err(Error::Config(
            "redis+sentinel:// needs idem-runtime's `redis-sentinel` feature".into(),
        ))
    }

    /// The longest a call may take: the timeout, plus the replicas' wait if any (a
    /// connection's own response timeout must not cut a `WAIT` short).
    fn call_bound(&self) -> Duration {
        self.timeout + self.wait.map_or(Duration::ZERO, |w| w.timeout)
    }

    pub(super) fn build(self, source: Source, target: Target) -> Result<RedisStore, Error> {
        let clients = self.clients()?;
        Ok(self.assemble(source, target, clients))
    }

    pub(super) fn clients(&self) -> Result<Vec<redis::Client>, Error> {
        self.pubsub_urls
            .iter()
            .map(|u| redis::Client::open(u.as_str()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| Error::Config(format!("redis URL: {e}")))
    }

    pub(super) fn assemble(
        self,
        source: Source,
        target: Target,
        clients: Vec<redis::Client>,
    ) -> RedisStore {
        let channel = format!("{}notify", self.prefix);
        RedisStore {
            inner: Arc::new(Inner {
                conns: Connections::new(source, target, self.connections),
                notifier: Arc::new(Notifier::new(clients, channel, self.timeout)),
                prefix: self.prefix,
                timeout: self.timeout,
                fence_ttl_ms: millis(self.fence_ttl).max(1),
                wait: self.wait,
            }),
        }
    }
}

/// rustls needs a process-wide crypto provider; install ring's for `rediss://` unless
/// the application already chose one (then this does nothing).
pub(super) fn install_tls_provider(url: &str) {
    #[cfg(feature = "tls")]
    if url.starts_with("rediss:") && rustls::crypto::CryptoProvider::get_default().is_none() {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
    #[cfg(not(feature = "tls"))]
    let _ = url;
}
