use idem_runtime::idempotent;

#[derive(Debug)]
struct AppError;

impl From<idem_runtime::Error> for AppError {
    fn from(_: idem_runtime::Error) -> Self {
        AppError
    }
}

// A lock stores nothing, so the `Ok` type needs no serde.
struct Reservation {
    fence: Option<u64>,
}

#[idempotent(key = "stock:{sku}", strategy = "lock", lease = "250ms", wait = "0s")]
async fn reserve(sku: &str) -> Result<Reservation, AppError> {
    let _ = sku;
    Ok(Reservation {
        fence: idem_runtime::fence(),
    })
}

fn main() {
    let _future = reserve("sku-1");
}
