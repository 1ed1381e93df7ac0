use idem_runtime::idempotent;

#[derive(Debug)]
struct AppError;

impl From<idem_runtime::Error> for AppError {
    fn from(_: idem_runtime::Error) -> Self {
        AppError
    }
}

// Rejecting duplicates stores only a marker, so the `Ok` type needs no serde, with or
// without `cache_err`.
struct Connection {
    id: u64,
}

#[idempotent(key = "open:{id}", on_duplicate = "reject")]
async fn open(id: u64) -> Result<Connection, AppError> {
    Ok(Connection { id })
}

#[idempotent(key = "open:{id}", on_duplicate = "reject", cache_err = true)]
async fn open_once(id: u64) -> Result<Connection, AppError> {
    Ok(Connection { id })
}

fn main() {
    let _a = open(1);
    let _b = open_once(1);
}
