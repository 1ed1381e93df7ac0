//! `recover` with `context`: recorded arguments (owned, `&T`, `&str`, `&[T]`), context
//! arguments (`&T` and owned), and the recoverer that finds the function by itself.
use idem_runtime::{Idem, idempotent};
use serde::{Deserialize, Serialize};

#[derive(Debug)]
struct AppError;

impl From<idem_runtime::Error> for AppError {
    fn from(_: idem_runtime::Error) -> Self {
        AppError
    }
}

impl std::fmt::Display for AppError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("app error")
    }
}

#[derive(Serialize, Deserialize)]
struct Order {
    id: u64,
    cents: u64,
}

struct Gateway;

#[derive(Clone)]
struct Pool;

#[idempotent(key = "charge:{order.id}", recover, context = [gateway, pool])]
async fn charge(
    order: &Order,
    note: &str,
    tags: &[String],
    gateway: &Gateway,
    pool: Pool,
    attempt: u32,
) -> Result<u64, AppError> {
    let _ = (note, tags, gateway, pool, attempt);
    Ok(order.cents)
}

fn main() {
    let idem = Idem::builder().build();
    let _ = idem.recoverer().provide(Gateway).provide(Pool);
    let _ = charge;
}
