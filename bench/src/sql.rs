//! The SQL family: dedup of a new key and replay of a completed one, beside a raw
//! `INSERT … ON CONFLICT DO NOTHING` of a new key on the same pool in the same run, at 1
//! and 50 concurrent tasks.
//!
//! [`run_url`] prints a table and `ratio CASE VALUE` lines (idem's throughput over the
//! raw baseline's; higher is better) as it goes: it is also the `idem-bench-sql` program.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idem_runtime::store::sql::sqlx::{self, AssertSqlSafe};
use idem_runtime::{Error, Idem, Options, SqlStore};

use crate::args::Args;
use crate::report::{Report, Summary};
use crate::work;

static NEW: Options = Options::dedup("bench::sql_new");
static REPLAY: Options = Options::dedup("bench::sql_replay");
static NEW_ASYNC: Options = Options::dedup("bench::sql_new_async");
static TX_NEW: Options = Options::dedup("bench::sql_tx_new");

/// One measured case.
#[derive(Debug, Clone)]
pub struct Row {
    /// Backend name: postgres, mysql, sqlite.
    pub backend: &'static str,
    /// Case name.
    pub case: &'static str,
    /// Concurrent tasks.
    pub tasks: usize,
    /// Operations per second.
    pub ops: f64,
}

/// Runs every SQL case against `url` for `per_case` each and prints the table and
/// ratio lines.
pub async fn run_url(url: &str, per_case: Duration) -> Result<Vec<Row>, Error> {
    let store = SqlStore::connect(url).await?;
    let backend = store.backend_name();
    let table = "idem_bench_raw";
    raw_exec(&store, &format!("DROP TABLE IF EXISTS {table}")).await?;
    let id_type = if backend == "mysql" {
        "BINARY(16)"
    } else if backend == "postgres" {
        "BYTEA"
    } else {
        "BLOB"
    };
    raw_exec(
        &store,
        &format!("CREATE TABLE {table} (id {id_type} NOT NULL PRIMARY KEY)"),
    )
    .await?;
    let insert = match backend {
        "mysql" => format!("INSERT IGNORE INTO {table} (id) VALUES (?)"),
        "postgres" => format!("INSERT INTO {table} (id) VALUES ($1) ON CONFLICT DO NOTHING"),
        _ => format!("INSERT INTO {table} (id) VALUES (?1) ON CONFLICT DO NOTHING"),
    };
    let idem = Idem::builder()
        .store(store.clone())
        // Owner ids are unique across processes as a whole (random high half, counter low
        // half): the whole id keeps two runs, or a run after an interrupted one, apart.
        .namespace(format!(
            "bench-{:032x}",
            idem_runtime::store::Owner::next().0
        ))
        .build();

    // Keys to replay: completed once, before the clock starts.
    let replay_keys = 2000u64;
    for k in 0..replay_keys {
        let _: u64 = idem
            .dedup(&REPLAY, k, async move { Ok::<_, Error>(k) })
            .await?;
    }

    // The cases take turns in short slices, so a change of the machine's load (it is
    // shared) touches every case alike and the ratios stay comparable.
    let slice = per_case / ROUNDS;
    let mut rows: Vec<Row> = Vec::new();
    for tasks in [1usize, 50] {
        for _round in 0..ROUNDS {
            let raw = measure(tasks, slice, {
                let (store, insert) = (store.clone(), insert.clone());
                move |n| {
                    let (store, insert) = (store.clone(), insert.clone());
                    async move {
                        let id = id16(n);
                        raw_insert(&store, &insert, &id).await
                    }
                }
            })
            .await?;
            add(
                &mut rows,
                backend,
                "raw-insert-new",
                tasks,
                raw / f64::from(ROUNDS),
            );

            let new = measure(tasks, slice, {
                let idem = idem.clone();
                move |n| {
                    let idem = idem.clone();
                    async move {
                        let _: u64 = idem
                            .dedup(&NEW, n, async move { Ok::<_, Error>(n) })
                            .await?;
                        Ok(())
                    }
                }
            })
            .await?;
            add(
                &mut rows,
                backend,
                "dedup-new",
                tasks,
                new / f64::from(ROUNDS),
            );

            let replay = measure(tasks, slice, {
                let idem = idem.clone();
                move |n| {
                    let idem = idem.clone();
                    async move {
                        let k = n % replay_keys;
                        let v: u64 = idem
                            .dedup(&REPLAY, k, async move { Ok::<_, Error>(u64::MAX) })
                            .await?;
                        debug_assert_eq!(v, k);
                        Ok(())
                    }
                }
            })
            .await?;
            add(
                &mut rows,
                backend,
                "dedup-replay",
                tasks,
                replay / f64::from(ROUNDS),
            );

            if backend == "postgres" {
                let async_idem = Idem::builder()
                    .store(store.clone().with_async_claim_commit(true))
                    .namespace(idem.namespace())
                    .build();
                let new_async = measure(tasks, slice, move |n| {
                    let idem = async_idem.clone();
                    async move {
                        let _: u64 = idem
                            .dedup(&NEW_ASYNC, n, async move { Ok::<_, Error>(n) })
                            .await?;
                        Ok(())
                    }
                })
                .await?;
                add(
                    &mut rows,
                    backend,
                    "dedup-new-async",
                    tasks,
                    new_async / f64::from(ROUNDS),
                );
            }

            // Transactional mode: claim, record and commit in one transaction (one commit
            // per new key instead of two), no business write.
            let tx_new = measure(tasks, slice, {
                let (store, idem) = (store.clone(), idem.clone());
                move |n| {
                    let (store, idem) = (store.clone(), idem.clone());
                    async move {
                        let key = idem.key(&TX_NEW, format_args!("{n}"));
                        tx_dedup(&store, &key, n).await
                    }
                }
            })
            .await?;
            add(
                &mut rows,
                backend,
                "tx-dedup-new",
                tasks,
                tx_new / f64::from(ROUNDS),
            );
        }
    }

    println!(
        "{:<10} {:<16} {:>6} {:>12}",
        "backend", "case", "tasks", "ops/s"
    );
    for r in &rows {
        println!(
            "{:<10} {:<16} {:>6} {:>12.0}",
            r.backend, r.case, r.tasks, r.ops
        );
    }
    for tasks in [1usize, 50] {
        let get = |case: &str| {
            rows.iter()
                .find(|r| r.case == case && r.tasks == tasks)
                .map_or(0.0, |r| r.ops)
        };
        let raw = get("raw-insert-new").max(f64::MIN_POSITIVE);
        println!(
            "ratio sql-{backend}-dedup-new-vs-raw-insert-t{tasks} {:.2}",
            get("dedup-new") / raw
        );
        println!(
            "ratio sql-{backend}-dedup-replay-vs-raw-insert-t{tasks} {:.2}",
            get("dedup-replay") / raw
        );
        println!(
            "ratio sql-{backend}-tx-dedup-new-vs-raw-insert-t{tasks} {:.2}",
            get("tx-dedup-new") / raw
        );
        if backend == "postgres" {
            println!(
                "ratio sql-{backend}-dedup-new-async-claim-vs-raw-insert-t{tasks} {:.2}",
                get("dedup-new-async") / raw
            );
        }
    }
    raw_exec(&store, &format!("DROP TABLE IF EXISTS {table}")).await?;
    // Leave no bench records behind.
    raw_exec(
        &store,
        &format!(
            "DELETE FROM idem_records WHERE namespace = '{}'",
            idem.namespace()
        ),
    )
    .await?;
    store.close().await;
    Ok(rows)
}

/// The family, once per `--sql` URL. [`run_url`] prints its own table and ratio lines as
/// it goes; the rows are gathered here too, so the run's one table and its final ratio
/// block (same names, same values) are complete.
pub(crate) async fn run(args: &Args, report: &mut Report) {
    for url in &args.sql {
        eprintln!("  sql {}", work::scheme(url));
        match run_url(url, args.window().1).await {
            Ok(rows) => gather(&rows, report),
            Err(e) => report.note(format!("sql cases for {} failed: {e}", work::scheme(url))),
        }
    }
}

fn gather(rows: &[Row], report: &mut Report) {
    let summary = |r: &Row| Summary {
        tasks: r.tasks,
        ops_per_sec: r.ops,
        p50: Duration::ZERO,
        p99: Duration::ZERO,
        errors: 0,
    };
    for r in rows {
        report.add_summary(&format!("sql/{}", r.backend), r.case, summary(r));
    }
    for tasks in [1usize, 50] {
        let get = |case: &str| {
            rows.iter()
                .find(|r| r.case == case && r.tasks == tasks)
                .map(summary)
        };
        let (Some(raw), Some(new), Some(replay)) =
            (get("raw-insert-new"), get("dedup-new"), get("dedup-replay"))
        else {
            continue;
        };
        let backend = rows.first().map_or("?", |r| r.backend);
        let what = format!(
            "raw INSERT … ON CONFLICT DO NOTHING on the same {backend} pool, {tasks} tasks"
        );
        report.ratio(
            format!("sql-{backend}-dedup-new-vs-raw-insert-t{tasks}"),
            &new,
            &raw,
            &format!("idem dedup new key / {what}"),
        );
        report.ratio(
            format!("sql-{backend}-dedup-replay-vs-raw-insert-t{tasks}"),
            &replay,
            &raw,
            &format!("idem dedup replay / {what}"),
        );
    }
}

/// Adds `ops` to the row of (`case`, `tasks`), creating it.
/// How many turns each case takes (the measured time per case is split among them).
const ROUNDS: u32 = 5;

fn add(rows: &mut Vec<Row>, backend: &'static str, case: &'static str, tasks: usize, ops: f64) {
    match rows.iter_mut().find(|r| r.case == case && r.tasks == tasks) {
        Some(r) => r.ops += ops,
        None => rows.push(Row {
            backend,
            case,
            tasks,
            ops,
        }),
    }
}

/// A 16-byte id unique to this run and `n`.
fn id16(n: u64) -> [u8; 16] {
    static RUN: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let run = *RUN.get_or_init(|| (idem_runtime::store::Owner::next().0 >> 64) as u64);
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&run.to_le_bytes());
    b[8..].copy_from_slice(&n.to_le_bytes());
    b
}

/// Runs `op(n)` with distinct `n` from `tasks` tasks for `dur`; returns ops per second.
async fn measure<F, Fut>(tasks: usize, dur: Duration, op: F) -> Result<f64, Error>
where
    F: Fn(u64) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<(), Error>> + Send,
{
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let end = start + dur;
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let (op, done) = (op.clone(), done.clone());
        handles.push(tokio::spawn(async move {
            while Instant::now() < end {
                op(NEXT.fetch_add(1, Ordering::Relaxed)).await?;
                done.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<_, Error>(())
        }));
    }
    for h in handles {
        h.await.map_err(Error::store)??;
    }
    Ok(done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64())
}

/// One transactional-mode call on whichever database the store runs on.
async fn tx_dedup(store: &SqlStore, key: &idem_runtime::Key, n: u64) -> Result<(), Error> {
    use idem_runtime::store::sql::{Begun, TxDatabase};
    async fn on<DB: TxDatabase>(
        store: &SqlStore,
        key: &idem_runtime::Key,
        n: u64,
    ) -> Result<(), Error> {
        match store.begin::<DB, u64>(&TX_NEW, key).await? {
            Begun::Replayed(_) => {}
            Begun::Claimed(tx) => {
                tx.commit(n).await?;
            }
        }
        Ok(())
    }
    match store.backend_name() {
        "postgres" => on::<sqlx::Postgres>(store, key, n).await,
        "mysql" => on::<sqlx::MySql>(store, key, n).await,
        _ => on::<sqlx::Sqlite>(store, key, n).await,
    }
}

async fn raw_exec(store: &SqlStore, sql: &str) -> Result<(), Error> {
    let sql = AssertSqlSafe(sql.to_owned());
    if let Some(p) = store.pg_pool() {
        sqlx::query(sql).execute(p).await.map_err(Error::store)?;
    } else if let Some(p) = store.mysql_pool() {
        sqlx::query(sql).execute(p).await.map_err(Error::store)?;
    } else if let Some(p) = store.sqlite_pool() {
        sqlx::query(sql).execute(p).await.map_err(Error::store)?;
    }
    Ok(())
}

async fn raw_insert(store: &SqlStore, insert: &str, id: &[u8; 16]) -> Result<(), Error> {
    let sql = AssertSqlSafe(insert.to_owned());
    if let Some(p) = store.pg_pool() {
        sqlx::query(sql)
            .bind(&id[..])
            .execute(p)
            .await
            .map_err(Error::store)?;
    } else if let Some(p) = store.mysql_pool() {
        sqlx::query(sql)
            .bind(&id[..])
            .execute(p)
            .await
            .map_err(Error::store)?;
    } else if let Some(p) = store.sqlite_pool() {
        sqlx::query(sql)
            .bind(&id[..])
            .execute(p)
            .await
            .map_err(Error::store)?;
    }
    Ok(())
}
