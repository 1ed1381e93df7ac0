//! [`RedisStore`]: records in Redis (standalone or Cluster), shared by every process.
//!
//! # Layout
//!
//! A record is one string, `{prefix}{namespace}:{scope}:{<digest>}`, and a lock's fencing
//! counter sits beside it at `...:fence`. The digest is the key's hash tag, so in a
//! Cluster both keys of a record live in one slot and every script touches one node.
//! The string is one state byte and what that state needs, at fixed places:
//!
//! - in progress: `p`, a waited flag (`-`, or `w` once a `Busy` answer was given, so
//!   whoever ends the claim publishes), the kind (`d` dedup, `l` lock, `t` token), the
//!   owner's 16 bytes, the fingerprint's 16 bytes if the claim had one; a token claim
//!   ends with its lease deadline and the token's deadline (15 decimal digits each, ms
//!   by the Redis clock). A dedup or lock claim keeps no deadline: the key's own expiry
//!   is the lease.
//! - completed: `c`, then `-` and the value, or `f`, the fingerprint's 16 bytes and the
//!   value.
//! - issued token: `i` and the waited flag; the key's expiry is the token's.
//!
//! Anything else under a record's name (another type, an unknown state byte, a record
//! cut short) is reported as [`Error::Corrupt`], never replayed; that includes the hash
//! records of idem versions before this layout, until they expire. Needs Redis 7.0 or
//! later (`SET … NX GET`).
//!
//! # Round trips
//!
//! Each [`Store`] method is one atomic step: a native command where one suffices, else
//! one Lua script run by SHA (`EVALSHA`, reloaded on `NOSCRIPT`).
//!
//! - A dedup claim is `SET rec <in-progress record> NX GET PX lease`: no reply is a new
//!   claim, a completed record a replay; anything else (held by another owner, a token,
//!   garbage) goes to the claim script, which answers busy, takes a token over, or
//!   reports corruption. So a new key costs that `SET` and a completion, a replay one `SET`.
//! - Completion, release and renewal are small scripts: read the record, compare the
//!   owner's bytes, then `SET … PX`, `DEL` or `PEXPIRE`, and `PUBLISH` only if somebody
//!   waited.
//! - A lock acquisition is one script (`SET … NX GET PX`, then the fence counter's
//!   `INCR`; the counter's expiry is set when it starts, and a new one starts from the
//!   Redis clock in microseconds, so fences only grow); a release one more.
//! - Issuing a token is `SET rec i- NX PX ttl`; consuming it a claim script and a completion.
//!
//! Expiry is Redis' own (`PX`, and `TIME` inside scripts for deadlines kept in a token
//! claim), never the client's clock.
//!
//! # Connections, waiting, timeouts
//!
//! Calls share a few multiplexed connections round-robin (see [`RedisStoreBuilder::connections`]);
//! a duplicate waiting for its twin is woken through pub/sub within milliseconds of the
//! twin finishing; every call is bounded by [`RedisStoreBuilder::timeout`] and fails
//! with [`Error::Store`], and a broken connection is replaced on the next call, so the
//! store recovers by itself when the server returns.

mod conn;
mod notify;
mod operate;
mod toolbox;

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use bytes::Bytes;

use redis::{Cmd, ErrorKind, RedisError, Script, ServerErrorKind, Value};

use self::conn::{Connections, Source, is_transport_error};
use self::notify::Notifier;
use super::{
    BoxFuture, ClaimKind, ClaimOutcome, ClaimRequest, Owner, Settle, Store, Subscription,
    TransitionOutcome, TransitionRequest, VersionedBytes,
};
use crate::{Error, Fingerprint, Key};

pub use deadpool_redis;
pub use redis;

/// The default bound on each store call.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);
/// The default prefix of every key the store writes.
pub const DEFAULT_PREFIX: &str = "idem:";
/// The default number of multiplexed connections calls are spread over.
pub const DEFAULT_CONNECTIONS: usize = 4;
/// The default lifetime of a lock's fencing counter (from its first use).
pub const DEFAULT_FENCE_TTL: Duration = Duration::from_secs(30 * 24 * 3600);

static CLAIM: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("claim.lua")));
// Complete, release and renew start alike: held.lua reads and checks the record and its
// owner for each of them.
static COMPLETE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("held.lua"),
        include_str!("complete.lua")
    ))
});
static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("held.lua"),
        include_str!("release.lua")
    ))
});
static RENEW: LazyLock<Script> =
    LazyLock::new(|| Script::new(concat!(include_str!("held.lua"), include_str!("renew.lua"))));

/// A [`Store`] in Redis, shared by every process that uses the same server and prefix.
///
/// Cheap to clone (clones share connections). Connects lazily: building it never blocks,
/// and a server that is down only fails the calls made while it is down.
///
/// ```no_run
/// use idem_runtime::{Idem, RedisStore};
/// # fn main() -> Result<(), idem_runtime::Error> {
/// let idem = Idem::builder()
///     .store(RedisStore::connect("redis://127.0.0.1:6379")?)
///     .namespace("shop")
///     .build();
/// # let _ = idem; Ok(()) }
/// ```
///
/// Options through [`RedisStore::builder`]:
///
/// ```no_run
/// use std::time::Duration;
/// use idem_runtime::RedisStore;
/// # fn main() -> Result<(), idem_runtime::Error> {
/// let store = RedisStore::builder()
///     .timeout(Duration::from_millis(500))
///     .prefix("billing:idem:")
///     .connect("redis://:secret@10.0.0.5:6379/2")?;
/// # let _ = store; Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    conns: Connections,
    notifier: Arc<Notifier>,
    prefix: String,
    timeout: Duration,
    fence_ttl_ms: u64,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.inner.prefix)
            .field("timeout", &self.inner.timeout)
            .finish_non_exhaustive()
    }
}

/// Options of a [`RedisStore`]; made by [`RedisStore::builder`].
#[derive(Debug, Clone)]
#[must_use]
pub struct RedisStoreBuilder {
    timeout: Duration,
    prefix: String,
    connections: usize,
    fence_ttl: Duration,
    pubsub_urls: Vec<String>,
}

impl Default for RedisStoreBuilder {
    fn default() -> Self {
        RedisStoreBuilder {
            timeout: DEFAULT_TIMEOUT,
            prefix: DEFAULT_PREFIX.to_owned(),
            connections: DEFAULT_CONNECTIONS,
            fence_ttl: DEFAULT_FENCE_TTL,
            pubsub_urls: Vec::new(),
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
    /// [`connect`](Self::connect) and [`connect_cluster`](Self::connect_cluster) set it
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

    /// A store on the standalone server at `url` (`redis://[user:password@]host:port[/db]`,
    /// or `rediss://` with the `tls` feature). Does not connect yet; fails only on a
    /// malformed URL.
    ///
    /// ```no_run
    /// let store = idem_runtime::RedisStore::builder().connect("redis://127.0.0.1:6379")?;
    /// # Ok::<(), idem_runtime::Error>(())
    /// ```
    pub fn connect(mut self, url: &str) -> Result<RedisStore, Error> {
        install_tls_provider(url);
        let bad = |e: redis::RedisError| Error::Config(format!("redis URL: {e}"));
        let conf = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout));
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
        self.build(Source::Single(pool))
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
        self.assemble(Source::Single(pool), clients)
    }

    /// A store on the Redis Cluster reached through any of `urls` (feature
    /// `redis-cluster`). Keys of one record share a hash tag, so each call touches one
    /// slot.
    ///
    /// ```no_run
    /// let store = idem_runtime::RedisStore::builder()
    ///     .connect_cluster(&["redis://127.0.0.1:7000", "redis://127.0.0.1:7001"])?;
    /// # Ok::<(), idem_runtime::Error>(())
    /// ```
    #[cfg(feature = "redis-cluster")]
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
        let mut pubsub = urls;
        pubsub.append(&mut self.pubsub_urls);
        self.pubsub_urls = pubsub;
        self.build(Source::Cluster(pool))
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
    #[cfg(feature = "redis-cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis-cluster")))]
    pub fn from_cluster_pool(self, pool: deadpool_redis::cluster::Pool) -> RedisStore {
        let clients = self.clients().unwrap_or_else(|e| {
            // A malformed pub/sub URL: keep the store, its waiters poll.
            tracing::warn!(error = %e, "idem: redis pub/sub disabled; waiters poll");
            Vec::new()
        });
        self.assemble(Source::Cluster(pool), clients)
    }

    fn build(self, source: Source) -> Result<RedisStore, Error> {
        let clients = self.clients()?;
        Ok(self.assemble(source, clients))
    }

    fn clients(&self) -> Result<Vec<redis::Client>, Error> {
        self.pubsub_urls
            .iter()
            .map(|u| redis::Client::open(u.as_str()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| Error::Config(format!("redis URL: {e}")))
    }

    fn assemble(self, source: Source, clients: Vec<redis::Client>) -> RedisStore {
        let channel = format!("{}notify", self.prefix);
        RedisStore {
            inner: Arc::new(Inner {
                conns: Connections::new(source, self.connections),
                notifier: Arc::new(Notifier::new(clients, channel, self.timeout)),
                prefix: self.prefix,
                timeout: self.timeout,
                fence_ttl_ms: millis(self.fence_ttl).max(1),
            }),
        }
    }
}

impl RedisStore {
    /// A store on the standalone server at `url`, with default options; see
    /// [`RedisStoreBuilder::connect`]. Does not connect yet.
    ///
    /// ```no_run
    /// let store = idem_runtime::RedisStore::connect("redis://127.0.0.1:6379")?;
    /// # Ok::<(), idem_runtime::Error>(())
    /// ```
    pub fn connect(url: &str) -> Result<RedisStore, Error> {
        RedisStoreBuilder::default().connect(url)
    }

    /// A store on connections from `pool`, with default options. Its waiters poll
    /// instead of being woken, since a pool does not reveal its server's address; use
    /// [`RedisStoreBuilder::pubsub_url`] for prompt wake-ups.
    ///
    /// ```no_run
    /// use idem_runtime::store::redis::deadpool_redis::{Config, Runtime};
    /// let pool = Config::from_url("redis://127.0.0.1:6379").create_pool(Some(Runtime::Tokio1)).unwrap();
    /// let store = idem_runtime::RedisStore::from_pool(pool);
    /// # let _ = store;
    /// ```
    pub fn from_pool(pool: deadpool_redis::Pool) -> RedisStore {
        RedisStoreBuilder::default().from_pool(pool)
    }

    /// A store on the Redis Cluster reached through `urls`, with default options
    /// (feature `redis-cluster`).
    ///
    /// ```no_run
    /// let store = idem_runtime::RedisStore::connect_cluster(&["redis://127.0.0.1:7000"])?;
    /// # Ok::<(), idem_runtime::Error>(())
    /// ```
    #[cfg(feature = "redis-cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis-cluster")))]
    pub fn connect_cluster<S: AsRef<str>>(
        urls: impl IntoIterator<Item = S>,
    ) -> Result<RedisStore, Error> {
        RedisStoreBuilder::default().connect_cluster(urls)
    }

    /// Options: timeout, key prefix, connections, pub/sub address.
    ///
    /// ```
    /// let b = idem_runtime::RedisStore::builder();
    /// # let _ = b;
    /// ```
    pub fn builder() -> RedisStoreBuilder {
        RedisStoreBuilder::default()
    }

    /// The name under which `key`'s record is stored: `{prefix}{namespace}:{scope}:{<digest>}`.
    /// The braces make the digest the Cluster hash tag.
    ///
    /// ```
    /// use idem_runtime::{Key, RedisStore};
    /// # fn main() -> Result<(), idem_runtime::Error> {
    /// let store = RedisStore::connect("redis://127.0.0.1:6379")?;
    /// let key = Key::from_str("shop", "charge", "order-42");
    /// assert!(store.record_name(&key).starts_with("idem:shop:charge:{"));
    /// # Ok(()) }
    /// ```
    pub fn record_name(&self, key: &Key) -> String {
        self.name_with(key, "")
    }

    /// The record's name followed by `suffix`, in one allocation sized for both.
    fn name_with(&self, key: &Key, suffix: &str) -> String {
        let mut s = String::with_capacity(
            self.inner.prefix.len() + key.namespace().len() + key.scope().len() + 36 + suffix.len(),
        );
        s.push_str(&self.inner.prefix);
        s.push_str(key.namespace());
        s.push(':');
        s.push_str(key.scope());
        s.push_str(":{");
        s.push_str(hex32(key.digest()).as_str());
        s.push('}');
        s.push_str(suffix);
        s
    }

    /// Runs one command on the store's own connections, bounded by its timeout, e.g. to
    /// measure a baseline through the same connections or to inspect a record.
    ///
    /// ```no_run
    /// use idem_runtime::store::redis::redis;
    /// # async fn f() -> Result<(), idem_runtime::Error> {
    /// let store = idem_runtime::RedisStore::connect("redis://127.0.0.1:6379")?;
    /// let pong: String = store.command(&redis::cmd("PING")).await?;
    /// assert_eq!(pong, "PONG");
    /// # Ok(()) }
    /// ```
    pub async fn command<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T, Error> {
        let v = self.exec(None, cmd).await?.map_err(Error::store)?;
        redis::from_redis_value(v).map_err(Error::store)
    }

    /// Runs `cmd` on the store's connections, bounded by the timeout. If `cmd` is the
    /// `EVALSHA` of `script` (from [`evalsha`]), the script is loaded on `NOSCRIPT` (a
    /// restarted or flushed server) and `cmd` sent again. A transport failure or a
    /// timeout is `Err` (and retires the connection: a hung connection would stall every
    /// call sharing it); an error reply from the server is `Ok(Err(_))`, for the caller.
    ///
    /// Every store call goes through here, and its future is part of every call's
    /// (boxed, so copied once per call): the rare paths (connecting, reloading a script)
    /// are boxed futures of their own to keep it small.
    async fn exec(
        &self,
        script: Option<&Script>,
        cmd: &Cmd,
    ) -> Result<Result<Value, RedisError>, Error> {
        let inner = &*self.inner;
        let deadline = tokio::time::Instant::now() + inner.timeout;
        let timed_out = || {
            Error::store(TimedOut {
                timeout: inner.timeout,
            })
        };
        let mut lease = match inner.conns.ready() {
            Ok(lease) => lease,
            Err(slot) => Box::pin(tokio::time::timeout_at(deadline, inner.conns.connect(slot)))
                .await
                .map_err(|_| timed_out())??,
        };
        let run = async {
            match cmd.query_async::<Value>(&mut lease.conn).await {
                Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                    match script {
                        Some(script) => Box::pin(reload(script, cmd, &mut lease.conn)).await,
                        None => Err(e),
                    }
                }
                r => r,
            }
        };
        match tokio::time::timeout_at(deadline, run).await {
            Ok(Ok(v)) => Ok(Ok(v)),
            Ok(Err(e)) => {
                if is_transport_error(&e) {
                    inner.conns.retire(&lease);
                    return Err(Error::store(e));
                }
                Ok(Err(e))
            }
            Err(_) => {
                inner.conns.retire(&lease);
                Err(timed_out())
            }
        }
    }

    /// Runs one script by SHA (`cmd` from [`evalsha`]); see [`exec`](Self::exec). Any
    /// error reply is a store error.
    async fn eval(&self, script: &Script, cmd: Cmd) -> Result<Value, Error> {
        self.exec(Some(script), &cmd).await?.map_err(Error::store)
    }

    /// Runs a script that answers 1/0 (or a corrupt-record report).
    async fn eval_bool(&self, key: &Key, script: &Script, cmd: Cmd) -> Result<bool, Error> {
        match self.eval(script, cmd).await? {
            Value::Int(n) => Ok(n == 1),
            Value::Array(items) => Err(corrupt_from(key, &items)),
            other => Err(corrupt(key, format!("unexpected reply {other:?}"))),
        }
    }

    /// Whether this store's kind of connections is a Cluster.
    #[doc(hidden)]
    pub fn is_cluster(&self) -> bool {
        !matches!(self.inner.conns.source(), Source::Single(_))
    }
}

/// rustls needs a process-wide crypto provider; install ring's for `rediss://` unless
/// the application already chose one (then this does nothing).
fn install_tls_provider(url: &str) {
    #[cfg(feature = "tls")]
    if url.starts_with("rediss:") && rustls::crypto::CryptoProvider::get_default().is_none() {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
    #[cfg(not(feature = "tls"))]
    let _ = url;
}

/// Loads `script` (the server answered `NOSCRIPT`: it restarted or was flushed) and
/// sends its `EVALSHA` again.
async fn reload(
    script: &Script,
    cmd: &Cmd,
    conn: &mut self::conn::Conn,
) -> Result<Value, RedisError> {
    script.load_async(conn).await?;
    cmd.query_async::<Value>(conn).await
}

/// The call got no answer within the store's timeout.
#[derive(Debug)]
struct TimedOut {
    timeout: Duration,
}

impl std::fmt::Display for TimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "redis did not answer within {:?}", self.timeout)
    }
}

impl std::error::Error for TimedOut {}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Leases and ttls in whole milliseconds, rounded up: Redis treats `PEXPIRE 0` as "delete
/// now", and a 0.5 ms lease should not be a zero one.
fn ceil_millis(d: Duration) -> u64 {
    let ms = millis(d);
    if Duration::from_millis(ms) < d {
        ms.saturating_add(1)
    } else {
        ms.max(1)
    }
}

/// `EVALSHA <sha> <nkeys>`, to which the caller appends keys and arguments. Built
/// directly rather than through `redis::ScriptInvocation`, which copies every key and
/// argument once more on each call.
fn evalsha(script: &Script, nkeys: usize) -> Cmd {
    let mut cmd = Cmd::with_capacity(10, 256);
    cmd.arg("EVALSHA").arg(script.get_hash()).arg(nkeys);
    cmd
}

/// 16 bytes as 32 lowercase hex digits, without a heap allocation.
struct Hex32([u8; 32]);

impl Hex32 {
    fn as_str(&self) -> &str {
        // Only ASCII hex digits are ever written.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

fn hex32(bytes: &[u8; 16]) -> Hex32 {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; 32];
    for (i, b) in bytes.iter().enumerate() {
        out[2 * i] = HEX[usize::from(b >> 4)];
        out[2 * i + 1] = HEX[usize::from(b & 15)];
    }
    Hex32(out)
}

/// The owner as 32 lowercase hex digits, without a heap allocation (toolbox records).
fn owner_hex(o: Owner) -> [u8; 32] {
    hex32(&o.0.to_be_bytes()).0
}

/// The longest in-progress record the client writes: state, waited flag, kind, owner,
/// fingerprint (a token claim's deadlines are appended by the claim script).
const CLAIM_MAX: usize = 3 + 16 + 16;

/// The in-progress record for `req`: `p`, `-` (nobody waited yet), the kind, the owner's
/// 16 bytes and the fingerprint's 16 if any. Returned with its length, on the stack.
fn in_progress(req: &ClaimRequest) -> ([u8; CLAIM_MAX], usize) {
    let mut b = [0u8; CLAIM_MAX];
    b[0] = b'p';
    b[1] = b'-';
    b[2] = match req.kind {
        ClaimKind::Dedup => b'd',
        ClaimKind::Lock => b'l',
        ClaimKind::Token => b't',
    };
    b[3..19].copy_from_slice(&req.owner.0.to_be_bytes());
    match &req.fingerprint {
        Some(f) => {
            b[19..35].copy_from_slice(&f.0);
            (b, 35)
        }
        None => (b, 19),
    }
}

fn corrupt(key: &Key, reason: impl Into<String>) -> Error {
    Error::Corrupt {
        key: *key,
        reason: reason.into(),
    }
}

fn corrupt_from(key: &Key, items: &[Value]) -> Error {
    match items {
        [Value::Int(0), Value::BulkString(b)] => corrupt(key, String::from_utf8_lossy(b)),
        _ => corrupt(key, format!("unexpected reply {items:?}")),
    }
}

fn fingerprint(key: &Key, v: Option<&Value>) -> Result<Option<Fingerprint>, Error> {
    match v {
        None | Some(Value::Nil) => Ok(None),
        Some(Value::BulkString(b)) => <[u8; 16]>::try_from(b.as_slice())
            .map(|a| Some(Fingerprint(a)))
            .map_err(|_| corrupt(key, "fingerprint of the wrong size")),
        Some(other) => Err(corrupt(key, format!("unexpected fingerprint {other:?}"))),
    }
}

/// A completed record (`c-<value>` or `cf<fingerprint><value>`) as a claim's answer. The
/// value is a view into the reply's buffer, not a copy.
fn parse_completed(key: &Key, record: Vec<u8>) -> Result<ClaimOutcome, Error> {
    let (fingerprint, at) = match record.get(..2) {
        Some(b"c-") => (None, 2),
        Some(b"cf") if record.len() >= 18 => {
            let mut f = [0u8; 16];
            f.copy_from_slice(&record[2..18]);
            (Some(Fingerprint(f)), 18)
        }
        _ => return Err(corrupt(key, "malformed completed record")),
    };
    Ok(ClaimOutcome::Completed {
        value: Bytes::from(record).slice(at..),
        fingerprint,
    })
}

/// The claim script's answer: a bare integer (the fence) for a claim, else `{tag, ...}`.
fn parse_claim(key: &Key, reply: Value) -> Result<ClaimOutcome, Error> {
    let items = match reply {
        Value::Int(fence) => {
            return Ok(ClaimOutcome::Claimed {
                fence: u64::try_from(fence).unwrap_or(0),
            });
        }
        Value::Array(items) => items,
        other => return Err(corrupt(key, format!("unexpected reply {other:?}"))),
    };
    let mut items = items.into_iter();
    let tag = items.next();
    let a = items.next();
    let b = items.next();
    match (tag, a) {
        (Some(Value::Int(2)), Some(Value::Int(ms))) => Ok(ClaimOutcome::Busy {
            retry_in: Duration::from_millis(u64::try_from(ms).unwrap_or(0)),
            fingerprint: fingerprint(key, b.as_ref())?,
        }),
        (Some(Value::Int(3)), Some(Value::BulkString(record))) => parse_completed(key, record),
        (Some(Value::Int(4)), None) => Ok(ClaimOutcome::Missing),
        (Some(Value::Int(0)), Some(Value::BulkString(why))) => {
            Err(corrupt(key, String::from_utf8_lossy(&why)))
        }
        (tag, a) => Err(corrupt(key, format!("unexpected reply {tag:?} {a:?}"))),
    }
}

impl Store for RedisStore {
    fn claim<'a>(
        &'a self,
        key: &'a Key,
        req: &'a ClaimRequest,
    ) -> BoxFuture<'a, Result<ClaimOutcome, Error>> {
        Box::pin(async move {
            let (buf, len) = in_progress(req);
            let record = &buf[..len];
            let lease = ceil_millis(req.lease);
            let channel = self.inner.notifier.channel();
            match req.kind {
                ClaimKind::Dedup => {
                    let rec = self.record_name(key);
                    let mut cmd = Cmd::with_capacity(7, rec.len() + len + 40);
                    cmd.arg("SET")
                        .arg(&rec)
                        .arg(record)
                        .arg("NX")
                        .arg("GET")
                        .arg("PX")
                        .arg(lease);
                    match self.exec(None, &cmd).await? {
                        Ok(Value::Nil) => return Ok(ClaimOutcome::Claimed { fence: 0 }),
                        Ok(Value::BulkString(b)) if b.first() == Some(&b'c') => {
                            return parse_completed(key, b);
                        }
                        // WRONGTYPE: not a string; the script says so in its words.
                        Err(e) if e.code() != Some("WRONGTYPE") => return Err(Error::store(e)),
                        // Held by another owner, a token, or garbage: the script decides.
                        _ => {}
                    }
                    let mut cmd = evalsha(&CLAIM, 1);
                    cmd.arg(&rec).arg(record).arg(lease).arg(channel);
                    parse_claim(key, self.eval(&CLAIM, cmd).await?)
                }
                ClaimKind::Lock => {
                    // One allocation for both names: the record's, then its fence counter's.
                    let names = self.name_with(key, ":fence");
                    let rec = &names[..names.len() - ":fence".len()];
                    let mut cmd = evalsha(&CLAIM, 2);
                    cmd.arg(rec)
                        .arg(&names)
                        .arg(record)
                        .arg(lease)
                        .arg(self.inner.fence_ttl_ms.max(lease + 1000));
                    parse_claim(key, self.eval(&CLAIM, cmd).await?)
                }
                ClaimKind::Token => {
                    let mut cmd = evalsha(&CLAIM, 1);
                    cmd.arg(self.record_name(key))
                        .arg(record)
                        .arg(lease)
                        .arg(channel);
                    parse_claim(key, self.eval(&CLAIM, cmd).await?)
                }
            }
        })
    }

    fn complete<'a>(
        &'a self,
        key: &'a Key,
        owner: Owner,
        value: Bytes,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            let mut cmd = evalsha(&COMPLETE, 1);
            cmd.arg(self.record_name(key))
                .arg(&owner.0.to_be_bytes()[..])
                .arg(value.as_ref())
                .arg(ceil_millis(ttl))
                .arg(self.inner.notifier.channel());
            self.eval_bool(key, &COMPLETE, cmd).await
        })
    }

    fn release<'a>(&'a self, key: &'a Key, owner: Owner) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            let mut cmd = evalsha(&RELEASE, 1);
            cmd.arg(self.record_name(key))
                .arg(&owner.0.to_be_bytes()[..])
                .arg(self.inner.notifier.channel());
            self.eval_bool(key, &RELEASE, cmd).await
        })
    }

    fn renew<'a>(
        &'a self,
        key: &'a Key,
        owner: Owner,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            let mut cmd = evalsha(&RENEW, 1);
            cmd.arg(self.record_name(key))
                .arg(&owner.0.to_be_bytes()[..])
                .arg(ceil_millis(lease));
            self.eval_bool(key, &RENEW, cmd).await
        })
    }

    fn issue<'a>(&'a self, key: &'a Key, ttl: Duration) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            // The key's expiry is the token's deadline; a claim reads it with `PTTL`.
            let rec = self.record_name(key);
            let mut cmd = Cmd::with_capacity(6, rec.len() + 32);
            cmd.arg("SET")
                .arg(&rec)
                .arg("i-")
                .arg("NX")
                .arg("PX")
                .arg(ceil_millis(ttl));
            match self.exec(None, &cmd).await?.map_err(Error::store)? {
                Value::Okay => Ok(true),
                Value::Nil => Ok(false),
                other => Err(corrupt(key, format!("unexpected reply {other:?}"))),
            }
        })
    }

    fn inspect<'a>(
        &'a self,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<Option<crate::RecordInfo>, Error>> {
        Box::pin(self.inspect_record(key))
    }

    fn forget<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.forget_record(key))
    }

    fn record_counts(&self) -> Option<&dyn crate::RecordCounts> {
        Some(self)
    }

    fn subscribe<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Subscription, Error>> {
        Box::pin(async move {
            let rec = self.record_name(key);
            Ok(self.inner.notifier.subscribe(&rec).await)
        })
    }

    fn load_versioned<'a>(
        &'a self,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<Option<VersionedBytes>, Error>> {
        Box::pin(self.tb_load_versioned(key))
    }

    fn compare_and_set<'a>(
        &'a self,
        key: &'a Key,
        expected: u64,
        value: Bytes,
        ttl: Option<Duration>,
    ) -> BoxFuture<'a, Result<Option<u64>, Error>> {
        Box::pin(self.tb_compare_and_set(key, expected, value, ttl))
    }

    fn transition<'a>(
        &'a self,
        key: &'a Key,
        req: &'a TransitionRequest<'a>,
    ) -> BoxFuture<'a, Result<TransitionOutcome, Error>> {
        Box::pin(self.tb_transition(key, req))
    }

    fn settle_transition<'a>(
        &'a self,
        key: &'a Key,
        owner: Owner,
        action: Settle,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.tb_settle_transition(key, owner, action))
    }

    fn load_state<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Option<String>, Error>> {
        Box::pin(self.tb_load_state(key))
    }

    fn bloom_insert<'a>(
        &'a self,
        filter: &'a Key,
        indexes: &'a [u64],
        size_bits: u64,
        ttl: Option<Duration>,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.tb_bloom_insert(filter, indexes, size_bits, ttl))
    }

    fn bloom_contains<'a>(
        &'a self,
        filter: &'a Key,
        indexes: &'a [u64],
        size_bits: u64,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.tb_bloom_contains(filter, indexes, size_bits))
    }

    fn name(&self) -> &'static str {
        "redis"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `rediss://` builds a store (provider installed, no panic); a call against a server
    /// that does not speak TLS is a store error.
    #[cfg(feature = "tls")]
    #[test]
    fn tls_url_connects_lazily_and_fails_cleanly() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let store = RedisStore::builder()
            .timeout(Duration::from_millis(300))
            .connect("rediss://127.0.0.1:1")
            .unwrap();
        let key = Key::from_str("t", "s", "k");
        let r = rt.block_on(store.issue(&key, Duration::from_secs(1)));
        assert!(matches!(r, Err(Error::Store(_))), "{r:?}");
    }

    #[test]
    fn lease_rounds_up_and_never_reaches_zero() {
        assert_eq!(ceil_millis(Duration::ZERO), 1);
        assert_eq!(ceil_millis(Duration::from_micros(1)), 1);
        assert_eq!(ceil_millis(Duration::from_micros(1500)), 2);
        assert_eq!(ceil_millis(Duration::from_millis(30)), 30);
    }

    #[test]
    fn garbage_replies_are_corrupt_not_panics() {
        let key = Key::from_str("t", "s", "k");
        for v in [
            Value::Nil,
            Value::Okay,
            Value::Array(vec![]),
            Value::Array(vec![Value::Int(3)]),
            Value::Array(vec![Value::Int(3), Value::Nil]),
            Value::Array(vec![Value::Int(9), Value::Int(1)]),
            Value::Array(vec![Value::Int(1), Value::Int(1)]),
            Value::Array(vec![
                Value::Int(2),
                Value::Int(5),
                Value::BulkString(vec![1, 2, 3]),
            ]),
        ] {
            assert!(
                matches!(parse_claim(&key, v.clone()), Err(Error::Corrupt { .. })),
                "{v:?}"
            );
        }
        let ok = parse_claim(
            &key,
            Value::Array(vec![Value::Int(3), Value::BulkString(b"c-x".to_vec())]),
        )
        .unwrap();
        assert_eq!(
            ok,
            ClaimOutcome::Completed {
                value: Bytes::from_static(b"x"),
                fingerprint: None
            }
        );
    }

    #[test]
    fn completed_records_parse_or_are_corrupt() {
        let key = Key::from_str("t", "s", "k");
        let mut with_fp = b"cf".to_vec();
        with_fp.extend_from_slice(&[7u8; 16]);
        with_fp.extend_from_slice(b"value");
        assert_eq!(
            parse_completed(&key, with_fp).unwrap(),
            ClaimOutcome::Completed {
                value: Bytes::from_static(b"value"),
                fingerprint: Some(Fingerprint([7; 16]))
            }
        );
        assert_eq!(
            parse_completed(&key, b"c-".to_vec()).unwrap(),
            ClaimOutcome::Completed {
                value: Bytes::new(),
                fingerprint: None
            }
        );
        for bad in [&b""[..], b"c", b"cx", b"cfshort", b"p-d", b"\xff"] {
            assert!(
                matches!(
                    parse_completed(&key, bad.to_vec()),
                    Err(Error::Corrupt { .. })
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn in_progress_records_have_their_fixed_layout() {
        let owner = Owner(0x0102_0304_0506_0708_090a_0b0c_0d0e_0f10);
        let req = ClaimRequest::new(ClaimKind::Lock, owner, Duration::from_secs(1));
        let (b, n) = in_progress(&req);
        assert_eq!(n, 19);
        assert_eq!(&b[..3], b"p-l");
        assert_eq!(&b[3..19], &owner.0.to_be_bytes());
        let req = ClaimRequest::new(ClaimKind::Dedup, owner, Duration::from_secs(1))
            .with_fingerprint(Some(Fingerprint([9; 16])));
        let (b, n) = in_progress(&req);
        assert_eq!((n, &b[..3], &b[19..35]), (35, &b"p-d"[..], &[9u8; 16][..]));
        assert_eq!(
            hex32(&[0xab; 16]).as_str(),
            "abababababababababababababababab"
        );
    }
}
