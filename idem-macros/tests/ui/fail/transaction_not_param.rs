use idem_runtime::idempotent;

#[derive(Debug)]
struct AppError;

impl From<idem_runtime::Error> for AppError {
    fn from(_: idem_runtime::Error) -> Self {
        AppError
    }
}

// `transaction` must name the parameter that carries the open transaction.
#[idempotent(key = "order:{id}", transaction = txn)]
async fn place(tx: &mut u8, id: u64) -> Result<u64, AppError> {
    let _ = tx;
    Ok(id)
}

fn main() {}
