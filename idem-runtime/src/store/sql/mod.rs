//! [`SqlStore`]: records in PostgreSQL, MySQL/MariaDB or SQLite, through sqlx.
//!
//! One table, `idem_records`, created by a versioned migration (tracked in its own
//! `_idem_migrations` table, so it never mixes with the application's own sqlx
//! migrations). One row per key, addressed by the key's 128-bit digest. Every [`Store`]
//! method is one conditional statement on the primary key, and every expiry is decided
//! by the database's clock:
//!
//! | operation | PostgreSQL | MariaDB | MySQL | SQLite |
//! |---|---|---|---|---|
//! | claim (new key) | 1 statement: CTE + `INSERT … ON CONFLICT DO UPDATE … WHERE` | 1: `INSERT … ON DUPLICATE KEY UPDATE … RETURNING` | 2: the same insert, then a read | 2: a read, then `INSERT … ON CONFLICT … RETURNING` |
//! | claim (replay) | 1 (the CTE's read; no write, no row lock) | 1 | 2 | 1 (a read, no write lock) |
//! | complete, release, renew | 1 `UPDATE … WHERE owner = ?` | 1 | 1 | 1 |
//!
//! On PostgreSQL, when the store is busy (calls of this process queueing for
//! connections), concurrent dedup and lock claims, and concurrent completions, are sent
//! together: one statement, one round trip and one commit for a batch of keys, each still
//! decided on its own by the same conditions (the `batch` module). A new key then costs
//! a fraction of two commits instead of two whole ones; an idle store runs each call
//! alone, as in the table.
//!
//! Lock fences are `max(previous + 1, the database clock in µs)`: strictly increasing
//! per key while the row exists (a released lock keeps its row for an hour), and still
//! increasing after the row is purged, because the clock has moved on since.
//!
//! Expired rows are deleted in bounded batches by [`SqlStore::purge_expired`], or by a
//! background task from [`SqlStore::spawn_purge`].
//!
//! [`SqlStore::begin`] (a guard) and [`SqlStore::transaction`] (a closure) run the
//! business writes inside a database transaction that also holds and completes the idem
//! record, so the writes and the record commit together or not at all.
//!
//! # Operating it
//!
//! - Columns: `id` (digest), `namespace`, `scope` (the function), `kind` (0 dedup, 1 lock,
//!   2 token), `state` (0 free, 1 issued, 2 in progress, 3 completed), `owner`, `fence`,
//!   `fingerprint`, `value` (the stored result envelope), `expires_us`, `lease_us`,
//!   `token_expires_us` (µs since the epoch). The rendered key is never stored.
//! - What is in flight, per function:
//!   `SELECT namespace, scope, state, COUNT(*) FROM idem_records GROUP BY 1, 2, 3`.
//! - Forgetting one function's records (so they run again):
//!   `DELETE FROM idem_records WHERE namespace = 'shop' AND scope = 'shop::charge'`.
//! - Connections: [`SqlStore::connect`] makes a pool of 16 (SQLite: 8) and bounds every
//!   call by [`DEFAULT_TIMEOUT`] ([`SqlStore::with_timeout`]).

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;

use super::{
    BoxFuture, ClaimKind, ClaimOutcome, ClaimRequest, Owner, Settle, Store, Subscription,
    TransitionOutcome, TransitionRequest, VersionedBytes,
};
use crate::{Error, Fingerprint, Key};

#[cfg(feature = "postgres")]
mod batch;
mod in_tx;
#[cfg(feature = "mysql")]
mod mysql;
mod operate;
#[cfg(feature = "postgres")]
mod postgres;
mod reach;
#[cfg(feature = "sqlite")]
mod sqlite;
mod toolbox;
mod tx;

pub use in_tx::TxConn;
#[doc(hidden)]
pub use in_tx::{TxBegun, TxClaim, tx_begin, tx_end};
pub use reach::{Cause, Unreachable};
pub use tx::{Begun, IdemTransaction, TxDatabase, TxFuture};

/// The client crate, re-exported so that pools built by the application and the ones
/// idem takes are always of the same sqlx version.
pub use sqlx;

/// Record states, as stored in the `state` column.
const FREE: i16 = 0;
const ISSUED: i16 = 1;
const IN_PROGRESS: i16 = 2;
const COMPLETED: i16 = 3;

/// Record kinds, as stored in the `kind` column.
const KIND_DEDUP: i16 = 0;
const KIND_LOCK: i16 = 1;
const KIND_TOKEN: i16 = 2;

/// How long a released lock keeps its row (and so its fence counter). Past that the fence
/// continues from the database clock, which has moved on by then.
const LOCK_RETENTION: Duration = Duration::from_secs(3600);

/// Every duration is capped so that `now + d` never overflows a BIGINT of microseconds.
const MAX_DURATION_US: i64 = 100 * 365 * 24 * 3600 * 1_000_000;

/// A claim statement that found the row taken over between its read and its write
/// (a race with another claimer) is run again, at most this many times.
const CLAIM_ATTEMPTS: usize = 16;

/// When a claim gave up waiting for a row lock (a transactional-mode twin's open
/// transaction), how soon to look again.
const LOCK_WAIT_RETRY: Duration = Duration::from_millis(10);

/// Default bound on every store call, connection acquisition included.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// How often a waiter re-checks a busy key when no in-process completion wakes it first
/// (the twin runs in another process; SQL has no cheap cross-process push).
const CROSS_PROCESS_POLL: Duration = Duration::from_millis(50);

fn us(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).map_or(MAX_DURATION_US, |v| v.min(MAX_DURATION_US))
}

fn from_us(v: i64) -> Duration {
    Duration::from_micros(u64::try_from(v).unwrap_or(0))
}

fn owner_bytes(owner: Owner) -> [u8; 16] {
    owner.0.to_be_bytes()
}

fn kind_code(kind: ClaimKind) -> i16 {
    match kind {
        ClaimKind::Dedup => KIND_DEDUP,
        ClaimKind::Lock => KIND_LOCK,
        ClaimKind::Token => KIND_TOKEN,
    }
}

/// A row as a claim statement saw it, by the database's clock.
#[derive(Debug, Default)]
struct Snapshot {
    /// The statement took the key for the caller.
    claimed: bool,
    state: i16,
    fence: i64,
    fingerprint: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    /// `expires_us - now`: the record exists while this is positive.
    remaining_us: i64,
    /// `lease_us - now` for an in-progress record.
    lease_left_us: Option<i64>,
}

/// Turns what a claim statement saw into an outcome. `None` means the row looked takeable
/// but the statement did not take it: another claimer won the race in between, so the
/// statement is run again. The conditions mirror the SQL `WHERE` clauses of the dialects
/// and [`MemoryStore`](crate::MemoryStore)'s rules.
fn decide(
    key: &Key,
    kind: ClaimKind,
    snap: Option<Snapshot>,
) -> Result<Option<ClaimOutcome>, Error> {
    let Some(s) = snap else {
        return Ok(match kind {
            ClaimKind::Token => Some(ClaimOutcome::Missing),
            _ => None,
        });
    };
    if s.claimed {
        let fence = match kind {
            ClaimKind::Lock => {
                u64::try_from(s.fence).map_err(|_| corrupt(key, "negative fence"))?
            }
            _ => 0,
        };
        return Ok(Some(ClaimOutcome::Claimed { fence }));
    }
    if !(FREE..=COMPLETED).contains(&s.state) {
        return Err(corrupt(key, &format!("unknown state {}", s.state)));
    }
    let fingerprint = match s.fingerprint {
        None => None,
        Some(b) => Some(Fingerprint(
            b.try_into()
                .map_err(|_| corrupt(key, "fingerprint is not 16 bytes"))?,
        )),
    };
    if s.remaining_us <= 0 || s.state == FREE {
        return Ok(match kind {
            ClaimKind::Token => Some(ClaimOutcome::Missing),
            _ => None,
        });
    }
    Ok(match s.state {
        COMPLETED => Some(ClaimOutcome::Completed {
            value: Bytes::from(
                s.value
                    .ok_or_else(|| corrupt(key, "completed record without a value"))?,
            ),
            fingerprint,
        }),
        IN_PROGRESS => {
            let lease_left = s.lease_left_us.unwrap_or(s.remaining_us);
            if lease_left > 0 || kind != ClaimKind::Token {
                Some(ClaimOutcome::Busy {
                    retry_in: from_us(lease_left),
                    fingerprint,
                })
            } else {
                // A token claim whose lease ended: takeable, so a race was lost.
                None
            }
        }
        // ISSUED: only a token claim takes it; a dedup or lock key never holds a token
        // (their scopes differ), so it is treated as held until it expires, as in memory.
        _ => match kind {
            ClaimKind::Token => None,
            _ => Some(ClaimOutcome::Busy {
                retry_in: from_us(s.remaining_us),
                fingerprint,
            }),
        },
    })
}

fn corrupt(key: &Key, reason: &str) -> Error {
    Error::Corrupt {
        key: *key,
        reason: reason.to_owned(),
    }
}

/// Maps a sqlx error: a value that does not decode means the row is damaged (or the
/// table was altered); anything else is the store failing.
fn sql_err(key: Option<&Key>, e: sqlx::Error) -> Error {
    match (key, &e) {
        (Some(key), sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_)) => Error::Corrupt {
            key: *key,
            reason: format!("a column does not decode: {e}"),
        },
        _ => Error::store(e),
    }
}

/// A lock wait that ran out (PostgreSQL `lock_timeout`, InnoDB lock wait timeout,
/// SQLite busy): a twin's transaction holds the key.
pub(super) fn is_lock_wait(e: &Error) -> bool {
    let Error::Store(source) = e else {
        return false;
    };
    let Some(sqlx::Error::Database(db)) = source.downcast_ref::<sqlx::Error>() else {
        return false;
    };
    let code = db.code();
    matches!(code.as_deref(), Some("55P03" | "5" | "517" | "261"))
        || db.message().contains("Lock wait timeout")
}

/// The pool settings of [`SqlStore::connect`].
fn pool_options<DB: sqlx::Database>(max: u32) -> sqlx::pool::PoolOptions<DB> {
    sqlx::pool::PoolOptions::new()
        .max_connections(max)
        .acquire_timeout(DEFAULT_TIMEOUT)
        // sqlx pings every connection it hands out by default: one more round trip per
        // statement, which would double the cost of a replay. A connection idle for a
        // while is still checked; a busy one is trusted, and if it died its statement
        // fails with `Error::Store` and the pool replaces it.
        .test_before_acquire(false)
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                if meta.idle_for > IDLE_CHECK {
                    sqlx::Connection::ping(conn).await?;
                }
                Ok(true)
            })
        })
}

/// A pooled connection idle longer than this is pinged before use.
const IDLE_CHECK: Duration = Duration::from_secs(5);

/// The backend behind a [`SqlStore`].
#[derive(Clone)]
enum Backend {
    #[cfg(feature = "postgres")]
    Postgres(sqlx::PgPool),
    #[cfg(feature = "mysql")]
    MySql {
        pool: sqlx::MySqlPool,
        /// MariaDB ≥ 10.5 answers `INSERT … ON DUPLICATE KEY UPDATE … RETURNING`, so a claim
        /// and its replay take one round trip; MySQL needs a second statement to read.
        returning: bool,
    },
    #[cfg(feature = "sqlite")]
    Sqlite(sqlx::SqlitePool),
}

/// Records in a SQL database: PostgreSQL, MySQL/MariaDB or SQLite (cargo features
/// `postgres`, `mysql`, `sqlite`).
///
/// Use it when the records must outlive the process and the service already has a
/// database, or (SQLite) as a durable embedded store for a single-node service. Cheap to
/// clone: clones share the pool.
///
/// ```no_run
/// # async fn demo() -> Result<(), idem_runtime::Error> {
/// use idem_runtime::{Idem, SqlStore};
///
/// let store = SqlStore::connect("postgres://postgres@127.0.0.1/test").await?;
/// let idem = Idem::builder().store(store.clone()).namespace("shop").build();
/// // Optional: delete expired records every minute, 1000 rows per statement.
/// let _purge = store.spawn_purge(std::time::Duration::from_secs(60), 1000);
/// # let _ = idem; Ok(()) }
/// ```
#[derive(Clone)]
pub struct SqlStore {
    backend: Backend,
    timeout: Duration,
    async_claim_commit: bool,
    watchers: Arc<Watchers>,
    /// Calls waiting to be sent together (PostgreSQL; see the `batch` module).
    #[cfg(feature = "postgres")]
    batches: Arc<PgBatches>,
}

/// The batch queues of a PostgreSQL store.
#[cfg(feature = "postgres")]
struct PgBatches {
    claims: Arc<batch::Batcher<postgres::Claims>>,
    async_claims: Arc<batch::Batcher<postgres::Claims>>,
    completions: Arc<batch::Batcher<postgres::Completions>>,
    /// Keys whose claim found the row locked by an open transaction (a transactional-mode
    /// twin), and when. Their claims stay out of batches for [`HELD_ALONE`], so one
    /// long-held key does not stall batch after batch of other keys.
    held: Mutex<HashMap<[u8; 16], std::time::Instant>>,
}

/// How long a key whose row was found locked keeps out of batches.
#[cfg(feature = "postgres")]
const HELD_ALONE: Duration = Duration::from_secs(2);

#[cfg(feature = "postgres")]
impl PgBatches {
    fn recently_held(&self, key: &Key) -> bool {
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.get(key.digest())
            .is_some_and(|at| at.elapsed() < HELD_ALONE)
    }

    /// Passes `result` on, remembering its key if it waited out a row lock.
    fn note_held<T>(&self, key: &Key, result: Result<T, Error>) -> Result<T, Error> {
        if let Err(e) = &result
            && is_lock_wait(e)
        {
            let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
            if held.len() >= 1024 {
                held.retain(|_, at| at.elapsed() < HELD_ALONE);
            }
            held.insert(*key.digest(), std::time::Instant::now());
        }
        result
    }
}

#[cfg(feature = "postgres")]
impl Default for PgBatches {
    fn default() -> Self {
        PgBatches {
            claims: Arc::new(batch::Batcher::new(postgres::Claims {
                async_commit: false,
            })),
            async_claims: Arc::new(batch::Batcher::new(postgres::Claims { async_commit: true })),
            completions: Arc::new(batch::Batcher::new(postgres::Completions)),
            held: Mutex::default(),
        }
    }
}

impl fmt::Debug for SqlStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlStore")
            .field("backend", &self.backend_name())
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl SqlStore {
    /// Connects to the database named by `url`, picking the backend from its scheme, and
    /// creates (or upgrades) idem's table.
    ///
    /// - `postgres://user@host/db` or `postgresql://…`
    /// - `mysql://user:pass@host/db` or `mariadb://…`
    /// - `sqlite://path/to/file.db?mode=rwc` (`rwc` creates the file), `sqlite::memory:`
    ///
    /// Several processes may start at once: the migration takes the database's lock
    /// (an advisory lock on PostgreSQL, `GET_LOCK` on MySQL) and is applied once.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), idem_runtime::Error> {
    /// let store = idem_runtime::SqlStore::connect("sqlite://idem.db?mode=rwc").await?;
    /// # let _ = store; Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<SqlStore, Error> {
        let scheme = url.split(':').next().unwrap_or_default();
        match scheme {
            #[cfg(feature = "postgres")]
            "postgres" | "postgresql" => {
                reach_before_pool::<sqlx::postgres::PgConnectOptions>(url, "PostgreSQL").await?;
                let pool = pool_options::<sqlx::Postgres>(16)
                    .connect(url)
                    .await
                    .map_err(Error::store)?;
                SqlStore::from_pg_pool(pool).await
            }
            #[cfg(feature = "mysql")]
            "mysql" | "mariadb" => {
                let url = url.replacen("mariadb:", "mysql:", 1);
                reach_before_pool::<sqlx::mysql::MySqlConnectOptions>(&url, "MySQL").await?;
                let pool = pool_options::<sqlx::MySql>(16)
                    .connect(&url)
                    .await
                    .map_err(Error::store)?;
                SqlStore::from_mysql_pool(pool).await
            }
            #[cfg(feature = "sqlite")]
            "sqlite" => {
                use std::str::FromStr as _;
                let opts = sqlx::sqlite::SqliteConnectOptions::from_str(url)
                    .map_err(|e| Error::Config(format!("bad sqlite url: {e}")))?
                    // WAL lets readers (replays) proceed while one writer commits.
                    .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal);
                // An in-memory database exists per connection: share one connection.
                let in_memory = url.contains(":memory:") || url.contains("mode=memory");
                // Opening a fresh file from several connections (or processes) at once
                // races on switching it to WAL, which needs an exclusive lock that
                // SQLite refuses at once ("database is locked") rather than waiting
                // for: try again briefly.
                let mut attempt = 0;
                let pool = loop {
                    match pool_options::<sqlx::Sqlite>(if in_memory { 1 } else { 8 })
                        .connect_with(opts.clone())
                        .await
                    {
                        Ok(pool) => break pool,
                        Err(e) if attempt < 10 && e.to_string().contains("database is locked") => {
                            attempt += 1;
                            tokio::time::sleep(Duration::from_millis(20 * attempt)).await;
                        }
                        Err(e) => return Err(Error::store(e)),
                    }
                };
                SqlStore::from_sqlite_pool(pool).await
            }
            other => Err(Error::Config(format!(
                "unsupported SQL store url scheme {other:?}: expected {}",
                Self::enabled_schemes()
            ))),
        }
    }

    fn enabled_schemes() -> String {
        let compiled: Vec<&str> = [
            (cfg!(feature = "postgres"), "postgres://"),
            (cfg!(feature = "mysql"), "mysql://"),
            (cfg!(feature = "sqlite"), "sqlite://"),
        ]
        .into_iter()
        .filter_map(|(on, s)| on.then_some(s))
        .collect();
        format!(
            "{} (other backends need their cargo feature: postgres, mysql, sqlite)",
            compiled.join(", ")
        )
    }

    /// A store on a PostgreSQL pool the application already has. Creates or upgrades
    /// idem's table.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::store::sql::sqlx::PgPool;
    /// let pool = PgPool::connect("postgres://postgres@127.0.0.1/test").await?;
    /// let store = idem_runtime::SqlStore::from_pg_pool(pool).await?;
    /// # let _ = store; Ok(()) }
    /// ```
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub async fn from_pg_pool(pool: sqlx::PgPool) -> Result<SqlStore, Error> {
        postgres::migrate(&pool).await?;
        Ok(SqlStore::new(Backend::Postgres(pool)))
    }

    /// A store on a MySQL or MariaDB pool the application already has. Creates or
    /// upgrades idem's table.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::store::sql::sqlx::MySqlPool;
    /// let pool = MySqlPool::connect("mysql://root@127.0.0.1/test").await?;
    /// let store = idem_runtime::SqlStore::from_mysql_pool(pool).await?;
    /// # let _ = store; Ok(()) }
    /// ```
    #[cfg(feature = "mysql")]
    #[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
    pub async fn from_mysql_pool(pool: sqlx::MySqlPool) -> Result<SqlStore, Error> {
        mysql::migrate(&pool).await?;
        let returning = mysql::supports_returning(&pool).await?;
        Ok(SqlStore::new(Backend::MySql { pool, returning }))
    }

    /// A store on a SQLite pool the application already has. Creates or upgrades idem's
    /// table. For a file shared by several connections, WAL journal mode is advised.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::store::sql::sqlx::SqlitePool;
    /// let pool = SqlitePool::connect("sqlite://idem.db?mode=rwc").await?;
    /// let store = idem_runtime::SqlStore::from_sqlite_pool(pool).await?;
    /// # let _ = store; Ok(()) }
    /// ```
    #[cfg(feature = "sqlite")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
    pub async fn from_sqlite_pool(pool: sqlx::SqlitePool) -> Result<SqlStore, Error> {
        sqlite::migrate(&pool).await?;
        Ok(SqlStore::new(Backend::Sqlite(pool)))
    }

    fn new(backend: Backend) -> SqlStore {
        SqlStore {
            backend,
            timeout: DEFAULT_TIMEOUT,
            async_claim_commit: false,
            watchers: Arc::default(),
            #[cfg(feature = "postgres")]
            batches: Arc::default(),
        }
    }

    /// Bounds every store call (connection acquisition included) by `timeout`; a call
    /// that takes longer fails with [`Error::Store`]. Default: [`DEFAULT_TIMEOUT`].
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// PostgreSQL only: commit claims without waiting for the WAL flush
    /// (`synchronous_commit = off` for the claim statement alone). Completions, releases
    /// and transactional mode stay synchronous.
    ///
    /// A new key then waits for one WAL flush instead of two; in the repository's
    /// benchmark this about doubled dedup throughput of new keys at 50 concurrent calls.
    /// The price: if the *database server* crashes (not the application)
    /// within a fraction of a second after a claim, the claim may be lost, and a
    /// duplicate arriving after the server restarts may run the body a second time while
    /// or after the first one ran. That is the durability Redis offers without
    /// `appendfsync always`. Off by default.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), idem_runtime::Error> {
    /// let store = idem_runtime::SqlStore::connect("postgres://postgres@127.0.0.1/test")
    ///     .await?
    ///     .with_async_claim_commit(true);
    /// # let _ = store; Ok(()) }
    /// ```
    pub fn with_async_claim_commit(mut self, on: bool) -> Self {
        self.async_claim_commit = on;
        self
    }

    /// Forces the two-statement claim that MySQL needs even on MariaDB, so tests can
    /// exercise that path on the server at hand.
    #[doc(hidden)]
    pub fn without_returning(mut self) -> Self {
        #[cfg(feature = "mysql")]
        if let Backend::MySql { returning, .. } = &mut self.backend {
            *returning = false;
        }
        self
    }

    /// The PostgreSQL pool, if this store runs on PostgreSQL.
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub fn pg_pool(&self) -> Option<&sqlx::PgPool> {
        match &self.backend {
            Backend::Postgres(p) => Some(p),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    /// The MySQL pool, if this store runs on MySQL or MariaDB.
    #[cfg(feature = "mysql")]
    #[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
    pub fn mysql_pool(&self) -> Option<&sqlx::MySqlPool> {
        match &self.backend {
            Backend::MySql { pool, .. } => Some(pool),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    /// The SQLite pool, if this store runs on SQLite.
    #[cfg(feature = "sqlite")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
    pub fn sqlite_pool(&self) -> Option<&sqlx::SqlitePool> {
        match &self.backend {
            Backend::Sqlite(p) => Some(p),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    /// `"postgres"`, `"mysql"` (MySQL or MariaDB) or `"sqlite"`.
    pub fn backend_name(&self) -> &'static str {
        match &self.backend {
            #[cfg(feature = "postgres")]
            Backend::Postgres(_) => "postgres",
            #[cfg(feature = "mysql")]
            Backend::MySql { .. } => "mysql",
            #[cfg(feature = "sqlite")]
            Backend::Sqlite(_) => "sqlite",
        }
    }

    /// Closes the pool: waits for connections in use to be returned, then closes them.
    pub async fn close(&self) {
        match &self.backend {
            #[cfg(feature = "postgres")]
            Backend::Postgres(p) => p.close().await,
            #[cfg(feature = "mysql")]
            Backend::MySql { pool, .. } => pool.close().await,
            #[cfg(feature = "sqlite")]
            Backend::Sqlite(p) => p.close().await,
        }
    }

    /// Deletes up to `batch` expired records (oldest first) and returns how many it
    /// deleted. Call it until it returns less than `batch` to purge everything expired;
    /// bounded batches keep each statement's locks and undo log small.
    ///
    /// ```no_run
    /// # async fn demo(store: idem_runtime::SqlStore) -> Result<(), idem_runtime::Error> {
    /// while store.purge_expired(1000).await? == 1000 {}
    /// # Ok(()) }
    /// ```
    pub async fn purge_expired(&self, batch: u32) -> Result<u64, Error> {
        let batch = i64::from(batch.max(1));
        self.bounded(async {
            match &self.backend {
                #[cfg(feature = "postgres")]
                Backend::Postgres(p) => postgres::purge(p, batch).await,
                #[cfg(feature = "mysql")]
                Backend::MySql { pool, .. } => mysql::purge(pool, batch).await,
                #[cfg(feature = "sqlite")]
                Backend::Sqlite(p) => sqlite::purge(p, batch).await,
            }
        })
        .await
    }

    /// Spawns a task (on the current tokio runtime) that purges expired records every
    /// `every`, in batches of `batch` rows until none is left. Errors are logged and the
    /// task carries on; it stops when the returned handle is dropped.
    pub fn spawn_purge(&self, every: Duration, batch: u32) -> PurgeTask {
        let store = self.clone();
        let handle = tokio::spawn(async move {
            let mut tick = tokio::time::interval(every.max(Duration::from_millis(10)));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                loop {
                    match store.purge_expired(batch).await {
                        Ok(n) => {
                            if n > 0 {
                                tracing::debug!(deleted = n, "purged expired idem records");
                            }
                            if n < u64::from(batch.max(1)) {
                                break;
                            }
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "purging expired idem records failed");
                            break;
                        }
                    }
                }
            }
        });
        PurgeTask(handle)
    }

    /// Bounds a store call by the timeout; a call with no answer after a moment looks
    /// at the server itself, so a database that refuses connections is reported at once
    /// with its address and the cause (see [`Unreachable`]).
    async fn bounded<T>(&self, fut: impl Future<Output = Result<T, Error>>) -> Result<T, Error> {
        reach::bounded(self.timeout, self.backend_name(), fut, |within| {
            self.probe(within)
        })
        .await
    }

    /// One connection attempt beside the pool, to name why the server is unreachable.
    async fn probe(&self, within: Duration) -> Result<(), Unreachable> {
        match &self.backend {
            #[cfg(feature = "postgres")]
            Backend::Postgres(p) => {
                let o = p.connect_options();
                let server = format!("{}:{}", o.get_host(), o.get_port());
                reach::probe(&*o, "PostgreSQL", server, within).await
            }
            #[cfg(feature = "mysql")]
            Backend::MySql { pool, .. } => {
                let o = pool.connect_options();
                let server = format!("{}:{}", o.get_host(), o.get_port());
                reach::probe(&*o, "MySQL", server, within).await
            }
            // A file: the pool fails at once with the file's own error.
            #[cfg(feature = "sqlite")]
            Backend::Sqlite(_) => Ok(()),
        }
    }

    async fn claim_once(&self, key: &Key, req: &ClaimRequest) -> Result<Option<Snapshot>, Error> {
        match &self.backend {
            #[cfg(feature = "postgres")]
            Backend::Postgres(p) => self.claim_pg(p, key, req).await,
            #[cfg(feature = "mysql")]
            Backend::MySql { pool, returning } => {
                let mut c = pool.acquire().await.map_err(Error::store)?;
                mysql::claim(&mut c, *returning, false, key, req).await
            }
            #[cfg(feature = "sqlite")]
            Backend::Sqlite(p) => {
                let mut c = p.acquire().await.map_err(Error::store)?;
                sqlite::claim(&mut c, key, req).await
            }
        }
    }

    /// A PostgreSQL claim: in a batch when the store is busy (see the `batch` module),
    /// else on a connection of its own. Token claims, and claims of a key that an open
    /// transaction held a moment ago, always run alone.
    #[cfg(feature = "postgres")]
    async fn claim_pg(
        &self,
        pool: &sqlx::PgPool,
        key: &Key,
        req: &ClaimRequest,
    ) -> Result<Option<Snapshot>, Error> {
        let async_commit = self.async_claim_commit;
        let batches = &self.batches;
        if req.kind != ClaimKind::Token && !batches.recently_held(key) {
            let batcher = if async_commit {
                &batches.async_claims
            } else {
                &batches.claims
            };
            let alone = batcher.alone(pool);
            let result = match alone {
                Some(mut c) => postgres::claim(&mut c, key, req, false, async_commit).await,
                None => match batcher
                    .submit(pool, self.timeout, postgres::Claim::new(key, req))
                    .await
                {
                    Ok(snap) => snap.transpose().map_err(|e| sql_err(Some(key), e)),
                    // Its batch waited out a row lock (or deadlocked) on some key: run
                    // this claim alone, so that key answers only for itself.
                    Err(e) if batch::rolled_back_for_a_row(&e) => {
                        let mut c = pool.acquire().await.map_err(Error::store)?;
                        postgres::claim(&mut c, key, req, false, async_commit).await
                    }
                    Err(e) => Err(e),
                },
            };
            return batches.note_held(key, result);
        }
        let mut c = pool.acquire().await.map_err(Error::store)?;
        let result = postgres::claim(&mut c, key, req, false, async_commit).await;
        batches.note_held(key, result)
    }

    async fn claim_now(&self, key: &Key, req: &ClaimRequest) -> Result<ClaimOutcome, Error> {
        for _ in 0..CLAIM_ATTEMPTS {
            let snap = match self.claim_once(key, req).await {
                // A transactional-mode twin holds the key uncommitted: busy, not broken.
                Err(e) if is_lock_wait(&e) => {
                    return Ok(ClaimOutcome::Busy {
                        retry_in: LOCK_WAIT_RETRY,
                        fingerprint: None,
                    });
                }
                other => other?,
            };
            if let Some(outcome) = decide(key, req.kind, snap)? {
                return Ok(outcome);
            }
        }
        // Lost the race every time: someone else keeps taking the key. Report it busy,
        // so the caller waits and tries again rather than failing.
        Ok(ClaimOutcome::Busy {
            retry_in: Duration::from_millis(1),
            fingerprint: None,
        })
    }
}

/// The background purge started by [`SqlStore::spawn_purge`]; dropping it stops the task.
#[derive(Debug)]
pub struct PurgeTask(tokio::task::JoinHandle<()>);

impl PurgeTask {
    /// Stops the task now.
    pub fn stop(self) {}
}

impl Drop for PurgeTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// In-process wake-ups: a waiter on a busy key is woken the moment a call of this process
/// completes or releases it. Twins in other processes are caught by polling.
#[derive(Default)]
struct Watchers(Mutex<HashMap<[u8; 16], watch::Sender<()>>>);

impl Watchers {
    fn subscribe(&self, key: &Key) -> watch::Receiver<()> {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        // Keys whose waiters are gone (their twin ran elsewhere) are dropped here, so the
        // map holds about as many keys as there are waiters.
        if map.len() >= 1024 {
            map.retain(|_, tx| tx.receiver_count() > 0);
        }
        map.entry(*key.digest())
            .or_insert_with(|| watch::channel(()).0)
            .subscribe()
    }

    fn wake(&self, key: &Key) {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(tx) = map.remove(key.digest()) {
            let _ = tx.send(());
        }
    }
}

impl Store for SqlStore {
    fn claim<'a>(
        &'a self,
        key: &'a Key,
        req: &'a ClaimRequest,
    ) -> BoxFuture<'a, Result<ClaimOutcome, Error>> {
        Box::pin(self.bounded(self.claim_now(key, req)))
    }

    fn complete<'a>(
        &'a self,
        key: &'a Key,
        owner: Owner,
        value: Bytes,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            let done = self
                .bounded(async {
                    match &self.backend {
                        #[cfg(feature = "postgres")]
                        Backend::Postgres(p) => {
                            let batcher = &self.batches.completions;
                            if let Some(mut c) = batcher.alone(p) {
                                return postgres::complete(&mut c, key, owner, &value, ttl).await;
                            }
                            let item = postgres::Completion {
                                id: *key.digest(),
                                owner: owner_bytes(owner),
                                value: value.clone(),
                                ttl_us: us(ttl),
                            };
                            batcher.submit(p, self.timeout, item).await
                        }
                        #[cfg(feature = "mysql")]
                        Backend::MySql { pool, .. } => {
                            let mut c = pool.acquire().await.map_err(Error::store)?;
                            mysql::complete(&mut c, key, owner, &value, ttl).await
                        }
                        #[cfg(feature = "sqlite")]
                        Backend::Sqlite(p) => {
                            let mut c = p.acquire().await.map_err(Error::store)?;
                            sqlite::complete(&mut c, key, owner, &value, ttl).await
                        }
                    }
                })
                .await?;
            if done {
                self.watchers.wake(key);
            }
            Ok(done)
        })
    }

    fn release<'a>(&'a self, key: &'a Key, owner: Owner) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            let done = self
                .bounded(async {
                    match &self.backend {
                        #[cfg(feature = "postgres")]
                        Backend::Postgres(p) => postgres::release(p, key, owner).await,
                        #[cfg(feature = "mysql")]
                        Backend::MySql { pool, .. } => mysql::release(pool, key, owner).await,
                        #[cfg(feature = "sqlite")]
                        Backend::Sqlite(p) => sqlite::release(p, key, owner).await,
                    }
                })
                .await?;
            if done {
                self.watchers.wake(key);
            }
            Ok(done)
        })
    }

    fn renew<'a>(
        &'a self,
        key: &'a Key,
        owner: Owner,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.bounded(async move {
            match &self.backend {
                #[cfg(feature = "postgres")]
                Backend::Postgres(p) => postgres::renew(p, key, owner, lease).await,
                #[cfg(feature = "mysql")]
                Backend::MySql { pool, .. } => mysql::renew(pool, key, owner, lease).await,
                #[cfg(feature = "sqlite")]
                Backend::Sqlite(p) => sqlite::renew(p, key, owner, lease).await,
            }
        }))
    }

    fn issue<'a>(&'a self, key: &'a Key, ttl: Duration) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.bounded(async move {
            match &self.backend {
                #[cfg(feature = "postgres")]
                Backend::Postgres(p) => postgres::issue(p, key, ttl).await,
                #[cfg(feature = "mysql")]
                Backend::MySql { pool, returning } => {
                    let mut c = pool.acquire().await.map_err(Error::store)?;
                    mysql::issue(&mut c, *returning, key, ttl).await
                }
                #[cfg(feature = "sqlite")]
                Backend::Sqlite(p) => sqlite::issue(p, key, ttl).await,
            }
        }))
    }

    fn inspect<'a>(
        &'a self,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<Option<crate::RecordInfo>, Error>> {
        Box::pin(self.bounded(async move {
            let row = match &self.backend {
                #[cfg(feature = "postgres")]
                Backend::Postgres(p) => postgres::inspect(p, key).await?,
                #[cfg(feature = "mysql")]
                Backend::MySql { pool, .. } => mysql::inspect(pool, key).await?,
                #[cfg(feature = "sqlite")]
                Backend::Sqlite(p) => sqlite::inspect(p, key).await?,
            };
            row.map(|r| r.into_info(key)).transpose()
        }))
    }

    fn forget<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            let done = self
                .bounded(async {
                    match &self.backend {
                        #[cfg(feature = "postgres")]
                        Backend::Postgres(p) => postgres::forget(p, key).await,
                        #[cfg(feature = "mysql")]
                        Backend::MySql { pool, .. } => mysql::forget(pool, key).await,
                        #[cfg(feature = "sqlite")]
                        Backend::Sqlite(p) => sqlite::forget(p, key).await,
                    }
                })
                .await?;
            // Waiters in this process claim again at once; others poll.
            self.watchers.wake(key);
            Ok(done)
        })
    }

    fn record_counts(&self) -> Option<&dyn crate::RecordCounts> {
        Some(self)
    }

    fn subscribe<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Subscription, Error>> {
        let mut rx = self.watchers.subscribe(key);
        Box::pin(std::future::ready(Ok(Subscription::new(async move {
            // Fires on an in-process completion or release, or after a short poll
            // interval for twins in other processes (a spurious wake-up is allowed:
            // the caller claims again).
            tokio::select! {
                _ = rx.changed() => {}
                _ = tokio::time::sleep(CROSS_PROCESS_POLL) => {}
            }
        }))))
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

    /// SQL has no bitmap here: the filter lives in this process' memory (see the
    /// `toolbox` module), so it sees only this process' ids.
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

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    fn name(&self) -> &'static str {
        match &self.backend {
            #[cfg(feature = "postgres")]
            Backend::Postgres(_) => "sql-postgres",
            #[cfg(feature = "mysql")]
            Backend::MySql { .. } => "sql-mysql",
            #[cfg(feature = "sqlite")]
            Backend::Sqlite(_) => "sql-sqlite",
        }
    }
}

impl crate::RecordCounts for SqlStore {
    fn count_records<'a>(
        &'a self,
        namespace: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<crate::RecordCount>, Error>> {
        Box::pin(self.bounded(async move {
            let rows = match &self.backend {
                #[cfg(feature = "postgres")]
                Backend::Postgres(p) => postgres::count(p, namespace).await?,
                #[cfg(feature = "mysql")]
                Backend::MySql { pool, .. } => mysql::count(pool, namespace).await?,
                #[cfg(feature = "sqlite")]
                Backend::Sqlite(p) => sqlite::count(p, namespace).await?,
            };
            Ok(operate::counts(rows))
        }))
    }
}

/// Before a pool is built (whose first connection would retry a refused server until
/// its acquire timeout), one direct attempt names an unreachable server and why.
#[cfg(any(feature = "postgres", feature = "mysql"))]
async fn reach_before_pool<O>(url: &str, backend: &'static str) -> Result<(), Error>
where
    O: sqlx::ConnectOptions + std::str::FromStr<Err = sqlx::Error>,
    O::Connection: Sized,
{
    let opts: O = url
        .parse()
        .map_err(|e| Error::Config(format!("bad {backend} url: {e}")))?;
    reach::probe(&opts, backend, reach::server_of(url), DEFAULT_TIMEOUT)
        .await
        .map_err(Error::store)
}
