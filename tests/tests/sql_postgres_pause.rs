//! A process paused (SIGSTOP) inside transactional-mode bodies on PostgreSQL
//! ([`SqlStore::begin`]): the claim and the business write sit in one open transaction,
//! so the pause cannot let a woken body's effect land beside a taker's.
//!
//! - With the server's default settings nobody takes the key over, however long the
//!   pause: its claim is an uncommitted row, not a lease. Duplicates wait (bounded by
//!   their `wait`) and get `Error::InProgress`; the woken process commits, once.
//! - When the database ends the paused session (here the session's own
//!   `idle_in_transaction_session_timeout`, as an operator's `pg_terminate_backend`
//!   would), its transaction rolls back: a taker runs and commits, and the woken
//!   process's commit fails. One effect either way.
//!
//! The paused process is this test binary run again with `IDEM_SQL_PAUSE_CHILD` set.
//! Ordered by events: the child's bodies wait for a file the parent creates once the
//! child is stopped, and the parent resumes it once the takers are done.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/stopped.rs"]
mod stopped;
#[path = "support/sql.rs"]
mod support;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use idem_runtime::store::sql::Begun;
use idem_runtime::store::sql::sqlx::{self, AssertSqlSafe, Postgres};
use idem_runtime::{Error, Idem, Options, SqlStore};

const KEYS: i64 = 8;

/// The lease does not apply to a transactional claim; it is short to show that.
static TX: Options = Options::dedup("sql_pause::tx")
    .lease(Duration::from_secs(1))
    .wait(Duration::from_secs(30));
/// A taker that gives up after twice the lease.
static IMPATIENT: Options = Options::dedup("sql_pause::tx")
    .lease(Duration::from_secs(1))
    .wait(Duration::from_secs(2));

async fn store() -> SqlStore {
    match tokio::time::timeout(
        Duration::from_secs(10),
        SqlStore::connect(&support::pg_url()),
    )
    .await
    {
        Ok(Ok(s)) => s,
        other => panic!(
            "PostgreSQL is not reachable at {} ({other:?}).\nStart it with: \
             pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start\n\
             (or set IDEM_TEST_PG_URL)",
            support::pg_url()
        ),
    }
}

fn idem(store: &SqlStore, ns: &str) -> Idem {
    Idem::builder().store(store.clone()).namespace(ns).build()
}

/// One transactional call of key `k`: the business row and the record in one
/// transaction; `before_commit` runs between the write and the commit.
async fn pay(
    (store, idem): (&SqlStore, &Idem),
    opts: &Options,
    table: &str,
    k: i64,
    who: &str,
    session_timeout: bool,
    before_commit: impl AsyncFnOnce(),
) -> Result<i64, Error> {
    let key = idem.key(opts, format_args!("k{k}"));
    match store.begin::<Postgres, i64>(opts, &key).await? {
        Begun::Replayed(v) => Ok(v),
        Begun::Claimed(mut tx) => {
            if session_timeout {
                // The application's own bound on a transaction left idle (a session
                // setting, not the server's).
                sqlx::query("SET LOCAL idle_in_transaction_session_timeout = 1000")
                    .execute(&mut **tx)
                    .await
                    .map_err(Error::store)?;
            }
            sqlx::query(AssertSqlSafe(format!(
                "INSERT INTO {table} (k, who) VALUES ($1, $2)"
            )))
            .bind(k)
            .bind(who)
            .execute(&mut **tx)
            .await
            .map_err(Error::store)?;
            before_commit().await;
            tx.commit(if who == "paused" { 1 } else { 2 }).await
        }
    }
}

async fn wait_for_file(go: &Path) {
    for _ in 0..6000 {
        if go.exists() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the parent never said go");
}

/// The paused side. Does nothing in a normal test run.
#[test]
fn child() {
    let Ok(role) = std::env::var("IDEM_SQL_PAUSE_CHILD") else {
        return;
    };
    let var = |n: &str| std::env::var(n).unwrap();
    let (ns, table, go) = (
        var("IDEM_SQL_PAUSE_NS"),
        var("IDEM_SQL_PAUSE_TABLE"),
        var("IDEM_SQL_PAUSE_GO"),
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let store = store().await;
        let idem = idem(&store, &ns);
        let (committed, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let mut tasks = Vec::new();
        for k in 0..KEYS {
            let (store, idem, table, go) = (
                store.clone(),
                idem.clone(),
                table.clone(),
                PathBuf::from(&go),
            );
            let (committed, failed, timeout) =
                (committed.clone(), failed.clone(), role == "session-timeout");
            tasks.push(tokio::spawn(async move {
                let r = pay(
                    (&store, &idem),
                    &TX,
                    &table,
                    k,
                    "paused",
                    timeout,
                    async || {
                        println!("IN {k}");
                        wait_for_file(&go).await;
                    },
                )
                .await;
                match r {
                    Ok(1) => committed.fetch_add(1, Ordering::SeqCst),
                    Ok(v) => panic!("key {k}: replayed {v} in the paused process"),
                    Err(_) => failed.fetch_add(1, Ordering::SeqCst),
                };
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        println!(
            "DONE committed={} failed={}",
            committed.load(Ordering::SeqCst),
            failed.load(Ordering::SeqCst)
        );
    });
    std::process::exit(0);
}

/// The stopped child, the business table and the go file; all cleaned up on drop.
struct Run {
    child: Child,
    out: BufReader<ChildStdout>,
    go: PathBuf,
    table: String,
    ns: String,
}

impl Run {
    async fn start(role: &str, store: &SqlStore) -> Run {
        let ns = support::unique("pause");
        let table = format!("pause_fx_{}", support::suffix());
        sqlx::query(AssertSqlSafe(format!(
            "CREATE TABLE {table} (k BIGINT NOT NULL, who TEXT NOT NULL)"
        )))
        .execute(store.pg_pool().unwrap())
        .await
        .unwrap();
        let go = std::env::temp_dir().join(format!("{table}.go"));
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["child", "--exact", "--nocapture", "--test-threads=1"])
            .env("IDEM_SQL_PAUSE_CHILD", role)
            .env("IDEM_SQL_PAUSE_NS", &ns)
            .env("IDEM_SQL_PAUSE_TABLE", &table)
            .env("IDEM_SQL_PAUSE_GO", &go)
            .env("RUST_LOG", "off")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        let mut run = Run {
            child,
            out,
            go,
            table,
            ns,
        };
        for _ in 0..KEYS {
            run.line("IN");
        }
        run
    }

    fn line(&mut self, tag: &str) -> String {
        let mut line = String::new();
        loop {
            line.clear();
            let n = self.out.read_line(&mut line).unwrap();
            assert!(n > 0, "the child exited before printing {tag}");
            if let Some(at) = line.find(tag) {
                return line[at + tag.len()..].trim().to_owned();
            }
        }
    }

    /// Stops the child, then lets its bodies go on once it is resumed.
    fn pause(&self) {
        stopped::stop(self.child.id());
        std::fs::write(&self.go, b"go").unwrap();
    }

    /// Resumes the child; its (committed, failed) counts once it has exited.
    fn resume(&mut self) -> (u64, u64) {
        stopped::signal(self.child.id(), "-CONT");
        let done = self.line("DONE");
        assert!(self.child.wait().unwrap().success());
        let n = |name: &str| -> u64 {
            done.split(' ')
                .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
                .unwrap()
                .parse()
                .unwrap()
        };
        (n("committed"), n("failed"))
    }

    /// Each key's business rows, by writer.
    async fn rows(&self, store: &SqlStore) -> Vec<Vec<String>> {
        let mut out = vec![Vec::new(); KEYS as usize];
        let rows: Vec<(i64, String)> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT k, who FROM {} ORDER BY k",
            self.table
        )))
        .fetch_all(store.pg_pool().unwrap())
        .await
        .unwrap();
        for (k, who) in rows {
            out[usize::try_from(k).unwrap()].push(who);
        }
        out
    }

    async fn drop_table(&self, store: &SqlStore) {
        let _ = sqlx::query(AssertSqlSafe(format!(
            "DROP TABLE IF EXISTS {}",
            self.table
        )))
        .execute(store.pg_pool().unwrap())
        .await;
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.go);
    }
}

/// Default server settings: the paused transaction keeps its uncommitted claim however
/// long it is stopped; a taker waits past the lease and gets `InProgress`, its body never
/// runs; the woken process commits, and later calls replay its value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_transaction_is_never_taken_over() {
    let store = store().await;
    let mut run = Run::start("plain", &store).await;
    run.pause();
    let taker = idem(&store, &run.ns);
    for k in 0..KEYS {
        let r = pay(
            (&store, &taker),
            &IMPATIENT,
            &run.table,
            k,
            "taker",
            false,
            async || {},
        )
        .await;
        assert!(matches!(r, Err(Error::InProgress { .. })), "key {k}: {r:?}");
    }
    assert_eq!(
        run.resume(),
        (KEYS as u64, 0),
        "the woken process commits each key"
    );
    for k in 0..KEYS {
        let r = pay(
            (&store, &taker),
            &TX,
            &run.table,
            k,
            "taker",
            false,
            async || {},
        )
        .await;
        assert_eq!(r.unwrap(), 1, "key {k} replays the paused process's value");
    }
    let rows = run.rows(&store).await;
    for (k, who) in rows.iter().enumerate() {
        assert_eq!(who, &["paused"], "key {k}");
    }
    run.drop_table(&store).await;
}

/// The database ends the paused session (its idle-in-transaction timeout): everything
/// it wrote rolls back, a taker runs and commits each key, and the woken process's
/// commits fail. One business row per key, the taker's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_transaction_ended_by_the_database_cannot_commit_when_woken() {
    let store = store().await;
    let mut run = Run::start("session-timeout", &store).await;
    run.pause();
    let taker = idem(&store, &run.ns);
    for k in 0..KEYS {
        let r = pay(
            (&store, &taker),
            &TX,
            &run.table,
            k,
            "taker",
            false,
            async || {},
        )
        .await;
        assert_eq!(r.unwrap(), 2, "key {k}: the taker ran it");
    }
    assert_eq!(run.resume(), (0, KEYS as u64), "every woken commit fails");
    let rows = run.rows(&store).await;
    for (k, who) in rows.iter().enumerate() {
        assert_eq!(who, &["taker"], "key {k}");
    }
    for k in 0..KEYS {
        let r = pay(
            (&store, &taker),
            &TX,
            &run.table,
            k,
            "again",
            false,
            async || {},
        )
        .await;
        assert_eq!(r.unwrap(), 2, "key {k} replays the taker's value");
    }
    run.drop_table(&store).await;
}
