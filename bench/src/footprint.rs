//! Memory per million completed records.
//!
//! In memory, each store fills in a child process of its own (so one store's freed pages
//! do not hide the next one's growth) and reports its resident-set growth. In Redis, the
//! run writes N records and reads `INFO memory` before and after (noisy on a server other
//! programs use at the same time) and `MEMORY USAGE` of a sample of the records (not).

use std::process::ExitCode;
use std::time::Duration;

use cached::proc_macro::cached;
use idem_runtime::store::redis::redis;
use idem_runtime::{Idem, MemoryStore, Options};

use crate::args::Args;
use crate::load::{self, Ctx, Plan};
use crate::peers;
use crate::report::{Report, fmt_bytes, markdown_table};
use crate::work::{BenchError, Receipt, receipt};

static RECORD: Options = Options::dedup("bench::footprint").ttl(Duration::from_secs(3600));
static REDIS_RECORD: Options = Options::dedup("bench::footprint").ttl(Duration::from_secs(300));

#[cached]
async fn fp_cached(order_id: u64) -> Result<Receipt, BenchError> {
    Ok(receipt(order_id))
}

fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024)
}

/// `--footprint-child KIND N`: fill a store with N completed records, print
/// `rss_before rss_after`.
pub fn child(args: Vec<String>) -> ExitCode {
    let (Some(kind), Some(n)) = (
        args.first(),
        args.get(1).and_then(|n| n.parse::<u64>().ok()),
    ) else {
        eprintln!("footprint child: bad arguments {args:?}");
        return ExitCode::FAILURE;
    };
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return ExitCode::FAILURE;
    };
    let code = rt.block_on(async {
        let idem = Idem::builder()
            .store(MemoryStore::new())
            .namespace("fp")
            .build();
        // Warm the allocator and the runtime before the first reading.
        for i in 0..1_000u64 {
            let _ = idem
                .dedup(&RECORD, i, async move { Ok::<_, BenchError>(receipt(i)) })
                .await;
            let _ = fp_cached(i).await;
        }
        let before = rss_bytes();
        for i in 1_000..1_000 + n {
            let r = match kind.as_str() {
                "idem-memory" => idem
                    .dedup(&RECORD, i, async move { Ok::<_, BenchError>(receipt(i)) })
                    .await
                    .map(drop),
                "cached-memory" => fp_cached(i).await.map(drop),
                _ => Err(BenchError("unknown kind".into())),
            };
            if let Err(e) = r {
                eprintln!("footprint child: {e}");
                return ExitCode::FAILURE;
            }
        }
        println!("{before} {}", rss_bytes());
        ExitCode::SUCCESS
    });
    // Keep the stores alive until after the reading (they drop here).
    code
}

async fn memory_child(kind: &str, n: u64) -> Result<f64, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let out = tokio::time::timeout(
        Duration::from_secs(300),
        tokio::process::Command::new(exe)
            .args(["--footprint-child", kind, &n.to_string()])
            .output(),
    )
    .await
    .map_err(|_| "child took over 5 minutes".to_owned())?
    .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut it = text
        .split_whitespace()
        .filter_map(|w| w.parse::<f64>().ok());
    match (it.next(), it.next()) {
        (Some(b), Some(a)) => Ok((a - b) / n as f64),
        _ => Err(format!("child said {text:?}")),
    }
}

async fn redis_used_memory(store: &idem_runtime::RedisStore) -> Option<f64> {
    let mut info = redis::cmd("INFO");
    info.arg("memory");
    let s: String = store.command(&info).await.ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("used_memory:")?.trim().parse().ok())
}

pub(crate) async fn run(args: &Args, report: &mut Report) {
    let n_mem: u64 = if args.quick { 100_000 } else { 1_000_000 };
    let mut rows = vec![vec![
        "store".to_owned(),
        "records written".to_owned(),
        "bytes per record".to_owned(),
        "per million records".to_owned(),
        "how measured".to_owned(),
    ]];
    for (kind, name) in [
        ("idem-memory", "idem MemoryStore"),
        ("cached-memory", "cached #[cached] (unbounded)"),
    ] {
        eprintln!("  {name}: {n_mem} records in a child process");
        match memory_child(kind, n_mem).await {
            Ok(per) => rows.push(vec![
                name.to_owned(),
                n_mem.to_string(),
                format!("{per:.0}"),
                fmt_bytes(per * 1e6),
                "resident-set growth of a child process".to_owned(),
            ]),
            Err(e) => report.note(format!("footprint of {name}: {e}")),
        }
    }
    if let Some(url) = &args.redis {
        let n_redis: u64 = if args.quick { 20_000 } else { 200_000 };
        match peers::redis_store(url) {
            Ok((store, idem)) => {
                let before = redis_used_memory(&store).await;
                eprintln!("  idem RedisStore: {n_redis} records");
                let tasks = 50u64;
                let mut plan = Plan::new(tasks as usize, Duration::ZERO, Duration::from_secs(600));
                plan.max_ops_per_task = n_redis / tasks;
                let i = idem.clone();
                let o = load::run(plan, move |c: Ctx| {
                    let i = i.clone();
                    async move {
                        i.dedup(&REDIS_RECORD, c.id, async move {
                            Ok::<_, BenchError>(receipt(c.id))
                        })
                        .await
                        .map(drop)
                    }
                })
                .await;
                let after = redis_used_memory(&store).await;
                // MEMORY USAGE of a sample of the records just written.
                let mut sampled = 0u64;
                let mut total = 0u64;
                let mut cursor = 0u64;
                let pattern = format!("{}*footprint*", peers::redis_prefix());
                for _ in 0..100 {
                    let mut scan = redis::cmd("SCAN");
                    scan.arg(cursor)
                        .arg("MATCH")
                        .arg(&pattern)
                        .arg("COUNT")
                        .arg(1000);
                    let Ok((next, keys)) = store.command::<(u64, Vec<String>)>(&scan).await else {
                        break;
                    };
                    for k in keys.iter().take(200usize.saturating_sub(sampled as usize)) {
                        let mut mu = redis::cmd("MEMORY");
                        mu.arg("USAGE").arg(k).arg("SAMPLES").arg(0);
                        if let Ok(Some(b)) = store.command::<Option<u64>>(&mu).await {
                            total += b;
                            sampled += 1;
                        }
                    }
                    cursor = next;
                    if cursor == 0 || sampled >= 200 {
                        break;
                    }
                }
                if sampled > 0 {
                    let per = total as f64 / sampled as f64;
                    rows.push(vec![
                        "idem RedisStore".to_owned(),
                        o.ops.to_string(),
                        format!("{per:.0}"),
                        fmt_bytes(per * 1e6),
                        format!("MEMORY USAGE of {sampled} records (key, hash, expiry)"),
                    ]);
                }
                if let (Some(b), Some(a)) = (before, after) {
                    let per = (a - b) / o.ops.max(1) as f64;
                    rows.push(vec![
                        "idem RedisStore".to_owned(),
                        o.ops.to_string(),
                        format!("{per:.0}"),
                        fmt_bytes(per * 1e6),
                        "INFO used_memory growth (server shared with other programs: noisy)"
                            .to_owned(),
                    ]);
                }
                if o.errors > 0 {
                    report.note(format!(
                        "redis footprint: {} errors, first: {:?}",
                        o.errors, o.first_error
                    ));
                }
                crate::work::redis_cleanup(&store, &peers::redis_prefix()).await;
            }
            Err(e) => report.note(format!("redis footprint skipped: {e}")),
        }
    }
    let mut md = markdown_table(&rows, &[false, true, true, true, false]);
    md.push_str(
        "\nA record is a completed dedup of the bench's receipt (order id, cents, status). \
         Per-million figures are the per-record figure times a million.\n",
    );
    report.section("Memory per completed record", md);
}
