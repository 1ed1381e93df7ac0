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
//! Case families (`--cases a,b,…`, default all that the given URLs allow) are listed in
//! `idem_bench::cases::FAMILIES`; `--help` prints them.

use std::process::ExitCode;

use idem_bench::args::Args;
use idem_bench::{cases, chart, durable, footprint, guarantees, recovery};

const USAGE: &str = "\
usage: idem-bench [--redis URL] [--sql URL]... [--quick] [--cases LIST] [--svg PATH]

  --redis URL    Redis to measure against (redis://127.0.0.1:6379)
  --sql URL      a SQL store: postgres://…, mysql://…, sqlite://FILE?mode=rwc (repeatable)
  --quick        short windows (a smoke run; numbers are noisier)
  --cases LIST   comma-separated subset of the families below
  --svg PATH     write the throughput-vs-concurrency chart there (needs the scaling case)

case families:
";

fn usage() -> String {
    let mut s = USAGE.to_owned();
    for f in cases::FAMILIES {
        s.push_str(&format!("  {:<14} {}\n", f.name, f.about));
    }
    s
}

fn parse(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut args = Args::default();
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match a.as_str() {
            "--redis" => args.redis = Some(value("--redis")?),
            "--sql" => args.sql.push(value("--sql")?),
            "--quick" => args.quick = true,
            "--cases" => {
                for c in value("--cases")?.split(',').filter(|c| !c.is_empty()) {
                    if cases::family(c).is_none() {
                        let known: Vec<_> = cases::FAMILIES.iter().map(|f| f.name).collect();
                        return Err(format!("unknown case {c:?}; known: {}", known.join(",")));
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
    // Child processes of the guarantee, footprint, durable and recovery checks: a crash
    // must be a real process dying, and a footprint or a count of round trips is measured
    // in a process of its own.
    match raw.peek().map(String::as_str) {
        Some("--child") => {
            raw.next();
            return guarantees::child(raw.collect());
        }
        Some("--footprint-child") => {
            raw.next();
            return footprint::child(raw.collect());
        }
        Some("--durable-trips-child") => {
            raw.next();
            return durable::trips_child(raw.collect());
        }
        Some("--recovery-child") => {
            raw.next();
            return recovery::child(raw.collect());
        }
        _ => {}
    }
    let args = match parse(raw) {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("idem-bench: {e}");
            }
            eprint!("{}", usage());
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
    let report = rt.block_on(cases::run(&args));
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
