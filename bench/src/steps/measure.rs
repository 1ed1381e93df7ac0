//! The measuring loop: the cases take turns in slices, each slice's calls timed from
//! many tasks that watch the clock themselves.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::raw::Raw;
use super::{Kind, ROUNDS};
use crate::load::{self, Histogram};
use crate::report::Summary;
use crate::work::BenchError;

/// The unmeasured start and the measured time of one slice.
#[derive(Debug, Clone, Copy)]
pub(super) struct Plan {
    pub(super) warmup: Duration,
    pub(super) slice: Duration,
}

/// One slice's window: calls whose timed part begins in `start..end` are measured; no
/// call starts at or after `end`.
///
/// The tasks watch the clock themselves rather than a flag set by a timer: a MemoryStore
/// call never yields, so tasks looping on it could keep every worker thread busy and a
/// timer meant to stop them might never fire.
#[derive(Debug, Clone, Copy)]
pub(super) struct Window {
    start: Instant,
    end: Instant,
}

/// What a task (then a case) gathered: measured calls, their latencies, errors, and
/// when its last measured call ended.
#[derive(Default)]
pub(super) struct Tally {
    hist: Histogram,
    sum_ns: u128,
    ops: u64,
    pub(super) errors: u64,
    pub(super) first_error: Option<String>,
    last_end: Option<Instant>,
}

impl Tally {
    fn merge(&mut self, o: Tally) {
        self.hist.merge(&o.hist);
        self.sum_ns += o.sum_ns;
        self.ops += o.ops;
        self.errors += o.errors;
        if self.first_error.is_none() {
            self.first_error = o.first_error;
        }
        self.last_end = self.last_end.max(o.last_end);
    }
}

/// One operation as the spawner of a slice's tasks. The loop around it is generic, so
/// each case's future is awaited in place rather than boxed per call.
pub(super) type Spawn = Arc<dyn Fn(Window) -> tokio::task::JoinHandle<Tally> + Send + Sync>;

pub(super) fn spawner<F, Fut>(f: F) -> Spawn
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(Instant, Duration), BenchError>> + Send + 'static,
{
    let f = Arc::new(f);
    Arc::new(move |w: Window| {
        let f = f.clone();
        tokio::spawn(async move {
            let mut t = Tally::default();
            loop {
                let t0 = Instant::now();
                if t0 >= w.end {
                    break;
                }
                match f(load::fresh_id()).await {
                    // Measured if its timed part began in the window (the resume
                    // case's first attempt, before it, is not timed).
                    Ok((began, d)) if began >= w.start && began < w.end => {
                        t.hist.record(d);
                        t.sum_ns += d.as_nanos();
                        t.ops += 1;
                        t.last_end = Some(Instant::now());
                    }
                    Ok(_) => {}
                    Err(e) => {
                        // A case that fails is not a measurement: its task stops here.
                        t.errors += 1;
                        t.first_error = Some(e.to_string());
                        break;
                    }
                }
                // Outside the timed call: a MemoryStore call never waits, so without a
                // yield each worker thread would run one task to the end of the window
                // and "50 tasks" would be as many as there are threads.
                tokio::task::yield_now().await;
            }
            t
        })
    })
}

/// One case after its slices.
pub(super) struct Measured {
    pub(super) kind: Kind,
    pub(super) tally: Tally,
    pub(super) elapsed: Duration,
    /// Each slice's mean latency (ns).
    pub(super) rounds: Vec<f64>,
}

impl Measured {
    pub(super) fn mean_ns(&self) -> f64 {
        if self.tally.ops == 0 {
            f64::NAN
        } else {
            self.tally.sum_ns as f64 / self.tally.ops as f64
        }
    }

    /// The row of the run's main table. The resume case's ops/s counts measured attempts
    /// only, while its slices also ran the unmeasured first attempts.
    pub(super) fn summary(&self, tasks: usize) -> Summary {
        let secs = self.elapsed.as_secs_f64();
        Summary {
            tasks,
            ops_per_sec: if secs > 0.0 {
                self.tally.ops as f64 / secs
            } else {
                0.0
            },
            p50: self.tally.hist.quantile(0.50),
            p99: self.tally.hist.quantile(0.99),
            errors: self.tally.errors,
        }
    }
}

/// Runs `cases` in turns, [`ROUNDS`] slices each, from `tasks` tasks.
pub(super) async fn measure(
    cases: &[(Kind, Spawn); 4],
    tasks: usize,
    plan: Plan,
    raw: &Raw,
) -> [Measured; 4] {
    let mut out = cases.each_ref().map(|(kind, _)| Measured {
        kind: *kind,
        tally: Tally::default(),
        elapsed: Duration::ZERO,
        rounds: Vec::new(),
    });
    for _ in 0..ROUNDS {
        for ((_, spawn), m) in cases.iter().zip(&mut out) {
            let (tally, elapsed) = one_slice(spawn, tasks, plan).await;
            raw.tidy();
            if tally.ops > 0 {
                m.rounds.push(tally.sum_ns as f64 / tally.ops as f64);
            }
            m.tally.merge(tally);
            m.elapsed += elapsed;
        }
    }
    out
}

async fn one_slice(spawn: &Spawn, tasks: usize, plan: Plan) -> (Tally, Duration) {
    let start = Instant::now() + plan.warmup;
    let w = Window {
        start,
        end: start + plan.slice,
    };
    let handles: Vec<_> = (0..tasks).map(|_| spawn(w)).collect();
    let mut all = Tally::default();
    for h in handles {
        match h.await {
            Ok(t) => all.merge(t),
            Err(e) => {
                all.errors += 1;
                all.first_error
                    .get_or_insert_with(|| format!("task panicked: {e}"));
            }
        }
    }
    let elapsed = all
        .last_end
        .map_or(Duration::ZERO, |e| e.saturating_duration_since(start));
    (all, elapsed)
}
