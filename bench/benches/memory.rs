//! In-process microbenchmarks: what `#[idempotent]` on the embedded `MemoryStore` costs
//! over a bare async call, beside the `cached` crate's `#[cached]` on the same function.
//!
//! `cargo bench -p idem-bench --bench memory`
//!
//! Cases, each for one task and for 50 concurrent tasks on a 2-worker runtime:
//! - `bare`: the function without any attribute (the floor);
//! - `idem-replay` / `cached-hit`: a key that already completed;
//! - `idem-new` / `cached-miss`: a fresh key every call (claim + run + complete).
//!
//! The guarantees differ: `#[cached]` runs the body for every concurrent caller of a key
//! that is not cached yet, and keeps nothing across processes; idem runs it once.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cached::proc_macro::cached;
use criterion::{Criterion, criterion_group, criterion_main};
use idem_runtime::{Idem, MemoryStore, idempotent};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    order_id: u64,
    cents: u64,
    status: String,
}

#[derive(Debug, Clone, thiserror::Error)]
enum BenchError {
    #[error("idem: {0}")]
    Idem(String),
}

impl From<idem_runtime::Error> for BenchError {
    fn from(e: idem_runtime::Error) -> Self {
        BenchError::Idem(e.to_string())
    }
}

fn receipt(order_id: u64) -> Receipt {
    Receipt {
        order_id,
        cents: order_id % 10_000,
        status: "paid".to_owned(),
    }
}

async fn bare(order_id: u64) -> Result<Receipt, BenchError> {
    Ok(receipt(order_id))
}

#[idempotent(key = "order:{order_id}", ttl = "2s")]
async fn with_idem(order_id: u64) -> Result<Receipt, BenchError> {
    Ok(receipt(order_id))
}

#[cached]
async fn with_cached(order_id: u64) -> Result<Receipt, BenchError> {
    Ok(receipt(order_id))
}

/// Fresh keys for the new-key cases; far above the replayed ones.
static NEXT: AtomicU64 = AtomicU64::new(1 << 40);

fn fresh() -> u64 {
    NEXT.fetch_add(1, Ordering::Relaxed)
}

fn single_task(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        with_idem(42).await.expect("warm idem");
        with_cached(42).await.expect("warm cached");
    });
    let mut g = c.benchmark_group("single-task");
    g.bench_function("bare", |b| b.to_async(&rt).iter(|| bare(black_box(42))));
    g.bench_function("idem-replay", |b| {
        b.to_async(&rt).iter(|| with_idem(black_box(42)))
    });
    g.bench_function("cached-hit", |b| {
        b.to_async(&rt).iter(|| with_cached(black_box(42)))
    });
    g.bench_function("idem-new", |b| b.to_async(&rt).iter(|| with_idem(fresh())));
    g.bench_function("cached-miss", |b| {
        b.to_async(&rt).iter(|| with_cached(fresh()))
    });
    g.finish();
}

/// Time per call with 50 tasks calling at once, each `iters / 50` times.
fn contended<F, Fut>(rt: &tokio::runtime::Runtime, iters: u64, call: F) -> Duration
where
    F: Fn(u64) -> Fut + Send + Sync + Copy + 'static,
    Fut: std::future::Future<Output = Result<Receipt, BenchError>> + Send,
{
    const TASKS: u64 = 50;
    let per_task = iters.div_ceil(TASKS);
    rt.block_on(async move {
        let start = Instant::now();
        let handles: Vec<_> = (0..TASKS)
            .map(|_| {
                tokio::spawn(async move {
                    for _ in 0..per_task {
                        black_box(call(42).await.expect("call"));
                    }
                })
            })
            .collect();
        for h in handles {
            h.await.expect("task");
        }
        start.elapsed()
    })
}

fn fifty_tasks(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        with_idem(42).await.expect("warm idem");
        with_cached(42).await.expect("warm cached");
    });
    let mut g = c.benchmark_group("50-tasks");
    g.bench_function("bare", |b| b.iter_custom(|n| contended(&rt, n, bare)));
    g.bench_function("idem-replay", |b| {
        b.iter_custom(|n| contended(&rt, n, with_idem))
    });
    g.bench_function("cached-hit", |b| {
        b.iter_custom(|n| contended(&rt, n, with_cached))
    });
    g.bench_function("idem-new", |b| {
        b.iter_custom(|n| contended(&rt, n, |_| with_idem(fresh())))
    });
    g.bench_function("cached-miss", |b| {
        b.iter_custom(|n| contended(&rt, n, |_| with_cached(fresh())))
    });
    g.finish();
}

fn setup() {
    idem_runtime::init(
        Idem::builder()
            .store(MemoryStore::new())
            .namespace("bench")
            .build(),
    )
    .expect("first init");
}

fn benches(c: &mut Criterion) {
    setup();
    single_task(c);
    fifty_tasks(c);
}

criterion_group! {
    name = memory;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = benches
}
criterion_main!(memory);
