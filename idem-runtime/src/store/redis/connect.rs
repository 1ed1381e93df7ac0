//! Connection use: a few multiplexed connections, shared round-robin by every call.
//!
//! Why not one deadpool checkout per command: deadpool-redis recycles a connection with a
//! `PING` on every checkout (a second round trip) and a checked-out connection serves one
//! caller at a time, so at 50 concurrent tasks a checkout per command reaches about a
//! quarter of what a shared multiplexed connection does. A multiplexed connection
//! pipelines every caller's commands on one socket instead; a few of them (taken from the
//! user's pool once, kept checked out) spread the encoding and socket work of many tasks
//! over the executor's threads. `idem-bench` measures the three designs side by side.
//!
//! A connection that cannot be made fails the call with an [`Unreachable`](super::Unreachable)
//! naming the server and the cause.
//!
//! A connection that fails at the transport level (I/O error, dropped, or no answer
//! within the timeout) is taken out of the pool and dropped; the next call on that slot
//! checks out a fresh one, so the store recovers on its own when the server returns.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{Cmd, Pipeline, RedisError, RedisFuture, Value};

use super::unreachable::Target;
use crate::Error;

/// A multiplexed connection to a standalone server or to a cluster.
#[derive(Clone)]
pub(crate) enum Conn {
    Single(MultiplexedConnection),
    #[cfg(feature = "redis-cluster")]
    Cluster(redis::cluster_async::ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(cmd, offset, count),
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// Where connections come from: the user's (or our own) deadpool pool.
#[derive(Clone)]
pub(crate) enum Source {
    Single(deadpool_redis::Pool),
    #[cfg(feature = "redis-cluster")]
    Cluster(deadpool_redis::cluster::Pool),
    /// Whichever server the sentinels name as primary, asked anew for each connection.
    #[cfg(feature = "redis-sentinel")]
    Sentinel(std::sync::Arc<super::sentinel::SentinelSource>),
}

/// A connection checked out of the pool for good (until it fails).
enum Held {
    Single(deadpool_redis::Connection),
    #[cfg(feature = "redis-cluster")]
    Cluster(deadpool_redis::cluster::Connection),
    #[cfg(feature = "redis-sentinel")]
    Sentinel(MultiplexedConnection),
}

impl Held {
    fn conn(&self) -> Conn {
        match self {
            Held::Single(c) => Conn::Single((**c).clone()),
            #[cfg(feature = "redis-cluster")]
            Held::Cluster(c) => Conn::Cluster((**c).clone()),
            #[cfg(feature = "redis-sentinel")]
            Held::Sentinel(c) => Conn::Single(c.clone()),
        }
    }

    /// Detaches a broken connection from its pool, so the pool does not hand it out
    /// again (nor spend a recycle `PING` on it), and closes it.
    fn discard(self) {
        match self {
            Held::Single(c) => drop(deadpool_redis::Connection::take(c)),
            #[cfg(feature = "redis-cluster")]
            Held::Cluster(c) => drop(deadpool_redis::cluster::Connection::take(c)),
            #[cfg(feature = "redis-sentinel")]
            Held::Sentinel(c) => drop(c),
        }
    }
}

struct Slot {
    /// The connection and its generation. A plain mutex: held only to clone a handle.
    current: Mutex<Option<(u64, Held)>>,
    /// Single flight for (re)connecting: one caller connects, the others wait for it.
    connecting: tokio::sync::Mutex<()>,
}

/// A handle for one call: the connection, and which slot and generation it came from so
/// a transport failure can retire exactly that connection.
pub(crate) struct Lease {
    pub(crate) conn: Conn,
    slot: usize,
    generation: u64,
}

pub(crate) struct Connections {
    source: Source,
    /// What `source` connects to, for messages.
    target: Target,
    slots: Box<[Slot]>,
    next: AtomicUsize,
    generation: AtomicU64,
}

impl Connections {
    pub(crate) fn new(source: Source, target: Target, count: usize) -> Self {
        Connections {
            source,
            target,
            slots: (0..count.max(1))
                .map(|_| Slot {
                    current: Mutex::new(None),
                    connecting: tokio::sync::Mutex::new(()),
                })
                .collect(),
            next: AtomicUsize::new(0),
            generation: AtomicU64::new(1),
        }
    }

    #[cfg(feature = "redis-cluster")]
    pub(crate) fn source(&self) -> &Source {
        &self.source
    }

    pub(crate) fn target(&self) -> &Target {
        &self.target
    }

    /// A connection for one call (round-robin over the slots), if its slot has one;
    /// else the slot to [`connect`](Self::connect). Never waits.
    pub(crate) fn ready(&self) -> Result<Lease, usize> {
        let slot = self.next.fetch_add(1, Ordering::Relaxed) % self.slots.len();
        self.current(slot).ok_or(slot)
    }

    /// Fills `slot` with a connection from the pool (one caller connects, others wait).
    /// Not bounded by itself: the caller wraps it in the call's timeout.
    pub(crate) async fn connect(&self, slot: usize) -> Result<Lease, Error> {
        let s = &self.slots[slot];
        let _one = s.connecting.lock().await;
        if let Some(lease) = self.current(slot) {
            return Ok(lease);
        }
        let unreachable = |e| Error::store(self.unreachable(e));
        let held = match &self.source {
            Source::Single(pool) => Held::Single(pool.get().await.map_err(unreachable)?),
            #[cfg(feature = "redis-cluster")]
            Source::Cluster(pool) => Held::Cluster(pool.get().await.map_err(unreachable)?),
            #[cfg(feature = "redis-sentinel")]
            Source::Sentinel(s) => Held::Sentinel(
                s.connect()
                    .await
                    .map_err(|e| Error::store(self.target.unreachable(&e)))?,
            ),
        };
        let generation = self.generation.fetch_add(1, Ordering::Relaxed);
        let conn = held.conn();
        *lock(&s.current) = Some((generation, held));
        Ok(Lease {
            conn,
            slot,
            generation,
        })
    }

    /// Why the pool gave no connection.
    fn unreachable(&self, e: deadpool_redis::PoolError) -> super::Unreachable {
        use deadpool_redis::{PoolError, TimeoutType};
        match e {
            PoolError::Backend(e) => self.target.unreachable(&e),
            // No connection within the store's timeout (the pool's create timeout).
            PoolError::Timeout(TimeoutType::Create) => self.target.no_answer(e.to_string()),
            e => self.target.other(e.to_string()),
        }
    }

    fn current(&self, slot: usize) -> Option<Lease> {
        let cur = lock(&self.slots[slot].current);
        cur.as_ref().map(|(generation, held)| Lease {
            conn: held.conn(),
            slot,
            generation: *generation,
        })
    }

    /// Retires the connection `lease` came from, unless it was already replaced.
    pub(crate) fn retire(&self, lease: &Lease) {
        let old = {
            let mut cur = lock(&self.slots[lease.slot].current);
            match &*cur {
                Some((g, _)) if *g == lease.generation => cur.take(),
                _ => None,
            }
        };
        if let Some((_, held)) = old {
            held.discard();
        }
    }
}

/// Whether `e` means the connection itself is unusable (as opposed to an error reply).
pub(crate) fn is_transport_error(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || e.is_unrecoverable_error()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Nothing panics while holding these locks; recover rather than propagate poison.
    m.lock().unwrap_or_else(|p| p.into_inner())
}
