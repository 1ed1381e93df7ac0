use idem_runtime::idempotent;

#[derive(Debug)]
struct AppError;

impl From<idem_runtime::Error> for AppError {
    fn from(_: idem_runtime::Error) -> Self {
        AppError
    }
}

// The UI tests build idem-runtime with default features: no SQL store, so the
// transactional mode says which feature it needs.
#[idempotent(key = "order:{id}", transaction = tx)]
async fn place(tx: &mut u8, id: u64) -> Result<u64, AppError> {
    let _ = tx;
    Ok(id)
}

fn main() {}
