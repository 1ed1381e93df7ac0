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

/// A store connection killed while its claim waits in the server is `Error::Store`;
/// the next call gets a fresh connection and works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_connection_is_a_store_error_then_recovers() {
    let s = store().await;
    let ns = unique("kill");
    let idem = idem_for(&s, &ns);
    let key = idem.key(&DEDUP, format_args!("k"));
    // Another session holds the key's row uncommitted, so the store's claim blocks in
    // the server on the unique key, where it can be killed.
    let admin = admin().await;
    let mut blocker = admin.begin().await.unwrap();
    sqlx::query("INSERT INTO idem_records (id, namespace, scope, kind, state, expires_us) VALUES ($1, $2, 'x', 0, 2, 0)")
        .bind(&key.digest()[..])
        .bind(&ns)
        .execute(&mut *blocker)
        .await
        .unwrap();
    let claim = {
        let s = s.clone();
        tokio::spawn(async move {
            let req = ClaimRequest::new(ClaimKind::Dedup, Owner::next(), ms(30_000));
            s.claim(&key, &req).await
        })
    };
    let killed = eventually(Duration::from_secs(20), || {
        let admin = admin.clone();
        async move {
            let n: i64 = sqlx::query_scalar(
                "SELECT COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity
                 WHERE wait_event_type = 'Lock' AND query LIKE 'WITH t AS%idem_records%'",
            )
            .fetch_one(&admin)
            .await
            .unwrap();
            n > 0
        }
    })
    .await;
    assert!(killed, "found the blocked claim's backend");
    let r = claim.await.unwrap();
    assert!(matches!(r, Err(Error::Store(_))), "{r:?}");
    blocker.rollback().await.unwrap();
    // Recovery: the pool replaces the dead connection.
    let v: u64 = idem
        .dedup(&DEDUP, "k", async { Ok::<_, Error>(5) })
        .await
        .unwrap();
    assert_eq!(v, 5);
    let v: u64 = idem
        .dedup(&DEDUP, "k", async { Ok::<_, Error>(6) })
        .await
        .unwrap();
    assert_eq!(v, 5);
}

// The same suite with claims committed asynchronously (semantics must not change).
idem_runtime::conformance_tests!(conformance_async_claims, || async {
    super::admin().await;
    std::sync::Arc::new(super::store().await.with_async_claim_commit(true))
        as std::sync::Arc<dyn idem_runtime::Store>
});
