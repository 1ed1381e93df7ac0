//! Latency samples and the result table.

use std::time::Duration;

/// One measured case.
pub(crate) struct Row {
    pub(crate) group: &'static str,
    pub(crate) case: String,
    pub(crate) tasks: usize,
    pub(crate) ops: u64,
    pub(crate) elapsed: Duration,
    pub(crate) p50: Duration,
    pub(crate) p99: Duration,
}

impl Row {
    pub(crate) fn ops_per_sec(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64()
    }
}

/// Builds a row from per-op latencies (nanoseconds) collected by every task.
pub(crate) fn row(
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

pub(crate) fn print_table(rows: &[Row]) {
    println!(
        "{:<14} {:<34} {:>5} {:>11} {:>10} {:>10}",
        "group", "case", "tasks", "ops/s", "p50", "p99"
    );
    println!("{}", "-".repeat(89));
    for r in rows {
        println!(
            "{:<14} {:<34} {:>5} {:>11.0} {:>10} {:>10}",
            r.group,
            r.case,
            r.tasks,
            r.ops_per_sec(),
            fmt_dur(r.p50),
            fmt_dur(r.p99)
        );
    }
}

pub(crate) fn fmt_dur(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us < 1000.0 {
        format!("{us:.0}µs")
    } else {
        format!("{:.2}ms", us / 1000.0)
    }
}
