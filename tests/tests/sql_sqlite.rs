//! `SqlStore` on SQLite files: the conformance suite, the shared SQL store tests, and
//! durability across closing and reopening.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/sql.rs"]
#[macro_use]
mod support;

use std::sync::OnceLock;

/// One database file per test binary run (tests share it, as processes would).
fn url() -> String {
    static PATH: OnceLock<String> = OnceLock::new();
    let path = PATH.get_or_init(|| {
        std::env::temp_dir()
            .join(format!("idem-sqlite-{}.db", support::suffix()))
            .display()
            .to_string()
    });
    format!("sqlite://{path}?mode=rwc")
}

async fn fresh_database() -> String {
    let path = std::env::temp_dir().join(format!("idem-sqlite-mig-{}.db", support::suffix()));
    format!("sqlite://{}?mode=rwc", path.display())
}

async fn drop_database(url: &str) {
    let path = url
        .trim_start_matches("sqlite://")
        .split('?')
        .next()
        .unwrap()
        .to_owned();
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{path}{suffix}"));
    }
}

sql_store_tests!(
    db = sqlx::Sqlite,
    pool = sqlite_pool,
    short_blob = "X'010203'"
);

idem_runtime::conformance_tests!(conformance, || async {
    std::sync::Arc::new(super::store().await) as std::sync::Arc<dyn idem_runtime::Store>
});

/// The durable embedded store: completed records and in-progress claims survive the
/// store being closed and the file reopened (a restart of the service).
#[tokio::test]
async fn records_survive_close_and_reopen() {
    let file = fresh_database().await;
    let ns = unique("durable");
    {
        let s = SqlStore::connect(&file).await.unwrap();
        let idem = idem_for(&s, &ns);
        let v: u64 = idem
            .dedup(&DEDUP, "done", async { Ok::<_, Error>(11) })
            .await
            .unwrap();
        assert_eq!(v, 11);
        let key = idem.key(&DEDUP, format_args!("held"));
        let req = ClaimRequest::new(ClaimKind::Dedup, Owner::next(), ms(60_000));
        assert!(matches!(
            s.claim(&key, &req).await.unwrap(),
            ClaimOutcome::Claimed { .. }
        ));
        s.close().await;
    }
    let s = SqlStore::connect(&file).await.unwrap();
    let idem = idem_for(&s, &ns);
    let runs = AtomicUsize::new(0);
    let v: u64 = idem
        .dedup(&DEDUP, "done", async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Error>(12)
        })
        .await
        .unwrap();
    assert_eq!(v, 11, "replayed after reopening");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    let key = idem.key(&DEDUP, format_args!("held"));
    let req = ClaimRequest::new(ClaimKind::Dedup, Owner::next(), ms(1000));
    assert!(
        matches!(
            s.claim(&key, &req).await.unwrap(),
            ClaimOutcome::Busy { .. }
        ),
        "the claim made before closing still holds"
    );
    s.close().await;
    drop_database(&file).await;
}

/// `sqlite::memory:` works (one shared connection).
#[tokio::test]
async fn in_memory_database() {
    let s = SqlStore::connect("sqlite::memory:").await.unwrap();
    let idem = idem_for(&s, "mem");
    let v: u64 = idem
        .dedup(&DEDUP, 1, async { Ok::<_, Error>(1) })
        .await
        .unwrap();
    let w: u64 = idem
        .dedup(&DEDUP, 1, async { Ok::<_, Error>(2) })
        .await
        .unwrap();
    assert_eq!((v, w), (1, 1));
}
