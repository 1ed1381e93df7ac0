use idem_runtime::idempotent;

#[derive(Debug)]
struct AppError;

impl From<idem_runtime::Error> for AppError {
    fn from(_: idem_runtime::Error) -> Self {
        AppError
    }
}

// The heartbeat renews every third of the lease: it cannot keep one of 1ms, and the
// duplicates would run beside the body.
#[idempotent(key = "charge:{id}", lease = "1ms")]
async fn charge(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

// 99ms is still below the floor.
#[idempotent(key = "refund:{id}", lease = "99ms")]
async fn refund(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

// The floor itself is accepted.
#[idempotent(key = "void:{id}", lease = "100ms")]
async fn void(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

fn main() {}
