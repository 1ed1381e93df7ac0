use idem_runtime::idempotent;

#[derive(Debug)]
struct AppError;

impl From<idem_runtime::Error> for AppError {
    fn from(_: idem_runtime::Error) -> Self {
        AppError
    }
}

#[idempotent(key = "charge:{id}")]
async fn charge(id: u64) -> Option<u64> {
    Some(id)
}

// An alias is recognised by its name ending in `Result`.
type Outcome<T> = Result<T, AppError>;

#[idempotent(key = "refund:{id}")]
async fn refund(id: u64) -> Outcome<u64> {
    Ok(id)
}

fn main() {}
