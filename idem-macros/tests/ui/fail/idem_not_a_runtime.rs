use idem_runtime::{Error, idempotent};

// `idem = ...` names the runtime; a store or a name is not one.
#[idempotent(key = "charge:{order}", idem = "shop")]
async fn charge(order: u64) -> Result<u64, Error> {
    Ok(order)
}

fn main() {}
