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
    std::env::var("IDEM_TEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into())
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
    std::sync::Arc::new(super::store().await.without_returning())
        as std::sync::Arc<dyn idem_runtime::Store>
});

/// A store connection killed (`KILL`) while its claim waits in the server is
/// `Error::Store`; the next call gets a fresh connection and works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_connection_is_a_store_error_then_recovers() {
    let s = store().await;
    let ns = unique("kill");
    let idem = idem_for(&s, &ns);
    let key = idem.key(&DEDUP, format_args!("k"));
    let admin = admin().await;
    let mut blocker = admin.begin().await.unwrap();
    sqlx::query("INSERT INTO idem_records (id, namespace, scope, kind, state, expires_us) VALUES (?, ?, 'x', 0, 2, 0)")
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
            let ids: Vec<i64> = sqlx::query_scalar(
                "SELECT ID FROM information_schema.PROCESSLIST
                 WHERE INFO LIKE 'INSERT INTO idem_records%' AND ID <> CONNECTION_ID()",
            )
            .fetch_all(&admin)
            .await
            .unwrap();
            for id in &ids {
                let _ = sqlx::query(AssertSqlSafe(format!("KILL {id}")))
                    .execute(&admin)
                    .await;
            }
            !ids.is_empty()
        }
    })
    .await;
    assert!(killed, "found the blocked claim's connection");
    let r = claim.await.unwrap();
    assert!(matches!(r, Err(Error::Store(_))), "{r:?}");
    blocker.rollback().await.unwrap();
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
