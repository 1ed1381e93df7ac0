//! What the `metrics` feature costs a replay when no recorder is installed: the
//! in-process replay path (the cheapest call idem has, so any fixed cost shows most
//! here), timed over many calls.
//!
//! Build it twice and run the two alternately, so both see the same machine:
//!
//! ```sh
//! cargo build --release -p idem-runtime --example replay_cost
//! cp target/release/examples/replay_cost /tmp/replay-plain
//! cargo build --release -p idem-runtime --example replay_cost --features metrics
//! cp target/release/examples/replay_cost /tmp/replay-metrics
//! for i in 1 2 3; do /tmp/replay-plain; /tmp/replay-metrics; done
//! ```
//!
//! Each run prints `replay_cost metrics=<on|off> <ns per call> ns/call` (the best of five
//! rounds of two million calls). Under `valgrind --tool=callgrind` with a call count
//! argument it runs that many calls once, for instruction counts.

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

fn main() -> Result<(), Error> {
    let once: Option<u64> = std::env::args().nth(1).and_then(|a| a.parse().ok());
    idem_runtime::init(Idem::builder().store(MemoryStore::new()).build())?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Config(e.to_string()))?;
    rt.block_on(async {
        // Completes the record, then decodes it once so later replays clone the kept value.
        for _ in 0..3 {
            black_box(charge(42).await?);
        }
        if let Some(n) = once {
            for _ in 0..n {
                black_box(charge(black_box(42)).await?);
            }
            return Ok(());
        }
        let n = 2_000_000u32;
        let mut best = f64::MAX;
        for _ in 0..5 {
            let start = Instant::now();
            for _ in 0..n {
                black_box(charge(black_box(42)).await?);
            }
            best = best.min(start.elapsed().as_nanos() as f64 / f64::from(n));
        }
        let on = if cfg!(feature = "metrics") {
            "on"
        } else {
            "off"
        };
        println!("replay_cost metrics={on} {best:.1} ns/call");
        Ok(())
    })
}
