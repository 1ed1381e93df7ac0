use idem_runtime::idempotent;
use serde::{Deserialize, Serialize};

#[derive(Debug)]
struct AppError;

impl From<idem_runtime::Error> for AppError {
    fn from(_: idem_runtime::Error) -> Self {
        AppError
    }
}

#[derive(Serialize, Deserialize)]
struct Order {
    id: u64,
}

#[idempotent(key = "{token}", strategy = "token", ttl = "15m")]
async fn submit(token: String, id: u64) -> Result<Order, AppError> {
    let _ = token;
    Ok(Order { id })
}

// Token default is reject, so no serde needed; replay is opt-in.
struct Ack;

#[idempotent(key = "{token}", strategy = "token")]
async fn ack(token: &str) -> Result<Ack, AppError> {
    let _ = token;
    Ok(Ack)
}

#[idempotent(key = "{token}", strategy = "token", on_duplicate = "replay")]
async fn submit_replayed(token: &str) -> Result<Order, AppError> {
    let _ = token;
    Ok(Order { id: 1 })
}

fn main() {
    let _a = submit("t".into(), 1);
    let _b = ack("t");
    let _c = submit_replayed("t");
}
