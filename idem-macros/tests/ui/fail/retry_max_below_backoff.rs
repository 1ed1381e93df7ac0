use idem_runtime::{Error, IsConflict, retry_on_conflict};

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

// The cap of one sleep below its base.
#[retry_on_conflict(backoff = "50ms", max_backoff = "5ms")]
async fn add(n: u64) -> Result<u64, AppError> {
    Ok(n + 1)
}

fn main() {}
