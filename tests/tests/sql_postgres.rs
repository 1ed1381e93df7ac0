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
    support::pg_url()
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

/// A store on a pool of `n` connections, so that concurrent calls queue and go out in
/// batches (claims and completions of one process share statements under load).
async fn small_store(n: u32) -> SqlStore {
    use idem_runtime::store::sql::sqlx::postgres::PgPoolOptions;
    let pool = PgPoolOptions::new()
        .max_connections(n)
        .connect(&url())
        .await
        .expect("connect");
    SqlStore::from_pg_pool(pool).await.unwrap()
}

/// Many calls on many keys, two per key, through two connections: every key's body
/// runs once, and both calls of a key get that key's value.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batched_calls_answer_each_key() {
    let s = small_store(2).await;
    let idem = idem_for(&s, &unique("batch"));
    static SLOW: Options = Options::dedup("sql::batch").wait(Duration::from_secs(60));
    let keys = 100u64;
    let runs: Arc<Vec<AtomicUsize>> = Arc::new((0..keys).map(|_| AtomicUsize::new(0)).collect());
    let mut tasks = Vec::new();
    for i in 0..2 * keys {
        let (idem, runs) = (idem.clone(), runs.clone());
        let k = i % keys;
        tasks.push(tokio::spawn(async move {
            let v: u64 = idem
                .dedup(&SLOW, k, async move {
                    runs[k as usize].fetch_add(1, Ordering::SeqCst);
                    Ok::<u64, Error>(k * 10 + i / keys)
                })
                .await
                .expect("every call gets an answer");
            (k, v)
        }));
    }
    let mut answers = vec![Vec::new(); keys as usize];
    for t in tasks {
        let (k, v) = t.await.unwrap();
        answers[k as usize].push(v);
    }
    for k in 0..keys as usize {
        assert_eq!(runs[k].load(Ordering::SeqCst), 1, "key {k} ran once");
        let a = &answers[k];
        assert_eq!(a.len(), 2);
        assert_eq!(a[0], a[1], "both calls of key {k} get its value");
        assert_eq!(a[0] / 10, k as u64, "key {k} got its own value: {a:?}");
    }
}

/// `n` new keys of `idem`, each claimed through `s` by an owner of its own, with `lease`.
async fn claimed(
    s: &SqlStore,
    idem: &Idem,
    n: u32,
    lease: Duration,
) -> Vec<(idem_runtime::Key, Owner)> {
    let mut keys = Vec::new();
    for i in 0..n {
        let key = idem.key(&DEDUP, format_args!("k{i}"));
        let owner = Owner::next();
        let req = ClaimRequest::new(ClaimKind::Dedup, owner, lease);
        assert!(matches!(
            s.claim(&key, &req).await.unwrap(),
            ClaimOutcome::Claimed { .. }
        ));
        keys.push((key, owner));
    }
    keys
}

/// Completions sent together are decided per record: the owner's complete, a stranger's
/// does not, whatever else is in the batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batched_completions_check_each_owner() {
    let s = Arc::new(small_store(2).await);
    let idem = idem_for(&s, &unique("batch-owner"));
    let lease = Duration::from_secs(60);
    let keys = claimed(&s, &idem, 60, lease).await;
    let mut tasks = Vec::new();
    for (i, (key, owner)) in keys.iter().copied().enumerate() {
        let s = s.clone();
        let honest = i % 2 == 0;
        let who = if honest { owner } else { Owner::next() };
        tasks.push(tokio::spawn(async move {
            let done = s
                .complete(&key, who, bytes::Bytes::from(vec![i as u8; 8]), lease)
                .await
                .unwrap();
            (honest, done)
        }));
    }
    for t in tasks {
        let (honest, done) = t.await.unwrap();
        assert_eq!(honest, done, "only the owner completes");
    }
    for (i, (key, _)) in keys.iter().enumerate() {
        let req = ClaimRequest::new(ClaimKind::Dedup, Owner::next(), lease);
        match s.claim(key, &req).await.unwrap() {
            ClaimOutcome::Completed { value, .. } if i % 2 == 0 => {
                assert_eq!(&value[..], &[i as u8; 8][..]);
            }
            ClaimOutcome::Busy { .. } if i % 2 == 1 => {}
            other => panic!("key {i}: {other:?}"),
        }
    }
}

/// A key held by an open transactional-mode call, claimed among many others through a
/// busy pool: the others are claimed and complete; that key alone is in progress.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batch_with_a_key_held_by_a_transaction() {
    use idem_runtime::store::sql::Begun;
    let s = small_store(3).await;
    let idem = idem_for(&s, &unique("batch-tx"));
    static NOW: Options = Options::dedup("sql::batch-tx").wait(Duration::ZERO);
    let held = idem.key(&NOW, format_args!("held"));
    let Begun::Claimed(tx) = s.begin::<sqlx::Postgres, u64>(&NOW, &held).await.unwrap() else {
        panic!("a new key is claimed")
    };
    let mut tasks = Vec::new();
    for i in 0..40u64 {
        let idem = idem.clone();
        tasks.push(tokio::spawn(async move {
            if i == 20 {
                let r: Result<u64, Error> = idem.dedup(&NOW, "held", async { Ok(1) }).await;
                (i, r)
            } else {
                (
                    i,
                    idem.dedup(&NOW, i, async move { Ok::<u64, Error>(i) })
                        .await,
                )
            }
        }));
    }
    for t in tasks {
        match t.await.unwrap() {
            (20, r) => assert!(matches!(r, Err(Error::InProgress { .. })), "{r:?}"),
            (i, r) => assert_eq!(r.unwrap(), i),
        }
    }
    assert_eq!(tx.commit(7u64).await.unwrap(), 7);
    let v: u64 = idem
        .dedup(&NOW, "held", async { Ok::<u64, Error>(1) })
        .await
        .unwrap();
    assert_eq!(v, 7);
}

/// Step writes sent together are decided per record: the owner's are journaled, a
/// stranger's are not, whatever else is in the batch; and a batch that meets a record
/// row held by an open transaction is rolled back and its writes run alone, so the
/// other records are journaled at once and the held one when the row is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batched_step_writes_check_each_owner() {
    use idem_runtime::store::JournalStore;
    let s = Arc::new(small_store(2).await);
    let idem = idem_for(&s, &unique("batch-steps"));
    let lease = Duration::from_secs(60);
    let keys = claimed(&s, &idem, 60, lease).await;
    // Key 7's row is locked by a transaction of another connection until the rest are
    // journaled.
    let admin = admin().await;
    let mut holder = admin.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM idem_records WHERE id = $1 FOR UPDATE")
        .bind(&keys[7].0.digest()[..])
        .execute(&mut *holder)
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for (i, (key, owner)) in keys.iter().copied().enumerate() {
        let s = s.clone();
        let honest = i % 2 == 1;
        let who = if honest { owner } else { Owner::next() };
        tasks.push(tokio::spawn(async move {
            let mut written = Vec::new();
            for step in ["a", "b", "c"] {
                let value = bytes::Bytes::from(format!("{step}{i}"));
                written.push(
                    s.write_step(&key, who, step, Some(value), lease)
                        .await
                        .unwrap(),
                );
            }
            (i, honest, written)
        }));
    }
    let held = tasks.remove(7);
    for t in tasks {
        let (i, honest, written) = t.await.unwrap();
        assert_eq!(written, vec![honest; 3], "key {i}: only the owner journals");
    }
    assert!(!held.is_finished(), "key 7's write waits for its row");
    holder.commit().await.unwrap();
    let (_, honest, written) = held.await.unwrap();
    assert_eq!(
        written,
        vec![honest; 3],
        "key 7 is journaled once its row is free"
    );
    for (i, (key, _)) in keys.iter().enumerate() {
        let journal = s.read_journal(key).await.unwrap();
        if i % 2 == 1 {
            let names: Vec<&str> = journal.iter().map(|e| &*e.name).collect();
            assert_eq!(names, ["a", "b", "c"], "key {i}");
            for e in &journal {
                let want = format!("{}{i}", e.name);
                assert_eq!(e.value.as_deref(), Some(want.as_bytes()), "key {i}");
            }
        } else {
            assert!(journal.is_empty(), "key {i}: a stranger journaled nothing");
        }
    }
}

/// Many 3-step calls through a pool of two connections: their step writes go out in
/// batches, and each step's effect happens once per key, with the body's value from
/// the steps' journaled values.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batched_steps_run_once_per_key() {
    let s = small_store(2).await;
    let idem = idem_for(&s, &unique("batch-steps-calls"));
    static SLOW: Options = Options::dedup("sql::batch-steps").wait(Duration::from_secs(60));
    let keys = 50u64;
    let effects: Arc<Vec<AtomicUsize>> =
        Arc::new((0..keys * 3).map(|_| AtomicUsize::new(0)).collect());
    let mut tasks = Vec::new();
    for i in 0..2 * keys {
        let (idem, effects) = (idem.clone(), effects.clone());
        let k = i % keys;
        tasks.push(tokio::spawn(async move {
            idem.dedup(&SLOW, k, async move {
                let mut sum = 0u64;
                for n in 0..3u64 {
                    let effects = effects.clone();
                    sum += idem_runtime::step(&format!("s{n}"), |_| async move {
                        effects[(k * 3 + n) as usize].fetch_add(1, Ordering::SeqCst);
                        Ok::<u64, Error>(k * 10 + n)
                    })
                    .await?;
                }
                Ok::<u64, Error>(sum)
            })
            .await
            .map(|v| (k, v))
        }));
    }
    for t in tasks {
        let (k, v) = t.await.unwrap().expect("every call gets an answer");
        assert_eq!(v, 3 * k * 10 + 3, "key {k}");
    }
    for (n, e) in effects.iter().enumerate() {
        assert_eq!(e.load(Ordering::SeqCst), 1, "step {n} ran once");
    }
}
