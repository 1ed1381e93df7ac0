//! The guarantee check: the same concurrent-duplicate workload through idem and
//! each peer, counting how often the body really ran.
//!
//! Per key, `CALLERS` tasks call at once (released by a barrier); the body sleeps a
//! little (so the calls overlap, as retries and redeliveries do) and counts itself. Then
//! one more call comes later: does it replay or run again? Then, for the Redis-backed
//! ones, two failure cases:
//!
//! - **crash mid-body**: a child process claims a key and exits inside the body (no
//!   destructor runs, as in a `kill -9`); how long until another caller can run it?
//! - **body slower than the lease**: the body takes three leases; a second caller comes
//!   after 1.6 leases. Does it run the body again (or, for a lock, enter while the first
//!   is still inside)?

use std::future::Future;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use cached::proc_macro::{cached, concurrent_cached};
use idem_runtime::store::redis::redis;
use idem_runtime::{Options, RedisStore, idempotent};
use tokio::sync::Barrier;

use crate::args::Args;
use crate::load;
use crate::peers;
use crate::report::{Report, markdown_table};
use crate::work::{BenchError, Receipt};

const CALLERS: usize = 32;
const BODY: Duration = Duration::from_millis(20);

/// Body executions, process-wide.
static RUNS: AtomicU64 = AtomicU64::new(0);

/// The measured body: counts itself and returns a receipt unique to this execution, so a
/// caller that got another execution's answer can tell.
async fn body(key: u64) -> Result<Receipt, BenchError> {
    let serial = RUNS.fetch_add(1, Ordering::SeqCst) + 1;
    tokio::time::sleep(BODY).await;
    Ok(Receipt {
        order_id: key,
        cents: serial,
        status: "paid".to_owned(),
    })
}

#[idempotent(key = "guard:{key}", ttl = "5m")]
async fn g_idem(key: u64) -> Result<Receipt, BenchError> {
    body(key).await
}

#[cached]
async fn g_cached(key: u64) -> Result<Receipt, BenchError> {
    body(key).await
}

#[cached(sync_writes = "by_key")]
async fn g_cached_by_key(key: u64) -> Result<Receipt, BenchError> {
    body(key).await
}

#[concurrent_cached]
async fn g_ccached(key: u64) -> Result<Receipt, BenchError> {
    body(key).await
}

#[concurrent_cached(
    map_error = r##"|e| BenchError::of("cached redis", e)"##,
    ty = "cached::AsyncRedisCache<u64, Receipt>",
    create = r##"{
        cached::AsyncRedisCache::builder(format!("{}gcached", crate::peers::redis_prefix()))
            .ttl(Duration::from_secs(120))
            .connection_string(crate::guarantees::url())
            .build()
            .await
            .expect("cached's AsyncRedisCache (is Redis up?)")
    }"##
)]
async fn g_cached_redis(key: u64) -> Result<Receipt, BenchError> {
    body(key).await
}

static URL: std::sync::OnceLock<String> = std::sync::OnceLock::new();

pub(crate) fn url() -> &'static str {
    URL.get().map_or("redis://127.0.0.1:6379", String::as_str)
}

static DEDUP: Options = Options::dedup("bench::guard").ttl(Duration::from_secs(300));
static LOCK: Options = Options::lock("bench::guard_lock").wait(Duration::from_secs(30));

/// One peer under the duplicate workload: a call on key `k`.
type Call = Arc<
    dyn Fn(u64) -> Pin<Box<dyn Future<Output = Result<Receipt, BenchError>> + Send>> + Send + Sync,
>;

struct Verdict {
    runs_per_key: f64,
    same_answer: f64,
    errors: u64,
    later_runs_again: bool,
}

/// `keys` keys, `CALLERS` concurrent calls each, then one later call per key.
async fn duplicate_workload(call: Call, keys: u64, base: u64) -> Verdict {
    let mut runs = 0u64;
    let mut same = 0u64;
    let mut answered = 0u64;
    let mut errors = 0u64;
    let mut later_runs = 0u64;
    for k in base..base + keys {
        let before = RUNS.load(Ordering::SeqCst);
        let barrier = Arc::new(Barrier::new(CALLERS));
        let handles: Vec<_> = (0..CALLERS)
            .map(|_| {
                let (call, barrier) = (Arc::clone(&call), Arc::clone(&barrier));
                tokio::spawn(async move {
                    barrier.wait().await;
                    call(k).await
                })
            })
            .collect();
        let mut answers = Vec::new();
        for h in handles {
            match h.await {
                Ok(Ok(r)) => answers.push(r.cents),
                _ => errors += 1,
            }
        }
        runs += RUNS.load(Ordering::SeqCst) - before;
        if let Some(first) = answers.iter().min() {
            same += answers.iter().filter(|a| *a == first).count() as u64;
        }
        answered += answers.len() as u64;
        let before = RUNS.load(Ordering::SeqCst);
        let _ = call(k).await;
        later_runs += RUNS.load(Ordering::SeqCst) - before;
    }
    Verdict {
        runs_per_key: runs as f64 / keys as f64,
        same_answer: if answered == 0 {
            0.0
        } else {
            same as f64 / answered as f64
        },
        errors,
        later_runs_again: later_runs > 0,
    }
}

fn boxed<F, Fut>(f: F) -> Call
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Receipt, BenchError>> + Send + 'static,
{
    Arc::new(move |k| Box::pin(f(k)))
}

pub(crate) async fn run(args: &Args, report: &mut Report) {
    peers::init_memory();
    let keys: u64 = if args.quick { 3 } else { 10 };
    // Keys unique to this run, so Redis-backed peers start from nothing.
    let base = (load::fresh_id() + 1) << 20;
    let mut rows: Vec<Vec<String>> = vec![vec![
        "peer".into(),
        format!("body runs per key ({CALLERS} concurrent callers)"),
        "callers given one answer".into(),
        "errors".into(),
        "a later call".into(),
        "crash mid-body".into(),
        "body slower than its lease".into(),
    ]];
    let mut add = |name: &str, v: Verdict, crash: String, slow: String| {
        rows.push(vec![
            name.to_owned(),
            format!("{:.1}", v.runs_per_key),
            format!("{:.0}%", v.same_answer * 100.0),
            v.errors.to_string(),
            if v.later_runs_again {
                "runs the body again".into()
            } else {
                "replays".into()
            },
            crash,
            slow,
        ]);
    };
    let in_proc = "in-process: a crash forgets every record (nothing stuck, nothing remembered)";
    eprintln!("  in-memory peers");
    add(
        "idem #[idempotent] (MemoryStore)",
        duplicate_workload(boxed(g_idem), keys, base).await,
        in_proc.into(),
        "lease renewed while the body runs".into(),
    );
    add(
        "cached #[cached]",
        duplicate_workload(boxed(g_cached), keys, base).await,
        in_proc.into(),
        "no lease".into(),
    );
    add(
        "cached #[cached(sync_writes = \"by_key\")]",
        duplicate_workload(boxed(g_cached_by_key), keys, base).await,
        in_proc.into(),
        "no lease".into(),
    );
    add(
        "cached #[concurrent_cached]",
        duplicate_workload(boxed(g_ccached), keys, base).await,
        in_proc.into(),
        "no lease".into(),
    );

    if let Some(u) = &args.redis {
        let _ = URL.set(u.clone());
        peers::set_redis_url(u);
        match peers::redis_store(u) {
            Ok((store, idem)) => {
                eprintln!("  redis-backed peers (crash checks start child processes)");
                let i = idem.clone();
                let v = duplicate_workload(
                    boxed(move |k| {
                        let i = i.clone();
                        async move { i.dedup(&DEDUP, k, body(k)).await }
                    }),
                    keys,
                    base,
                )
                .await;
                let crash = crash_check(u, "idem-dedup").await;
                let slow = slow_check(u, "idem-dedup", &store).await;
                add("idem dedup (RedisStore)", v, crash, slow);

                let v = duplicate_workload(boxed(g_cached_redis), keys, base).await;
                add(
                    "cached AsyncRedisCache",
                    v,
                    "nothing held (no in-progress marker)".into(),
                    "no lease".into(),
                );

                let s = store.clone();
                let v = duplicate_workload(
                    boxed(move |k| {
                        let s = s.clone();
                        async move {
                            let key = format!("{}ghand:{k}", peers::redis_prefix());
                            peers::handwritten(&s, &key, Duration::from_secs(30), body(k)).await
                        }
                    }),
                    keys,
                    base,
                )
                .await;
                let crash = crash_check(u, "handwritten").await;
                let slow = slow_check(u, "handwritten", &store).await;
                add("hand-written SET NX PX + GET", v, crash, slow);

                let i = idem.clone();
                let v = duplicate_workload(
                    boxed(move |k| {
                        let i = i.clone();
                        async move { i.lock(&LOCK, k, body(k)).await }
                    }),
                    keys.min(3),
                    base,
                )
                .await;
                let crash = crash_check(u, "idem-lock").await;
                let slow = slow_check(u, "idem-lock", &store).await;
                add("idem lock (RedisStore)", v, crash, slow);

                let mut rl = rslock::LockManager::new(vec![u.clone()]);
                rl.set_retry(1_000, Duration::from_millis(5));
                let rl = Arc::new(rl);
                let v = duplicate_workload(
                    boxed(move |k| {
                        let rl = Arc::clone(&rl);
                        async move {
                            let key = format!("{}grs:{k}", peers::redis_prefix());
                            let l = rl
                                .lock(key.as_str(), Duration::from_secs(30))
                                .await
                                .map_err(|e| BenchError::of("rslock", e))?;
                            let r = body(k).await;
                            rl.unlock(&l).await;
                            r
                        }
                    }),
                    keys.min(3),
                    base,
                )
                .await;
                let crash = crash_check(u, "rslock").await;
                let slow = slow_check(u, "rslock", &store).await;
                add("rslock", v, crash, slow);
                crate::work::redis_cleanup(&store, &peers::redis_prefix()).await;
            }
            Err(e) => report.note(format!("redis guarantee checks skipped: {e}")),
        }
    }
    let mut md = markdown_table(&rows, &[false, true, true, true, false, false, false]);
    md.push_str(&format!(
        "\nEach key: {CALLERS} callers at once (a barrier releases them), a {BODY:?} body; \
         {keys} keys per peer (3 for the locks, whose callers queue). \"callers given one \
         answer\": share of successful callers that got the first execution's result. \
         Locks order the bodies but remember nothing, so every caller runs it: that is \
         what a lock is for, and why a lock alone does not make a call idempotent.\n"
    ));
    report.section("Guarantees under concurrent duplicates", md);
}

/// The lease the failure checks use: short, so a run does not wait long.
const LEASE: Duration = Duration::from_millis(400);

/// Starts a child that takes `kind`'s claim on a fresh key and dies inside the body;
/// then measures how long until a call in this process can run that key.
async fn crash_check(url: &str, kind: &str) -> String {
    let key = format!(
        "crash:{}",
        load::fresh_id() + (u64::from(std::process::id()) << 32)
    );
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => return format!("not checked ({e})"),
    };
    let child = tokio::process::Command::new(exe)
        .args(["--child", "crash", kind, url, &key, &peers::redis_prefix()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .output();
    let out = match tokio::time::timeout(Duration::from_secs(20), child).await {
        Ok(Ok(out)) => out,
        Ok(Err(e)) => return format!("not checked ({e})"),
        Err(_) => return "not checked (child hung)".into(),
    };
    if !String::from_utf8_lossy(&out.stdout).contains("claimed") {
        return format!(
            "not checked (child: {})",
            String::from_utf8_lossy(&out.stdout).trim()
        );
    }
    let died = Instant::now();
    let Ok((store, idem)) = peers::redis_store(url) else {
        return "not checked (store)".into();
    };
    let mut rl = rslock::LockManager::new(vec![url.to_owned()]);
    rl.set_retry(1, Duration::from_millis(1));
    static NOWAIT: Options = Options::dedup("bench::crash")
        .lease(LEASE)
        .wait(Duration::ZERO);
    static NOWAIT_LOCK: Options = Options::lock("bench::crash_lock")
        .lease(LEASE)
        .wait(Duration::ZERO);
    // Bounded: ten leases.
    while died.elapsed() < LEASE * 10 {
        let ran = match kind {
            "idem-dedup" => idem
                .dedup(&NOWAIT, &key, async { Ok::<_, BenchError>(0u8) })
                .await
                .is_ok(),
            "idem-lock" => idem
                .lock(&NOWAIT_LOCK, &key, async { Ok::<_, BenchError>(()) })
                .await
                .is_ok(),
            "handwritten" => {
                let mut set = redis::cmd("SET");
                set.arg(format!("{}{key}", peers::redis_prefix()))
                    .arg("x")
                    .arg("NX")
                    .arg("PX")
                    .arg(60_000);
                matches!(store.command::<Option<String>>(&set).await, Ok(Some(_)))
            }
            "rslock" => rl
                .lock(format!("{}{key}", peers::redis_prefix()).as_str(), LEASE)
                .await
                .is_ok(),
            _ => return "not checked".into(),
        };
        if ran {
            return format!(
                "held {} ms after the crash (lease {} ms), then free",
                died.elapsed().as_millis(),
                LEASE.as_millis()
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    format!(
        "still held {} ms after the crash: stuck",
        died.elapsed().as_millis()
    )
}

/// A body three leases long; a second caller arrives after 1.6 leases. Dedup kinds:
/// how many times did the body run? Lock kinds: was the second inside while the first
/// still was?
async fn slow_check(url: &str, kind: &str, store: &RedisStore) -> String {
    let Ok((_, idem)) = peers::redis_store(url) else {
        return "not checked".into();
    };
    static SLOW: Options = Options::dedup("bench::slow")
        .lease(LEASE)
        .wait(Duration::from_secs(10));
    static SLOW_LOCK: Options = Options::lock("bench::slow_lock")
        .lease(LEASE)
        .wait(Duration::from_secs(10));
    let key = format!(
        "slow:{}",
        load::fresh_id() + (u64::from(std::process::id()) << 32)
    );
    let runs = Arc::new(AtomicUsize::new(0));
    let inside = Arc::new(AtomicUsize::new(0));
    let overlap = Arc::new(AtomicUsize::new(0));
    let call = {
        let (idem, store, key) = (idem.clone(), store.clone(), key.clone());
        let (runs, inside, overlap) = (runs.clone(), inside.clone(), overlap.clone());
        let mut rl = rslock::LockManager::new(vec![url.to_owned()]);
        rl.set_retry(1_000, Duration::from_millis(5));
        let rl = Arc::new(rl);
        let kind = kind.to_owned();
        move || {
            let (idem, store, key, rl, kind) = (
                idem.clone(),
                store.clone(),
                key.clone(),
                rl.clone(),
                kind.clone(),
            );
            let (runs, inside, overlap) = (runs.clone(), inside.clone(), overlap.clone());
            async move {
                let b = async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    if inside.fetch_add(1, Ordering::SeqCst) > 0 {
                        overlap.fetch_add(1, Ordering::SeqCst);
                    }
                    tokio::time::sleep(LEASE * 3).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    Ok::<_, BenchError>(crate::work::receipt(1))
                };
                match kind.as_str() {
                    "idem-dedup" => idem.dedup(&SLOW, &key, b).await.map(drop),
                    "idem-lock" => idem.lock(&SLOW_LOCK, &key, b).await.map(drop),
                    "handwritten" => {
                        let k = format!("{}{key}", peers::redis_prefix());
                        peers::handwritten(&store, &k, LEASE, b).await.map(drop)
                    }
                    _ => {
                        let k = format!("{}{key}", peers::redis_prefix());
                        let l = rl
                            .lock(k.as_str(), LEASE)
                            .await
                            .map_err(|e| BenchError::of("rslock", e))?;
                        let r = b.await.map(drop);
                        rl.unlock(&l).await;
                        r
                    }
                }
            }
        }
    };
    let first = tokio::spawn(call());
    tokio::time::sleep(LEASE * 8 / 5).await;
    let second = tokio::spawn(call());
    let (a, b) = (first.await, second.await);
    let errs = [a, b].iter().filter(|r| !matches!(r, Ok(Ok(())))).count();
    let runs = runs.load(Ordering::SeqCst);
    let overlapped = overlap.load(Ordering::SeqCst) > 0;
    let mut s = match (kind, runs, overlapped) {
        ("idem-lock" | "rslock", _, true) => "second holder entered while the first ran".to_owned(),
        ("idem-lock" | "rslock", _, false) => "second waited for the first".to_owned(),
        (_, 1, _) => "ran once (second caller replayed)".to_owned(),
        (_, n, _) => format!("ran {n} times"),
    };
    if errs > 0 {
        s.push_str(&format!(" ({errs} call(s) failed)"));
    }
    s
}

/// `--child crash KIND URL KEY PREFIX`: take the claim, say so, die inside the body.
pub fn child(args: Vec<String>) -> ExitCode {
    let [what, kind, url, key, prefix] = &args[..] else {
        eprintln!("child: bad arguments {args:?}");
        return ExitCode::FAILURE;
    };
    if what != "crash" {
        return ExitCode::FAILURE;
    }
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return ExitCode::FAILURE;
    };
    fn die<T>() -> T {
        use std::io::Write as _;
        println!("claimed");
        let _ = std::io::stdout().flush();
        // No destructor, no release, no renewal from here on: as a kill -9.
        std::process::exit(9)
    }
    rt.block_on(async {
        let store = match RedisStore::builder().prefix(prefix.clone()).connect(url) {
            Ok(s) => s,
            Err(e) => {
                println!("store: {e}");
                return ExitCode::FAILURE;
            }
        };
        let idem = idem_runtime::Idem::builder()
            .store(store.clone())
            .namespace("peers")
            .build();
        static CLAIM: Options = Options::dedup("bench::crash").lease(LEASE);
        static CLAIM_LOCK: Options = Options::lock("bench::crash_lock").lease(LEASE);
        let r: Result<(), BenchError> = match kind.as_str() {
            "idem-dedup" => idem
                .dedup(&CLAIM, key, async { die::<Result<u8, BenchError>>() })
                .await
                .map(drop),
            "idem-lock" => {
                idem.lock(&CLAIM_LOCK, key, async { die::<Result<(), BenchError>>() })
                    .await
            }
            "handwritten" => {
                let mut set = redis::cmd("SET");
                set.arg(format!("{prefix}{key}"))
                    .arg("pending")
                    .arg("NX")
                    .arg("PX")
                    .arg(LEASE.as_millis() as u64);
                match store.command::<Option<String>>(&set).await {
                    Ok(Some(_)) => die(),
                    other => Err(BenchError(format!("{other:?}"))),
                }
            }
            "rslock" => {
                let rl = rslock::LockManager::new(vec![url.clone()]);
                match rl.lock(format!("{prefix}{key}").as_str(), LEASE).await {
                    Ok(_) => die(),
                    Err(e) => Err(BenchError::of("rslock", e)),
                }
            }
            _ => Err(BenchError("unknown kind".into())),
        };
        println!("no claim: {r:?}");
        ExitCode::FAILURE
    })
}
