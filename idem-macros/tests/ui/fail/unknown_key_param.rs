use idem_runtime::idempotent;

#[derive(Debug)]
struct AppError;

impl From<idem_runtime::Error> for AppError {
    fn from(_: idem_runtime::Error) -> Self {
        AppError
    }
}

#[idempotent(key = "charge:{order_id}")]
async fn charge(id: u64, cents: u64) -> Result<u64, AppError> {
    Ok(id + cents)
}

fn main() {}
