use idem_runtime::idempotent;

#[derive(Debug)]
struct AppError;

impl From<idem_runtime::Error> for AppError {
    fn from(_: idem_runtime::Error) -> Self {
        AppError
    }
}

// A lock stores no record, so there is nothing to commit with the caller's writes.
#[idempotent(key = "order:{id}", strategy = "lock", transaction = tx)]
async fn place(tx: &mut u8, id: u64) -> Result<u64, AppError> {
    let _ = tx;
    Ok(id)
}

fn main() {}
