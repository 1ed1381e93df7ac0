use idem_runtime::idempotent;

#[derive(Debug)]
struct AppError;

impl From<idem_runtime::Error> for AppError {
    fn from(_: idem_runtime::Error) -> Self {
        AppError
    }
}

// Both mistakes are reported: a malformed option does not hide the next one.
#[idempotent(key = "charge:{id}", wait = 10, cache_err = "yes")]
async fn charge(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

fn main() {}
