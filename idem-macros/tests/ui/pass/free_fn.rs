use idem_runtime::idempotent;
use serde::{Deserialize, Serialize};

#[derive(Debug)]
struct AppError;

impl From<idem_runtime::Error> for AppError {
    fn from(_: idem_runtime::Error) -> Self {
        AppError
    }
}

#[derive(Serialize, Deserialize)]
struct Receipt {
    id: u64,
}

/// Doc comments and other attributes are kept.
#[idempotent(key = "charge:{id}")]
pub async fn charge(id: u64, cents: u64) -> Result<Receipt, AppError> {
    if cents == 0 {
        return Err(AppError);
    }
    Ok(Receipt { id })
}

fn main() {
    let _future = charge(1, 100);
}
