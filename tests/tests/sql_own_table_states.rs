//! State machines whose state is a column of the application's own table
//! (`StateColumn`): the same tests on PostgreSQL, MariaDB/MySQL and SQLite.
//!
//! Needs PostgreSQL on 127.0.0.1:5432 (database `test`, trust auth) and MariaDB/MySQL on
//! 127.0.0.1:3306 (database `test`, user root); `IDEM_TEST_PG_URL` and
//! `IDEM_TEST_MYSQL_URL` override the URLs. SQLite uses a file in the temp directory.
//! Each test makes its own table and its own small pool (at most 8 connections), since
//! a default MariaDB allows 151 connections for every test on the machine.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/sql.rs"]
mod support;

use std::time::Duration;

use idem_runtime::store::sql::sqlx;
use idem_runtime::toolbox::StateMachine;

const POOL: u32 = 8;
const MOVERS: usize = 30;

/// The order flow of the tests: `delivered` and `cancelled` are terminal.
fn orders() -> StateMachine {
    StateMachine::builder("shop::order")
        .states(["created", "paid", "shipped", "delivered", "cancelled"])
        .initial("created")
        .allow("created", ["paid", "cancelled"])
        .allow("paid", ["shipped", "cancelled"])
        .allow("shipped", ["delivered"])
        .terminal(["delivered", "cancelled"])
        .build()
        .expect("a valid table")
}

async fn pg_pool() -> sqlx::PgPool {
    let url = support::pg_url();
    let connect = sqlx::postgres::PgPoolOptions::new()
        .max_connections(POOL)
        .connect(&url);
    match tokio::time::timeout(Duration::from_secs(20), connect).await {
        Ok(Ok(pool)) => pool,
        other => panic!(
            "PostgreSQL at {url} is not reachable ({other:?}).\nStart it with: \
             pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start \
             (or set IDEM_TEST_PG_URL)"
        ),
    }
}

async fn mysql_pool() -> sqlx::MySqlPool {
    let url = support::mysql_url();
    let connect = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(POOL)
        .connect(&url);
    match tokio::time::timeout(Duration::from_secs(20), connect).await {
        Ok(Ok(pool)) => pool,
        other => panic!(
            "MariaDB/MySQL at {url} is not reachable ({other:?}).\nStart it with: \
             service mariadb start (or set IDEM_TEST_MYSQL_URL)"
        ),
    }
}

async fn sqlite_pool() -> sqlx::SqlitePool {
    use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
    let path = std::env::temp_dir().join(format!("idem-own-table-{}.db", support::suffix()));
    let opts = SqliteConnectOptions::new()
        .filename(&path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        // 30 movers queue for the database's one write lock.
        .busy_timeout(Duration::from_secs(60));
    SqlitePoolOptions::new()
        .max_connections(POOL)
        .connect_with(opts)
        .await
        .expect("a SQLite file in the temp directory")
}

/// The tests, once per backend. `$p` is the first placeholder, `$create` the
/// idempotent create of the guide (`{t}` is the table).
macro_rules! own_table_tests {
    ($db:ty, pool = $pool:expr, p = $p:literal, create = $create:literal) => {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};

        use idem_runtime::store::sql::sqlx::{self, AssertSqlSafe};
        use idem_runtime::Error;
        use idem_runtime::toolbox::{StateColumn, Moved};

        type Pool = sqlx::Pool<$db>;

        async fn exec(pool: &Pool, sql: String) -> u64 {
            sqlx::query(AssertSqlSafe(sql))
                .execute(pool)
                .await
                .expect("test SQL")
                .rows_affected()
        }

        async fn status(pool: &Pool, table: &str, id: i64) -> Option<String> {
            sqlx::query_scalar::<_, Option<String>>(AssertSqlSafe(format!(
                "SELECT status FROM {table} WHERE id = {}",
                $p
            )))
            .bind(id)
            .fetch_one(pool)
            .await
            .expect("the row")
        }

        async fn count(pool: &Pool, sql: String) -> i64 {
            sqlx::query_scalar::<_, i64>(AssertSqlSafe(sql))
                .fetch_one(pool)
                .await
                .expect("test count")
        }

        /// An `orders` table and a `shipments` table (the effect), both new.
        async fn tables(pool: &Pool, prefix: &str) -> (String, String, StateColumn) {
            let orders = format!("{prefix}_{}", crate::support::suffix());
            let shipments = format!("{orders}_fx");
            exec(
                pool,
                format!("CREATE TABLE {orders} (id BIGINT PRIMARY KEY, status VARCHAR(32) NULL)"),
            )
            .await;
            exec(pool, format!("CREATE TABLE {shipments} (order_id BIGINT NOT NULL)")).await;
            let column = crate::orders().stored_in(&orders, "id", "status").unwrap();
            (orders, shipments, column)
        }

        async fn drop_tables(pool: &Pool, tables: [&str; 2]) {
            for t in tables {
                exec(pool, format!("DROP TABLE {t}")).await;
            }
        }

        /// 30 concurrent movers of one order to one state: one performs (and its body,
        /// in the move's transaction, runs once), 29 find it already there. Then 30
        /// plain movers of the same order on: one again.
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn thirty_movers_one_effect() {
            let pool: Pool = $pool.await;
            let (orders, shipments, column) = tables(&pool, "own_race").await;
            exec(&pool, format!("INSERT INTO {orders} (id, status) VALUES (1, 'paid')")).await;
            let runs = Arc::new(AtomicUsize::new(0));
            let mut tasks = Vec::new();
            for _ in 0..crate::MOVERS {
                let (pool, column, runs, shipments) =
                    (pool.clone(), column.clone(), runs.clone(), shipments.clone());
                tasks.push(tokio::spawn(async move {
                    column
                        .transition_with(&pool, 1_i64, "shipped", |tx| {
                            Box::pin(async move {
                                runs.fetch_add(1, Ordering::SeqCst);
                                sqlx::query(AssertSqlSafe(format!(
                                    "INSERT INTO {shipments} (order_id) VALUES (1)"
                                )))
                                .execute(&mut **tx)
                                .await
                                .map_err(Error::store)?;
                                Ok::<_, Error>("parcel")
                            })
                        })
                        .await
                }));
            }
            let (mut performed, mut already) = (Vec::new(), 0);
            for t in tasks {
                match t.await.unwrap() {
                    Ok(Moved::Performed { from, value }) => performed.push((from, value)),
                    Ok(Moved::AlreadyThere) => already += 1,
                    Err(e) => panic!("every mover succeeds: {e}"),
                }
            }
            assert_eq!(performed, vec![(Some("paid".to_owned()), "parcel")]);
            assert_eq!(already, crate::MOVERS - 1);
            assert_eq!(runs.load(Ordering::SeqCst), 1, "the body ran once");
            assert_eq!(count(&pool, format!("SELECT COUNT(*) FROM {shipments}")).await, 1);
            assert_eq!(status(&pool, &orders, 1).await.as_deref(), Some("shipped"));

            let mut tasks = Vec::new();
            for _ in 0..crate::MOVERS {
                let (pool, column) = (pool.clone(), column.clone());
                tasks.push(tokio::spawn(async move {
                    column.transition(&pool, 1_i64, "delivered").await
                }));
            }
            let mut steps = Vec::new();
            for t in tasks {
                steps.push(t.await.unwrap().expect("every plain mover succeeds"));
            }
            let moved: Vec<_> = steps.iter().filter(|s| s.performed()).collect();
            assert_eq!(
                moved,
                vec![&Moved::Performed { from: Some("shipped".into()), value: () }]
            );
            assert_eq!(status(&pool, &orders, 1).await.as_deref(), Some("delivered"));
            drop_tables(&pool, [&orders, &shipments]).await;
            pool.close().await;
        }

        /// Refusals say why: a move the table does not allow names the state the row
        /// is in; terminal states stay terminal; a missing row, an unknown state and a
        /// bad name are typed errors; a failed body leaves the row where it was.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn refusals_are_typed_and_change_nothing() {
            let pool: Pool = $pool.await;
            let (orders, shipments, column) = tables(&pool, "own_refuse").await;
            exec(&pool, format!("INSERT INTO {orders} (id, status) VALUES (1, 'created'), (2, NULL)")).await;

            let r = column.transition(&pool, 1_i64, "shipped").await;
            assert!(
                matches!(&r, Err(Error::InvalidTransition { from: Some(f), to }) if f == "created" && to == "shipped"),
                "{r:?}"
            );
            assert_eq!(
                r.unwrap_err().to_string(),
                "transition from created to shipped is not allowed"
            );
            assert_eq!(status(&pool, &orders, 1).await.as_deref(), Some("created"));

            // A body's Err rolls the move back; the retry performs it.
            let r: Result<Moved<()>, Error> = column
                .transition_with(&pool, 1_i64, "paid", |tx| {
                    let sql = format!("INSERT INTO {shipments} (order_id) VALUES (1)");
                    Box::pin(async move {
                        sqlx::query(AssertSqlSafe(sql)).execute(&mut **tx).await.map_err(Error::store)?;
                        Err(Error::Config("card declined".into()))
                    })
                })
                .await;
            assert!(matches!(r, Err(Error::Config(_))), "{r:?}");
            assert_eq!(status(&pool, &orders, 1).await.as_deref(), Some("created"));
            assert_eq!(count(&pool, format!("SELECT COUNT(*) FROM {shipments}")).await, 0);
            assert_eq!(
                column.transition(&pool, 1_i64, "paid").await.unwrap(),
                Moved::Performed { from: Some("created".into()), value: () }
            );

            // Terminal: delivered stays delivered, and a body tied to a refused move
            // never runs.
            for to in ["shipped", "delivered"] {
                assert!(column.transition(&pool, 1_i64, to).await.unwrap().performed());
            }
            for to in ["cancelled", "paid", "created", "shipped"] {
                let r: Result<Moved<()>, Error> = column
                    .transition_with(&pool, 1_i64, to, |_tx| {
                        Box::pin(async { panic!("a refused move runs no body") })
                    })
                    .await;
                assert!(
                    matches!(&r, Err(Error::InvalidTransition { from: Some(f), to: t }) if f == "delivered" && t == to),
                    "{to}: {r:?}"
                );
            }
            assert_eq!(
                column.transition(&pool, 1_i64, "delivered").await.unwrap(),
                Moved::AlreadyThere
            );
            assert_eq!(status(&pool, &orders, 1).await.as_deref(), Some("delivered"));

            // No state yet (NULL): only an initial state may be entered.
            let r = column.transition(&pool, 2_i64, "paid").await;
            assert!(matches!(r, Err(Error::InvalidTransition { from: None, .. })), "{r:?}");
            assert_eq!(
                column.transition(&pool, 2_i64, "created").await.unwrap(),
                Moved::Performed { from: None, value: () }
            );

            // No such row, no such state, bad names.
            let r = column.transition(&pool, 99_i64, "paid").await;
            assert!(matches!(&r, Err(Error::NoSuchRow { table }) if *table == orders), "{r:?}");
            let r = column.transition(&pool, 1_i64, "refunded").await;
            assert!(matches!(r, Err(Error::Config(_))), "{r:?}");
            for (t, i, c) in [
                (format!("{orders}; DROP TABLE {orders}"), "id", "status"),
                (orders.clone(), "id = id OR 1", "status"),
                (orders.clone(), "id", "status`"),
                (orders.clone(), "id", "\"status\""),
            ] {
                let r = crate::orders().stored_in(&t, i, c);
                assert!(matches!(r, Err(Error::Config(_))), "{t} {i} {c}: {r:?}");
            }
            assert_eq!(count(&pool, format!("SELECT COUNT(*) FROM {orders}")).await, 2);
            drop_tables(&pool, [&orders, &shipments]).await;
            pool.close().await;
        }

        /// Inside the caller's transaction the move commits or rolls back with it, and
        /// the guide's create enters the initial state once, however often retried,
        /// without resetting an order that moved on.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn callers_transaction_and_idempotent_create() {
            let pool: Pool = $pool.await;
            let (orders, shipments, column) = tables(&pool, "own_tx").await;
            let create = format!($create, t = orders);
            for _ in 0..3 {
                sqlx::query(AssertSqlSafe(create.clone())).bind(7_i64).execute(&pool).await.unwrap();
            }
            assert_eq!(count(&pool, format!("SELECT COUNT(*) FROM {orders}")).await, 1);
            assert_eq!(status(&pool, &orders, 7).await.as_deref(), Some("created"));

            let mut tx = pool.begin().await.unwrap();
            assert!(column.transition(&mut *tx, 7_i64, "paid").await.unwrap().performed());
            tx.rollback().await.unwrap();
            assert_eq!(status(&pool, &orders, 7).await.as_deref(), Some("created"));

            let mut tx = pool.begin().await.unwrap();
            assert!(column.transition(&mut tx, 7_i64, "paid").await.unwrap().performed());
            let step = column
                .transition_with(&mut tx, 7_i64, "shipped", |tx| {
                    let sql = format!("INSERT INTO {shipments} (order_id) VALUES (7)");
                    Box::pin(async move {
                        sqlx::query(AssertSqlSafe(sql)).execute(&mut **tx).await.map_err(Error::store)?;
                        Ok::<_, Error>(7)
                    })
                })
                .await
                .unwrap();
            assert_eq!(step, Moved::Performed { from: Some("paid".into()), value: 7 });
            tx.commit().await.unwrap();
            assert_eq!(status(&pool, &orders, 7).await.as_deref(), Some("shipped"));
            assert_eq!(count(&pool, format!("SELECT COUNT(*) FROM {shipments}")).await, 1);

            // A late retry of the create does not put the order back to `created`.
            sqlx::query(AssertSqlSafe(create)).bind(7_i64).execute(&pool).await.unwrap();
            assert_eq!(status(&pool, &orders, 7).await.as_deref(), Some("shipped"));
            drop_tables(&pool, [&orders, &shipments]).await;
            pool.close().await;
        }
    };
}

mod postgres {
    own_table_tests!(
        sqlx::Postgres,
        pool = crate::pg_pool(),
        p = "$1",
        create = "INSERT INTO {t} (id, status) VALUES ($1, 'created') ON CONFLICT (id) DO NOTHING"
    );

    /// A PostgreSQL `ENUM` status column works: the states are SQL literals, which
    /// PostgreSQL reads as the enum, and the state is read back as text.
    #[tokio::test]
    async fn enum_column() {
        let pool = crate::pg_pool().await;
        let ty = format!("own_status_{}", crate::support::suffix());
        let table = format!("own_enum_{}", crate::support::suffix());
        exec(
            &pool,
            format!(
                "CREATE TYPE {ty} AS ENUM ('created', 'paid', 'shipped', 'delivered', 'cancelled')"
            ),
        )
        .await;
        exec(
            &pool,
            format!("CREATE TABLE {table} (id BIGINT PRIMARY KEY, status {ty})"),
        )
        .await;
        exec(&pool, format!("INSERT INTO {table} VALUES (1, 'created')")).await;
        let column = crate::orders().stored_in(&table, "id", "status").unwrap();
        assert!(
            column
                .transition(&pool, 1_i64, "paid")
                .await
                .unwrap()
                .performed()
        );
        assert_eq!(
            column.transition(&pool, 1_i64, "paid").await.unwrap(),
            Moved::AlreadyThere
        );
        let r = column.transition(&pool, 1_i64, "delivered").await;
        assert!(
            matches!(&r, Err(Error::InvalidTransition { from: Some(f), .. }) if f == "paid"),
            "{r:?}"
        );
        exec(&pool, format!("DROP TABLE {table}")).await;
        exec(&pool, format!("DROP TYPE {ty}")).await;
        pool.close().await;
    }
    /// A row that enters an allowed state between the guarded UPDATEs and the read that
    /// classifies their refusal is moved, not refused: the row has no state, another
    /// transaction enters `created` and holds it; the move to `cancelled` finds no
    /// `created` or `paid` row (PostgreSQL does not wait on a row that did not match),
    /// its read waits on the row lock, sees `created`, and the move is tried again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_row_entering_a_source_state_meanwhile_is_moved() {
        let pool = crate::pg_pool().await;
        let table = format!("own_late_{}", crate::support::suffix());
        exec(
            &pool,
            format!("CREATE TABLE {table} (id BIGINT PRIMARY KEY, status TEXT)"),
        )
        .await;
        exec(&pool, format!("INSERT INTO {table} VALUES (1, NULL)")).await;
        let column = crate::orders().stored_in(&table, "id", "status").unwrap();
        let mut other = pool.begin().await.unwrap();
        sqlx::query(AssertSqlSafe(format!(
            "UPDATE {table} SET status = 'created' WHERE id = 1"
        )))
        .execute(&mut *other)
        .await
        .unwrap();
        let mover = {
            let (pool, column) = (pool.clone(), column.clone());
            tokio::spawn(async move { column.transition(&pool, 1_i64, "cancelled").await })
        };
        let waiting = format!(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
             AND query LIKE 'SELECT CAST(%{table}%'"
        );
        let blocked = crate::support::eventually(std::time::Duration::from_secs(20), || {
            let (pool, waiting) = (pool.clone(), waiting.clone());
            async move { count(&pool, waiting).await == 1 }
        })
        .await;
        assert!(
            blocked,
            "the classifying read waits on the other transaction's row lock"
        );
        other.commit().await.unwrap();
        let step = tokio::time::timeout(std::time::Duration::from_secs(20), mover)
            .await
            .expect("the mover finishes once the lock is gone")
            .unwrap()
            .unwrap();
        assert_eq!(
            step,
            Moved::Performed {
                from: Some("created".into()),
                value: ()
            }
        );
        assert_eq!(status(&pool, &table, 1).await.as_deref(), Some("cancelled"));
        exec(&pool, format!("DROP TABLE {table}")).await;
        pool.close().await;
    }
}

mod mysql {
    own_table_tests!(
        sqlx::MySql,
        pool = crate::mysql_pool(),
        p = "?",
        create =
            "INSERT INTO {t} (id, status) VALUES (?, 'created') ON DUPLICATE KEY UPDATE id = id"
    );
}

mod sqlite {
    own_table_tests!(
        sqlx::Sqlite,
        pool = crate::sqlite_pool(),
        p = "?",
        create = "INSERT INTO {t} (id, status) VALUES (?, 'created') ON CONFLICT (id) DO NOTHING"
    );
}
