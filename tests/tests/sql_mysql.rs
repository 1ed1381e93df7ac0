//! `SqlStore` on MySQL/MariaDB: the conformance suite (on MariaDB's one-statement
//! `RETURNING` claim and on the two-statement path MySQL needs), the shared SQL store
//! tests, and killed connections.
//!
//! Needs the server on 127.0.0.1:3306 (root, empty password, database `test`);
//! `IDEM_TEST_MYSQL_URL` overrides the URL.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/sql.rs"]
#[macro_use]
mod support;

use idem_runtime::store::sql::sqlx::MySqlPool;

fn url() -> String {
    support::mysql_url()
}

/// Fails loudly, saying how to start the server, if MariaDB is not there.
async fn admin() -> MySqlPool {
    match tokio::time::timeout(
        std::time::Duration::from_secs(10),
        MySqlPool::connect(&url()),
    )
    .await
    {
        Ok(Ok(p)) => p,
        other => panic!(
            "MariaDB/MySQL is not reachable at {} ({other:?}).\nStart it with: \
             start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd\n\
             (or set IDEM_TEST_MYSQL_URL)",
            url()
        ),
    }
}

async fn fresh_database() -> String {
    let name = format!("idem_mig_{}", support::suffix());
    sqlx::query(AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&admin().await)
        .await
        .expect("create database");
    let base = url();
    let (prefix, _) = base.rsplit_once('/').expect("url with a database");
    format!("{prefix}/{name}")
}

async fn drop_database(url: &str) {
    let name = url.rsplit_once('/').expect("db").1;
    sqlx::query(AssertSqlSafe(format!("DROP DATABASE IF EXISTS {name}")))
        .execute(&admin().await)
        .await
        .expect("drop database");
}

sql_store_tests!(
    db = sqlx::MySql,
    pool = mysql_pool,
    short_blob = "X'010203'"
);

idem_runtime::conformance_tests!(conformance, || async {
    super::admin().await;
    std::sync::Arc::new(super::store().await) as std::sync::Arc<dyn idem_runtime::Store>
});

// The same suite on the path MySQL (no RETURNING) takes: insert, then read.
idem_runtime::conformance_tests!(conformance_without_returning, || async {
    super::admin().await;
    std::sync::Arc::new(idem_runtime::__private::without_returning(
        super::store().await,
    )) as std::sync::Arc<dyn idem_runtime::Store>
});

/// The store's connection killed by the server (`KILL`) between two calls: the next
/// call fails with `Error::Store` (its claim never reached the server, so the key stays
/// free), and the call after it runs on a fresh connection.
#[tokio::test]
async fn killed_connection_is_a_store_error_then_recovers() {
    use idem_runtime::store::sql::sqlx::mysql::MySqlPoolOptions;
    // One connection, not tested before use: the call after the kill meets it dead.
    let pool = MySqlPoolOptions::new()
        .max_connections(1)
        .test_before_acquire(false)
        .connect(&url())
        .await
        .expect("connect");
    let id: u64 = sqlx::query_scalar("SELECT CONNECTION_ID()")
        .fetch_one(&pool)
        .await
        .unwrap();
    let s = SqlStore::from_mysql_pool(pool).await.unwrap();
    let idem = idem_for(&s, &unique("kill"));
    let v: u64 = idem
        .dedup(&DEDUP, "before", async { Ok::<_, Error>(1) })
        .await
        .unwrap();
    assert_eq!(v, 1);
    let admin = admin().await;
    sqlx::query(AssertSqlSafe(format!("KILL {id}")))
        .execute(&admin)
        .await
        .unwrap();
    assert!(
        eventually(Duration::from_secs(20), || {
            let admin = admin.clone();
            async move {
                let n: i64 = sqlx::query_scalar(
                    "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ?",
                )
                .bind(id)
                .fetch_one(&admin)
                .await
                .unwrap();
                n == 0
            }
        })
        .await,
        "the connection is gone"
    );
    let r: Result<u64, Error> = idem.dedup(&DEDUP, "during", async { Ok(2) }).await;
    assert!(matches!(r, Err(Error::Store(_))), "{r:?}");
    let v: u64 = idem
        .dedup(&DEDUP, "during", async { Ok::<_, Error>(3) })
        .await
        .unwrap();
    assert_eq!(v, 3, "the failed call claimed nothing; the retry runs");
    let v: u64 = idem
        .dedup(&DEDUP, "before", async { Ok::<_, Error>(4) })
        .await
        .unwrap();
    assert_eq!(v, 1, "records made before the kill replay");
}
