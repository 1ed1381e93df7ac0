use idem_runtime::idempotent;

#[derive(Debug)]
struct AppError;

impl From<idem_runtime::Error> for AppError {
    fn from(_: idem_runtime::Error) -> Self {
        AppError
    }
}

struct Order {
    id: u64,
}

#[idempotent(key = "charge:{ordr.id}")]
async fn charge(order: &Order) -> Result<u64, AppError> {
    Ok(order.id)
}

fn main() {}
