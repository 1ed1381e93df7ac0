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

#[derive(Debug, Serialize, Deserialize)]
enum ChargeError {
    Declined,
    Idem(String),
}

impl From<idem_runtime::Error> for ChargeError {
    fn from(e: idem_runtime::Error) -> Self {
        ChargeError::Idem(e.to_string())
    }
}

#[idempotent(
    key = "charge:{id}",
    strategy = "dedup",
    ttl = "7d",
    lease = "5m",
    wait = "1500ms",
    on_duplicate = "replay",
    fingerprint = [id, cents],
    cache_err = true,
    crate = "::idem_runtime",
)]
async fn charge(id: u64, cents: u64) -> Result<Receipt, ChargeError> {
    if cents > 1_000 {
        return Err(ChargeError::Declined);
    }
    Ok(Receipt { id })
}

fn main() {
    let _future = charge(1, 2);
    let _ = AppError;
}
