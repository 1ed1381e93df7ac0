use idem_runtime::idempotent;

#[derive(Debug)]
struct AppError;

impl From<idem_runtime::Error> for AppError {
    fn from(_: idem_runtime::Error) -> Self {
        AppError
    }
}

impl std::fmt::Display for AppError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("app error")
    }
}

#[idempotent(key = "stock:{sku}", strategy = "lock", recover)]
async fn reserve(sku: String) -> Result<(), AppError> {
    let _ = sku;
    Ok(())
}

fn main() {}
