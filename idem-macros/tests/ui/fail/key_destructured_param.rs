use idem_runtime::idempotent;

#[derive(Debug)]
struct AppError;

impl From<idem_runtime::Error> for AppError {
    fn from(_: idem_runtime::Error) -> Self {
        AppError
    }
}

#[idempotent(key = "move:{x}")]
async fn shift((x, y): (u64, u64)) -> Result<u64, AppError> {
    Ok(x + y)
}

fn main() {}
