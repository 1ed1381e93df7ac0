//! The `replay` measurement: the in-process replay of an attribute function (the
//! cheapest call idem has, so any fixed cost shows most there), timed over many calls
//! with no metrics recorder installed.
//!
//! It exists to price the `metrics` feature: `bench/metrics-cost.sh` builds the
//! `idem-bench-replay` binary with idem-bench's default features (`metrics` on) and
//! with `--no-default-features` (off), runs the two alternately on the same machine and
//! prints both figures and `ratio metrics-replay VALUE` (ops/s on ÷ ops/s off).

use std::hint::black_box;
use std::time::Instant;

use idem_runtime::{Error, Idem, MemoryStore, idempotent};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    order_id: u64,
    cents: u64,
    status: String,
}

#[idempotent(key = "order:{order_id}", ttl = "1h")]
async fn charge(order_id: u64) -> Result<Receipt, Error> {
    Ok(Receipt {
        order_id,
        cents: order_id % 10_000,
        status: "paid".to_owned(),
    })
}

/// Whether this build has idem's `metrics` feature (idem-bench's default feature).
pub const METRICS: bool = cfg!(feature = "metrics");

/// One run: the best of `rounds` rounds of `calls` replays each.
#[derive(Debug, Clone, Copy)]
pub struct Figures {
    /// Nanoseconds per replay.
    pub ns_per_op: f64,
    /// Replays per second.
    pub ops_per_sec: f64,
}

impl std::fmt::Display for Figures {
    /// `replay metrics=on ns/op 581.2 ops/s 1720578`, the line `metrics-cost.sh` reads.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let on = if METRICS { "on" } else { "off" };
        write!(
            f,
            "replay metrics={on} ns/op {:.1} ops/s {:.0}",
            self.ns_per_op, self.ops_per_sec
        )
    }
}

/// Installs a runtime on a fresh in-process store (once per process), records one
/// result and replays it: `calls` times per round, keeping the fastest round (the one
/// least disturbed by the rest of the machine).
pub fn measure(rounds: u32, calls: u32) -> Result<Figures, Error> {
    let best = run(|rt| {
        rt.block_on(async {
            let mut best = f64::MAX;
            for _ in 0..rounds.max(1) {
                let start = Instant::now();
                for _ in 0..calls {
                    black_box(charge(black_box(42)).await?);
                }
                best = best.min(start.elapsed().as_nanos() as f64 / f64::from(calls.max(1)));
            }
            Ok(best)
        })
    })?;
    Ok(Figures {
        ns_per_op: best,
        ops_per_sec: 1e9 / best,
    })
}

/// `calls` replays, untimed: for instruction counts under `valgrind --tool=callgrind`.
pub fn replay_only(calls: u64) -> Result<(), Error> {
    run(|rt| {
        rt.block_on(async {
            for _ in 0..calls {
                black_box(charge(black_box(42)).await?);
            }
            Ok(())
        })
    })
}

fn run<T>(body: impl FnOnce(&tokio::runtime::Runtime) -> Result<T, Error>) -> Result<T, Error> {
    // A second call in one process finds the runtime installed: keep it.
    let _ = idem_runtime::init(Idem::builder().store(MemoryStore::new()).build());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Config(e.to_string()))?;
    // Completes the record, then decodes it once so later replays clone the kept value.
    rt.block_on(async {
        for _ in 0..3 {
            black_box(charge(42).await?);
        }
        Ok::<_, Error>(())
    })?;
    body(&rt)
}
