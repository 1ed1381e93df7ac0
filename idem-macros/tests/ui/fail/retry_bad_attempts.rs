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

#[retry_on_conflict(attempts = 0)]
async fn none(n: u64) -> Result<u64, AppError> {
    Ok(n + 1)
}

#[retry_on_conflict(attempts = "50")]
async fn quoted(n: u64) -> Result<u64, AppError> {
    Ok(n + 1)
}

#[retry_on_conflict(attempts = 99999999999)]
async fn huge(n: u64) -> Result<u64, AppError> {
    Ok(n + 1)
}

fn main() {}
