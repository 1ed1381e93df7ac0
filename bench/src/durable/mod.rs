//! The `durable` family: the same 3-step workflow written in each durable-steps library
//! for Rust, on the same PostgreSQL, in the same process and run.
//!
//! The workflow is a checkout of three steps (`charge`, `reserve`, `mail`); each step's
//! effect is one insert into the bench's own table (`idem_bench_durable_effects`) and its value a small
//! receipt, the last of which the workflow returns. Written idiomatically in:
//!
//! - idem (`idem.rs`): an `#[idempotent]` fn with three `step`s, on PostgreSQL; the same
//!   with three `step_tx`s (each insert commits with its journal entry); the first again
//!   on Redis (the peers have no Redis backend; the effects still go to PostgreSQL);
//! - DBOS Transact for Rust (`dbos.rs`): a workflow with three steps;
//! - durare (`durare.rs`): a workflow with three steps, and one with three transactional
//!   steps;
//! - durable-rust (`durable_rust.rs`): a workflow with three steps.
//!
//! Each library runs on its documented defaults (pool sizes included); plain steps'
//! inserts go through the bench's own pool (`flow::Effects`), the same for all, so no
//! library's pool limit applies to them.
//!
//! Measured at 1 and 50 concurrent workflows, each library taking turns in
//! `measure::ROUNDS` slices: a new workflow (p50, p99, mean; per step = mean ÷ 3, start
//! and completion included; workflows/s), the same call again for a finished workflow
//! (replay), and the resume of a workflow killed right after step 2's checkpoint (each
//! library's documented resume). One `ratio durable-vs-<peer>@<tasks> X` line per peer and
//! concurrency: X = the peer's mean time per new workflow ÷ idem's on PostgreSQL with
//! plain steps, so higher is better for idem. At the end every library's effects are
//! checked: no (workflow, step) may have run twice.
//!
//! Needs a `postgres://` `--sql` URL; Redis is added with `--redis`.

mod dbos;
mod durable_rust;
// `recovery` reuses the checkout's effects, shared parts and durare's schema.
pub(crate) mod durare;
pub(crate) mod flow;
mod idem;
mod measure;
mod trips;

use std::sync::Arc;

use idem_runtime::store::sql::sqlx::{self, AssertSqlSafe};
use idem_runtime::{Idem, RedisStore, SqlStore};

use self::flow::{Effects, Flow, Shared};
use self::measure::{Kind, Plan, ROUNDS, Tally};
use crate::args::Args;
use crate::load;
use crate::report::{Report, fmt_dur, fmt_rate, markdown_table};
use crate::work;

/// One library's workflow, as the table names it.
struct Case {
    label: &'static str,
    /// The ratio line's `<peer>` (None for idem's own variants).
    peer: Option<&'static str>,
    flow: Arc<dyn Flow>,
    sh: Shared,
}

/// What has to be shut down or cleaned after the run.
#[derive(Default)]
struct Running {
    idem_pg: Option<(SqlStore, String)>,
    idem_redis: Option<(RedisStore, String)>,
    dbos: Option<Arc<dbos::DbosFlow>>,
    durare: Option<Arc<durare::DurareFlow>>,
    durable_rust: bool,
}

/// The round-trip counting child process (`idem-bench --durable-trips-child URL`).
pub fn trips_child(args: Vec<String>) -> std::process::ExitCode {
    let Some(url) = args.first() else {
        eprintln!("durable trips child: no URL");
        return std::process::ExitCode::FAILURE;
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("durable trips child: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match rt.block_on(trips::child(url)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("durable trips child: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

pub(crate) async fn run(args: &Args, report: &mut Report) {
    let Some(url) = args.sql.iter().find(|u| u.starts_with("postgres")) else {
        report.note("durable: skipped, it needs a postgres:// --sql URL");
        return;
    };
    eprintln!("  durable: counting round trips (a process of its own)");
    trips::run(url, report).await;
    if cfg!(debug_assertions) {
        report.note("durable: a debug build; its figures say nothing about a release build");
    }
    let effects = match Effects::connect(url).await {
        Ok(e) => e,
        Err(e) => {
            report.note(format!("durable: skipped, {e}"));
            return;
        }
    };
    let tag = load::run_tag();
    let mut running = Running::default();
    let cases = start(args, url, &effects, tag, report, &mut running).await;
    let (warmup, window) = args.window();
    let plan = Plan {
        warmup: warmup / ROUNDS,
        slice: window / ROUNDS,
    };
    let flows: Vec<Arc<dyn Flow>> = cases.iter().map(|c| c.flow.clone()).collect();
    let mut table = Vec::new();
    for tasks in [1usize, 50] {
        let mut by_kind = Vec::new();
        for kind in [Kind::New, Kind::Replay, Kind::Resume] {
            eprintln!("  durable: {} at {tasks} tasks", kind.name());
            let tallies = measure::measure(&flows, kind, tasks, plan).await;
            for (case, t) in cases.iter().zip(&tallies) {
                if let Some(e) = &t.first_error {
                    report.note(format!(
                        "durable / {} / {} / {tasks} tasks: {} errors, first: {e}",
                        case.label,
                        kind.name(),
                        t.errors
                    ));
                }
                report.add_summary(
                    "durable",
                    &format!("{}, {}", case.label, kind.name()),
                    t.summary(tasks),
                );
            }
            by_kind.push(tallies);
        }
        let [new, replay, resume] = <[Vec<Tally>; 3]>::try_from(by_kind)
            .unwrap_or_else(|_| unreachable!("three kinds were measured"));
        ratios(report, &cases, &new, tasks);
        let base = idem_pg(&cases).map(|i| &new[i]);
        for (i, case) in cases.iter().enumerate() {
            table.push(row(case, tasks, &new[i], base, &replay[i], &resume[i]));
        }
    }
    let doubled = check_effects(&cases, &effects, report).await;
    section(report, table, &doubled);
    stop(running, &effects, tag).await;
    for case in &cases {
        effects.forget(&case.sh.lib).await;
    }
}

/// Builds every library's flows; a library that cannot start is noted and left out.
async fn start(
    args: &Args,
    url: &str,
    effects: &Effects,
    tag: &str,
    report: &mut Report,
    running: &mut Running,
) -> Vec<Case> {
    let mut cases = Vec::new();
    let ns = format!("bench-durable-{tag}");
    match SqlStore::connect(url).await {
        Ok(store) => {
            let idem = Idem::builder()
                .store(store.clone())
                .namespace(ns.clone())
                .build();
            for (label, body, lib) in [
                ("idem postgres, 3 steps", idem::Body::Steps, "idem-pg"),
                ("idem postgres, 3 step_tx", idem::Body::Tx, "idem-pg-tx"),
            ] {
                let sh = Shared::new(lib, effects, tag);
                let flow = idem::IdemFlow {
                    idem: idem.clone(),
                    sh: sh.clone(),
                    body,
                };
                cases.push(Case {
                    label,
                    peer: None,
                    flow: Arc::new(flow),
                    sh,
                });
            }
            running.idem_pg = Some((store, ns.clone()));
        }
        Err(e) => report.note(format!("durable: idem on PostgreSQL did not start: {e}")),
    }
    if let Some(redis) = &args.redis {
        match RedisStore::connect(redis) {
            Ok(store) => {
                let idem = Idem::builder()
                    .store(store.clone())
                    .namespace(ns.clone())
                    .build();
                let sh = Shared::new("idem-redis", effects, tag);
                let flow = idem::IdemFlow {
                    idem,
                    sh: sh.clone(),
                    body: idem::Body::Steps,
                };
                cases.push(Case {
                    label: "idem redis, 3 steps",
                    peer: None,
                    flow: Arc::new(flow),
                    sh,
                });
                running.idem_redis = Some((store, ns.clone()));
            }
            Err(e) => report.note(format!("durable: idem on Redis did not start: {e}")),
        }
    }
    let sh = Shared::new("dbos", effects, tag);
    match dbos::DbosFlow::start(url, sh.clone()).await {
        Ok(flow) => {
            let flow = Arc::new(flow);
            running.dbos = Some(flow.clone());
            cases.push(Case {
                label: "dbos, 3 steps",
                peer: Some("dbos"),
                flow,
                sh,
            });
        }
        Err(e) => report.note(format!("durable: DBOS did not start: {e}")),
    }
    let (steps, tx) = (
        Shared::new("durare", effects, tag),
        Shared::new("durare-tx", effects, tag),
    );
    match durare::start(url, steps.clone(), tx.clone()).await {
        Ok((plain, transactional)) => {
            let plain = Arc::new(plain);
            running.durare = Some(plain.clone());
            cases.push(Case {
                label: "durare, 3 steps",
                peer: Some("durare"),
                flow: plain,
                sh: steps,
            });
            cases.push(Case {
                label: "durare, 3 transactions",
                peer: None,
                flow: Arc::new(transactional),
                sh: tx,
            });
        }
        Err(e) => report.note(format!("durable: durare did not start: {e}")),
    }
    let sh = Shared::new("durable-rust", effects, tag);
    match durable_rust::DurableRustFlow::start(url, sh.clone()).await {
        Ok(flow) => {
            running.durable_rust = true;
            cases.push(Case {
                label: "durable-rust, 3 steps",
                peer: Some("durable-rust"),
                flow: Arc::new(flow),
                sh,
            });
        }
        Err(e) => report.note(format!("durable: durable-rust did not start: {e}")),
    }
    cases
}

/// The case every ratio divides by: idem on PostgreSQL with plain steps.
const BASE: &str = "idem postgres, 3 steps";

fn idem_pg(cases: &[Case]) -> Option<usize> {
    cases.iter().position(|c| c.label == BASE)
}

/// `ratio durable-vs-<peer>@<tasks>`: the peer's mean time per new workflow over idem's
/// on PostgreSQL with plain steps.
fn ratios(report: &mut Report, cases: &[Case], new: &[Tally], tasks: usize) {
    let Some(idem) = idem_pg(cases) else {
        return;
    };
    let base = &new[idem];
    for (i, case) in cases.iter().enumerate() {
        let Some(peer) = case.peer else { continue };
        let name = format!("durable-vs-{peer}@{tasks}");
        let t = &new[i];
        if t.errors > 0 || base.errors > 0 || t.ops == 0 || base.ops == 0 {
            report.note(format!("no ratio {name}: a case had errors or no calls"));
            continue;
        }
        let per_round: Vec<f64> = t
            .rounds
            .iter()
            .zip(&base.rounds)
            .map(|(p, b)| p / b)
            .collect();
        let spread = match (
            per_round.iter().copied().reduce(f64::min),
            per_round.iter().copied().reduce(f64::max),
        ) {
            (Some(lo), Some(hi)) => format!("per-slice {lo:.2} to {hi:.2}"),
            _ => "one slice".to_owned(),
        };
        report.gain_ratio(
            name,
            t.mean_ns() / base.mean_ns(),
            &format!(
                "{}'s mean time per new 3-step workflow / idem's (`#[idempotent]` with 3 \
                 `step`s on PostgreSQL), same PostgreSQL and effects, {tasks} concurrent \
                 workflows; higher is better for idem; {spread}",
                case.label
            ),
        );
    }
}

/// A duration in nanoseconds as the report prints durations.
fn fmt_ns(ns: f64) -> String {
    if ns.is_finite() && ns >= 0.0 {
        fmt_dur(std::time::Duration::from_nanos(ns as u64))
    } else {
        "n/a".to_owned()
    }
}

fn lat(t: &Tally, q: f64) -> String {
    if t.ops == 0 {
        "n/a".to_owned()
    } else {
        fmt_dur(t.hist.quantile(q))
    }
}

/// The family table's line of a case at `tasks`: its new workflows `t`, compared with
/// idem's on PostgreSQL (`base`), its replays and resumes.
fn row(
    case: &Case,
    tasks: usize,
    t: &Tally,
    base: Option<&Tally>,
    replay: &Tally,
    resume: &Tally,
) -> Vec<String> {
    let vs_idem = base.filter(|b| b.ops > 0 && t.ops > 0).map_or_else(
        || "n/a".to_owned(),
        |b| format!("{:.2}", t.mean_ns() / b.mean_ns()),
    );
    vec![
        case.label.to_owned(),
        tasks.to_string(),
        lat(t, 0.50),
        lat(t, 0.99),
        fmt_ns(t.mean_ns()),
        fmt_ns(t.mean_ns() / 3.0),
        fmt_rate(t.summary(tasks).ops_per_sec),
        vs_idem,
        lat(replay, 0.50),
        lat(replay, 0.99),
        lat(resume, 0.50),
        lat(resume, 0.99),
        (t.errors + replay.errors + resume.errors).to_string(),
    ]
}

/// Every library's (workflow, step) pairs that ran more than once, as the table's note.
async fn check_effects(cases: &[Case], effects: &Effects, report: &mut Report) -> String {
    let mut out = String::new();
    for case in cases {
        match effects.doubled(&case.sh.lib).await {
            Ok(0) => {}
            Ok(n) => {
                report.note(format!("durable / {}: {n} steps ran twice", case.label));
                out.push_str(&format!("{}: {n} steps ran twice. ", case.label));
            }
            Err(e) => report.note(format!("durable / {}: {e}", case.label)),
        }
    }
    if out.is_empty() {
        "No step of any library ran twice (one effect row per workflow and step).".to_owned()
    } else {
        out
    }
}

fn section(report: &mut Report, table: Vec<Vec<String>>, doubled: &str) {
    if table.is_empty() {
        return;
    }
    let mut rows = vec![
        [
            "library",
            "tasks",
            "p50",
            "p99",
            "mean",
            "per step",
            "workflows/s",
            "÷ idem pg",
            "replay p50",
            "replay p99",
            "resume p50",
            "resume p99",
            "errors",
        ]
        .map(str::to_owned)
        .to_vec(),
    ];
    rows.extend(table);
    let mut body = markdown_table(
        &rows,
        &[
            false, true, true, true, true, true, true, true, true, true, true, true, true,
        ],
    );
    body.push_str(&format!(
        "\nA new 3-step workflow, start to result (p50, p99, mean; per step = mean ÷ 3, start \
         and completion included); `÷ idem pg` = its mean ÷ idem's on PostgreSQL with 3 \
         `step`s (higher: slower than idem). `replay` = the same call again for a finished \
         workflow; `resume` = each library's documented resume of a workflow killed right \
         after step 2's checkpoint. {doubled}\n",
    ));
    report.section(
        "Durable workflows against the Rust peers (`--cases durable`)",
        body,
    );
}

/// Shuts the libraries down and deletes the run's rows and keys.
async fn stop(running: Running, effects: &Effects, tag: &str) {
    let pool = &effects.pool;
    let like = format!("{tag}-%");
    if let Some((store, ns)) = running.idem_pg {
        let _ = sqlx::query(AssertSqlSafe(format!(
            "DELETE FROM idem_records WHERE namespace = '{ns}'"
        )))
        .execute(pool)
        .await;
        store.close().await;
    }
    if let Some((store, ns)) = running.idem_redis {
        work::redis_cleanup(&store, &format!("idem:{ns}:")).await;
    }
    if let Some(flow) = running.dbos {
        flow.shutdown().await;
        for table in ["operation_outputs", "workflow_status"] {
            let _ = sqlx::query(AssertSqlSafe(format!(
                "DELETE FROM dbos.{table} WHERE workflow_uuid LIKE $1"
            )))
            .bind(&like)
            .execute(pool)
            .await;
        }
    }
    if let Some(flow) = running.durare {
        flow.shutdown().await;
        for table in ["operation_outputs", "workflow_status"] {
            let _ = sqlx::query(AssertSqlSafe(format!(
                "DELETE FROM {}.{table} WHERE workflow_uuid LIKE $1",
                durare::SCHEMA
            )))
            .bind(&like)
            .execute(pool)
            .await;
        }
    }
    if running.durable_rust {
        let _ = sqlx::query(
            "DELETE FROM durable.task WHERE parent_id IN \
             (SELECT id FROM durable.task WHERE parent_id IS NULL AND name LIKE $1)",
        )
        .bind(&like)
        .execute(pool)
        .await;
        let _ = sqlx::query("DELETE FROM durable.task WHERE parent_id IS NULL AND name LIKE $1")
            .bind(&like)
            .execute(pool)
            .await;
    }
}
