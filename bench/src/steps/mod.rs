//! The `steps` family: what one durable step ([`idem_runtime::step`]) costs, next to one
//! raw write of the same store through the same connections.
//!
//! A step journals its `Ok` value in one owner-checked write. Issue 23's bar is that this
//! costs at most 1.2 times a write a user could make by hand to the same store, without
//! the owner check, at 50 concurrent tasks. To price the step alone, every case is the
//! same dedup call on a new key (claim, body, completion) and only the body differs:
//!
//! - **empty body**: the body returns its result at once;
//! - **3 steps**: the body runs three [`step`](idem_runtime::step)s, each returning a small receipt;
//! - **3 raw writes**: the body writes the same three receipts itself, owner-less, where
//!   and as the journal would, through the store's own connections:
//!   - memory: an entry (name, serialized value, time) in an in-process map sharded and
//!     keyed like MemoryStore's journals (by the record's digest), under a `std` mutex
//!     (MemoryStore's journals cannot be written from outside); the body drops the
//!     record's entries at its end, as MemoryStore's completion drops a journal;
//!   - Redis: `HSET <record>:steps <name> <entry>` through `RedisStore::command`: the
//!     journal's own hash and entry bytes (kind, 15 digits of milliseconds, value), one
//!     command and one round trip. The hash outlives the call (idem's completion
//!     deletes a journal only for a record its steps made a stepped one, and a raw
//!     write leaves the record plain) until the run's cleanup: so a step's call pays
//!     for dropping its journal, within its completion script, and a raw write does not;
//!   - PostgreSQL: SqlStore's own step statement (`PG_RAW_WRITE` in `raw.rs`) without
//!     its owner, state, lease and expiry checks: it numbers the step on the record's
//!     row and inserts or replaces the step's row in `idem_steps`, in the journal's
//!     format and stamped by the database's clock, through the store's pool; the
//!     completion deletes those rows within the timed call, as it does a journal's;
//! - **resume**: a body whose first 2 of 3 steps are already journaled. Before each
//!   measured call, unmeasured, a first attempt at the same key runs two steps and
//!   returns `Err`, which releases the key and keeps the journal; the measured attempt
//!   gets the journal with its claim, replays two steps and runs one. Each measured
//!   attempt checks that exactly one step ran.
//!
//! A step's cost is (mean call with 3 steps − mean call with an empty body) / 3, a raw
//! write's is (mean call with 3 raw writes − the same empty call) / 3, and the ratio
//! divides the first by the second (a `cost-ratio` line: lower is better; until 0.2 also
//! printed as the old `ratio` line, see `Report::cost_ratio`). At 50 tasks a mean
//! latency is the tasks over the throughput, so the ratio is also that of the capacity
//! each uses. The four cases take turns in short slices, as the Redis and SQL families'
//! do, so a change of the shared machine's load lands on all of them alike; the table
//! shows the spread of the per-slice ratios beside the figure from all slices together.
//!
//! Stores: MemoryStore always, Redis with `--redis`, PostgreSQL with a `postgres://`
//! `--sql` URL (other SQL backends are not measured here), each at 1 and 50 tasks. A
//! store without a step journal is noted and skipped. Each case measures `--quick`'s or
//! the full window in total (split in [`ROUNDS`] slices), or `$IDEM_BENCH_STEPS_SECS`
//! seconds if set: the subtraction of two means wants more samples than a throughput
//! does, so give it several seconds on a quiet machine.

use std::sync::Arc;
use std::time::Duration;

use idem_runtime::store::sql::sqlx::{self, AssertSqlSafe};
use idem_runtime::{Idem, MemoryStore, Options, RedisStore, SqlStore, Store};

use crate::args::Args;
use crate::report::{Report, fmt_dur, markdown_table};
use crate::{load, work};

use self::bodies::op;
use self::measure::{Plan, measure};
use self::raw::{Raw, RawMap};

mod bodies;
mod measure;
mod raw;

/// Records and journals live this long; Redis keys expire by themselves after the run.
const TTL: Duration = Duration::from_secs(30);

static EMPTY: Options = Options::dedup("bench::steps_empty").ttl(TTL);
static STEPS: Options = Options::dedup("bench::steps").ttl(TTL);
static RAW: Options = Options::dedup("bench::steps_raw").ttl(TTL);
static RESUME: Options = Options::dedup("bench::steps_resume").ttl(TTL);

/// How many turns each case takes (its measured time is split among them).
pub const ROUNDS: u32 = 5;

/// The bar of issue 23: a step costs at most this many raw writes, at [`BAR_TASKS`].
const BAR: f64 = 1.2;
const BAR_TASKS: usize = 50;

/// What the resume case's first attempt fails with.
const FAIL: &str = "steps bench: the first attempt fails after two steps";

/// The four cases, in the order they take turns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Empty,
    Steps,
    Raw,
    Resume,
}

const KINDS: [Kind; 4] = [Kind::Empty, Kind::Steps, Kind::Raw, Kind::Resume];

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Empty => "dedup new key, empty body",
            Kind::Steps => "dedup new key, 3 steps",
            Kind::Raw => "dedup new key, 3 raw writes",
            Kind::Resume => "resume: 2 steps replayed, 1 run",
        }
    }
}

/// Runs the family on every store the command line gives.
pub(crate) async fn run(args: &Args, report: &mut Report) {
    let (warmup, window) = args.window();
    let window = match std::env::var("IDEM_BENCH_STEPS_SECS") {
        Ok(s) => match s.parse::<f64>() {
            Ok(secs) if secs > 0.0 && secs.is_finite() => Duration::from_secs_f64(secs),
            _ => {
                report.note(format!(
                    "IDEM_BENCH_STEPS_SECS={s:?} is not a positive number of seconds; using {window:?}"
                ));
                window
            }
        },
        Err(_) => window,
    };
    let plan = Plan {
        warmup: warmup / ROUNDS,
        slice: window / ROUNDS,
    };
    if cfg!(debug_assertions) {
        report.note("steps: a debug build; its figures say nothing about a release build");
    }
    // One namespace per run: keys of two runs, or of a run and a test suite, never meet.
    let ns = format!("bench-steps-{}", load::run_tag());
    let mut table = Vec::new();

    let memory = Idem::builder()
        .store(MemoryStore::new())
        .namespace(ns.clone())
        .build();
    store_cases(
        report,
        &mut table,
        "memory",
        plan,
        &memory,
        &Raw::Memory(Arc::new(RawMap::new())),
    )
    .await;

    if let Some(url) = &args.redis {
        match RedisStore::connect(url) {
            Ok(store) => {
                let idem = Idem::builder()
                    .store(store.clone())
                    .namespace(ns.clone())
                    .build();
                store_cases(
                    report,
                    &mut table,
                    "redis",
                    plan,
                    &idem,
                    &Raw::Redis(store.clone()),
                )
                .await;
                // Records, journals and raw keys all live under the run's namespace.
                work::redis_cleanup(&store, &format!("idem:{ns}:")).await;
            }
            Err(e) => report.note(format!("steps/redis skipped: {e}")),
        }
    }

    for url in args.sql.iter().filter(|u| u.starts_with("postgres")) {
        if let Err(e) = postgres(report, &mut table, plan, url, &ns).await {
            report.note(format!("steps/postgres failed: {e}"));
        }
    }

    if table.is_empty() {
        return;
    }
    let mut rows = vec![
        [
            "store",
            "tasks",
            "empty body",
            "3 steps",
            "3 raw writes",
            "resume",
            "per step",
            "per raw write",
            "step / raw write",
            "per-slice ratios",
            "bar ≤ 1.2 at 50 tasks",
        ]
        .map(str::to_owned)
        .to_vec(),
    ];
    rows.extend(table);
    let mut body = markdown_table(
        &rows,
        &[
            false, true, true, true, true, true, true, true, true, false, false,
        ],
    );
    body.push_str(
        "\nMean latency of one dedup call on a new key, by what its body does; \
         `resume` is an attempt that replays 2 journaled steps and runs the third (its \
         failed first attempt not counted). `per step` = (3 steps − empty body) / 3, \
         `per raw write` = (3 raw writes − empty body) / 3, through the same store and \
         connections; `step / raw write` divides them (lower is better).\n",
    );
    report.section("Durable steps (`--cases steps`)", body);
}

/// The PostgreSQL cases: the store, the cases, clean-up.
async fn postgres(
    report: &mut Report,
    table: &mut Vec<Vec<String>>,
    plan: Plan,
    url: &str,
    ns: &str,
) -> Result<(), idem_runtime::Error> {
    let store = SqlStore::connect(url).await?;
    if store.journal().is_none() {
        report.note("steps/postgres skipped: this build's SqlStore keeps no step journal");
        store.close().await;
        return Ok(());
    }
    let Some(pool) = store.pg_pool().cloned() else {
        return Err(idem_runtime::Error::Config("not a PostgreSQL pool".into()));
    };
    let idem = Idem::builder()
        .store(store.clone())
        .namespace(ns.to_owned())
        .build();
    store_cases(
        report,
        table,
        "postgres",
        plan,
        &idem,
        &Raw::Postgres(pool.clone()),
    )
    .await;
    // Leave nothing behind: the run's records (a completion drops a journal with its
    // record's value, so no journal outlives them).
    sqlx::query(AssertSqlSafe(format!(
        "DELETE FROM idem_records WHERE namespace = '{ns}'"
    )))
    .execute(&pool)
    .await
    .map_err(idem_runtime::Error::store)?;
    store.close().await;
    Ok(())
}

/// One store's cases at 1 and 50 tasks: rows, ratio lines and the table's lines.
async fn store_cases(
    report: &mut Report,
    table: &mut Vec<Vec<String>>,
    label: &str,
    plan: Plan,
    idem: &Idem,
    raw: &Raw,
) {
    let group = format!("steps/{label}");
    for tasks in [1usize, BAR_TASKS] {
        eprintln!("  steps {label}, {tasks} tasks");
        let cases = KINDS.map(|k| (k, op(k, idem.clone(), raw.clone())));
        let measured = measure(&cases, tasks, plan, raw).await;
        let mut clean = true;
        for m in &measured {
            if let Some(e) = &m.tally.first_error {
                clean = false;
                report.note(format!(
                    "{group} / {} / {tasks} tasks: {} errors, first: {e}",
                    m.kind.name(),
                    m.tally.errors
                ));
            }
            report.add_summary(&group, m.kind.name(), m.summary(tasks));
        }
        let [empty, steps, raws, resume] = &measured;
        let per_step = (steps.mean_ns() - empty.mean_ns()) / 3.0;
        let per_raw = (raws.mean_ns() - empty.mean_ns()) / 3.0;
        let ratio = (per_raw > 0.0).then(|| per_step / per_raw);
        let per_round: Vec<f64> = (0..ROUNDS as usize)
            .filter_map(|r| {
                let e = empty.rounds.get(r)?;
                let raw = (raws.rounds.get(r)? - e) / 3.0;
                let step = (steps.rounds.get(r)? - e) / 3.0;
                (raw > 0.0).then(|| step / raw)
            })
            .collect();
        let spread = match (
            per_round.iter().copied().reduce(f64::min),
            per_round.iter().copied().reduce(f64::max),
        ) {
            (Some(lo), Some(hi)) => format!("{lo:.2} to {hi:.2} ({} slices)", per_round.len()),
            _ => "n/a".to_owned(),
        };
        let bar = match (clean, ratio) {
            (false, _) => "n/a (errors)".to_owned(),
            (true, None) => "n/a (raw writes measured no cost)".to_owned(),
            (true, Some(_)) if tasks != BAR_TASKS => "(bar is at 50 tasks)".to_owned(),
            (true, Some(r)) if r <= BAR => format!("met ({r:.2} ≤ {BAR})"),
            (true, Some(r)) => format!("NOT met ({r:.2} > {BAR})"),
        };
        if let (true, Some(r)) = (clean, ratio) {
            report.cost_ratio(
                format!("steps-{label}-step-vs-raw-write@{tasks}"),
                r,
                &format!(
                    "(dedup call with 3 steps − with an empty body) / 3, over (the same call \
                     with 3 raw owner-less writes − empty body) / 3, mean latencies, {label}, \
                     same store and connections, {tasks} tasks; a cost ratio (lower is \
                     better), bar ≤ {BAR} at {BAR_TASKS} tasks; per-slice ratios {spread}"
                ),
            );
        }
        table.push(vec![
            label.to_owned(),
            tasks.to_string(),
            fmt_ns(empty.mean_ns()),
            fmt_ns(steps.mean_ns()),
            fmt_ns(raws.mean_ns()),
            fmt_ns(resume.mean_ns()),
            fmt_ns(per_step),
            fmt_ns(per_raw),
            ratio.map_or_else(|| "n/a".to_owned(), |r| format!("{r:.2}")),
            spread,
            bar,
        ]);
    }
}

/// A duration in nanoseconds as the report prints durations; a negative one (a
/// difference lost in noise) with its sign.
fn fmt_ns(ns: f64) -> String {
    if !ns.is_finite() {
        return "n/a".to_owned();
    }
    let d = fmt_dur(Duration::from_nanos(ns.abs() as u64));
    if ns < 0.0 { format!("−{d}") } else { d }
}
