//! The load loop: one async operation run from N concurrent tasks for a fixed time (or a
//! fixed count), with ops/s and latency percentiles from a small log-linear histogram.
//!
//! Each task times every call with `Instant` and records it in its own histogram (no
//! shared state on the hot path); the histograms are merged at the end. Calls started in
//! a warm-up period before the measured window are not recorded, so connection set-up,
//! script loading and first allocations do not count.

use std::fmt::Display;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long and how wide one measurement is.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Plan {
    /// Concurrent tasks.
    pub(crate) tasks: usize,
    /// Calls started before this has passed are warm-up, not measured.
    pub(crate) warmup: Duration,
    /// The measured window.
    pub(crate) duration: Duration,
    /// Stop each task after this many measured calls (a bound, whatever the duration).
    pub(crate) max_ops_per_task: u64,
}

impl Plan {
    pub(crate) fn new(tasks: usize, warmup: Duration, duration: Duration) -> Plan {
        Plan {
            tasks: tasks.max(1),
            warmup,
            duration,
            max_ops_per_task: u64::MAX,
        }
    }
}

/// What a call is told: which task runs it and a per-process unique number, for keys.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ctx {
    pub(crate) task: usize,
    pub(crate) id: u64,
}

/// A number never handed out before in this process (keys of "new key" cases).
pub(crate) fn fresh_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A tag unique to this run, so keys written to a shared server by two runs (or by a run
/// and a test suite) never meet.
pub(crate) fn run_tag() -> &'static str {
    static TAG: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TAG.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        format!("{:x}{:05x}", std::process::id(), nanos & 0xfffff)
    })
}

/// The result of one measurement.
#[derive(Debug, Clone)]
pub(crate) struct Outcome {
    pub(crate) tasks: usize,
    pub(crate) ops: u64,
    pub(crate) errors: u64,
    pub(crate) first_error: Option<String>,
    pub(crate) elapsed: Duration,
    pub(crate) hist: Histogram,
}

impl Outcome {
    pub(crate) fn ops_per_sec(&self) -> f64 {
        let s = self.elapsed.as_secs_f64();
        if s <= 0.0 { 0.0 } else { self.ops as f64 / s }
    }
    pub(crate) fn p50(&self) -> Duration {
        self.hist.quantile(0.50)
    }
    pub(crate) fn p99(&self) -> Duration {
        self.hist.quantile(0.99)
    }
}

/// Runs `op` from `plan.tasks` tasks (spawned on the current multi-thread runtime) and
/// measures it. Failed calls are counted, not timed; the first error is kept for the
/// report, since a case that fails is not a fast case.
pub(crate) async fn run<F, Fut, E>(plan: Plan, op: F) -> Outcome
where
    F: Fn(Ctx) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), E>> + Send + 'static,
    E: Display,
{
    let op = Arc::new(op);
    let start = Instant::now() + plan.warmup;
    let end = start + plan.duration;
    let handles: Vec<_> = (0..plan.tasks)
        .map(|task| {
            let op = Arc::clone(&op);
            tokio::spawn(async move {
                let mut hist = Histogram::new();
                let mut ops = 0u64;
                let mut errors = 0u64;
                let mut first_error = None;
                let mut last_end = start;
                loop {
                    let t0 = Instant::now();
                    if t0 >= end || ops >= plan.max_ops_per_task {
                        break;
                    }
                    let result = op(Ctx {
                        task,
                        id: fresh_id(),
                    })
                    .await;
                    let t1 = Instant::now();
                    if t0 < start {
                        continue;
                    }
                    last_end = t1;
                    match result {
                        Ok(()) => {
                            ops += 1;
                            hist.record(t1 - t0);
                        }
                        Err(e) => {
                            errors += 1;
                            if first_error.is_none() {
                                first_error = Some(e.to_string());
                            }
                            // A failing store answers fast; do not let a dead case spin.
                            if errors > 1000 && ops == 0 {
                                break;
                            }
                        }
                    }
                }
                (hist, ops, errors, first_error, last_end)
            })
        })
        .collect();
    let mut out = Outcome {
        tasks: plan.tasks,
        ops: 0,
        errors: 0,
        first_error: None,
        elapsed: Duration::ZERO,
        hist: Histogram::new(),
    };
    let mut last = start;
    for h in handles {
        match h.await {
            Ok((hist, ops, errors, first_error, last_end)) => {
                out.hist.merge(&hist);
                out.ops += ops;
                out.errors += errors;
                if out.first_error.is_none() {
                    out.first_error = first_error;
                }
                last = last.max(last_end);
            }
            Err(e) => {
                out.errors += 1;
                out.first_error
                    .get_or_insert_with(|| format!("task panicked: {e}"));
            }
        }
    }
    out.elapsed = last.saturating_duration_since(start);
    out
}

/// Runs the same measurement `repeats` times, back to back, and keeps the one with the
/// median throughput. On a shared machine one window can land on another program's
/// burst; the median of three discards one such window in either direction.
pub(crate) async fn run_median<F, Fut, E>(plan: Plan, repeats: usize, op: F) -> Outcome
where
    F: Fn(Ctx) -> Fut + Send + Sync + Clone + 'static,
    Fut: Future<Output = Result<(), E>> + Send + 'static,
    E: Display,
{
    let mut runs = Vec::with_capacity(repeats.max(1));
    for _ in 0..repeats.max(1) {
        runs.push(run(plan, op.clone()).await);
    }
    runs.sort_by(|a, b| a.ops_per_sec().total_cmp(&b.ops_per_sec()));
    let errors: u64 = runs.iter().map(|o| o.errors).sum();
    let first_error = runs.iter().find_map(|o| o.first_error.clone());
    let mut median = runs.swap_remove(runs.len() / 2);
    // Errors in any repeat count: a case that failed once is not a clean measurement.
    median.errors = errors;
    median.first_error = first_error;
    median
}

/// Latencies in nanoseconds, log-linear: 32 sub-buckets per power of two, so any
/// recorded value is reported within about 3% (plenty for p50/p99 of a load test) in a
/// fixed 16 KiB per task, whatever the number of calls.
#[derive(Debug, Clone)]
pub(crate) struct Histogram {
    counts: Vec<u64>,
    total: u64,
}

const SUB_BITS: u32 = 5;
const SUB: u64 = 1 << SUB_BITS;

impl Histogram {
    pub(crate) fn new() -> Histogram {
        Histogram {
            counts: vec![0; ((64 - SUB_BITS as usize) + 1) * SUB as usize],
            total: 0,
        }
    }

    fn index(v: u64) -> usize {
        if v < SUB {
            return v as usize;
        }
        let exp = 63 - v.leading_zeros(); // >= SUB_BITS
        let shift = exp - SUB_BITS;
        let mantissa = (v >> shift) & (SUB - 1);
        ((shift as u64 + 1) * SUB + mantissa) as usize
    }

    /// The middle of bucket `i`'s value range.
    fn value(i: usize) -> u64 {
        let i = i as u64;
        if i < SUB {
            return i;
        }
        let shift = i / SUB - 1;
        let mantissa = i % SUB;
        let low = (SUB + mantissa) << shift;
        low + ((1u64 << shift) >> 1)
    }

    pub(crate) fn record(&mut self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.counts[Self::index(ns)] += 1;
        self.total += 1;
    }

    pub(crate) fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.total += other.total;
    }

    pub(crate) fn quantile(&self, q: f64) -> Duration {
        if self.total == 0 {
            return Duration::ZERO;
        }
        let rank = ((self.total as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Duration::from_nanos(Self::value(i));
            }
        }
        Duration::ZERO
    }
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_stay_within_a_few_percent() {
        for v in [0u64, 1, 31, 32, 33, 100, 1_000, 12_345, 999_999, 1 << 40] {
            let i = Histogram::index(v);
            let back = Histogram::value(i);
            let err = (back as f64 - v as f64).abs() / (v.max(1) as f64);
            assert!(err <= 0.04, "{v} -> bucket {i} -> {back}");
        }
    }

    #[test]
    fn quantiles_of_a_uniform_spread() {
        let mut h = Histogram::new();
        for us in 1..=1000u64 {
            h.record(Duration::from_micros(us));
        }
        let p50 = h.quantile(0.5).as_micros() as f64;
        let p99 = h.quantile(0.99).as_micros() as f64;
        assert!((p50 - 500.0).abs() < 20.0, "{p50}");
        assert!((p99 - 990.0).abs() < 40.0, "{p99}");
    }
}
