// `crate = "..."` is where the expansion looks for the runtime: a wrong path fails there.
use idem_runtime::idempotent;

mod not_the_runtime {}

#[derive(Debug)]
struct AppError;

impl From<idem_runtime::Error> for AppError {
    fn from(_: idem_runtime::Error) -> Self {
        AppError
    }
}

#[idempotent(key = "charge:{id}", crate = "not_the_runtime")]
async fn charge(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

fn main() {}
