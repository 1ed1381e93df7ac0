use idem_runtime::idempotent;

#[derive(Debug)]
struct AppError;

impl From<idem_runtime::Error> for AppError {
    fn from(_: idem_runtime::Error) -> Self {
        AppError
    }
}

// A token key is the issued token; any text around it would make every token unknown.
#[idempotent(key = "submit:{token}", strategy = "token")]
async fn submit(token: &str) -> Result<u64, AppError> {
    Ok(token.len() as u64)
}

fn main() {}
