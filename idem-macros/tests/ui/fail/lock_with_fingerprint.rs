use idem_runtime::idempotent;

#[derive(Debug)]
struct AppError;

impl From<idem_runtime::Error> for AppError {
    fn from(_: idem_runtime::Error) -> Self {
        AppError
    }
}

#[idempotent(key = "stock:{sku}", strategy = "lock", fingerprint = [sku])]
async fn reserve(sku: &str) -> Result<(), AppError> {
    let _ = sku;
    Ok(())
}

fn main() {}
