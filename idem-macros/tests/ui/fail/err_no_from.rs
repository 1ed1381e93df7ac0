use idem_runtime::idempotent;

// No `From<idem_runtime::Error>`: idem's own errors would have nowhere to go.
#[derive(Debug)]
struct AppError;

#[idempotent(key = "charge:{id}")]
async fn charge(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

fn main() {}
