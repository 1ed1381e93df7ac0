//! The Redis family: raw baselines and idem's operations through `RedisStore`, taking
//! turns through the same connections (see [`turns`]), then the connection-use designs
//! and wake-up latency.
//!
//! Modules, each importing only those listed before it: [`ctx`] (store, `Idem`, run
//! namespace), [`op`] (one operation as a task spawner), [`baseline`], [`idem_ops`] and
//! [`stepped`] (the operations), [`turns`] (the loop that runs cases in turns), [`connections`] and
//! [`wake`] (cases of their own). This file lists the compared cases and reports them.

pub mod baseline;
pub mod connections;
pub mod ctx;
pub mod idem_ops;
pub mod op;
pub mod replicas;
pub mod stepped;
pub mod turns;
pub mod wake;

use ctx::Ctx;
use op::Op;
use turns::Case;

use crate::args::Args;
use crate::report::{self, Report};
use crate::stats::Row;

/// An operation's constructor.
pub type Make = fn(&Ctx) -> Op;

/// A Redis case: a short name (for `idem-bench-redis --case`), group, case, operation.
pub type Named = (&'static str, &'static str, &'static str, Make);

/// The cases the report compares: three raw baselines, then idem's four operations.
pub const COMPARED: [Named; 7] = [
    ("one", "baseline", baseline::ONE_RT, baseline::set_nx_px),
    ("two", "baseline", baseline::TWO_RT, baseline::set_nx_px_del),
    (
        "three",
        "baseline",
        baseline::THREE_RT,
        baseline::three_steps,
    ),
    ("new", "idem", idem_ops::DEDUP_NEW, idem_ops::dedup_new),
    (
        "replay",
        "idem",
        idem_ops::DEDUP_REPLAY,
        idem_ops::dedup_replay,
    ),
    ("lock", "idem", idem_ops::LOCK_CYCLE, idem_ops::lock_cycle),
    (
        "token",
        "idem",
        idem_ops::TOKEN_CYCLE,
        idem_ops::token_cycle,
    ),
];

/// Diagnostic cases outside the report's table (`idem-bench-redis --case NAME` only).
pub const DIAGNOSTIC: [Named; 4] = [
    (
        "new-wait1",
        "idem",
        replicas::DEDUP_NEW_WAIT1,
        replicas::dedup_new_wait1,
    ),
    (
        "two-keep",
        "baseline",
        baseline::TWO_RT_KEEP,
        baseline::set_nx_px_set_xx,
    ),
    ("steps", "idem", stepped::DEDUP_STEPS, stepped::dedup_steps),
    (
        "raw-writes",
        "idem",
        stepped::DEDUP_RAW_WRITES,
        stepped::dedup_raw_writes,
    ),
];

/// `cases` as [`turns::Case`]s at `tasks`, after seeding the keys the replay case reads.
pub async fn prepare<'a>(
    ctx: &Ctx,
    cases: impl IntoIterator<Item = &'a Named>,
    tasks: usize,
) -> Vec<Case> {
    idem_ops::seed_replay(ctx, tasks).await;
    cases
        .into_iter()
        .map(|(_, group, name, make)| Case::new(group, name, tasks, make(ctx)))
        .collect()
}

/// The rows of [`COMPARED`] at `tasks`, measured in turns through the same connections.
pub async fn compared(ctx: &Ctx, tasks: usize) -> [Row; 7] {
    let mut ctx = ctx.clone();
    ctx.find_server().await;
    let cases = prepare(&ctx, &COMPARED, tasks).await;
    let rows = turns::run(cases, tasks, ctx.secs, ctx.server_pid).await;
    let Ok(rows) = <[Row; 7]>::try_from(rows) else {
        unreachable!("seven cases give seven rows")
    };
    rows
}

/// The family, gathered into the report with its ratio lines: new key, lock and token
/// against the two-round-trip baseline, replay against the one-round-trip one, all
/// through the same connections. Skipped without `--redis`.
pub(crate) async fn run(args: &Args, report: &mut Report) {
    let Some(url) = &args.redis else { return };
    let secs = args.window().1.as_secs_f64();
    let ctx = match Ctx::new(url, secs, idem_runtime::store::redis::DEFAULT_CONNECTIONS) {
        Ok(c) => c,
        Err(e) => {
            report.note(format!("redis cases skipped: {e}"));
            return;
        }
    };
    let add = |report: &mut Report, r: Row| {
        let g = format!("redis/{}", r.group);
        report.add_summary(&g, &r.case, report::Summary::from(&r))
    };
    for tasks in [1usize, 50] {
        let [one, two, three, new, replay, lock, token] =
            compared(&ctx, tasks).await.map(|r| add(report, r));
        let b2 = format!("raw SET NX PX + DEL through the same connections, {tasks} tasks");
        let b1 = format!("raw SET NX PX through the same connections, {tasks} tasks");
        report.ratio(
            format!("redis-dedup-new@{tasks}"),
            &new,
            &two,
            &format!("idem dedup new key / {b2}"),
        );
        report.ratio(
            format!("redis-dedup-replay@{tasks}"),
            &replay,
            &one,
            &format!("idem dedup replay / {b1}"),
        );
        report.ratio(
            format!("redis-lock@{tasks}"),
            &lock,
            &two,
            &format!("idem lock acquire+release / {b2}"),
        );
        report.ratio(
            format!("redis-token@{tasks}"),
            &token,
            &two,
            &format!("idem token issue+consume (three round trips: issue, claim, complete) / {b2}"),
        );
        report.ratio(
            format!("redis-token-vs-3rt@{tasks}"),
            &token,
            &three,
            &format!(
                "idem token issue+consume / raw SET NX PX + SET XX GET + SET XX PX through the same connections, {tasks} tasks"
            ),
        );
        if !args.quick {
            for r in connections::all(&ctx, tasks).await {
                add(report, r);
            }
        }
    }
    for r in wake::all(&ctx).await {
        add(report, r);
    }
}
