//! The Redis family's rows: ops and latency percentiles from per-call samples.

use std::time::Duration;

/// One measured case.
pub struct Row {
    pub group: &'static str,
    pub case: String,
    pub tasks: usize,
    pub ops: u64,
    pub elapsed: Duration,
    pub p50: Duration,
    pub p99: Duration,
}

impl Row {
    pub fn ops_per_sec(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64()
    }
}

/// Builds a row from per-op latencies (nanoseconds) collected by every task.
pub fn row(
    group: &'static str,
    case: impl Into<String>,
    tasks: usize,
    elapsed: Duration,
    mut lat: Vec<u64>,
) -> Row {
    lat.sort_unstable();
    let pick = |q: f64| -> Duration {
        if lat.is_empty() {
            return Duration::ZERO;
        }
        let i = ((lat.len() as f64 - 1.0) * q).round() as usize;
        Duration::from_nanos(lat[i])
    };
    Row {
        group,
        case: case.into(),
        tasks,
        ops: lat.len() as u64,
        elapsed,
        p50: pick(0.50),
        p99: pick(0.99),
    }
}
