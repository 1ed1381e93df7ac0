//! Redis Cluster (feature `redis-cluster`): a store on a Cluster's pool of
//! deadpool-redis, whose connections route each command to the node of its key's slot.
//!
//! Every key of a record shares the record's hash tag (its digest in braces), so each
//! script touches one slot on one node. Pub/sub wake-ups go through the nodes' URLs; the
//! `WAIT` of `wait_for_replicas` goes to the node that took the write.

use super::builder::install_tls_provider;
use super::connect::Source;
use super::unreachable::Target;
use super::{DEFAULT_CONNECTIONS, RedisStore, RedisStoreBuilder};
use crate::Error;

impl RedisStore {
    /// A store on the Redis Cluster reached through `urls`, with default options
    /// (feature `redis-cluster`).
    ///
    /// ```no_run
    /// let store = idem_runtime::RedisStore::connect_cluster(&["redis://127.0.0.1:7000"])?;
    /// # Ok::<(), idem_runtime::Error>(())
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "redis-cluster")))]
    pub fn connect_cluster<S: AsRef<str>>(
        urls: impl IntoIterator<Item = S>,
    ) -> Result<RedisStore, Error> {
        RedisStoreBuilder::default().connect_cluster(urls)
    }
}

impl RedisStoreBuilder {
    /// A store on the Redis Cluster reached through any of `urls` (feature
    /// `redis-cluster`). Keys of one record share a hash tag, so each call touches one
    /// slot.
    ///
    /// ```no_run
    /// let store = idem_runtime::RedisStore::builder()
    ///     .connect_cluster(&["redis://127.0.0.1:7000", "redis://127.0.0.1:7001"])?;
    /// # Ok::<(), idem_runtime::Error>(())
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "redis-cluster")))]
    pub fn connect_cluster<S: AsRef<str>>(
        mut self,
        urls: impl IntoIterator<Item = S>,
    ) -> Result<RedisStore, Error> {
        let urls: Vec<String> = urls.into_iter().map(|u| u.as_ref().to_owned()).collect();
        for u in &urls {
            install_tls_provider(u);
        }
        if urls.is_empty() {
            return Err(Error::Config("redis cluster: no node URL".into()));
        }
        let cfg = deadpool_redis::cluster::Config::from_urls(urls.clone());
        let pool = cfg
            .builder()
            .map_err(|e| Error::Config(format!("redis cluster: {e}")))?
            .max_size(self.connections.max(DEFAULT_CONNECTIONS) * 2)
            .runtime(deadpool_redis::Runtime::Tokio1)
            .wait_timeout(Some(self.timeout))
            .create_timeout(Some(self.timeout))
            .recycle_timeout(Some(self.timeout))
            .build()
            .map_err(|e| Error::Config(format!("redis cluster pool: {e}")))?;
        let target = Target::cluster(&urls);
        let mut pubsub = urls;
        pubsub.append(&mut self.pubsub_urls);
        self.pubsub_urls = pubsub;
        self.build(Source::Cluster(pool), target)
    }

    /// A store on connections from a Redis Cluster `pool` (feature `redis-cluster`).
    ///
    /// ```no_run
    /// use idem_runtime::store::redis::deadpool_redis::{cluster::Config, Runtime};
    /// let pool = Config::from_urls(vec!["redis://127.0.0.1:7000".to_owned()])
    ///     .create_pool(Some(Runtime::Tokio1)).unwrap();
    /// let store = idem_runtime::RedisStore::builder()
    ///     .pubsub_url("redis://127.0.0.1:7000")
    ///     .from_cluster_pool(pool);
    /// # let _ = store;
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "redis-cluster")))]
    pub fn from_cluster_pool(self, pool: deadpool_redis::cluster::Pool) -> RedisStore {
        let clients = self.clients().unwrap_or_else(|e| {
            // A malformed pub/sub URL: keep the store, its waiters poll.
            tracing::warn!(error = %e, "idem: redis pub/sub disabled; waiters poll");
            Vec::new()
        });
        let target = Target::cluster(&self.pubsub_urls);
        self.assemble(Source::Cluster(pool), target, clients)
    }
}
