use idem_runtime::idempotent;

#[derive(Debug)]
struct AppError;

impl From<idem_runtime::Error> for AppError {
    fn from(_: idem_runtime::Error) -> Self {
        AppError
    }
}

// Half of what a replay needs: it can be stored but not read back.
#[derive(serde::Serialize)]
struct Receipt {
    id: u64,
}

#[idempotent(key = "charge:{id}")]
async fn charge(id: u64) -> Result<Receipt, AppError> {
    Ok(Receipt { id })
}

fn main() {}
