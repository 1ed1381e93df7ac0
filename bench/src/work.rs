//! The workload every case shares (one small record, like a payment receipt) and the
//! description of the machine the run happened on.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::args::Args;

/// What the measured function returns and what a replay gives back: the size of a
/// typical small business result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Receipt {
    pub(crate) order_id: u64,
    pub(crate) cents: u64,
    pub(crate) status: String,
}

/// The three steps' names, as a checkout would call them: every family's workflow of
/// three durable steps (and the raw writes priced against them) uses these.
pub(crate) const STEP_NAMES: [&str; 3] = ["charge", "reserve", "mail"];

pub(crate) fn receipt(order_id: u64) -> Receipt {
    Receipt {
        order_id,
        cents: order_id % 10_000,
        status: "paid".to_owned(),
    }
}

/// The error type of the measured functions: carries idem's errors (`E: From<Error>`)
/// and the peers' as text.
#[derive(Debug, Clone)]
pub(crate) struct BenchError(pub String);

impl std::fmt::Display for BenchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BenchError {}

impl From<idem_runtime::Error> for BenchError {
    fn from(e: idem_runtime::Error) -> Self {
        BenchError(format!("idem: {e}"))
    }
}

impl BenchError {
    pub(crate) fn of(what: &str, e: impl std::fmt::Display) -> BenchError {
        BenchError(format!("{what}: {e}"))
    }
}

pub(crate) fn scheme(url: &str) -> &str {
    url.split(':').next().unwrap_or(url)
}

pub(crate) fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".to_owned())
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_owned())
        })
        .unwrap_or_else(|| "?".to_owned())
}

/// The header: machine, servers, windows, load.
pub(crate) async fn machine(args: &Args) -> String {
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    let mem_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0 / 1024.0);
    let (warmup, window) = args.window();
    let mut s = String::new();
    let _ = writeln!(
        s,
        "- CPU: {} ({cores} cores visible), {mem_gib:.0} GiB",
        cpu_model()
    );
    let _ = writeln!(
        s,
        "- runtime: tokio multi-thread, {cores} workers; each case warms up {warmup:?} then measures {window:?}; the peer cases (`peers/*`) run {} such windows and keep the median; the `http` cases run {} rounds, each ratio the median of the rounds' ratios",
        args.repeats(),
        crate::http::rounds(args)
    );
    let _ = writeln!(s, "- load average at the start: {}", loadavg());
    if let Some(url) = &args.redis {
        let version = redis_version(url).await;
        let _ = writeln!(s, "- Redis: {version} at {url}");
    }
    for url in &args.sql {
        let _ = writeln!(s, "- SQL: {}", sql_version(url).await);
    }
    s
}

/// Removes every key under `pfx` from the store's server (they expire within minutes
/// anyway; this keeps a shared server tidy for the test suites running beside the
/// benchmark). Bounded: at most 10,000 SCAN pages.
pub(crate) async fn redis_cleanup(store: &idem_runtime::RedisStore, pfx: &str) {
    use idem_runtime::store::redis::redis;
    let mut cursor = 0u64;
    for _ in 0..10_000 {
        let mut scan = redis::cmd("SCAN");
        scan.arg(cursor)
            .arg("MATCH")
            .arg(format!("{pfx}*"))
            .arg("COUNT")
            .arg(1000);
        let Ok((next, keys)) = store.command::<(u64, Vec<String>)>(&scan).await else {
            return;
        };
        if !keys.is_empty() {
            let mut unlink = redis::cmd("UNLINK");
            for k in &keys {
                unlink.arg(k);
            }
            let _ = store.command::<redis::Value>(&unlink).await;
        }
        cursor = next;
        if cursor == 0 {
            return;
        }
    }
}

async fn redis_version(url: &str) -> String {
    use idem_runtime::store::redis::redis;
    let info: Result<String, String> = async {
        let client = redis::Client::open(url).map_err(|e| e.to_string())?;
        let mut c = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| e.to_string())?;
        redis::cmd("INFO")
            .arg("server")
            .query_async(&mut c)
            .await
            .map_err(|e| e.to_string())
    }
    .await;
    match info {
        Ok(info) => info
            .lines()
            .find_map(|l| l.strip_prefix("redis_version:"))
            .map_or_else(
                || "Redis (version unknown)".to_owned(),
                |v| format!("Redis {}", v.trim()),
            ),
        Err(e) => format!("unreachable ({e})"),
    }
}

async fn sql_version(url: &str) -> String {
    use idem_runtime::store::sql::sqlx;
    let Ok(store) = idem_runtime::SqlStore::connect(url).await else {
        return format!("{} (unreachable)", scheme(url));
    };
    let v: Result<String, sqlx::Error> = if let Some(p) = store.pg_pool() {
        sqlx::query_scalar("SELECT version()").fetch_one(p).await
    } else if let Some(p) = store.mysql_pool() {
        sqlx::query_scalar("SELECT version()").fetch_one(p).await
    } else if let Some(p) = store.sqlite_pool() {
        sqlx::query_scalar("SELECT 'SQLite ' || sqlite_version()")
            .fetch_one(p)
            .await
    } else {
        Ok("?".to_owned())
    };
    let v = v.unwrap_or_else(|e| format!("? ({e})"));
    // PostgreSQL's version() names the compiler too; the first clause is enough.
    let short = v.split(" on ").next().unwrap_or(&v).to_owned();
    format!("{} ({short})", store.backend_name())
}
