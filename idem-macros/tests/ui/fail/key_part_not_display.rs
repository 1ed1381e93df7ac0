use idem_runtime::idempotent;

#[derive(Debug)]
struct AppError;

impl From<idem_runtime::Error> for AppError {
    fn from(_: idem_runtime::Error) -> Self {
        AppError
    }
}

// Key parts are rendered with `Display`; the error points at the key.
struct OrderId(u64);

#[idempotent(key = "charge:{id}")]
async fn charge(id: OrderId) -> Result<u64, AppError> {
    Ok(id.0)
}

fn main() {}
