//! The durable family's measuring loop: one kind of call (a new workflow, a duplicate of
//! a finished one, the resume of a killed one) from N tasks for a window, in slices that
//! the libraries take in turns, so a change of the shared machine's load lands on all of
//! them alike.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::flow::Flow;
use crate::load::{self, Histogram};
use crate::report::Summary;
use crate::work::BenchError;

/// How many turns each library takes (its measured time is split among them).
pub(crate) const ROUNDS: u32 = 3;

/// No single call may take longer: a resume that never comes back is an error, not a
/// hang of the whole run.
const CALL_LIMIT: Duration = Duration::from_secs(30);

/// What is timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A new workflow, start to result.
    New,
    /// The same call again for a finished workflow (unmeasured: its first run).
    Replay,
    /// The resume of a workflow killed right after step 2 (unmeasured: the killed run).
    Resume,
}

impl Kind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::New => "new",
            Kind::Replay => "replay",
            Kind::Resume => "resume after a kill at step 2",
        }
    }
}

/// The unmeasured start and the measured time of one slice.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Plan {
    pub(crate) warmup: Duration,
    pub(crate) slice: Duration,
}

/// What one library's calls came to.
#[derive(Default)]
pub(crate) struct Tally {
    pub(crate) hist: Histogram,
    pub(crate) sum_ns: u128,
    pub(crate) ops: u64,
    pub(crate) errors: u64,
    pub(crate) first_error: Option<String>,
    /// Measured time (each slice from its start to its last measured call's end).
    pub(crate) elapsed: Duration,
    /// Each slice's mean latency (ns).
    pub(crate) rounds: Vec<f64>,
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
    }

    pub(crate) fn mean_ns(&self) -> f64 {
        if self.ops == 0 {
            f64::NAN
        } else {
            self.sum_ns as f64 / self.ops as f64
        }
    }

    /// The run's main-table row. For the replay and resume kinds, ops/s counts measured
    /// calls only, while the slices also ran their unmeasured first calls.
    pub(crate) fn summary(&self, tasks: usize) -> Summary {
        let secs = self.elapsed.as_secs_f64();
        Summary {
            tasks,
            ops_per_sec: if secs > 0.0 {
                self.ops as f64 / secs
            } else {
                0.0
            },
            p50: self.hist.quantile(0.50),
            p99: self.hist.quantile(0.99),
            errors: self.errors,
        }
    }
}

/// Measures `kind` on every flow from `tasks` tasks, [`ROUNDS`] slices each, in turns.
pub(crate) async fn measure(
    flows: &[Arc<dyn Flow>],
    kind: Kind,
    tasks: usize,
    plan: Plan,
) -> Vec<Tally> {
    let mut out: Vec<Tally> = flows.iter().map(|_| Tally::default()).collect();
    for _ in 0..ROUNDS {
        for (flow, tally) in flows.iter().zip(&mut out) {
            // A library that failed stops being measured: its numbers would mean nothing.
            if tally.errors > 0 {
                continue;
            }
            let (slice, elapsed) = one_slice(flow, kind, tasks, plan).await;
            if slice.ops > 0 {
                tally.rounds.push(slice.mean_ns());
            }
            tally.merge(slice);
            tally.elapsed += elapsed;
        }
    }
    out
}

/// One call of `kind` on a fresh workflow: when its timed part began and how long it took.
async fn one_call(flow: &dyn Flow, kind: Kind) -> Result<(Instant, Duration), BenchError> {
    let n = load::fresh_id();
    match kind {
        Kind::New => {}
        Kind::Replay => {
            flow.run(n).await?;
        }
        Kind::Resume => flow.run_killed(n).await?,
    }
    let call = match kind {
        Kind::Resume => flow.resume(n),
        Kind::New | Kind::Replay => flow.run(n),
    };
    let t0 = Instant::now();
    match tokio::time::timeout(CALL_LIMIT, call).await {
        Ok(r) => r.map(|_| (t0, t0.elapsed())),
        Err(_) => Err(BenchError(format!(
            "a {} call took over {CALL_LIMIT:?}",
            kind.name()
        ))),
    }
}

async fn one_slice(
    flow: &Arc<dyn Flow>,
    kind: Kind,
    tasks: usize,
    plan: Plan,
) -> (Tally, Duration) {
    let start = Instant::now() + plan.warmup;
    let end = start + plan.slice;
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let flow = flow.clone();
            tokio::spawn(async move {
                let mut t = Tally::default();
                let mut last_end = None;
                // Until the window ends, and in any case until one call is measured: a
                // call slower than the window (a resume that waits for a queue's poll)
                // still gives each task one sample.
                while Instant::now() < end || t.ops == 0 {
                    match one_call(&*flow, kind).await {
                        Ok((began, d)) if began >= start && (began < end || t.ops == 0) => {
                            t.hist.record(d);
                            t.sum_ns += d.as_nanos();
                            t.ops += 1;
                            last_end = Some(Instant::now());
                        }
                        Ok(_) => {}
                        Err(e) => {
                            t.errors += 1;
                            t.first_error = Some(e.to_string());
                            break;
                        }
                    }
                }
                (t, last_end)
            })
        })
        .collect();
    let mut all = Tally::default();
    let mut last = None;
    for h in handles {
        match h.await {
            Ok((t, end)) => {
                all.merge(t);
                last = last.max(end);
            }
            Err(e) => {
                all.errors += 1;
                all.first_error
                    .get_or_insert_with(|| format!("task panicked: {e}"));
            }
        }
    }
    let elapsed = last.map_or(Duration::ZERO, |e: Instant| {
        e.saturating_duration_since(start)
    });
    (all, elapsed)
}
