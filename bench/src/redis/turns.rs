//! Redis cases taking turns: the baselines and idem's operations each run
//! in `ROUNDS` short slices, one case after another, so a change of the machine's load
//! (it is shared with compilers and test suites) lands on every case alike instead of
//! on one case and not its baseline. Each case's row sums its slices.
//!
//! Where Linux reports it (`/proc/…/schedstat`), each case's line on stderr also gives
//! the CPU time per operation of this process and of the Redis server (when it runs on
//! this machine): a measure of cost that a busy machine disturbs far less than ops/s.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::op::{Op, Slice};
use crate::stats::{Row, row};

/// How many turns each case takes (its measured time is split among them).
const ROUNDS: u32 = 5;
/// Unmeasured time at the start of each slice, while the tasks get going.
const WARMUP: Duration = Duration::from_millis(40);

/// One case: its name, operation, and what its slices gathered.
pub struct Case {
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

/// Runs `cases` in turns for `secs` each (in total, over `ROUNDS` slices) with `tasks`
/// concurrent tasks, and returns one row per case, in order.
pub async fn run(mut cases: Vec<Case>, tasks: usize, secs: f64, server: Option<u32>) -> Vec<Row> {
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
