use idem_runtime::idempotent;
use serde::Serialize;

#[derive(Debug)]
struct AppError;

impl From<idem_runtime::Error> for AppError {
    fn from(_: idem_runtime::Error) -> Self {
        AppError
    }
}

#[derive(Serialize)]
struct Order {
    id: u64,
    customer: Customer,
}

#[derive(Serialize)]
struct Customer {
    email: String,
}

struct Pair(u64, u64);

// Reference arguments, nested fields, tuple fields, escaped braces, and a destructured
// argument that the key does not name.
#[idempotent(
    key = "{{ship}}:{order.customer.email}:{order.id}:{sku}:{pair.1}",
    fingerprint = [order, sku]
)]
async fn ship(
    order: &Order,
    sku: &str,
    pair: &Pair,
    (a, b): (u8, u8),
) -> Result<u64, AppError> {
    Ok(order.id + sku.len() as u64 + pair.0 + u64::from(a) + u64::from(b))
}

fn main() {
    let order = Order {
        id: 1,
        customer: Customer {
            email: "a@b.c".into(),
        },
    };
    let _future = ship(&order, "sku-1", &Pair(1, 2), (1, 2));
}
