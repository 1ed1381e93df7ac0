use idem_runtime::idempotent;

#[derive(Debug)]
struct AppError;

impl From<idem_runtime::Error> for AppError {
    fn from(_: idem_runtime::Error) -> Self {
        AppError
    }
}

#[idempotent(key = "charge:{id}")]
async fn charge(id: u64) {
    let _ = id;
}

fn main() {}
