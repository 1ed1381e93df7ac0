//! Issue 3's cases taking turns: the three baselines and idem's four operations each run
//! in [`ROUNDS`] short slices, one case after another, so a change of the machine's load
//! (it is shared with compilers and test suites) lands on every case alike instead of
//! on one case and not its baseline. Each case's row sums its slices.
//!
//! Where Linux reports it (`/proc/…/schedstat`), each case's line on stderr also gives
//! the CPU time per operation of this process and of the Redis server (when it runs on
//! this machine): a measure of cost that a busy machine disturbs far less than ops/s.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::Ctx;
use crate::stats::{Row, row};

/// How many turns each case takes (its measured time is split among them).
const ROUNDS: u32 = 5;
/// Unmeasured time at the start of each slice, while the tasks get going.
const WARMUP: Duration = Duration::from_millis(40);

/// What one slice's tasks share: the per-task next `i`, and the stop and measuring flags.
#[derive(Clone)]
pub(crate) struct Slice {
    next: Arc<Vec<AtomicU64>>,
    stop: Arc<AtomicBool>,
    measuring: Arc<AtomicBool>,
}

/// One operation, `op(task, i)` with `i` distinct per task across all of a case's
/// slices, as the spawner of a slice's tasks. The loop around the operation is generic,
/// so its future is awaited in place (a boxed future per operation would add a copy of
/// the whole future to every call, more for idem's larger futures than for a raw command).
pub(crate) type Op = Arc<dyn Fn(usize, &Slice) -> tokio::task::JoinHandle<Vec<u64>> + Send + Sync>;

/// Wraps a closure returning a future as an [`Op`].
pub(crate) fn op<F, Fut>(f: F) -> Op
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), String>> + Send + 'static,
{
    let f = Arc::new(f);
    Arc::new(move |t, slice: &Slice| {
        let (f, s) = (f.clone(), slice.clone());
        tokio::spawn(async move {
            let mut lat = Vec::with_capacity(1 << 12);
            while !s.stop.load(Ordering::Relaxed) {
                let i = s.next[t].fetch_add(1, Ordering::Relaxed);
                let start = Instant::now();
                if let Err(e) = f(t, i).await {
                    panic!("operation failed: {e}");
                }
                if s.measuring.load(Ordering::Relaxed) {
                    lat.push(start.elapsed().as_nanos() as u64);
                }
            }
            lat
        })
    })
}

/// One case: its name, operation, and what its slices gathered.
pub(crate) struct Case {
    group: &'static str,
    name: &'static str,
    op: Op,
    /// Per task, the next `i` (kept across slices so new-key cases never repeat a key).
    next: Arc<Vec<AtomicU64>>,
    elapsed: Duration,
    lat: Vec<u64>,
    /// CPU nanoseconds spent in measured windows by this process and by the server.
    cpu: (u64, u64),
}

impl Case {
    pub(crate) fn new(group: &'static str, name: &'static str, tasks: usize, op: Op) -> Case {
        Case {
            group,
            name,
            op,
            next: Arc::new((0..tasks).map(|_| AtomicU64::new(0)).collect()),
            elapsed: Duration::ZERO,
            lat: Vec::new(),
            cpu: (0, 0),
        }
    }
}

/// Runs `cases` in turns for `secs` each (in total, over [`ROUNDS`] slices) with `tasks`
/// concurrent tasks, and returns one row per case, in order.
pub(crate) async fn run(
    mut cases: Vec<Case>,
    tasks: usize,
    secs: f64,
    server: Option<u32>,
) -> Vec<Row> {
    let slice = Duration::from_secs_f64(secs / f64::from(ROUNDS));
    for _ in 0..ROUNDS {
        for case in &mut cases {
            let (elapsed, lat, cpu) = one_slice(case, tasks, slice, server).await;
            case.elapsed += elapsed;
            case.lat.extend(lat);
            case.cpu.0 += cpu.0;
            case.cpu.1 += cpu.1;
        }
    }
    cases
        .into_iter()
        .map(|c| {
            let cpu = c.cpu;
            let r = row(c.group, c.name, tasks, c.elapsed, c.lat);
            let per_op = |ns: u64| ns as f64 / 1000.0 / r.ops.max(1) as f64;
            eprintln!(
                "  {:<12} {:<34} {:>3} tasks: {:>9.0} ops/s  cpu/op: client {:>5.2} µs, server {:>5.2} µs",
                r.group,
                r.case,
                r.tasks,
                r.ops_per_sec(),
                per_op(cpu.0),
                per_op(cpu.1),
            );
            r
        })
        .collect()
}

/// CPU time so far (ns) of every thread of this process, and of `server`'s main thread
/// (Redis executes commands on it); 0 where `/proc` does not say.
fn cpu_now(server: Option<u32>) -> (u64, u64) {
    fn ns(path: &std::path::Path) -> u64 {
        std::fs::read_to_string(path)
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    }
    let client = std::fs::read_dir("/proc/self/task")
        .map(|d| d.flatten().map(|t| ns(&t.path().join("schedstat"))).sum())
        .unwrap_or(0);
    let server = server.map_or(0, |pid| {
        ns(std::path::Path::new(&format!("/proc/{pid}/schedstat")))
    });
    (client, server)
}

async fn one_slice(
    case: &Case,
    tasks: usize,
    slice: Duration,
    server: Option<u32>,
) -> (Duration, Vec<u64>, (u64, u64)) {
    let slice_ctl = Slice {
        next: case.next.clone(),
        stop: Arc::new(AtomicBool::new(false)),
        measuring: Arc::new(AtomicBool::new(false)),
    };
    let handles: Vec<_> = (0..tasks).map(|t| (case.op)(t, &slice_ctl)).collect();
    let (stop, measuring) = (&slice_ctl.stop, &slice_ctl.measuring);
    tokio::time::sleep(WARMUP).await;
    let cpu0 = cpu_now(server);
    measuring.store(true, Ordering::Relaxed);
    let began = Instant::now();
    tokio::time::sleep(slice).await;
    measuring.store(false, Ordering::Relaxed);
    let elapsed = began.elapsed();
    let cpu1 = cpu_now(server);
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.await.expect("bench task panicked"));
    }
    let cpu = (cpu1.0.saturating_sub(cpu0.0), cpu1.1.saturating_sub(cpu0.1));
    (elapsed, all, cpu)
}

/// The seven rows of issue 3 at `tasks`: raw 1 RT, raw 2 RT, raw 3 RT, dedup new, dedup
/// replay, lock, token, measured in turns through the same connections.
pub(crate) async fn issue3(ctx: &Ctx, tasks: usize) -> [Row; 7] {
    let mut ctx = ctx.clone();
    ctx.find_server().await;
    let ctx = &ctx;
    super::idem_ops::seed_replay(ctx, tasks).await;
    let cases = ISSUE3
        .iter()
        .map(|(_, group, name, make)| Case::new(group, name, tasks, make(ctx)))
        .collect();
    let rows = run(cases, tasks, ctx.secs, ctx.server_pid).await;
    let Ok(rows) = <[Row; 7]>::try_from(rows) else {
        unreachable!("seven cases give seven rows")
    };
    rows
}

/// An operation's constructor.
pub(crate) type Make = fn(&Ctx) -> Op;

/// Issue 3's cases: a short name (for `idem-bench-redis --case`), group, case, operation.
pub(crate) const ISSUE3: [(&str, &str, &str, Make); 7] = {
    use super::{baseline, idem_ops};
    [
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
    ]
};

/// Diagnostic cases outside issue 3's table (`idem-bench-redis --case NAME` only).
#[allow(dead_code)] // The main load program does not run them.
pub(crate) const EXTRA: [(&str, &str, &str, Make); 1] = [(
    "two-keep",
    "baseline",
    super::baseline::TWO_RT_KEEP,
    super::baseline::set_nx_px_set_xx,
)];
