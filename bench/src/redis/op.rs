//! One operation of a Redis case, as the spawner of a slice's tasks (see [`super::turns`]).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

/// What one slice's tasks share: the per-task next `i`, and the stop and measuring flags.
#[derive(Clone)]
pub struct Slice {
    pub(crate) next: Arc<Vec<AtomicU64>>,
    pub(crate) stop: Arc<AtomicBool>,
    pub(crate) measuring: Arc<AtomicBool>,
}

/// One operation, `op(task, i)` with `i` distinct per task across all of a case's
/// slices, as the spawner of a slice's tasks. The loop around the operation is generic,
/// so its future is awaited in place (a boxed future per operation would add a copy of
/// the whole future to every call, more for idem's larger futures than for a raw command).
pub type Op = Arc<dyn Fn(usize, &Slice) -> tokio::task::JoinHandle<Vec<u64>> + Send + Sync>;

/// Wraps a closure returning a future as an [`Op`].
pub(crate) fn op<F, Fut>(f: F) -> Op
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), String>> + Send + 'static,
{
    let f = Arc::new(f);
    Arc::new(move |t, slice: &Slice| {
        let (f, s) = (f.clone(), slice.clone());
        tokio::spawn(async move {
            let mut lat = Vec::with_capacity(1 << 12);
            while !s.stop.load(Ordering::Relaxed) {
                let i = s.next[t].fetch_add(1, Ordering::Relaxed);
                let start = Instant::now();
                if let Err(e) = f(t, i).await {
                    panic!("operation failed: {e}");
                }
                if s.measuring.load(Ordering::Relaxed) {
                    lat.push(start.elapsed().as_nanos() as u64);
                }
            }
            lat
        })
    })
}
