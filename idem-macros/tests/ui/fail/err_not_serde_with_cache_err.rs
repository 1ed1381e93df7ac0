use idem_runtime::idempotent;

// `cache_err` replays errors too, so the error type must be storable.
#[derive(Debug)]
struct AppError;

impl From<idem_runtime::Error> for AppError {
    fn from(_: idem_runtime::Error) -> Self {
        AppError
    }
}

#[idempotent(key = "charge:{id}", cache_err = true)]
async fn charge(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

fn main() {}
