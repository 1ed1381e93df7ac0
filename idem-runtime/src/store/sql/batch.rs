//! Group commit (PostgreSQL): concurrent claims, concurrent completions, and concurrent
//! step writes of this process, each kind sent together as one statement.
//!
//! A dedup call on a new key waits for two synchronous commits, its claim's and its
//! completion's, and a connection that commits is held until the WAL is flushed. When
//! every pooled connection is busy, statements queue for a connection anyway; here they
//! queue for a batch instead, and one statement (one round trip, one commit, one flush)
//! carries all of them. What each record gets is unchanged: a claim is still decided per
//! key by one atomic insert-or-take on the database clock, a completion still requires
//! the owner's live lease, each caller gets its own record's answer, and none is
//! answered before the statement has committed.
//!
//! Gathering adds no wait. A call that finds the queue empty and a connection idle runs
//! its own statement at once, as without batching. Otherwise it joins the queue, and a
//! flusher task takes everything queued by the time it holds a connection; the calls
//! that arrive while one batch runs go out with the next. So batches form only when
//! calls would otherwise wait for a connection, and grow with the load.

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use sqlx::PgPool;
use sqlx::pool::PoolConnection;
use sqlx::postgres::PgConnection;
use tokio::sync::oneshot;

use super::BoxFuture;
use crate::Error;

/// At most this many calls per statement. A whole batch waiting behind the running ones
/// gets a flusher (a connection) of its own, so under heavy load the work spreads over a
/// few connections instead of queueing behind one.
const MAX_BATCH: usize = 32;

/// At most this many batches of one kind in flight at once (each holds a connection).
const MAX_FLUSHERS: usize = 4;

/// After a batch carried several calls, calls keep going through the queue for this
/// long even when a connection is idle: under load, a flusher that found the queue
/// empty for a moment would otherwise hand the store back to calls that each hold a
/// connection, and batching would not resume until the pool ran dry again.
const BUSY_FOR: Duration = Duration::from_secs(1);

/// A call queued this long while every flusher is busy gets a flusher of its own (one
/// slow batch, say one waiting for a row lock, must not hold up the calls behind it).
const STALLED: Duration = Duration::from_millis(50);

/// One kind of statement that can carry many calls.
pub(super) trait Job: Send + Sync + 'static {
    /// One call's arguments.
    type Item: Send + Sync + 'static;
    /// One call's answer.
    type Answer: Send + 'static;

    /// The record a call is about; a batch holds at most one call per record.
    fn id(item: &Self::Item) -> [u8; 16];

    /// Whether a call whose caller stopped waiting before its batch went out is dropped
    /// (a claim nobody will complete) rather than sent (a completion, whose effect
    /// happened).
    const DROP_ABANDONED: bool;

    /// Runs the statement for `items` (sorted by id, ids distinct) and answers each, in
    /// order.
    fn run<'c>(
        &'c self,
        conn: &'c mut PgConnection,
        items: &'c [Self::Item],
    ) -> BoxFuture<'c, Result<Vec<Self::Answer>, Error>>;
}

struct Entry<J: Job> {
    item: J::Item,
    queued: Instant,
    reply: oneshot::Sender<Result<J::Answer, Error>>,
}

/// The queue of one kind of statement of one [`SqlStore`](super::SqlStore) (shared by
/// its clones).
pub(super) struct Batcher<J: Job> {
    job: J,
    queue: Mutex<Queue<J>>,
}

struct Queue<J: Job> {
    pending: VecDeque<Entry<J>>,
    /// Flusher tasks alive.
    flushers: usize,
    /// A flusher has yet to take from the queue, so a new call needs no new one.
    taking: bool,
    /// When a batch last carried more than one call: the store has been busy since.
    shared_at: Option<Instant>,
}

impl<J: Job> Queue<J> {
    /// Whether a new flusher should start; if so, counts it. One flusher is enough
    /// while it keeps up: the calls queued while it runs a batch go out in its next one,
    /// and fewer, larger batches leave more connections to everyone else. Another starts
    /// only when a whole batch is waiting or the queue has stalled.
    fn start_flusher(&mut self) -> bool {
        let Some(oldest) = self.pending.front() else {
            return false;
        };
        let start = self.flushers == 0
            || (!self.taking
                && self.flushers < MAX_FLUSHERS
                && (self.pending.len() >= MAX_BATCH || oldest.queued.elapsed() >= STALLED));
        if start {
            self.flushers += 1;
            self.taking = true;
        }
        start
    }

    /// Up to [`MAX_BATCH`] queued calls, at most one per record (a second one for the
    /// same record waits for the next batch, so every answer is unambiguous), sorted by
    /// record: rows are then locked in id order, so two batches never wait on each other
    /// in a cycle.
    fn take(&mut self) -> Vec<Entry<J>> {
        self.taking = false;
        let mut batch: Vec<Entry<J>> = Vec::new();
        let mut rest = VecDeque::new();
        while let Some(e) = self.pending.pop_front() {
            if J::DROP_ABANDONED && e.reply.is_closed() {
                continue;
            }
            let id = J::id(&e.item);
            if batch.len() < MAX_BATCH && batch.iter().all(|b| J::id(&b.item) != id) {
                batch.push(e);
            } else {
                rest.push_back(e);
            }
        }
        self.pending = rest;
        if batch.len() > 1 {
            self.shared_at = Some(Instant::now());
        }
        batch.sort_unstable_by_key(|e| J::id(&e.item));
        batch
    }
}

impl<J: Job> Batcher<J> {
    pub(super) fn new(job: J) -> Self {
        Batcher {
            job,
            queue: Mutex::new(Queue {
                pending: VecDeque::new(),
                flushers: 0,
                taking: false,
                shared_at: None,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Queue<J>> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An idle connection for a call to run alone, when the store is not busy: nothing
    /// queued, no flusher running, no batch of several calls lately. A call then costs
    /// what it costs without batching. While the store is busy, a call joins the next
    /// batch, which is cheaper than holding a connection of its own.
    pub(super) fn alone(&self, pool: &PgPool) -> Option<PoolConnection<sqlx::Postgres>> {
        {
            let q = self.lock();
            if !q.pending.is_empty()
                || q.flushers > 0
                || q.shared_at.is_some_and(|at| at.elapsed() < BUSY_FOR)
            {
                return None;
            }
        }
        pool.try_acquire()
    }

    /// Runs `item` in the next batch.
    pub(super) async fn submit(
        self: &Arc<Self>,
        pool: &PgPool,
        timeout: Duration,
        item: J::Item,
    ) -> Result<J::Answer, Error> {
        let (reply, answer) = oneshot::channel();
        let start = {
            let mut q = self.lock();
            q.pending.push_back(Entry {
                item,
                queued: Instant::now(),
                reply,
            });
            q.start_flusher()
        };
        if start {
            spawn_flusher(self.clone(), pool.clone(), timeout);
        }
        answer
            .await
            .unwrap_or_else(|_| Err(Error::store("the batch of this store call was dropped")))
    }
}

/// Starts a flusher already counted by [`Queue::start_flusher`].
fn spawn_flusher<J: Job>(batcher: Arc<Batcher<J>>, pool: PgPool, timeout: Duration) {
    let alive = Alive {
        batcher,
        counted: true,
    };
    let task: BoxFuture<'static, ()> = Box::pin(flush(alive, pool, timeout));
    tokio::spawn(task);
}

/// A flusher's place in the count. A flusher that leaves normally takes itself off the
/// count in the same critical section that finds the queue empty; one that is dropped
/// instead (a panic, or its runtime shutting down, even before it first ran) is taken
/// off here, so that the next call starts a new one.
struct Alive<J: Job> {
    batcher: Arc<Batcher<J>>,
    counted: bool,
}

impl<J: Job> Alive<J> {
    /// Leaves the count (with the queue locked by the caller).
    fn leave(&mut self, q: &mut Queue<J>) {
        q.flushers -= 1;
        self.counted = false;
    }
}

impl<J: Job> Drop for Alive<J> {
    fn drop(&mut self) {
        if self.counted {
            let mut q = self.batcher.lock();
            q.flushers -= 1;
            q.taking = false;
        }
    }
}

/// Takes batches from the queue and runs them on one connection until the queue is
/// empty. Runs as its own task, so a caller that stops waiting does not strand the
/// others of its batch.
async fn flush<J: Job>(mut alive: Alive<J>, pool: PgPool, timeout: Duration) {
    let batcher = alive.batcher.clone();
    let mut conn: Option<PoolConnection<sqlx::Postgres>> = None;
    loop {
        let (batch, more) = {
            let mut q = batcher.lock();
            let batch = q.take();
            if batch.is_empty() {
                alive.leave(&mut q);
                return;
            }
            // More than a batch is queued: another connection takes the rest meanwhile.
            (batch, q.start_flusher())
        };
        if more {
            spawn_flusher(batcher.clone(), pool.clone(), timeout);
        }
        let (items, replies): (Vec<J::Item>, Vec<_>) =
            batch.into_iter().map(|e| (e.item, e.reply)).unzip();
        let result = run(&batcher.job, &pool, &mut conn, timeout, &items).await;
        let failed = result.is_err();
        answer(replies, result);
        if failed {
            // The connection may be broken: give it back and leave the rest of the
            // queue to a fresh flusher.
            drop(conn.take());
            let again = {
                let mut q = batcher.lock();
                alive.leave(&mut q);
                q.start_flusher()
            };
            if again {
                spawn_flusher(batcher, pool, timeout);
            }
            return;
        }
    }
}

/// One batch within `timeout`, on the flusher's connection (acquired if it has none).
async fn run<J: Job>(
    job: &J,
    pool: &PgPool,
    conn: &mut Option<PoolConnection<sqlx::Postgres>>,
    timeout: Duration,
    items: &[J::Item],
) -> Result<Vec<J::Answer>, Error> {
    let work = async {
        if conn.is_none() {
            *conn = Some(pool.acquire().await.map_err(Error::store)?);
        }
        match conn.as_mut() {
            Some(c) => job.run(c, items).await,
            None => Err(Error::store("no connection")),
        }
    };
    match tokio::time::timeout(timeout, work).await {
        Ok(r) => r,
        Err(_) => Err(Error::store(format!(
            "postgres store call timed out after {timeout:?}"
        ))),
    }
}

/// Per call of a batch, in order: whether its record's id is among the ids the statement
/// answered (a statement that answers the records it changed: completions, step writes).
pub(super) fn changed(ids: &[[u8; 16]], answered: &[Vec<u8>]) -> Vec<bool> {
    ids.iter()
        .map(|id| answered.iter().any(|a| a[..] == id[..]))
        .collect()
}

fn answer<A>(replies: Vec<oneshot::Sender<Result<A, Error>>>, result: Result<Vec<A>, Error>) {
    match result {
        Ok(answers) => {
            for (reply, a) in replies.into_iter().zip(answers) {
                let _ = reply.send(Ok(a));
            }
        }
        Err(e) if replies.len() == 1 => {
            if let Some(reply) = replies.into_iter().next() {
                let _ = reply.send(Err(e));
            }
        }
        Err(e) => {
            let e = Arc::new(e);
            for reply in replies {
                let _ = reply.send(Err(Error::store(BatchFailed(e.clone()))));
            }
        }
    }
}

/// The error of a batch of several calls, given to each of them.
#[derive(Debug)]
struct BatchFailed(Arc<Error>);

impl fmt::Display for BatchFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a batch of store calls failed: {}", self.0)
    }
}

impl std::error::Error for BatchFailed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

/// Whether `e` is a batch of several calls that the database certainly rolled back
/// because of one of its rows (a lock wait that ran out, or a deadlock with a
/// transaction holding several keys): each call is then run again on its own, so a key
/// held by a long transaction answers only for itself.
pub(super) fn rolled_back_for_a_row(e: &Error) -> bool {
    let Error::Store(source) = e else {
        return false;
    };
    let Some(BatchFailed(inner)) = source.downcast_ref::<BatchFailed>() else {
        return false;
    };
    if super::is_lock_wait(inner) {
        return true;
    }
    let Error::Store(source) = &**inner else {
        return false;
    };
    matches!(
        source.downcast_ref::<sqlx::Error>(),
        Some(sqlx::Error::Database(db)) if db.code().as_deref() == Some("40P01")
    )
}
