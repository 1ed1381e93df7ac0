//! `SqlStore` on PostgreSQL: the conformance suite, the shared SQL store tests, and
//! PostgreSQL's own (killed connections).
//!
//! Needs the server on 127.0.0.1:5432 with a database `test` (trust auth);
//! `IDEM_TEST_PG_URL` overrides the URL.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/sql.rs"]
#[macro_use]
mod support;

use idem_runtime::store::sql::sqlx::PgPool;

fn url() -> String {
    std::env::var("IDEM_TEST_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// Fails loudly, saying how to start the server, if PostgreSQL is not there.
async fn admin() -> PgPool {
    match tokio::time::timeout(std::time::Duration::from_secs(10), PgPool::connect(&url())).await {
        Ok(Ok(p)) => p,
        other => panic!(
            "PostgreSQL is not reachable at {} ({other:?}).\nStart it with: \
             pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start\n\
             (or set IDEM_TEST_PG_URL)",
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
    sqlx::query(AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
    )))
    .execute(&admin().await)
    .await
    .expect("drop database");
}

sql_store_tests!(
    db = sqlx::Postgres,
    pool = pg_pool,
    short_blob = "'\x010203'::bytea"
);

idem_runtime::conformance_tests!(conformance, || async {
    super::admin().await;
    std::sync::Arc::new(super::store().await) as std::sync::Arc<dyn idem_runtime::Store>
});

/// The store's connection killed by the server (`pg_terminate_backend`) between two
/// calls: the next call fails with `Error::Store` (its claim never reached the server,
/// so the key stays free), and the call after it runs on a fresh connection.
#[tokio::test]
async fn killed_connection_is_a_store_error_then_recovers() {
    use idem_runtime::store::sql::sqlx::postgres::PgPoolOptions;
    // One connection, not tested before use: the call after the kill meets it dead.
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .test_before_acquire(false)
        .connect(&url())
        .await
        .expect("connect");
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&pool)
        .await
        .unwrap();
    let s = SqlStore::from_pg_pool(pool).await.unwrap();
    let idem = idem_for(&s, &unique("kill"));
    let v: u64 = idem
        .dedup(&DEDUP, "before", async { Ok::<_, Error>(1) })
        .await
        .unwrap();
    assert_eq!(v, 1);
    let admin = admin().await;
    let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(&admin)
        .await
        .unwrap();
    assert!(killed);
    assert!(
        eventually(Duration::from_secs(20), || {
            let admin = admin.clone();
            async move {
                let n: i64 =
                    sqlx::query_scalar("SELECT COUNT(*) FROM pg_stat_activity WHERE pid = $1")
                        .bind(pid)
                        .fetch_one(&admin)
                        .await
                        .unwrap();
                n == 0
            }
        })
        .await
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

// The same suite with claims committed asynchronously (semantics must not change).
idem_runtime::conformance_tests!(conformance_async_claims, || async {
    super::admin().await;
    std::sync::Arc::new(super::store().await.with_async_claim_commit(true))
        as std::sync::Arc<dyn idem_runtime::Store>
});
