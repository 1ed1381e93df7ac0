//! [`SqlStore`]: records in PostgreSQL, MySQL/MariaDB or SQLite, through sqlx.
//!
//! One table, `idem_records`, created by a versioned migration (tracked in its own
//! `_idem_migrations` table, so it never mixes with the application's own sqlx
//! migrations), and beside it `idem_steps` for durable steps (the `journal` module).
//! One row per key, addressed by the key's 128-bit digest. Every [`Store`](crate::Store)
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
//! connections), concurrent dedup and lock claims, concurrent completions, and
//! concurrent durable step writes are sent together, each kind in its own batches: one
//! statement, one round trip and one commit for a batch of keys, each still decided on
//! its own by the same conditions (the `batch` module). A new key then costs a fraction
//! of two commits instead of two whole ones, and a step a fraction of one; an idle store
//! runs each call alone, as in the table. Transactional steps (`step_tx`) commit in the
//! caller's transaction and are never batched.
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
//!   `token_expires_us` (µs since the epoch), and for durable steps `steps_expires_us`,
//!   `steps_fp`, `steps_n`, `steps_base` (the journal's rows are in `idem_steps`, one per
//!   step; `steps` is version 3's, no longer used). The rendered key is never stored.
//! - What is in flight, per function:
//!   `SELECT namespace, scope, state, COUNT(*) FROM idem_records GROUP BY 1, 2, 3`.
//! - Forgetting one function's records (so they run again):
//!   `DELETE FROM idem_records WHERE namespace = 'shop' AND scope = 'shop::charge'`.
//!   Their step journals' rows in `idem_steps` are then never read again, and the purge
//!   deletes them an hour later.
//! - Connections: [`SqlStore::connect`] makes a pool of 16 (SQLite: 8) and bounds every
//!   call by [`DEFAULT_TIMEOUT`] ([`SqlStore::with_timeout`]).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use self::dialect::Dialect;
use super::BoxFuture;
use super::local_blooms::Blooms;
use crate::Error;

#[cfg(feature = "postgres")]
mod batch;
mod caller_tx;
mod dialect;
mod inspection;
mod journal;
#[cfg(feature = "mysql")]
mod mysql;
pub(crate) mod own_tx;
#[cfg(feature = "postgres")]
mod postgres;
mod purge;
mod record;
mod recovery;
#[cfg(feature = "sqlite")]
mod sqlite;
mod store_impl;
mod toolbox;
mod unreachable;

// The record's vocabulary, for the backends (`super::…`).
#[cfg(feature = "mysql")]
use self::record::IN_PROGRESS;
#[cfg(feature = "postgres")]
use self::record::is_lock_wait;
use self::record::{
    KIND_TOKEN, LOCK_RETENTION, Snapshot, corrupt, kind_code, owner_bytes, sql_err, us,
};
use self::store_impl::Watchers;

/// The one error of every store that cannot be reached, here too for its old path.
pub use crate::store::{Cause, Unreachable};
pub use caller_tx::TxConn;
pub use own_tx::{Begun, IdemTransaction, TxDatabase, TxFuture};
pub use purge::PurgeTask;

/// The client crate, re-exported so that pools built by the application and the ones
/// idem takes are always of the same sqlx version.
pub use sqlx;

/// Default bound on every store call, connection acquisition included.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

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
    /// The database's statements and pool.
    dialect: Arc<dyn Dialect>,
    timeout: Duration,
    async_claim_commit: bool,
    watchers: Arc<Watchers>,
    /// The one connection attempt beside the pool that slow calls share.
    probes: Arc<unreachable::ProbeGate>,
    /// Bloom bitmaps, which have no SQL form here (see the `toolbox` module).
    blooms: Arc<Blooms>,
    /// Keys whose journal rows a completion should delete (see the `journal` module).
    journaled: Arc<journal::Journaled>,
    /// Calls waiting to be sent together (PostgreSQL; see the `batch` module).
    #[cfg(feature = "postgres")]
    batches: Arc<postgres::PgBatches>,
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
        Ok(SqlStore::new(Arc::new(postgres::PgDialect { pool })))
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
        let max_packet = mysql::max_packet(&pool).await?;
        Ok(SqlStore::new(Arc::new(mysql::MySqlDialect {
            pool,
            returning,
            max_packet,
        })))
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
        Ok(SqlStore::new(Arc::new(sqlite::SqliteDialect { pool })))
    }

    fn new(dialect: Arc<dyn Dialect>) -> SqlStore {
        SqlStore {
            dialect,
            timeout: DEFAULT_TIMEOUT,
            async_claim_commit: false,
            watchers: Arc::default(),
            probes: Arc::default(),
            blooms: Arc::default(),
            journaled: Arc::default(),
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
    /// exercise that path on the server at hand (through
    /// `__private::without_returning`).
    pub(crate) fn without_returning(self) -> Self {
        match self.dialect.without_returning() {
            Some(dialect) => SqlStore { dialect, ..self },
            None => self,
        }
    }

    /// The PostgreSQL pool, if this store runs on PostgreSQL.
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub fn pg_pool(&self) -> Option<&sqlx::PgPool> {
        self.dialect.pool().downcast_ref()
    }

    /// The MySQL pool, if this store runs on MySQL or MariaDB.
    #[cfg(feature = "mysql")]
    #[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
    pub fn mysql_pool(&self) -> Option<&sqlx::MySqlPool> {
        self.dialect.pool().downcast_ref()
    }

    /// The SQLite pool, if this store runs on SQLite.
    #[cfg(feature = "sqlite")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
    pub fn sqlite_pool(&self) -> Option<&sqlx::SqlitePool> {
        self.dialect.pool().downcast_ref()
    }

    /// `"postgres"`, `"mysql"` (MySQL or MariaDB) or `"sqlite"`.
    pub fn backend_name(&self) -> &'static str {
        self.dialect.name()
    }

    /// Closes the pool: waits for connections in use to be returned, then closes them.
    pub async fn close(&self) {
        self.dialect.close().await
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
    unreachable::probe(&opts, backend, unreachable::server_of(url), DEFAULT_TIMEOUT)
        .await
        .map_err(Error::store)
}
