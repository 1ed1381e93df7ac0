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

#[retry_on_conflict(backoff = "1 ms", max_backoff = "1.5s")]
async fn add(n: u64) -> Result<u64, AppError> {
    Ok(n + 1)
}

fn main() {}
