//! `idem-chaos`: payments from several worker processes against one store while a
//! controller kills workers (SIGKILL) and restarts, fails over or cuts the store; then
//! an effects ledger kept outside idem is checked against the README's failure model.
//!
//! ```text
//! cargo run --release -p idem-bench --bin idem-chaos -- --store URL --seconds N
//! ```
//!
//! `--store` is a URL (`redis://…`, `postgres://…`, any that `idem_runtime::store::connect`
//! takes, on loopback only) or `redis-aof` (a private Redis with `appendfsync always`,
//! killed with SIGKILL and restarted) or `redis-sentinel` (a private primary, replica and
//! three sentinels; the primary is killed and the replica promoted; the store waits for
//! one replica, unless `--no-wait`). With a `postgres://` URL the store's connections
//! are cut. Other options: `--workers N` (4), `--tasks N` per worker (8), `--keys N`,
//! `--ledger URL` (PostgreSQL, default `postgres://postgres@127.0.0.1:5432/test`),
//! `--long` (10 minutes unless `--seconds` says otherwise), `--seed N`, `--keep` (keep the
//! ledger tables), `--faults pause` (workers SIGSTOPped past their lease, see `pause.rs`),
//! `--faults netem` (workers reach the store through a slow, lossy proxy with 1 s leases,
//! see `proxy.rs`; a single-host store URL), `--faults all`.
//!
//! It prints a summary ending in `violations: N` and exits non-zero on any violation.
//! Workers are this program run again with `--worker`; everything stops by itself.

mod check;
mod controller;
mod ledger;
mod pause;
mod proxy;
mod rng;
mod servers;
mod worker;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use idem_runtime::{Error, Store};

/// The command line.
#[derive(Debug, Clone)]
pub(crate) struct Opts {
    pub(crate) store: String,
    pub(crate) seconds: u64,
    pub(crate) workers: usize,
    pub(crate) tasks: usize,
    pub(crate) keys: Option<u64>,
    pub(crate) ledger: String,
    pub(crate) no_wait: bool,
    pub(crate) seed: u64,
    pub(crate) keep: bool,
    /// `--faults`: `pause` stops workers past their lease, `netem` puts a slow, lossy
    /// proxy between workers and store, `all` both (besides the kills and store faults).
    pub(crate) faults: String,
}

impl Opts {
    pub(crate) fn fault(&self, name: &str) -> bool {
        self.faults.split(',').any(|f| f == name || f == "all")
    }
}

const USAGE: &str = "usage: idem-chaos --store URL|redis-aof|redis-sentinel [--seconds N] [--long] \
                     [--workers N] [--tasks N] [--keys N] [--ledger URL] [--no-wait] [--seed N] [--keep] \
                     [--faults pause|netem|all]";

fn parse(args: &[String]) -> Result<Opts, String> {
    let mut o = Opts {
        store: String::new(),
        seconds: 0,
        workers: 4,
        tasks: 8,
        keys: None,
        ledger: "postgres://postgres@127.0.0.1:5432/test".into(),
        no_wait: false,
        seed: worker::now_ms(),
        keep: false,
        faults: String::new(),
    };
    let mut long = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or(format!("{a} takes a value\n{USAGE}"))
        };
        let num = |s: String| s.parse::<u64>().map_err(|e| format!("{a}: {e}"));
        match a.as_str() {
            "--store" => o.store = value()?,
            "--seconds" => o.seconds = num(value()?)?,
            "--workers" => {
                o.workers = usize::try_from(num(value()?)?).map_err(|e| e.to_string())?
            }
            "--tasks" => o.tasks = usize::try_from(num(value()?)?).map_err(|e| e.to_string())?,
            "--keys" => o.keys = Some(num(value()?)?),
            "--ledger" => o.ledger = value()?,
            "--seed" => o.seed = num(value()?)?,
            "--no-wait" => o.no_wait = true,
            "--long" => long = true,
            "--keep" => o.keep = true,
            "--faults" => o.faults = value()?,
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument {other}\n{USAGE}")),
        }
    }
    if o.store.is_empty() {
        return Err(format!("--store is required\n{USAGE}"));
    }
    if o.seconds == 0 {
        o.seconds = if long { 600 } else { 60 };
    }
    o.workers = o.workers.clamp(1, 32);
    o.tasks = o.tasks.clamp(1, 64);
    for url in [&o.store, &o.ledger] {
        if url.contains("://") && !on_loopback(url) {
            return Err(format!(
                "{url}: idem-chaos only touches servers on loopback"
            ));
        }
    }
    Ok(o)
}

/// Whether every host in `url` is 127.0.0.1, ::1 or localhost.
fn on_loopback(url: &str) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let hosts = rest.split(['/', '?']).next().unwrap_or_default();
    let hosts = hosts.rsplit_once('@').map_or(hosts, |(_, h)| h);
    hosts.split(',').all(|h| {
        let host = if let Some(v6) = h.strip_prefix('[') {
            v6.split(']').next().unwrap_or_default()
        } else {
            h.split(':').next().unwrap_or_default()
        };
        matches!(host, "127.0.0.1" | "localhost" | "::1")
    })
}

/// The store behind `url`, waiting for `replicas` replicas on each write (Redis only).
pub(crate) async fn connect(url: &str, replicas: usize) -> Result<Arc<dyn Store>, String> {
    if replicas == 0 {
        return idem_runtime::store::connect(url)
            .await
            .map_err(|e: Error| format!("store {url}: {e}"));
    }
    if !url.starts_with("redis") {
        return Err(format!("store {url}: only Redis waits for replicas"));
    }
    let store = idem_runtime::RedisStore::builder()
        .wait_for_replicas(replicas, Duration::from_secs(1))
        .connect(url)
        .map_err(|e| format!("store {url}: {e}"))?;
    Ok(Arc::new(store))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("idem-chaos: tokio: {e}");
            return ExitCode::FAILURE;
        }
    };
    if args.first().map(String::as_str) == Some("--worker") {
        let done = worker::Settings::from_env().map(|s| rt.block_on(worker::run(s)));
        return match done {
            Ok(Ok(())) => ExitCode::SUCCESS,
            Ok(Err(e)) | Err(e) => {
                eprintln!("idem-chaos worker: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let opts = match parse(&args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    match rt.block_on(controller::run(opts)) {
        Ok(0) => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("idem-chaos: {e}");
            ExitCode::FAILURE
        }
    }
}

/// How long to wait for workers to stop by themselves after the run.
pub(crate) const GRACE: Duration = Duration::from_secs(15);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_urls_pass() {
        for ok in [
            "redis://127.0.0.1:6379",
            "postgres://postgres@127.0.0.1:5432/test",
            "redis+sentinel://127.0.0.1:1,localhost:2/svc",
            "redis://[::1]:6379/0",
        ] {
            assert!(on_loopback(ok), "{ok}");
        }
        for bad in [
            "redis://10.0.0.5:6379",
            "postgres://u@db.example.com/test",
            "redis+sentinel://127.0.0.1:1,10.1.1.1:2/svc",
        ] {
            assert!(!on_loopback(bad), "{bad}");
        }
    }

    #[test]
    fn long_runs_are_a_flag_and_short_ones_the_default() {
        let args = |s: &str| s.split(' ').map(str::to_owned).collect::<Vec<_>>();
        assert_eq!(parse(&args("--store redis-aof")).unwrap().seconds, 60);
        assert_eq!(
            parse(&args("--store redis-aof --long")).unwrap().seconds,
            600
        );
        assert_eq!(
            parse(&args("--store redis-aof --seconds 5"))
                .unwrap()
                .seconds,
            5
        );
        assert!(parse(&args("--seconds 5")).is_err());
    }
}
