//! Shared tests of `SqlStore`, expanded once per backend by `sql_store_tests!`.
//!
//! Each backend file provides `url()` (failing loudly, with the command that starts the
//! server, when the database is unreachable), the pool accessor, the transaction's
//! database type and the SQL placeholder style.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

/// The PostgreSQL the tests use: `IDEM_TEST_PG_URL`, or the server on its usual port.
pub(crate) fn pg_url() -> String {
    std::env::var("IDEM_TEST_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// The MariaDB/MySQL the tests use: `IDEM_TEST_MYSQL_URL`, or the server on its usual port.
pub(crate) fn mysql_url() -> String {
    std::env::var("IDEM_TEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into())
}

/// A namespace no other test (or earlier run) uses.
pub(crate) fn unique(prefix: &str) -> String {
    format!("{prefix}-{:032x}", idem_runtime::store::Owner::next().0)
}

/// A short suffix for table and database names, unique across processes and runs: the
/// owner id's random per-process half mixed with its per-call half.
pub(crate) fn suffix() -> String {
    let id = idem_runtime::store::Owner::next().0;
    format!("{:016x}", (id >> 64) as u64 ^ (id as u64).rotate_left(32))
}

pub(crate) fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Polls `cond` every 20 ms for up to `limit`; a behaviour check with a generous bound,
/// not a timing assertion.
pub(crate) async fn eventually<F, Fut>(limit: Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let end = tokio::time::Instant::now() + limit;
    loop {
        if cond().await {
            return true;
        }
        if tokio::time::Instant::now() >= end {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Environment of the crash test's child process.
pub(crate) const CHILD_ENV: &str = "IDEM_SQL_CHILD";
pub(crate) const CHILD_MARK: &str = "IDEM-CHILD-WRITTEN";

#[macro_export]
macro_rules! sql_store_tests {
    (db = $db:ty, pool = $pool:ident, short_blob = $blob:literal) => {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::time::Duration;

        use idem_runtime::store::sql::sqlx::{self, AssertSqlSafe, Transaction};
        use idem_runtime::{Error, Idem, Options, SqlStore, Store};
        use idem_runtime::store::{ClaimKind, ClaimOutcome, ClaimRequest, Owner};
        use support::{eventually, ms, unique};

        async fn store() -> SqlStore {
            SqlStore::connect(&url()).await.unwrap_or_else(|e| {
                panic!("cannot open the SQL store at {}: {e}", url())
            })
        }

        /// A statement of the test's own (a table made or dropped). On SQLite the tests
        /// share one file, and a schema change can be refused at once ("database is
        /// locked") while other tests' transactions hold it: try again, a bounded while.
        async fn exec(store: &SqlStore, sql: String) -> u64 {
            let mut attempt = 0;
            loop {
                match sqlx::query(AssertSqlSafe(sql.clone()))
                    .execute(store.$pool().expect("pool"))
                    .await
                {
                    Ok(done) => return done.rows_affected(),
                    Err(e) if attempt < 50 && e.to_string().contains("database is locked") => {
                        attempt += 1;
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    Err(e) => panic!("test SQL: {e}"),
                }
            }
        }

        async fn count(store: &SqlStore, sql: String) -> i64 {
            sqlx::query_scalar::<_, i64>(AssertSqlSafe(sql))
                .fetch_one(store.$pool().expect("pool"))
                .await
                .expect("test count")
        }

        fn idem_for(store: &SqlStore, ns: &str) -> Idem {
            Idem::builder().store(store.clone()).namespace(ns).build()
        }

        static DEDUP: Options = Options::dedup("sql::dedup");

        /// Two stores with their own pools (as two processes would have) race 2 × 25 calls
        /// on one key: one body run, one answer.
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn two_pools_race_on_one_key() {
            let (a, b) = (store().await, store().await);
            let ns = unique("race");
            let runs = Arc::new(AtomicUsize::new(0));
            let mut tasks = Vec::new();
            for i in 0..50 {
                let idem = idem_for(if i % 2 == 0 { &a } else { &b }, &ns);
                let runs = runs.clone();
                tasks.push(tokio::spawn(async move {
                    idem.dedup(&DEDUP, "one-key", async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(ms(50)).await;
                        Ok::<u64, Error>(u64::from(i as u32) + 1000)
                    })
                    .await
                }));
            }
            let mut answers = Vec::new();
            for t in tasks {
                answers.push(t.await.unwrap().expect("every call gets the answer"));
            }
            assert_eq!(runs.load(Ordering::SeqCst), 1);
            assert!(answers.windows(2).all(|w| w[0] == w[1]), "{answers:?}");
        }

        /// A record whose state or fingerprint column is damaged is `Error::Corrupt`,
        /// never replayed or overwritten.
        #[tokio::test]
        async fn corrupt_rows_are_typed_errors() {
            let s = store().await;
            let ns = unique("corrupt");
            let idem = idem_for(&s, &ns);
            let v: u64 = idem.dedup(&DEDUP, "k", async { Ok::<_, Error>(7) }).await.unwrap();
            assert_eq!(v, 7);
            exec(&s, format!("UPDATE idem_records SET state = 9 WHERE namespace = '{ns}'")).await;
            let r: Result<u64, Error> = idem.dedup(&DEDUP, "k", async { Ok(8) }).await;
            assert!(matches!(r, Err(Error::Corrupt { .. })), "{r:?}");

            let key = idem.key(&DEDUP, format_args!("k2"));
            let req = ClaimRequest::new(ClaimKind::Dedup, Owner::next(), ms(30_000));
            assert!(matches!(s.claim(&key, &req).await.unwrap(), ClaimOutcome::Claimed { .. }));
            exec(
                &s,
                format!(
                    "UPDATE idem_records SET fingerprint = {} WHERE namespace = '{ns}' AND state = 2",
                    $blob
                ),
            )
            .await;
            let other = ClaimRequest::new(ClaimKind::Dedup, Owner::next(), ms(1000));
            let r = s.claim(&key, &other).await;
            assert!(matches!(r, Err(Error::Corrupt { .. })), "{r:?}");

            // Completed without a value.
            let key3 = idem.key(&DEDUP, format_args!("k3"));
            let req = ClaimRequest::new(ClaimKind::Dedup, Owner::next(), ms(30_000));
            assert!(matches!(s.claim(&key3, &req).await.unwrap(), ClaimOutcome::Claimed { .. }));
            exec(&s, format!("UPDATE idem_records SET state = 3, value = NULL WHERE namespace = '{ns}' AND state = 2")).await;
            let r = s.claim(&key3, &other).await;
            assert!(matches!(r, Err(Error::Corrupt { .. })), "{r:?}");
        }

        /// Expired rows go in bounded batches; live ones stay.
        #[tokio::test]
        async fn purge_deletes_expired_in_batches() {
            let s = store().await;
            let ns = unique("purge");
            let idem = idem_for(&s, &ns);
            static SHORT: Options = Options::dedup("sql::purge").ttl(Duration::from_millis(200));
            static LONG: Options = Options::dedup("sql::purge-long");
            for i in 0..5 {
                let _: u64 = idem.dedup(&SHORT, i, async { Ok::<_, Error>(1) }).await.unwrap();
            }
            let _: u64 = idem.dedup(&LONG, "keep", async { Ok::<_, Error>(1) }).await.unwrap();
            tokio::time::sleep(ms(400)).await;
            let n = s.purge_expired(2).await.unwrap();
            assert!((1..=2).contains(&n), "a batch is bounded: {n}");
            while s.purge_expired(100).await.unwrap() == 100 {}
            let left = count(&s, format!("SELECT COUNT(*) FROM idem_records WHERE namespace = '{ns}'")).await;
            assert_eq!(left, 1, "only the live record stays");

            // The background task does the same.
            for i in 0..3 {
                let _: u64 = idem.dedup(&SHORT, 100 + i, async { Ok::<_, Error>(1) }).await.unwrap();
            }
            let task = s.spawn_purge(ms(100), 10);
            assert!(
                eventually(Duration::from_secs(20), || {
                    let s = s.clone();
                    let ns = ns.clone();
                    async move {
                        count(&s, format!("SELECT COUNT(*) FROM idem_records WHERE namespace = '{ns}'")).await == 1
                    }
                })
                .await,
                "the background purge removes expired records"
            );
            drop(task);
        }

        /// Several processes starting together on a fresh schema: every one gets a
        /// working store, the table is created once.
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn concurrent_migrations_on_a_fresh_database() {
            let fresh = fresh_database().await;
            let mut tasks = Vec::new();
            for _ in 0..4 {
                let url = fresh.clone();
                tasks.push(tokio::spawn(async move { SqlStore::connect(&url).await }));
            }
            let mut stores = Vec::new();
            for t in tasks {
                stores.push(t.await.unwrap().expect("every concurrent connect migrates or sees it done"));
            }
            let idem = idem_for(&stores[0], &unique("mig"));
            let v: u64 = idem.dedup(&DEDUP, "k", async { Ok::<_, Error>(3) }).await.unwrap();
            assert_eq!(v, 3);
            let idem2 = idem_for(&stores[3], idem.namespace());
            let v: u64 = idem2.dedup(&DEDUP, "k", async { Ok::<_, Error>(4) }).await.unwrap();
            assert_eq!(v, 3, "replayed from the same table");
            // Migrations 1 (records), 2 (toolbox values and states), 3 (step
            // journals), 4 (one row per step) and 5 (recovery), each applied once.
            let applied = count(&stores[1], "SELECT COUNT(*) FROM _idem_migrations".into()).await;
            assert_eq!(applied, 5);
            for s in &stores {
                s.close().await;
            }
            drop_database(&fresh).await;
        }

        /// Transactional mode: the business row and the record commit together; a
        /// duplicate (in either mode) replays; an `Err` rolls both back.
        #[tokio::test]
        async fn transaction_commits_record_with_business_write() {
            let s = store().await;
            let table = format!("idem_orders_{}", support::suffix());
            exec(&s, format!("CREATE TABLE {table} (k VARCHAR(64) NOT NULL, n BIGINT NOT NULL)")).await;
            let ns = unique("tx");
            let idem = idem_for(&s, &ns);
            static ORDER: Options = Options::dedup("sql::create_order");
            let key = idem.key(&ORDER, format_args!("order:1"));
            let runs = Arc::new(AtomicUsize::new(0));
            for _ in 0..3 {
                let (runs, table) = (runs.clone(), table.clone());
                let v: u64 = s
                    .transaction(&ORDER, &key, |tx: &mut Transaction<'static, $db>| Box::pin(async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        sqlx::query(AssertSqlSafe(format!("INSERT INTO {table} (k, n) VALUES ('order:1', 42)")))
                            .execute(&mut **tx)
                            .await
                            .map_err(Error::store)?;
                        Ok::<u64, Error>(42)
                    }))
                    .await
                    .unwrap();
                assert_eq!(v, 42);
            }
            assert_eq!(runs.load(Ordering::SeqCst), 1);
            assert_eq!(count(&s, format!("SELECT COUNT(*) FROM {table}")).await, 1);
            // The normal path replays the transactional record: same envelope.
            let v: u64 = idem
                .dedup(&ORDER, "order:1", async { Ok::<_, Error>(0) })
                .await
                .unwrap();
            assert_eq!(v, 42);

            // An Err rolls back the business write and leaves the key free.
            let key2 = idem.key(&ORDER, format_args!("order:2"));
            let t = table.clone();
            let r: Result<u64, Error> = s
                .transaction(&ORDER, &key2, |tx: &mut Transaction<'static, $db>| Box::pin(async move {
                    sqlx::query(AssertSqlSafe(format!("INSERT INTO {t} (k, n) VALUES ('order:2', 1)")))
                        .execute(&mut **tx)
                        .await
                        .map_err(Error::store)?;
                    Err(Error::Config("declined".into()))
                }))
                .await;
            assert!(matches!(r, Err(Error::Config(_))), "{r:?}");
            assert_eq!(count(&s, format!("SELECT COUNT(*) FROM {table} WHERE k = 'order:2'")).await, 0);
            let t = table.clone();
            let v: u64 = s
                .transaction(&ORDER, &key2, |tx: &mut Transaction<'static, $db>| Box::pin(async move {
                    sqlx::query(AssertSqlSafe(format!("INSERT INTO {t} (k, n) VALUES ('order:2', 2)")))
                        .execute(&mut **tx)
                        .await
                        .map_err(Error::store)?;
                    Ok::<u64, Error>(2)
                }))
                .await
                .unwrap();
            assert_eq!(v, 2);
            assert_eq!(count(&s, format!("SELECT COUNT(*) FROM {table} WHERE k = 'order:2'")).await, 1);
            exec(&s, format!("DROP TABLE {table}")).await;
        }

        /// A normal call on a key held by an open transactional-mode call does not hang
        /// in the server: with `wait = 0` it is `InProgress` at once; a waiting one
        /// replays the value once the transaction commits.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn normal_call_on_a_key_held_by_an_open_transaction() {
            use idem_runtime::store::sql::Begun;
            let s = store().await;
            let idem = idem_for(&s, &unique("mixed"));
            static NOW: Options = Options::dedup("sql::mixed").wait(Duration::ZERO);
            static PATIENT: Options = Options::dedup("sql::mixed").wait(Duration::from_secs(60));
            let key = idem.key(&NOW, format_args!("k"));
            let Begun::Claimed(tx) = s.begin::<$db, u64>(&NOW, &key).await.unwrap() else {
                panic!("a new key is claimed")
            };
            let r: Result<u64, Error> = idem.dedup(&NOW, "k", async { Ok(1) }).await;
            assert!(matches!(r, Err(Error::InProgress { .. })), "{r:?}");
            let waiter = {
                let idem = idem.clone();
                tokio::spawn(async move {
                    idem.dedup(&PATIENT, "k", async { Ok::<u64, Error>(2) }).await
                })
            };
            tokio::time::sleep(ms(300)).await;
            assert_eq!(tx.commit(7u64).await.unwrap(), 7);
            assert_eq!(waiter.await.unwrap().unwrap(), 7, "replayed the committed value");
        }

        /// Concurrent transactional duplicates: one body, one business row, one answer.
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn concurrent_transactions_run_once() {
            let s = store().await;
            let table = format!("idem_orders_{}", support::suffix());
            exec(&s, format!("CREATE TABLE {table} (k VARCHAR(64) NOT NULL, n BIGINT NOT NULL)")).await;
            let ns = unique("txrace");
            let idem = idem_for(&s, &ns);
            static ORDER: Options = Options::dedup("sql::tx_race").wait(Duration::from_secs(30));
            let key = idem.key(&ORDER, format_args!("order:race"));
            let runs = Arc::new(AtomicUsize::new(0));
            let mut tasks = Vec::new();
            for i in 0..8u64 {
                let (s, key, runs, table) = (s.clone(), key, runs.clone(), table.clone());
                tasks.push(tokio::spawn(async move {
                    s.transaction(&ORDER, &key, |tx: &mut Transaction<'static, $db>| Box::pin(async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        sqlx::query(AssertSqlSafe(format!("INSERT INTO {table} (k, n) VALUES ('race', {i})")))
                            .execute(&mut **tx)
                            .await
                            .map_err(Error::store)?;
                        tokio::time::sleep(ms(100)).await;
                        Ok::<u64, Error>(i)
                    }))
                    .await
                }));
            }
            let mut answers = Vec::new();
            for t in tasks {
                answers.push(t.await.unwrap().expect("every duplicate replays"));
            }
            assert_eq!(runs.load(Ordering::SeqCst), 1, "the body ran once");
            assert!(answers.windows(2).all(|w| w[0] == w[1]), "{answers:?}");
            assert_eq!(count(&s, format!("SELECT COUNT(*) FROM {table}")).await, 1);
            exec(&s, format!("DROP TABLE {table}")).await;
        }

        /// `#[idempotent(transaction = tx)]`: the caller's own transaction carries the
        /// claim, the body's write and the record; an `Err` undoes the body's write only.
        #[idem_runtime::idempotent(key = "order:{order}", transaction = tx, wait = "60s")]
        async fn place_order(
            tx: &mut Transaction<'static, $db>,
            table: &str,
            order: u64,
            runs: &AtomicUsize,
            fail: bool,
            pause: Duration,
        ) -> Result<u64, Error> {
            runs.fetch_add(1, Ordering::SeqCst);
            sqlx::query(AssertSqlSafe(format!(
                "INSERT INTO {table} (k, n) VALUES ('order:{order}', {order})"
            )))
            .execute(&mut **tx)
            .await
            .map_err(Error::store)?;
            if fail {
                return Err(Error::Config("declined".into()));
            }
            // Long enough for concurrent duplicates to meet the open transaction.
            tokio::time::sleep(pause).await;
            Ok(order * 10)
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn attribute_runs_in_the_callers_transaction() {
            let s = store().await;
            let table = format!("idem_orders_{}", support::suffix());
            exec(&s, format!("CREATE TABLE {table} (k VARCHAR(64) NOT NULL, n BIGINT NOT NULL)")).await;
            let idem = idem_for(&s, &unique("txattr"));
            let rows = |k: &str| count(&s, format!("SELECT COUNT(*) FROM {table} WHERE k = '{k}'"));
            let pool = s.$pool().expect("pool").clone();
            let sqlite = s.name() == "sql-sqlite";
            // SQLite serializes whole write transactions (BEGIN IMMEDIATE), so duplicates
            // meet the first one at BEGIN anyway; holding the file's only write lock
            // longer would only slow the other tests sharing the file.
            let pause = if sqlite { ms(1) } else { ms(50) };
            // SQLite: a transaction that will write must say so up front, or a concurrent
            // commit makes its snapshot stale and every later write in it fails.
            let begin = move |pool: sqlx::Pool<$db>| async move {
                if sqlite { pool.begin_with("BEGIN IMMEDIATE").await } else { pool.begin().await }
            };
            let runs = AtomicUsize::new(0);
            idem.scope(async {
                // Committed by the caller: record and business row together; then replayed
                // inside another transaction without running or writing.
                for _ in 0..2 {
                    let mut tx = begin(pool.clone()).await.unwrap();
                    assert_eq!(place_order(&mut tx, &table, 1, &runs, false, pause).await.unwrap(), 10);
                    tx.commit().await.unwrap();
                }
                assert_eq!(runs.load(Ordering::SeqCst), 1);
                assert_eq!(rows("order:1").await, 1);

                // Rolled back by the caller: neither the row nor the record is left, so the
                // next call runs (once) and its commit holds.
                let mut tx = begin(pool.clone()).await.unwrap();
                assert_eq!(place_order(&mut tx, &table, 2, &runs, false, pause).await.unwrap(), 20);
                tx.rollback().await.unwrap();
                assert_eq!(rows("order:2").await, 0);
                let mut tx = begin(pool.clone()).await.unwrap();
                assert_eq!(place_order(&mut tx, &table, 2, &runs, false, pause).await.unwrap(), 20);
                tx.commit().await.unwrap();
                assert_eq!((runs.load(Ordering::SeqCst), rows("order:2").await), (3, 1));

                // An `Err` undoes the body's write and frees the key, but keeps what the
                // caller wrote before the call in the same transaction.
                let mut tx = begin(pool.clone()).await.unwrap();
                sqlx::query(AssertSqlSafe(format!("INSERT INTO {table} (k, n) VALUES ('mine', 0)")))
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                let r = place_order(&mut tx, &table, 3, &runs, true, pause).await;
                assert!(matches!(r, Err(Error::Config(_))), "{r:?}");
                tx.commit().await.unwrap();
                assert_eq!((rows("mine").await, rows("order:3").await), (1, 0));
                let mut tx = begin(pool.clone()).await.unwrap();
                assert_eq!(place_order(&mut tx, &table, 3, &runs, false, pause).await.unwrap(), 30);
                tx.commit().await.unwrap();
                assert_eq!(rows("order:3").await, 1);

                // A call outside any transaction replays the record written inside one.
                static PLACE: Options = Options::dedup(concat!(module_path!(), "::place_order"));
                let v: u64 = idem.dedup(&PLACE, "order:3", async { Ok::<_, Error>(0) }).await.unwrap();
                assert_eq!(v, 30);
            })
            .await;

            // Concurrent duplicates, each in its own transaction: one body, one row.
            let before = runs.load(Ordering::SeqCst);
            let runs = Arc::new(runs);
            let mut tasks = Vec::new();
            for _ in 0..8 {
                let (idem, pool, table, runs) = (idem.clone(), pool.clone(), table.clone(), runs.clone());
                let begin = begin.clone();
                tasks.push(tokio::spawn(async move {
                    idem.scope(async {
                        let mut tx = begin(pool.clone()).await.unwrap();
                        let v = place_order(&mut tx, &table, 4, &runs, false, pause).await;
                        tx.commit().await.unwrap();
                        v
                    })
                    .await
                }));
            }
            for t in tasks {
                assert_eq!(t.await.unwrap().expect("every duplicate replays"), 40);
            }
            assert_eq!(runs.load(Ordering::SeqCst) - before, 1, "the body ran once");
            assert_eq!(rows("order:4").await, 1);
            exec(&s, format!("DROP TABLE {table}")).await;
        }

        /// The crash test: a child process is killed (SIGKILL) after its business write
        /// and before its commit. Neither the write nor the claim survives; the retry runs
        /// once; the business table holds exactly one row; a later call replays.
        #[tokio::test]
        async fn crash_between_business_write_and_commit() {
            let s = store().await;
            let table = format!("idem_orders_{}", support::suffix());
            exec(&s, format!("CREATE TABLE {table} (k VARCHAR(64) NOT NULL, n BIGINT NOT NULL)")).await;
            let ns = unique("crash");
            let runs_file = std::env::temp_dir().join(format!("idem-crash-{}.log", support::suffix()));
            let _ = std::fs::remove_file(&runs_file);

            // Run this very test binary as the child, in `crash_child` below.
            let mut child = std::process::Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "crash_child", "--nocapture", "--test-threads=1"])
                .env(support::CHILD_ENV, "1")
                .env("IDEM_CHILD_TABLE", &table)
                .env("IDEM_CHILD_URL", url())
                .env("IDEM_CHILD_NS", &ns)
                .env("IDEM_CHILD_RUNS", &runs_file)
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("spawn the child");
            let stdout = child.stdout.take().unwrap();
            let saw_mark = tokio::task::spawn_blocking(move || {
                use std::io::BufRead;
                std::io::BufReader::new(stdout)
                    .lines()
                    .map_while(Result::ok)
                    .any(|l| l.contains(support::CHILD_MARK))
            });
            let saw = tokio::time::timeout(Duration::from_secs(60), saw_mark)
                .await
                .expect("the child reaches its business write")
                .unwrap();
            assert!(saw, "the child printed its mark");
            child.kill().expect("SIGKILL the child");
            let _ = child.wait();

            let idem = idem_for(&s, &ns);
            let key = idem.key(&CRASH, format_args!("order:crash"));
            let table2 = table.clone();
            let runs_file2 = runs_file.clone();
            let v: u64 = s
                .transaction(&CRASH, &key, |tx: &mut Transaction<'static, $db>| Box::pin(async move {
                    crash_body(tx, &table2, &runs_file2, 2).await
                }))
                .await
                .expect("the retry runs");
            assert_eq!(v, 2, "the retry's own value: the killed run left nothing");
            let again: u64 = s
                .transaction(&CRASH, &key, |_tx: &mut Transaction<'static, $db>| Box::pin(async move { Ok::<u64, Error>(3) }))
                .await
                .unwrap();
            assert_eq!(again, 2, "replayed");
            let runs = std::fs::read_to_string(&runs_file).unwrap_or_default();
            assert_eq!(runs.lines().count(), 2, "the killed run and the retry ran, nothing else: {runs:?}");
            assert_eq!(count(&s, format!("SELECT COUNT(*) FROM {table}")).await, 1, "exactly one business row");
            exec(&s, format!("DROP TABLE {table}")).await;
            let _ = std::fs::remove_file(&runs_file);
        }

        static CRASH: Options = Options::dedup("sql::crash").wait(Duration::from_secs(60));

        static CHECKOUT: Options = Options::dedup("sql::checkout");

        /// Inserts one reservation row in the step's transaction, counting the runs.
        /// (The step's closure may borrow only the transaction, as `SqlStore::transaction`
        /// bodies: what else it uses, it owns.)
        fn reserve<'c>(
            tx: &'c mut Transaction<'static, $db>,
            table: String,
            runs: Arc<AtomicUsize>,
            fail: bool,
        ) -> idem_runtime::store::sql::TxFuture<'c, u64, Error> {
            Box::pin(async move {
                runs.fetch_add(1, Ordering::SeqCst);
                sqlx::query(AssertSqlSafe(format!("INSERT INTO {table} (k, n) VALUES ('r', 1)")))
                    .execute(&mut **tx)
                    .await
                    .map_err(Error::store)?;
                if fail {
                    return Err(Error::Config("the gateway declined".into()));
                }
                Ok(7)
            })
        }

        /// A transactional step's write and its journal entry commit together: a later
        /// failure of the body keeps both, and the retry replays the step (its write is
        /// not repeated); a step that fails rolls its own write back and runs again.
        #[tokio::test]
        async fn transactional_step_commits_with_its_journal_entry() {
            let s = store().await;
            let table = format!("idem_resv_{}", support::suffix());
            exec(&s, format!("CREATE TABLE {table} (k VARCHAR(64) NOT NULL, n BIGINT NOT NULL)")).await;
            let idem = idem_for(&s, &unique("txstep"));
            let runs = Arc::new(AtomicUsize::new(0));
            let after = AtomicUsize::new(0);
            let attempt = |fail_step: bool, fail_after: bool| {
                let (table, runs, after) = (table.clone(), runs.clone(), &after);
                idem.dedup(&CHECKOUT, "order-1", async move {
                    let r: u64 = idem_runtime::step_tx(
                        "reserve",
                        |_s, tx: &mut Transaction<'static, $db>| reserve(tx, table, runs, fail_step),
                    )
                    .await?;
                    after.fetch_add(1, Ordering::SeqCst);
                    if fail_after {
                        return Err(Error::Config("the mail server is down".into()));
                    }
                    Ok::<u64, Error>(r + 1)
                })
            };
            // The step fails: its row rolls back, nothing is journaled.
            let r = attempt(true, false).await;
            assert!(matches!(r, Err(Error::Config(_))), "{r:?}");
            assert_eq!(count(&s, format!("SELECT COUNT(*) FROM {table}")).await, 0);
            // The step commits, then the body fails.
            let r = attempt(false, true).await;
            assert!(matches!(r, Err(Error::Config(_))), "{r:?}");
            assert_eq!(count(&s, format!("SELECT COUNT(*) FROM {table}")).await, 1);
            // The retry replays the step from the journal: no second row.
            assert_eq!(attempt(false, false).await.unwrap(), 8);
            assert_eq!(runs.load(Ordering::SeqCst), 2, "the failed run and the committed one");
            assert_eq!(after.load(Ordering::SeqCst), 2);
            assert_eq!(count(&s, format!("SELECT COUNT(*) FROM {table}")).await, 1);
            let key = idem.key(&CHECKOUT, format_args!("order-1"));
            let left = s.journal().unwrap().read_journal(&key).await.unwrap();
            assert!(left.is_empty(), "completion drops the journal: {left:?}");
            exec(&s, format!("DROP TABLE {table}")).await;
        }

        /// A transactional step whose claim is gone when it is about to journal (here the
        /// operator forgot the key) rolls its write back and reports the lost lease.
        #[tokio::test]
        async fn transactional_step_without_its_claim_rolls_back() {
            let s = store().await;
            let table = format!("idem_resv_{}", support::suffix());
            exec(&s, format!("CREATE TABLE {table} (k VARCHAR(64) NOT NULL, n BIGINT NOT NULL)")).await;
            let idem = idem_for(&s, &unique("txlost"));
            let runs = Arc::new(AtomicUsize::new(0));
            let (t, r, i) = (table.clone(), runs.clone(), &idem);
            let out: Result<u64, Error> = idem
                .dedup(&CHECKOUT, "order-2", async move {
                    i.forget(&CHECKOUT, "order-2").await?;
                    idem_runtime::step_tx("reserve", |_s, tx: &mut Transaction<'static, $db>| {
                        reserve(tx, t, r, false)
                    })
                    .await
                })
                .await;
            assert!(matches!(out, Err(Error::LeaseLost { .. })), "{out:?}");
            assert_eq!(runs.load(Ordering::SeqCst), 1);
            assert_eq!(count(&s, format!("SELECT COUNT(*) FROM {table}")).await, 0, "rolled back");
            exec(&s, format!("DROP TABLE {table}")).await;
        }

        async fn crash_body(
            tx: &mut Transaction<'static, $db>,
            table: &str,
            runs_file: &std::path::Path,
            n: u64,
        ) -> Result<u64, Error> {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new().create(true).append(true).open(runs_file).unwrap();
            writeln!(f, "run {n} pid {}", std::process::id()).unwrap();
            f.sync_all().unwrap();
            sqlx::query(AssertSqlSafe(format!("INSERT INTO {table} (k, n) VALUES ('crash', {n})")))
                .execute(&mut **tx)
                .await
                .map_err(Error::store)?;
            Ok(n)
        }

        /// Not a test on its own: the crash test's child process. Without its
        /// environment it returns at once.
        #[test]
        fn crash_child() {
            if std::env::var_os(support::CHILD_ENV).is_none() {
                return;
            }
            let table = std::env::var("IDEM_CHILD_TABLE").unwrap();
            let ns = std::env::var("IDEM_CHILD_NS").unwrap();
            let runs = std::path::PathBuf::from(std::env::var_os("IDEM_CHILD_RUNS").unwrap());
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                let s = SqlStore::connect(&std::env::var("IDEM_CHILD_URL").unwrap()).await.unwrap();
                let idem = idem_for(&s, &ns);
                let key = idem.key(&CRASH, format_args!("order:crash"));
                let _: Result<u64, Error> = s
                    .transaction(&CRASH, &key, |tx: &mut Transaction<'static, $db>| Box::pin(async move {
                        let n = crash_body(tx, &table, &runs, 1).await?;
                        // The business write is in the open transaction: tell the parent,
                        // then wait to be killed before the commit.
                        println!("{}", support::CHILD_MARK);
                        use std::io::Write;
                        std::io::stdout().flush().unwrap();
                        tokio::time::sleep(Duration::from_secs(120)).await;
                        Ok(n)
                    }))
                    .await;
                panic!("the child should have been killed before committing");
            });
        }
    };
}
