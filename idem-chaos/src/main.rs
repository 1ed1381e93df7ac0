//! `idem-chaos`: payments from several worker processes against one store while a
//! controller kills workers (SIGKILL) and restarts, fails over or cuts the store; then
//! an effects ledger kept outside idem is checked against the failure model
//! (docs/failure-model.md).
//!
//! ```text
//! cargo run --release -p idem-chaos -- --store URL --seconds N
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
//! ledger tables).
//!
//! `--faults` names more faults, separated by commas: `partition`, `pause`, `netem`, or
//! `all` (the three).
//!
//! `--faults partition` replaces the store faults above with silent network partitions
//! (see [`netns`]): workers run on virtual hosts in network namespaces and are cut from
//! the store with nftables `drop` rules (no reset), then healed. With a URL store the
//! workers reach it through a forwarder in this process, so the server itself is never
//! touched; `redis-aof` runs its server on a virtual host; `redis-sentinel` runs its five
//! servers on three virtual hosts and alternates a cut of workers from all of them with a
//! split brain (the primary and some workers cut from the rest; a replica is promoted;
//! both sides keep calling; healed). `--min-replicas N` sets the private Redis servers'
//! `min-replicas-to-write` (lag 1 s; default 1 with partitions on `redis-sentinel`, else
//! 0). Needs root, `ip` and `nft`.
//!
//! `--faults pause` stops a worker (SIGSTOP) past its lease every few seconds, then
//! resumes it (see [`pause`]). `--faults netem` puts a slow, lossy proxy between the
//! workers and the store and gives them 1 s leases (see [`proxy`]; the final sweep goes
//! direct). Netem needs a single-host store: a URL, or `redis-aof` without partitions;
//! `--faults all` on another store skips it with a note.
//!
//! Each run records a history (every call with its start, end and outcome; every effect
//! with its claim's owner; every fault) that [`check`] reads against the failure model.
//! It prints a summary ending in `violations: N` and exits non-zero on any violation.
//! Workers are this program run again with `--worker`; everything stops by itself.

mod check;
mod controller;
mod ledger;
mod netns;
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
    /// The faults asked for with `--faults`; empty: kills and the store's own faults.
    pub(crate) faults: Vec<Fault>,
    /// Whether `--faults` said `all`: a fault this store cannot take is then skipped
    /// with a note (netem on Sentinel) rather than refused.
    pub(crate) all_faults: bool,
    /// `min-replicas-to-write` of the private Redis servers; `None`: the default.
    pub(crate) min_replicas: Option<u32>,
}

/// A kind of fault `--faults` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    /// Silent partitions in network namespaces (app ↔ store; Sentinel split brain).
    Partition,
    /// A worker stopped (SIGSTOP) inside its body past its lease.
    Pause,
    /// Slow and lossy links through a proxy.
    Netem,
}

impl Fault {
    const ALL: [Fault; 3] = [Fault::Partition, Fault::Pause, Fault::Netem];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Fault::Partition => "partition",
            Fault::Pause => "pause",
            Fault::Netem => "netem",
        }
    }

    /// `partition`, `pause`, `netem`, `all`, or several separated by commas.
    fn parse_list(s: &str) -> Result<Vec<Fault>, String> {
        let mut out = Vec::new();
        for name in s.split(',').map(str::trim) {
            let add: &[Fault] = match name {
                "all" => &Fault::ALL,
                "partition" => &[Fault::Partition],
                "pause" => &[Fault::Pause],
                "netem" => &[Fault::Netem],
                other => {
                    return Err(format!(
                        "--faults {other}: expected partition, pause, netem or all"
                    ));
                }
            };
            for f in add {
                if !out.contains(f) {
                    out.push(*f);
                }
            }
        }
        Ok(out)
    }
}

impl Opts {
    /// Whether `--faults` asked for `f` (by name or with `all`).
    pub(crate) fn has(&self, f: Fault) -> bool {
        self.faults.contains(&f)
    }
}

const USAGE: &str = "usage: idem-chaos --store URL|redis-aof|redis-sentinel [--seconds N] [--long] \
                     [--faults partition|pause|netem|all] [--min-replicas N] \
                     [--workers N] [--tasks N] [--keys N] [--ledger URL] [--no-wait] [--seed N] [--keep]";

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
        faults: Vec::new(),
        all_faults: false,
        min_replicas: None,
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
            "--faults" => {
                let list = value()?;
                o.faults = Fault::parse_list(&list)?;
                o.all_faults = list.split(',').any(|f| f.trim() == "all");
            }
            "--min-replicas" => {
                o.min_replicas = Some(u32::try_from(num(value()?)?).map_err(|e| e.to_string())?)
            }
            "--no-wait" => o.no_wait = true,
            "--long" => long = true,
            "--keep" => o.keep = true,
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
/// `small`: a PostgreSQL store gets a pool of [`SMALL_POOL`] and calls bounded by
/// [`SMALL_TIMEOUT`] (partition runs: a cut call ends as soon as a Redis one does, and
/// the connections a cut strands stay few).
pub(crate) async fn connect(
    url: &str,
    replicas: usize,
    small: bool,
) -> Result<Arc<dyn Store>, String> {
    if small && url.starts_with("postgres") {
        let pool = idem_runtime::store::sql::sqlx::postgres::PgPoolOptions::new()
            .max_connections(SMALL_POOL)
            .acquire_timeout(SMALL_TIMEOUT)
            .connect(url)
            .await
            .map_err(|e| format!("store {url}: {e}"))?;
        let store = idem_runtime::SqlStore::from_pg_pool(pool)
            .await
            .map_err(|e| format!("store {url}: {e}"))?
            .with_timeout(SMALL_TIMEOUT);
        return Ok(Arc::new(store));
    }
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

/// A partition run's PostgreSQL pool per process.
pub(crate) const SMALL_POOL: u32 = 4;
/// A partition run's bound on a PostgreSQL call.
pub(crate) const SMALL_TIMEOUT: Duration = Duration::from_secs(2);

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

    #[test]
    fn faults_are_named_one_by_one_or_all() {
        let args = |s: &str| s.split(' ').map(str::to_owned).collect::<Vec<_>>();
        assert!(parse(&args("--store redis-aof")).unwrap().faults.is_empty());
        assert_eq!(
            parse(&args("--store redis-sentinel --faults partition"))
                .unwrap()
                .faults,
            vec![Fault::Partition]
        );
        assert_eq!(
            parse(&args("--store redis-aof --faults netem,pause,netem"))
                .unwrap()
                .faults,
            vec![Fault::Netem, Fault::Pause]
        );
        assert_eq!(
            parse(&args("--store redis-aof --faults all"))
                .unwrap()
                .faults,
            Fault::ALL.to_vec()
        );
        assert!(parse(&args("--store redis-aof --faults flood")).is_err());
        let all = parse(&args("--store redis-sentinel --faults all")).unwrap();
        assert!(all.all_faults && all.has(Fault::Netem) && all.has(Fault::Pause));
        let named = parse(&args("--store redis-sentinel --faults netem")).unwrap();
        assert!(!named.all_faults && named.has(Fault::Netem) && !named.has(Fault::Pause));
    }
}
