use std::sync::Arc;

use idem_runtime::{Error, Idem, idempotent};

// The runtime is named by the function, from its parameters: no `init`, no scope.
struct Service {
    idem: Idem,
}

impl Service {
    #[idempotent(key = "charge:{order}", idem = self.idem)]
    async fn charge(&self, order: u64) -> Result<u64, Error> {
        Ok(order)
    }

    #[idempotent(key = "stock:{sku}", strategy = "lock", idem = &self.idem)]
    async fn reserve(&self, sku: String) -> Result<(), Error> {
        let _ = sku;
        Ok(())
    }
}

struct AppState {
    idem: Idem,
}

// A reference, as an axum handler gets its `State`.
#[idempotent(key = "ship:{order}", idem = &state.idem)]
async fn ship(state: Arc<AppState>, order: u64) -> Result<u64, Error> {
    Ok(order)
}

// An owned runtime, moved into the body after the runtime was taken from it.
#[idempotent(key = "label:{order}", idem = idem.clone(), on_duplicate = "reject")]
async fn label(idem: Idem, order: u64) -> Result<String, Error> {
    Ok(format!("{}:{order}", idem.namespace()))
}

fn main() {
    let idem = Idem::builder().build();
    let service = Service { idem: idem.clone() };
    let state = Arc::new(AppState { idem: idem.clone() });
    let _ = service.charge(1);
    let _ = service.reserve("sku".to_owned());
    let _ = ship(state, 1);
    let _ = label(idem, 1);
}
