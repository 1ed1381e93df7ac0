//! Runs one operation from N concurrent tasks for a fixed time and collects latencies.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::stats::{Row, row};

/// Runs `op(task, i)` in a loop on `tasks` tasks for `secs` (after a short warm-up)
/// and returns the row. An op that fails aborts the run: a benchmark of errors is
/// meaningless.
pub(crate) async fn run<F, Fut>(
    group: &'static str,
    case: impl Into<String>,
    tasks: usize,
    secs: f64,
    op: F,
) -> Row
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), String>> + Send,
{
    let case = case.into();
    let op = Arc::new(op);
    let stop = Arc::new(AtomicBool::new(false));
    let measuring = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    for t in 0..tasks {
        let (op, stop, measuring) = (op.clone(), stop.clone(), measuring.clone());
        handles.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(1 << 16);
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let start = Instant::now();
                if let Err(e) = op(t, i).await {
                    panic!("operation failed: {e}");
                }
                if measuring.load(Ordering::Relaxed) {
                    lat.push(start.elapsed().as_nanos() as u64);
                }
                i += 1;
            }
            lat
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    measuring.store(true, Ordering::Relaxed);
    let began = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    measuring.store(false, Ordering::Relaxed);
    let elapsed = began.elapsed();
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.await.expect("bench task panicked"));
    }
    let r = row(group, case, tasks, elapsed, all);
    eprintln!(
        "  {:<12} {:<34} {:>3} tasks: {:>9.0} ops/s",
        r.group,
        r.case,
        r.tasks,
        r.ops_per_sec()
    );
    r
}
