//! The `recovery` family: N calls of the 3-step checkout abandoned by a killed process
//! after step 2's checkpoint, then finished by each library's own recovery, timed from
//! the start of that recovery until all N are complete.
//!
//! The checkout is the `durable` family's (steps `charge`, `reserve`, `mail`, each one
//! insert into `idem_bench_durable_effects`), written for recovery in:
//!
//! - idem (`idem.rs`): [`Idem::dedup_recoverable`] with three `step`s, on PostgreSQL and
//!   on Redis (the effects still go to PostgreSQL), finished by a [`Recoverer`] that
//!   knows the function ([`Recoverer::register`]);
//! - DBOS Transact for Rust and durare (`peers.rs`), on the same PostgreSQL: a workflow
//!   of three steps, finished by each library's documented recovery of pending
//!   workflows: DBOS relaunched under the dead executor's id (its `launch` re-enqueues
//!   that executor's `PENDING` workflows), durare's `recover_pending_for` with the dead
//!   executor's id (`DurableEngine::recover` limited to it, which its docs prefer).
//!
//! How a call is abandoned, the same for every library: a child process of its own
//! (`idem-bench --recovery-child`, `child.rs`) starts N calls, each of which stops for
//! good right after step 2's checkpoint; once all N are there the parent kills it with
//! SIGKILL. Nothing of it runs after that, nothing is released or marked failed: the
//! rows a crashed service leaves. idem then waits for the dead calls' leases to run out
//! by the store's clock (it decides by itself that their owner is gone; DBOS and durare
//! are told so by their caller), and that wait is not timed: the clock starts when every
//! call is listed as abandoned.
//!
//! Each library recovers with what it does by default: DBOS runs every re-enqueued
//! workflow at once (its internal queue has no concurrency limit) on its pool of 10,
//! durare spawns every recovered workflow at once on its pool of 8, idem's recoverer
//! runs 16 at once (its default) on the store's pool of 16. Every round ends with the
//! effects checked: each of the N workflows has exactly one charge, one reserve and
//! one mail row.
//!
//! `args.repeats()` rounds (1 with `--quick`, else 3), the libraries in turns, each round
//! with its own ids; the table shows the median and the spread. `ratio
//! recovery-vs-<peer> X`: X = the peer's median time ÷ idem's on PostgreSQL, so higher
//! is better for idem. Needs a `postgres://` `--sql` URL; Redis is added with `--redis`.

mod child;
mod idem;
mod peers;

use std::future::Future;
use std::time::{Duration, Instant};

use idem_runtime::store::sql::sqlx::{self, AssertSqlSafe};
use idem_runtime::{Idem, RedisStore, SqlStore};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::watch;

pub use self::child::child;
use crate::args::Args;
use crate::durable::flow::{Effects, Shared};
use crate::load;
use crate::report::{Report, markdown_table};
use crate::work::{self, BenchError};

#[cfg(doc)]
use idem_runtime::recover::Recoverer;

/// How often a finished recovery is looked for: the resolution of the timings.
const POLL: Duration = Duration::from_millis(10);

/// A recovery (or the child's setup) that takes longer failed.
const LIMIT: Duration = Duration::from_secs(300);

/// One library (on one store) whose recovery is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lib {
    IdemPg,
    IdemRedis,
    Dbos,
    Durare,
}

impl Lib {
    const ALL: [Lib; 4] = [Lib::IdemPg, Lib::IdemRedis, Lib::Dbos, Lib::Durare];

    /// Its name on the child's command line and in the effects table's labels.
    fn name(self) -> &'static str {
        match self {
            Lib::IdemPg => "idem-pg",
            Lib::IdemRedis => "idem-redis",
            Lib::Dbos => "dbos",
            Lib::Durare => "durare",
        }
    }

    fn parse(s: &str) -> Option<Lib> {
        Lib::ALL.into_iter().find(|l| l.name() == s)
    }

    /// The table's library column.
    fn label(self) -> &'static str {
        match self {
            Lib::IdemPg | Lib::IdemRedis => "idem, `Recoverer` (16 at once)",
            Lib::Dbos => "DBOS Transact 0.5, relaunch",
            Lib::Durare => "durare 0.5, `recover_pending_for`",
        }
    }

    fn store(self) -> &'static str {
        match self {
            Lib::IdemRedis => "Redis",
            Lib::IdemPg | Lib::Dbos | Lib::Durare => "PostgreSQL",
        }
    }
}

/// The idem namespace of one round (`rtag`): a round's calls never meet another's.
pub(crate) fn namespace(rtag: &str) -> String {
    format!("bench-recovery-{rtag}")
}

/// The DBOS and durare executor id of the killed process of one round.
pub(crate) fn executor(rtag: &str) -> String {
    format!("idem-bench-recovery-{rtag}")
}

/// Where the child's calls stop for good: right after step 2's checkpoint. Counts the
/// calls that got there, so the child knows when to tell the parent to kill it.
pub(crate) struct Stall {
    reached: watch::Sender<u64>,
}

impl Stall {
    pub(crate) fn new() -> Stall {
        Stall {
            reached: watch::channel(0).0,
        }
    }

    /// Called after step 2 returned (its checkpoint written): counts the call, then waits
    /// forever, as a process that died there would.
    pub(crate) async fn point(&self) {
        self.reached.send_modify(|r| *r += 1);
        std::future::pending::<()>().await;
    }

    pub(crate) fn watch(&self) -> watch::Receiver<u64> {
        self.reached.subscribe()
    }
}

/// What starts workflow `n` in the child (its future ends only if the call failed).
pub(crate) type Starter =
    Box<dyn Fn(u64) -> futures_util::future::BoxFuture<'static, Result<(), BenchError>> + Send>;

/// One recovery: seconds from its start until all N were complete, and (DBOS) how much
/// of it was the relaunch itself.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timed {
    pub(crate) secs: f64,
    pub(crate) launch: Option<f64>,
}

/// Polls `done` every [`POLL`] until it says yes; the seconds since `t0` when it did.
pub(crate) async fn poll_until<F, Fut>(t0: Instant, mut done: F) -> Result<f64, String>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool, String>>,
{
    loop {
        if done().await? {
            return Ok(t0.elapsed().as_secs_f64());
        }
        if t0.elapsed() > LIMIT {
            return Err(format!("not all complete after {LIMIT:?}"));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The stores idem's rows run on, connected once for the whole family.
struct Stores {
    pg: Option<SqlStore>,
    redis: Option<RedisStore>,
}

/// One library's rounds.
struct Outcome {
    lib: Lib,
    /// One entry per round: its timing, or why it failed.
    rounds: Vec<Result<Timed, String>>,
}

pub(crate) async fn run(args: &Args, report: &mut Report) {
    let Some(url) = args.sql.iter().find(|u| u.starts_with("postgres")) else {
        report.note("recovery: skipped, it needs a postgres:// --sql URL");
        return;
    };
    if cfg!(debug_assertions) {
        report.note("recovery: a debug build; its figures say nothing about a release build");
    }
    let effects = match Effects::connect(url).await {
        Ok(e) => e,
        Err(e) => {
            report.note(format!("recovery: skipped, {e}"));
            return;
        }
    };
    let stores = Stores {
        pg: SqlStore::connect(url)
            .await
            .map_err(|e| report.note(format!("recovery: idem on PostgreSQL: {e}")))
            .ok(),
        redis: args.redis.as_deref().and_then(|r| {
            RedisStore::connect(r)
                .map_err(|e| report.note(format!("recovery: idem on Redis: {e}")))
                .ok()
        }),
    };
    let n: u64 = if args.quick { 100 } else { 1000 };
    let tag = load::run_tag();
    let libs: Vec<Lib> = Lib::ALL
        .into_iter()
        .filter(|l| match l {
            Lib::IdemPg => stores.pg.is_some(),
            Lib::IdemRedis => stores.redis.is_some(),
            Lib::Dbos | Lib::Durare => true,
        })
        .collect();
    let mut outcomes: Vec<Outcome> = libs
        .iter()
        .map(|&lib| Outcome {
            lib,
            rounds: Vec::new(),
        })
        .collect();
    for round in 0..args.repeats() {
        let rtag = format!("{tag}r{round}");
        for o in &mut outcomes {
            eprintln!(
                "  recovery: {} round {}, {n} abandoned calls",
                o.lib.name(),
                round + 1
            );
            let r = one(o.lib, url, args, &stores, &effects, &rtag, n).await;
            match &r {
                Ok(t) => eprintln!(
                    "  recovery: {} recovered {n} in {:.2} s",
                    o.lib.name(),
                    t.secs
                ),
                Err(e) => report.note(format!(
                    "recovery / {} / round {}: {e}",
                    o.lib.name(),
                    round + 1
                )),
            }
            o.rounds.push(r);
        }
    }
    section(report, &outcomes, n);
    ratios(report, &outcomes);
    cleanup(&stores, &effects, &libs, tag, args.repeats()).await;
}

/// One round of one library: abandon N calls in a killed child, recover them, check the
/// effects.
async fn one(
    lib: Lib,
    url: &str,
    args: &Args,
    stores: &Stores,
    effects: &Effects,
    rtag: &str,
    n: u64,
) -> Result<Timed, String> {
    let store_url = match lib {
        Lib::IdemRedis => args.redis.as_deref().unwrap_or("-"),
        _ => url,
    };
    abandon(lib, url, store_url, rtag, n).await?;
    let sh = Shared::new(lib.name(), effects, rtag);
    let timed = match lib {
        Lib::IdemPg | Lib::IdemRedis => {
            let builder = Idem::builder().namespace(namespace(rtag));
            let idem = match (lib, &stores.pg, &stores.redis) {
                (Lib::IdemPg, Some(pg), _) => builder.store(pg.clone()).build(),
                (Lib::IdemRedis, _, Some(redis)) => builder.store(redis.clone()).build(),
                _ => return Err("no store".to_owned()),
            };
            idem::recover(&idem, &sh, n).await?
        }
        Lib::Dbos => peers::dbos_recover(url, &sh, rtag, n).await?,
        Lib::Durare => peers::durare_recover(url, &sh, rtag, n).await?,
    };
    check_effects(effects, &sh.lib, n).await?;
    Ok(timed)
}

/// Runs the child that starts N calls of `lib`, waits until all N stopped after step 2,
/// and kills it (SIGKILL).
async fn abandon(lib: Lib, url: &str, store_url: &str, rtag: &str, n: u64) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| format!("no executable: {e}"))?;
    let mut child = tokio::process::Command::new(exe)
        .arg("--recovery-child")
        .args([lib.name(), url, store_url, rtag, &n.to_string()])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("child: {e}"))?;
    let stdout = child.stdout.take().ok_or("child: no stdout")?;
    let ready = tokio::time::timeout(LIMIT, async {
        let mut lines = BufReader::new(stdout).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if line == "ready" {
                return true;
            }
        }
        false
    })
    .await;
    // The kill: whatever the child was doing, it does nothing more.
    let _ = child.start_kill();
    let _ = child.wait().await;
    match ready {
        Ok(true) => Ok(()),
        Ok(false) => Err("the child ended before all its calls reached step 2".to_owned()),
        Err(_) => Err(format!(
            "the child's calls did not reach step 2 in {LIMIT:?}"
        )),
    }
}

/// Each of the N workflows of `lib` ran each step exactly once: one row per (workflow,
/// step), N workflows.
async fn check_effects(effects: &Effects, lib: &str, n: u64) -> Result<(), String> {
    let rows: Vec<(i32, i64, i64)> = sqlx::query_as(
        "SELECT step, count(*), count(DISTINCT wf) FROM idem_bench_durable_effects \
         WHERE lib = $1 GROUP BY step ORDER BY step",
    )
    .bind(lib)
    .fetch_all(&effects.pool)
    .await
    .map_err(|e| format!("effects check: {e}"))?;
    let n = n as i64;
    let want: Vec<(i32, i64, i64)> = (0..3).map(|s| (s, n, n)).collect();
    if rows == want {
        Ok(())
    } else {
        Err(format!(
            "effects (step, rows, workflows) are {rows:?}, not one row per workflow and step"
        ))
    }
}

/// The median and the spread of a library's rounds, if none failed.
fn summary(o: &Outcome) -> Option<(f64, f64, f64)> {
    let mut secs = o
        .rounds
        .iter()
        .map(|r| r.as_ref().ok().map(|t| t.secs))
        .collect::<Option<Vec<f64>>>()?;
    if secs.is_empty() {
        return None;
    }
    secs.sort_by(f64::total_cmp);
    let k = secs.len();
    let median = if k % 2 == 1 {
        secs[k / 2]
    } else {
        (secs[k / 2 - 1] + secs[k / 2]) / 2.0
    };
    Some((median, secs[0], secs[k - 1]))
}

fn section(report: &mut Report, outcomes: &[Outcome], n: u64) {
    if outcomes.is_empty() {
        return;
    }
    let mut rows = vec![
        [
            "library",
            "store",
            "N",
            "seconds to recover all",
            "calls/s",
            "rounds (min to max, s)",
            "each step once",
        ]
        .map(str::to_owned)
        .to_vec(),
    ];
    let mut launch = Vec::new();
    for o in outcomes {
        let failed = o.rounds.iter().filter(|r| r.is_err()).count();
        let (secs, rate, spread) = match summary(o) {
            Some((median, lo, hi)) => (
                format!("{median:.2}"),
                format!("{:.0}", n as f64 / median),
                format!("{lo:.2} to {hi:.2}"),
            ),
            None => ("n/a".to_owned(), "n/a".to_owned(), "n/a".to_owned()),
        };
        let once = if failed == 0 {
            "yes".to_owned()
        } else {
            format!("{failed} round(s) failed: see notes")
        };
        rows.push(vec![
            o.lib.label().to_owned(),
            o.lib.store().to_owned(),
            n.to_string(),
            secs,
            rate,
            spread,
            once,
        ]);
        let l: Vec<String> = o
            .rounds
            .iter()
            .filter_map(|r| r.as_ref().ok()?.launch)
            .map(|s| format!("{s:.2}"))
            .collect();
        if !l.is_empty() {
            launch.push(l.join(", "));
        }
    }
    let mut body = markdown_table(&rows, &[false, false, true, true, true, true, false]);
    body.push_str(&format!(
        "\n{n} calls of a 3-step checkout, each stopped right after step 2's checkpoint in a \
         process then killed (SIGKILL), finished by each library's own recovery on the same \
         PostgreSQL (idem on Redis: its records there, the effects in PostgreSQL). Timed from \
         the start of the recovery (idem: the recoverer's spawn, once the dead calls' leases \
         ran out; DBOS: the relaunch; durare: `recover_pending_for`) until all {n} are \
         complete, polled every {} ms; the median of the rounds. `each step once`: every \
         workflow has exactly one charge, one reserve and one mail effect. DBOS runs every \
         re-enqueued workflow at once, durare spawns every recovered one, idem runs 16 at \
         once (its default).\n",
        POLL.as_millis()
    ));
    if !launch.is_empty() {
        body.push_str(&format!(
            "\nOf DBOS's time, its relaunch (connect, migrations check, re-enqueue) took {} s.\n",
            launch.join("; ")
        ));
    }
    report.section("Recovery of abandoned calls (`--cases recovery`)", body);
}

/// `ratio recovery-vs-<peer>`: the peer's median time to recover all ÷ idem's on
/// PostgreSQL.
fn ratios(report: &mut Report, outcomes: &[Outcome]) {
    let Some(base) = outcomes.iter().find(|o| o.lib == Lib::IdemPg) else {
        return;
    };
    for (peer, lib) in [("dbos", Lib::Dbos), ("durare", Lib::Durare)] {
        let Some(o) = outcomes.iter().find(|o| o.lib == lib) else {
            continue;
        };
        let name = format!("recovery-vs-{peer}");
        let (Some((b, ..)), Some((p, ..))) = (summary(base), summary(o)) else {
            report.note(format!("no ratio {name}: a round failed"));
            continue;
        };
        let per_round: Vec<String> = o
            .rounds
            .iter()
            .zip(&base.rounds)
            .filter_map(|(p, b)| Some(p.as_ref().ok()?.secs / b.as_ref().ok()?.secs))
            .map(|r| format!("{r:.2}"))
            .collect();
        report.gain_ratio(
            name,
            p / b,
            &format!(
                "{}'s median time to recover all abandoned 3-step calls / idem's on \
                 PostgreSQL (same PostgreSQL, same effects, same kill after step 2); higher \
                 is better for idem; per round {}",
                o.lib.label(),
                per_round.join(", ")
            ),
        );
    }
}

/// Deletes the run's rows and keys, every round's.
async fn cleanup(stores: &Stores, effects: &Effects, libs: &[Lib], tag: &str, rounds: usize) {
    let pool = &effects.pool;
    let like = format!("{tag}r%");
    for lib in libs {
        for round in 0..rounds {
            let sh = Shared::new(lib.name(), effects, &format!("{tag}r{round}"));
            effects.forget(&sh.lib).await;
        }
    }
    if stores.pg.is_some() {
        let ns = format!("bench-recovery-{like}");
        for sql in [
            "DELETE FROM idem_steps WHERE id IN \
             (SELECT id FROM idem_records WHERE namespace LIKE $1)",
            "DELETE FROM idem_recovery WHERE namespace LIKE $1",
            "DELETE FROM idem_records WHERE namespace LIKE $1",
        ] {
            let _ = sqlx::query(sql).bind(&ns).execute(pool).await;
        }
    }
    if let Some(store) = &stores.redis {
        work::redis_cleanup(store, &format!("idem:bench-recovery-{tag}r")).await;
    }
    for schema in ["dbos", crate::durable::durare::SCHEMA] {
        for table in ["operation_outputs", "workflow_status"] {
            let _ = sqlx::query(AssertSqlSafe(format!(
                "DELETE FROM {schema}.{table} WHERE workflow_uuid LIKE $1"
            )))
            .bind(&like)
            .execute(pool)
            .await;
        }
    }
    if let Some(store) = &stores.pg {
        store.close().await;
    }
}
