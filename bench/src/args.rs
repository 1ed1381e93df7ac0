//! What the command line asked for, and the measuring windows it implies.

use std::time::Duration;

use crate::load;

/// The load program's options (parsed by the `idem-bench` binary).
#[derive(Debug, Clone, Default)]
pub struct Args {
    /// Redis to measure against; the Redis-backed cases are skipped without it.
    pub redis: Option<String>,
    /// SQL stores to measure against, one run of the SQL cases each.
    pub sql: Vec<String>,
    /// Short windows: a smoke run, noisier numbers.
    pub quick: bool,
    /// The case families to run (see [`crate::cases::FAMILIES`]); empty is all.
    pub cases: Vec<String>,
    /// Where to write the throughput-vs-concurrency chart.
    pub svg: Option<String>,
}

impl Args {
    /// Whether the family `case` was asked for.
    pub fn wants(&self, case: &str) -> bool {
        self.cases.is_empty() || self.cases.iter().any(|c| c == case)
    }

    /// Warm-up and measured window of one case.
    pub(crate) fn window(&self) -> (Duration, Duration) {
        if self.quick {
            (Duration::from_millis(100), Duration::from_millis(400))
        } else {
            (Duration::from_millis(200), Duration::from_secs(1))
        }
    }

    /// How many windows a peer case runs, keeping the median (see `load::run_median`).
    pub(crate) fn repeats(&self) -> usize {
        if self.quick { 1 } else { 3 }
    }

    /// The plan of one case at `tasks` concurrency.
    pub(crate) fn plan(&self, tasks: usize) -> load::Plan {
        let (warmup, duration) = self.window();
        load::Plan::new(tasks, warmup, duration)
    }
}
