use idem_runtime::idempotent;

#[derive(Debug)]
struct AppError;

impl From<idem_runtime::Error> for AppError {
    fn from(_: idem_runtime::Error) -> Self {
        AppError
    }
}

struct Cart {
    total: u64,
}

#[idempotent(key = "checkout:{id}", fingerprint = [cart])]
async fn checkout(id: u64, cart: &Cart) -> Result<u64, AppError> {
    Ok(id + cart.total)
}

fn main() {}
