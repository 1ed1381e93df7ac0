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
//!   whoever ends the claim publishes), the kind (`d` dedup, `l` lock, `s` stepped
//!   dedup, `t` token), the owner's 16 bytes, the fingerprint's 16 bytes if the claim
//!   had one; a stepped claim ends with its lease deadline, a token claim with its lease
//!   deadline and the token's deadline (15 decimal digits each, ms by the Redis clock).
//!   A dedup or lock claim keeps no deadline: the key's own expiry is the lease.
//! - completed: `c`, then `-` and the value, or `f`, the fingerprint's 16 bytes and the
//!   value.
//! - issued token: `i` and the waited flag; the key's expiry is the token's.
//!
//! A record's step journal (durable steps) is a hash at `...}:steps`, one field per step
//! name: `d` (done) or `i` (an intent), when it was written (15 decimal digits, ms by the
//! Redis clock), then the value. The field named by the single byte `0xFF` (never a step
//! name: those are UTF-8) keeps the fingerprint of the last claim with one that wrote a
//! step. The journal lives at least the ttl it is written with (the record's lease plus
//! its ttl) after each write: a step that finds less left sets the journal's expiry, and
//! the record's, to the lease deadline plus that ttl, so the later steps of the same
//! lease write no expiry. It survives a release or an expired lease, and is dropped by a
//! completion or a `forget`.
//!
//! A dedup claim's first step makes its record *stepped* (`d` becomes `s`): the lease
//! moves into the record as a deadline, and the key lives at least as long as the
//! journal. So while a journal lives its record exists, even released (its deadline then
//! all zeros) or abandoned (its deadline past), and the next claim meets it: one of
//! another payload is refused ([`ClaimOutcome::OtherPayload`](crate::store::ClaimOutcome::OtherPayload)),
//! any other takes the record over and resumes the journal, in one script. A stepped
//! record whose lease ended is no record to [`inspect`](crate::Store::inspect), `forget`
//! or `idem stats`, only its journal's keeper. A call without steps never touches a
//! journal.
//!
//! Anything else under a record's name (another type, an unknown state byte, a record
//! cut short) is reported as [`Error::Corrupt`], never replayed; that includes the hash
//! records of idem versions before this layout, until they expire. Needs Redis 7.0 or
//! later (`SET … NX GET`).
//!
//! # Round trips
//!
//! Each [`Store`](crate::Store) method is one atomic step: a native command where one suffices, else
//! one Lua script run by SHA (`EVALSHA`, reloaded on `NOSCRIPT`).
//!
//! - A dedup claim is `SET rec <in-progress record> NX GET PX lease`: no reply is a new
//!   claim, a completed record a replay; anything else (held by another owner, a stepped
//!   record to resume, a token, garbage) goes to the claim script, which answers busy,
//!   takes a stepped record or a token over (with its journal, in the same reply), refuses
//!   another payload, or reports corruption. So a new key costs that `SET` and a
//!   completion, a replay one `SET`, a resumed body one more script.
//! - Each durable step is one script: check the owner and the lease, write the entry
//!   (the first step of a dedup claim also makes the record stepped, and the first of
//!   each lease sets the expiries).
//! - Completion, release and renewal are small scripts: read the record, compare the
//!   owner's bytes (and a kept lease deadline), then `SET … PX`, `DEL` or `PEXPIRE`
//!   (a stepped record: `SET … KEEPTTL` on release, `PEXPIREAT … GT` on renewal), and
//!   `PUBLISH` only if somebody waited. Only a stepped or token claim's completion drops
//!   a journal.
//! - A lock acquisition is one script (`SET … NX GET PX`, then the fence counter's
//!   `INCR`; the counter's expiry is set when it starts, and a new one starts from the
//!   Redis clock in microseconds, so fences only grow); a release one more.
//! - Issuing a token is `SET rec i- NX PX ttl`; consuming it a claim script and a completion.
//!
//! Expiry is Redis' own (`PX`, and `TIME` inside scripts for deadlines kept in a stepped
//! or token claim), never the client's clock.
//!
//! Every script reads the Redis clock by arithmetic (`t[1] * 1000 + …`), as held.lua does
//! the kept deadline once its digits are checked (`ld + 0`) and step.lua its ttl, rather
//! than by `tonumber` (kept off those paths, and where its `nil` for garbage is the
//! check); and the 15-digit deadlines and entry times are written with `%015d` rather
//! than `%015.0f`. In Redis 7.0's Lua a `tonumber` call costs about 0.2 µs and a `%.0f`
//! format about 1 µs more than `%d`, which made up a seventh of a step script's own time.
//!
//! # Connections, waiting, timeouts
//!
//! Calls share a few multiplexed connections round-robin (see [`RedisStoreBuilder::connections`]);
//! a duplicate waiting for its twin is woken through pub/sub within milliseconds of the
//! twin finishing; every call is bounded by [`RedisStoreBuilder::timeout`] and fails
//! with [`Error::Store`], and a broken connection is replaced on the next call, so the
//! store recovers by itself when the server returns. A call that cannot connect fails
//! with an [`Unreachable`] as the error's source, naming the server (or the Cluster's
//! nodes, or the Sentinel service) and the [`Cause`]: refused, name lookup,
//! authentication, TLS, no answer, no reachable node, no primary.

mod builder;
#[cfg(feature = "redis-cluster")]
mod cluster;
mod connect;
mod inspection;
mod journal;
mod notify;
mod record;
mod recovery;
mod replicas;
mod reply;
#[cfg(feature = "redis-sentinel")]
mod sentinel;
mod store_impl;
#[cfg(test)]
mod tests;
mod toolbox;
mod unreachable;

use std::sync::Arc;
use std::time::Duration;

use redis::{Cmd, ErrorKind, RedisError, Script, ServerErrorKind, Value};

#[cfg(feature = "redis-cluster")]
use self::connect::Source;
use self::connect::{Connections, is_transport_error};
use self::notify::Notifier;
use self::record::hex32;
pub use self::replicas::NotReplicated;
use self::replicas::Wait;
use self::reply::bool_reply;
/// The one error of every store that cannot be reached, here too for its old path.
pub use crate::store::{Cause, Unreachable};
use crate::{Error, Key};

pub use builder::RedisStoreBuilder;
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

/// A [`Store`](crate::Store) in Redis, shared by every process that uses the same server and prefix.
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
    wait: Option<Wait>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.inner.prefix)
            .field("timeout", &self.inner.timeout)
            .finish_non_exhaustive()
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
        Ok(self.exec_with(script, cmd, None).await?.map(|(v, _)| v))
    }

    /// [`exec`](Self::exec), and with `wait`, `cmd` followed by `WAIT` in the same round
    /// trip; then `WAIT`'s reply comes back too (for [`Wait::check`]), and the bound is
    /// the timeout plus the wait.
    async fn exec_with(
        &self,
        script: Option<&Script>,
        cmd: &Cmd,
        wait: Option<&Wait>,
    ) -> Result<Result<(Value, Option<Value>), RedisError>, Error> {
        let inner = &*self.inner;
        let bound = inner.timeout + wait.map_or(Duration::ZERO, |w| w.timeout);
        let deadline = tokio::time::Instant::now() + bound;
        let timed_out = || Error::store(TimedOut { timeout: bound });
        let mut lease = match inner.conns.ready() {
            Ok(lease) => lease,
            Err(slot) => Box::pin(tokio::time::timeout_at(deadline, inner.conns.connect(slot)))
                .await
                .map_err(|_| Error::store(inner.conns.target().timed_out(bound)))??,
        };
        let run = async {
            if let Some(wait) = wait {
                return Box::pin(waited(script, cmd, wait, &mut lease.conn)).await;
            }
            match cmd.query_async::<Value>(&mut lease.conn).await {
                Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                    match script {
                        Some(script) => Box::pin(reload(script, cmd, &mut lease.conn)).await,
                        None => Err(e),
                    }
                }
                r => r,
            }
            .map(|v| (v, None))
        };
        match tokio::time::timeout_at(deadline, run).await {
            Ok(Ok(v)) => Ok(Ok(v)),
            Ok(Err(e)) => {
                // A demoted primary (after a failover) answers writes with READONLY:
                // drop the connection so the next call finds the new primary.
                if is_transport_error(&e) || e.code() == Some("READONLY") {
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

    /// [`eval`](Self::eval) of a write that must reach the replicas asked for
    /// ([`RedisStoreBuilder::wait_for_replicas`]): its reply, and the check to make if
    /// the script did write.
    async fn eval_acked(
        &self,
        script: &Script,
        cmd: Cmd,
    ) -> Result<(Value, impl FnOnce() -> Result<(), Error> + use<'_>), Error> {
        let wait = self.inner.wait.as_ref();
        let (v, reply) = self
            .exec_with(Some(script), &cmd, wait)
            .await?
            .map_err(Error::store)?;
        Ok((v, move || wait.map_or(Ok(()), |w| w.check(reply.as_ref()))))
    }

    /// Runs a script that answers 1/0 (or a corrupt-record report).
    async fn eval_bool(&self, key: &Key, script: &Script, cmd: Cmd) -> Result<bool, Error> {
        bool_reply(key, self.eval(script, cmd).await?)
    }

    /// [`eval_bool`](Self::eval_bool) of a write whose 1 must reach the replicas asked for.
    async fn eval_bool_acked(&self, key: &Key, script: &Script, cmd: Cmd) -> Result<bool, Error> {
        let (v, confirm) = self.eval_acked(script, cmd).await?;
        let done = bool_reply(key, v)?;
        if done {
            confirm()?;
        }
        Ok(done)
    }

    /// Whether this store's kind of connections is a Cluster.
    pub(crate) fn is_cluster(&self) -> bool {
        #[cfg(feature = "redis-cluster")]
        return matches!(self.inner.conns.source(), Source::Cluster(_));
        #[cfg(not(feature = "redis-cluster"))]
        false
    }
}

/// `cmd` and `WAIT` in one pipeline (reloading `script` on `NOSCRIPT`, as [`reload`]).
/// An error reply to `cmd` is the error; otherwise its reply and `WAIT`'s.
async fn waited(
    script: Option<&Script>,
    cmd: &Cmd,
    wait: &Wait,
    conn: &mut self::connect::Conn,
) -> Result<(Value, Option<Value>), RedisError> {
    use redis::aio::ConnectionLike as _;
    let mut pipe = redis::Pipeline::with_capacity(2);
    pipe.add_command(cmd.clone()).add_command(wait.cmd());
    let mut replies = conn.req_packed_commands(&pipe, 0, 2).await?;
    if let (Some(script), Some(Value::ServerError(e))) = (script, replies.first())
        && e.kind() == Some(ServerErrorKind::NoScript)
    {
        script.load_async(conn).await?;
        replies = conn.req_packed_commands(&pipe, 0, 2).await?;
    }
    let mut replies = replies.into_iter();
    match replies.next() {
        Some(Value::ServerError(e)) => Err(e.into()),
        Some(v) => Ok((v, replies.next())),
        None => Err(RedisError::from((
            ErrorKind::Client,
            "no reply to a pipelined write",
        ))),
    }
}

/// Loads `script` (the server answered `NOSCRIPT`: it restarted or was flushed) and
/// sends its `EVALSHA` again.
async fn reload(
    script: &Script,
    cmd: &Cmd,
    conn: &mut self::connect::Conn,
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
