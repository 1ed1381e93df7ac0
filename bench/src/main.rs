//! idem's load program: idem beside raw store baselines and peer crates, measured in one
//! process and one run, printed as a Markdown table followed by `ratio CASE VALUE` lines.
//!
//! ```text
//! cargo run --release -p idem-bench -- \
//!     --redis redis://127.0.0.1:6379 \
//!     --sql postgres://postgres@127.0.0.1:5432/test \
//!     --sql mysql://root@127.0.0.1:3306/test \
//!     --sql 'sqlite://target/idem-bench.db?mode=rwc' \
//!     --svg docs/throughput.svg
//! ```
//!
//! Cases (`--cases a,b,…`, default all that the given URLs allow): `redis` (issue 3: idem
//! on RedisStore against raw `SET NX PX` and `SET NX PX` + `DEL` through the same
//! connections), `sql` (issue 4: idem on SqlStore against a raw `INSERT … ON CONFLICT DO
//! NOTHING` on the same pool), `peers` (issue 6: `cached`, `rslock`, hand-written
//! `SET NX PX` + `GET`), `guarantees` (body executions under concurrent duplicates, crash
//! behaviour), `scaling` (1 → 256 tasks), `footprint` (bytes per completed record).
//!
//! Wall-clock numbers on a shared machine move with its load; the header prints the load
//! average before and after, and every comparison is made within the same run.

mod chart;
mod footprint;
mod guarantees;
mod load;
mod peers;
mod redis;
mod report;
mod runner;
mod scaling;
// Also the `idem-bench-sql` program's module, whose items are public there.
#[allow(unreachable_pub)]
mod sql;
// `print_table` and `fmt_dur` are the Redis cases' own printer, unused by this report.
#[allow(dead_code)]
mod stats;
mod work;

use std::process::ExitCode;
use std::time::Duration;

use report::Report;

/// What the command line asked for.
#[derive(Debug, Clone)]
pub(crate) struct Args {
    pub(crate) redis: Option<String>,
    pub(crate) sql: Vec<String>,
    pub(crate) quick: bool,
    pub(crate) cases: Vec<String>,
    pub(crate) svg: Option<String>,
}

impl Args {
    pub(crate) fn wants(&self, case: &str) -> bool {
        self.cases.is_empty() || self.cases.iter().any(|c| c == case)
    }

    /// Warm-up and measured window of one case.
    pub(crate) fn window(&self) -> (Duration, Duration) {
        if self.quick {
            (Duration::from_millis(100), Duration::from_millis(400))
        } else {
            (Duration::from_millis(200), Duration::from_secs(1))
        }
    }

    /// How many windows a peer case runs, keeping the median (see `load::run_median`).
    pub(crate) fn repeats(&self) -> usize {
        if self.quick { 1 } else { 3 }
    }

    /// The plan of one case at `tasks` concurrency.
    pub(crate) fn plan(&self, tasks: usize) -> load::Plan {
        let (warmup, duration) = self.window();
        load::Plan::new(tasks, warmup, duration)
    }
}

const USAGE: &str = "\
usage: idem-bench [--redis URL] [--sql URL]... [--quick] [--cases LIST] [--svg PATH]

  --redis URL    Redis to measure against (redis://127.0.0.1:6379)
  --sql URL      a SQL store: postgres://…, mysql://…, sqlite://FILE?mode=rwc (repeatable)
  --quick        short windows (a smoke run; numbers are noisier)
  --cases LIST   comma-separated subset of: memory,redis,sql,peers,guarantees,scaling,footprint
  --svg PATH     write the throughput-vs-concurrency chart there (needs the scaling case)
";

fn parse(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut args = Args {
        redis: None,
        sql: Vec::new(),
        quick: false,
        cases: Vec::new(),
        svg: None,
    };
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match a.as_str() {
            "--redis" => args.redis = Some(value("--redis")?),
            "--sql" => args.sql.push(value("--sql")?),
            "--quick" => args.quick = true,
            "--cases" => {
                for c in value("--cases")?.split(',').filter(|c| !c.is_empty()) {
                    const KNOWN: [&str; 7] = [
                        "memory",
                        "redis",
                        "sql",
                        "peers",
                        "guarantees",
                        "scaling",
                        "footprint",
                    ];
                    if !KNOWN.contains(&c) {
                        return Err(format!("unknown case {c:?}; known: {}", KNOWN.join(",")));
                    }
                    args.cases.push(c.to_owned());
                }
            }
            "--svg" => args.svg = Some(value("--svg")?),
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(args)
}

fn main() -> ExitCode {
    let mut raw = std::env::args().skip(1).peekable();
    // Child processes of the guarantee and footprint checks: a crash must be a real
    // process dying, and a footprint is measured in a process of its own.
    match raw.peek().map(String::as_str) {
        Some("--child") => {
            raw.next();
            return guarantees::child(raw.collect());
        }
        Some("--footprint-child") => {
            raw.next();
            return footprint::child(raw.collect());
        }
        _ => {}
    }
    let args = match parse(raw) {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("idem-bench: {e}");
            }
            eprint!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("idem-bench: tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let report = rt.block_on(run(args.clone()));
    println!("{}", report.render());
    if let Some(path) = args.svg.as_ref().filter(|_| !report.series.is_empty()) {
        let svg = chart::svg(
            "idem and peers: throughput against concurrency",
            &report.series,
        );
        if let Err(e) = std::fs::write(path, svg) {
            eprintln!("idem-bench: writing {path}: {e}");
            return ExitCode::FAILURE;
        }
        eprintln!("chart written to {path}");
    }
    ExitCode::SUCCESS
}

async fn run(args: Args) -> Report {
    let mut report = Report::default();
    let header = work::machine(&args).await;
    report.section("Machine and run", header);
    if args.wants("memory") || args.wants("peers") {
        eprintln!("== peers in memory (issue 6)");
        peers::memory(&args, &mut report).await;
    }
    if let Some(url) = &args.redis {
        if args.wants("redis") {
            eprintln!("== redis (issue 3)");
            redis_cases(&args, url, &mut report).await;
        }
        if args.wants("peers") {
            eprintln!("== peers on redis (issue 6)");
            peers::redis(&args, url, &mut report).await;
        }
    }
    if args.wants("sql") {
        for url in &args.sql {
            eprintln!("== sql {} (issue 4)", work::scheme(url));
            sql_cases(&args, url, &mut report).await;
        }
    }
    if args.wants("guarantees") {
        eprintln!("== guarantees (issue 6)");
        guarantees::run(&args, &mut report).await;
    }
    if args.wants("scaling") {
        eprintln!("== scaling (issue 6)");
        scaling::run(&args, &mut report).await;
    }
    if args.wants("footprint") {
        eprintln!("== footprint (issue 6)");
        footprint::run(&args, &mut report).await;
    }
    report.note(format!(
        "load average at the end of the run: {}",
        work::loadavg()
    ));
    report
}

/// Issue 3's cases (the `redis` module set, written with the Redis store), gathered into
/// the report with its ratio lines: new key, lock and token against the two-round-trip
/// baseline, replay against the one-round-trip one, all through the same connections.
async fn redis_cases(args: &Args, url: &str, report: &mut Report) {
    let secs = args.window().1.as_secs_f64();
    let ctx = match redis::Ctx::new(url, secs, idem_runtime::store::redis::DEFAULT_CONNECTIONS) {
        Ok(c) => c,
        Err(e) => {
            report.note(format!("redis cases skipped: {e}"));
            return;
        }
    };
    let add = |report: &mut Report, r: stats::Row| {
        let g = format!("redis/{}", r.group);
        report.add_summary(&g, &r.case, report::Summary::from(&r))
    };
    for tasks in [1usize, 50] {
        // The seven cases take turns in short slices (see `redis::turns`).
        let [one, two, three, new, replay, lock, token] = redis::turns::issue3(&ctx, tasks)
            .await
            .map(|r| add(report, r));
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
            for r in redis::connections::all(&ctx, tasks).await {
                add(report, r);
            }
        }
    }
    for r in redis::wake::all(&ctx).await {
        add(report, r);
    }
}

/// Issue 4's cases (the `sql` module, written with the SQL store). It prints its own
/// table and ratio lines as it goes (it is also the `idem-bench-sql` program); the rows
/// are gathered here too so the run's one table has them.
async fn sql_cases(args: &Args, url: &str, report: &mut Report) {
    match sql::run(url, args.window().1).await {
        Ok(rows) => {
            for r in &rows {
                report.add_summary(
                    &format!("sql/{}", r.backend),
                    r.case,
                    report::Summary {
                        tasks: r.tasks,
                        ops_per_sec: r.ops,
                        p50: Duration::ZERO,
                        p99: Duration::ZERO,
                        errors: 0,
                    },
                );
            }
            // The module printed these lines already; they are repeated (same names, same
            // values) so the run's final ratio block is complete.
            for tasks in [1usize, 50] {
                let get = |case: &str| {
                    rows.iter()
                        .find(|r| r.case == case && r.tasks == tasks)
                        .map(|r| report::Summary {
                            tasks,
                            ops_per_sec: r.ops,
                            p50: Duration::ZERO,
                            p99: Duration::ZERO,
                            errors: 0,
                        })
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
        Err(e) => report.note(format!("sql cases for {} failed: {e}", work::scheme(url))),
    }
}
