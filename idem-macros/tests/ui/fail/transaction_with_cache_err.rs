use idem_runtime::idempotent;
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
struct AppError;

impl From<idem_runtime::Error> for AppError {
    fn from(_: idem_runtime::Error) -> Self {
        AppError
    }
}

// An `Err` rolls the body's writes back, so there is no result to keep.
#[idempotent(key = "order:{id}", transaction = tx, cache_err = true)]
async fn place(tx: &mut u8, id: u64) -> Result<u64, AppError> {
    let _ = tx;
    Ok(id)
}

fn main() {}
