//! Picking a store from a URL, for programs configured by environment or flags.

use std::sync::Arc;

use super::Store;
use super::memory::MemoryStore;
use crate::Error;

/// Connects to the store a URL names, by its scheme:
///
/// | URL | store | feature |
/// |---|---|---|
/// | `memory` or `memory://` | [`MemoryStore`] | always |
/// | `redis://host:port/db`, `rediss://...` | `RedisStore` | `redis` (`tls` for rediss) |
/// | `redis+cluster://host:port,host:port` | `RedisStore` on a Cluster | `redis-cluster` |
/// | `redis+sentinel://host:port,host:port/SERVICE[/db]` | `RedisStore` behind Sentinel | `redis-sentinel` |
/// | `postgres://...`, `mysql://...`, `sqlite://path?mode=rwc` | `SqlStore` | `postgres`, `mysql`, `sqlite` |
///
/// A scheme whose feature is not compiled in is [`Error::Config`] naming the feature.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), idem_runtime::Error> {
/// let store = idem_runtime::store::connect("memory").await?;
/// assert_eq!(store.name(), "memory");
/// assert!(matches!(
///     idem_runtime::store::connect("ftp://nowhere").await,
///     Err(idem_runtime::Error::Config(_))
/// ));
/// # Ok(()) }
/// ```
pub async fn connect(url: &str) -> Result<Arc<dyn Store>, Error> {
    let scheme = url.split_once(':').map_or(url, |(s, _)| s);
    #[allow(unused_variables)]
    let missing = |feature: &str| -> Result<Arc<dyn Store>, Error> {
        Err(Error::Config(format!(
            "{scheme}:// needs idem-runtime's `{feature}` feature"
        )))
    };
    match scheme {
        "memory" => Ok(Arc::new(MemoryStore::new())),
        #[cfg(feature = "redis-cluster")]
        "redis+cluster" => Ok(Arc::new(super::redis::RedisStore::connect_cluster(
            url.trim_start_matches("redis+cluster://")
                .split(',')
                .map(|node| format!("redis://{node}"))
                .collect::<Vec<_>>(),
        )?)),
        #[cfg(not(feature = "redis-cluster"))]
        "redis+cluster" => missing("redis-cluster"),
        #[cfg(feature = "redis-sentinel")]
        "redis+sentinel" => Ok(Arc::new(super::redis::RedisStore::connect(url)?)),
        #[cfg(not(feature = "redis-sentinel"))]
        "redis+sentinel" => missing("redis-sentinel"),
        #[cfg(feature = "redis")]
        "redis" | "rediss" => Ok(Arc::new(super::redis::RedisStore::connect(url)?)),
        #[cfg(not(feature = "redis"))]
        "redis" | "rediss" => missing("redis"),
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => Ok(Arc::new(super::sql::SqlStore::connect(url).await?)),
        #[cfg(not(feature = "postgres"))]
        "postgres" | "postgresql" => missing("postgres"),
        #[cfg(feature = "mysql")]
        "mysql" | "mariadb" => Ok(Arc::new(super::sql::SqlStore::connect(url).await?)),
        #[cfg(not(feature = "mysql"))]
        "mysql" | "mariadb" => missing("mysql"),
        #[cfg(feature = "sqlite")]
        "sqlite" => Ok(Arc::new(super::sql::SqlStore::connect(url).await?)),
        #[cfg(not(feature = "sqlite"))]
        "sqlite" => missing("sqlite"),
        _ => Err(Error::Config(format!(
            "unknown store URL scheme {scheme:?}; expected memory, redis, rediss, \
             redis+cluster, redis+sentinel, postgres, mysql or sqlite"
        ))),
    }
}
