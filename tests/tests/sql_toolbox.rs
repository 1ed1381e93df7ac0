//! The toolbox primitives on `SqlStore`: the toolbox conformance suite on PostgreSQL,
//! MariaDB/MySQL and SQLite, and the optimistic-update recipe on an application's own
//! table (`UPDATE ... WHERE id = ? AND version = ?`).
//!
//! Needs PostgreSQL on 127.0.0.1:5432 (database `test`, trust auth) and MariaDB/MySQL on
//! 127.0.0.1:3306 (database `test`, user root); `IDEM_TEST_PG_URL` and
//! `IDEM_TEST_MYSQL_URL` override the URLs. SQLite uses a file in the temp directory.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/sql.rs"]
mod support;

use std::sync::Arc;
use std::time::Duration;

use idem_runtime::store::sql::sqlx::{self, AssertSqlSafe};
use idem_runtime::toolbox::{Optimistic, Retry};
use idem_runtime::{Error, Idem, SqlStore, Store, retry_on_conflict};

fn sqlite_url() -> String {
    let path = std::env::temp_dir().join(format!("idem-sqlite-toolbox-{}.db", std::process::id()));
    format!("sqlite://{}?mode=rwc", path.display())
}

/// Connects, failing loudly with the command that starts the server.
async fn connect(url: String, start: &str) -> SqlStore {
    match tokio::time::timeout(Duration::from_secs(20), SqlStore::connect(&url)).await {
        Ok(Ok(s)) => s,
        other => {
            panic!("the SQL store at {url} is not reachable ({other:?}).\nStart it with: {start}")
        }
    }
}

const PG_START: &str = "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start (or set IDEM_TEST_PG_URL)";
const MYSQL_START: &str = "service mariadb start (or set IDEM_TEST_MYSQL_URL)";

mod postgres {
    idem_runtime::toolbox_conformance_tests!(toolbox, || async {
        std::sync::Arc::new(crate::connect(crate::support::pg_url(), crate::PG_START).await)
            as std::sync::Arc<dyn idem_runtime::Store>
    });
}

mod mysql {
    idem_runtime::toolbox_conformance_tests!(toolbox, || async {
        std::sync::Arc::new(crate::connect(crate::support::mysql_url(), crate::MYSQL_START).await)
            as std::sync::Arc<dyn idem_runtime::Store>
    });
}

mod sqlite {
    idem_runtime::toolbox_conformance_tests!(toolbox, || async {
        std::sync::Arc::new(crate::connect(crate::sqlite_url(), "").await)
            as std::sync::Arc<dyn idem_runtime::Store>
    });
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// The recipe on an application table of PostgreSQL: 50 tasks each add 1 to one balance
/// with `SELECT` then `UPDATE ... WHERE version = ?`, retried on conflict: exactly 50.
#[test]
fn recipe_on_own_table_postgres() {
    runtime().block_on(async {
        let store = connect(support::pg_url(), PG_START).await;
        let pool = store.pg_pool().expect("postgres").clone();
        let table = format!("accounts_{:x}", idem_runtime::store::Owner::next().0 as u64);
        sqlx::query(AssertSqlSafe(format!(
            "CREATE TABLE {table} (id TEXT PRIMARY KEY, balance BIGINT NOT NULL, version BIGINT NOT NULL)"
        )))
        .execute(&pool)
        .await
        .unwrap();
        sqlx::query(AssertSqlSafe(format!("INSERT INTO {table} VALUES ('acct', 0, 1)")))
            .execute(&pool)
            .await
            .unwrap();
        static ACCOUNTS: Optimistic = Optimistic::new("bank::accounts");
        let idem = Idem::builder().store(store.clone()).namespace("recipe").build();
        let policy = Retry::new(500).backoff(Duration::from_millis(1), Duration::from_millis(20));
        let mut tasks = Vec::new();
        for _ in 0..50 {
            let (pool, idem, table) = (pool.clone(), idem.clone(), table.clone());
            tasks.push(tokio::spawn(async move {
                retry_on_conflict(&policy, || async {
                    let (balance, version): (i64, i64) = sqlx::query_as(AssertSqlSafe(format!(
                        "SELECT balance, version FROM {table} WHERE id = 'acct'"
                    )))
                    .fetch_one(&pool)
                    .await
                    .map_err(Error::store)?;
                    tokio::task::yield_now().await;
                    let done = sqlx::query(AssertSqlSafe(format!(
                        "UPDATE {table} SET balance = $1, version = version + 1 \
                         WHERE id = 'acct' AND version = $2"
                    )))
                    .bind(balance + 1)
                    .bind(version)
                    .execute(&pool)
                    .await
                    .map_err(Error::store)?;
                    idem.expect_updated(&ACCOUNTS, "acct", done.rows_affected())
                })
                .await
            }));
        }
        for t in tasks {
            t.await.unwrap().expect("each add lands within its attempts");
        }
        let (balance, version): (i64, i64) = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT balance, version FROM {table} WHERE id = 'acct'"
        )))
        .fetch_one(&pool)
        .await
        .unwrap();
        sqlx::query(AssertSqlSafe(format!("DROP TABLE {table}")))
            .execute(&pool)
            .await
            .unwrap();
        assert_eq!((balance, version), (50, 51));
    });
}

/// Expired versioned values and state records are deleted by the toolbox purge.
#[test]
fn purge_deletes_expired_toolbox_rows() {
    runtime().block_on(async {
        let store = connect(sqlite_url(), "").await;
        let idem = Idem::builder()
            .shared_store(Arc::new(store.clone()) as Arc<dyn Store>)
            .namespace(format!("purge-{:x}", idem_runtime::store::Owner::next().0))
            .build();
        static SHORT: Optimistic = Optimistic::new("purge::short").ttl(Duration::from_millis(50));
        for i in 0..10 {
            idem.compare_and_set(&SHORT, i, 0, i).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut deleted = 0;
        loop {
            let n = store.purge_expired_toolbox(4).await.unwrap();
            deleted += n;
            if n < 4 {
                break;
            }
        }
        assert!(deleted >= 10, "deleted {deleted}");
        assert_eq!(idem.load::<u32>(&SHORT, 3).await.unwrap(), None);
    });
}
