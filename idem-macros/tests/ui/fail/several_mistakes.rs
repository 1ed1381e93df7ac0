use idem_runtime::idempotent;

#[derive(Debug)]
struct AppError;

impl From<idem_runtime::Error> for AppError {
    fn from(_: idem_runtime::Error) -> Self {
        AppError
    }
}

// Every mistake is reported in one build, not only the first.
#[idempotent(key = "charge:{order}", strategy = "lock", ttl = "5 min", wait = "10s", wait = "1s")]
fn charge(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

fn main() {}
