// #[idempotent] takes any path whose last name ends in `Result`, as its siblings do: the
// full path, and aliases that fix the error type or both types.
use std::sync::atomic::{AtomicUsize, Ordering};

use idem_runtime::{Error, Idem, IsConflict, idempotent, retry_on_conflict};

#[derive(Debug)]
struct AppError(Error);

impl From<Error> for AppError {
    fn from(e: Error) -> Self {
        AppError(e)
    }
}

impl IsConflict for AppError {
    fn is_conflict(&self) -> bool {
        self.0.is_conflict()
    }
}

type AppResult<T> = Result<T, AppError>;
type ChargeResult = Result<u64, AppError>;
type BothResult<T, E> = Result<T, E>;

static RUNS: AtomicUsize = AtomicUsize::new(0);

fn run(value: u64) -> u64 {
    RUNS.fetch_add(1, Ordering::SeqCst);
    value
}

#[idempotent(key = "full:{id}")]
async fn full_path(id: u64) -> std::result::Result<u64, AppError> {
    Ok(run(id))
}

#[idempotent(key = "one:{id}")]
async fn one_parameter(id: u64) -> AppResult<u64> {
    Ok(run(id))
}

// A replayed `Ok` type that is not `Clone` takes the decoding path.
#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct Receipt(u64);

#[idempotent(key = "receipt:{id}")]
async fn not_clone(id: u64) -> AppResult<Receipt> {
    Ok(Receipt(run(id)))
}

#[idempotent(key = "none:{id}")]
async fn no_parameter(id: u64) -> ChargeResult {
    Ok(run(id))
}

#[idempotent(key = "both:{id}")]
async fn two_parameters(id: u64) -> BothResult<u64, AppError> {
    Ok(run(id))
}

#[retry_on_conflict(attempts = 3)]
#[idempotent(key = "retried:{id}")]
async fn retried(id: u64) -> AppResult<u64> {
    Ok(run(id))
}

#[idempotent(key = "reject:{id}", on_duplicate = "reject")]
async fn rejected(id: u64) -> AppResult<u64> {
    Ok(run(id))
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    let idem = Idem::builder().namespace("result-alias").build();
    runtime.block_on(idem.scope(async {
        for _ in 0..2 {
            assert_eq!(full_path(1).await.expect("ok"), 1);
            assert_eq!(one_parameter(2).await.expect("ok"), 2);
            assert_eq!(not_clone(3).await.expect("ok"), Receipt(3));
            assert_eq!(no_parameter(4).await.expect("ok"), 4);
            assert_eq!(two_parameters(5).await.expect("ok"), 5);
            assert_eq!(retried(6).await.expect("ok"), 6);
        }
        // Each body ran once; the second call of each was a replay.
        assert_eq!(RUNS.load(Ordering::SeqCst), 6);
        assert_eq!(rejected(7).await.expect("ok"), 7);
        assert!(matches!(rejected(7).await, Err(AppError(Error::Duplicate { .. }))));
        assert_eq!(RUNS.load(Ordering::SeqCst), 7);
    }));
}
