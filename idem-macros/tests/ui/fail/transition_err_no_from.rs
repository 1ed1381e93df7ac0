use std::sync::LazyLock;

use idem_runtime::transition;
use idem_runtime::toolbox::{StateMachine, Moved};

static ORDER: LazyLock<StateMachine> = LazyLock::new(|| {
    StateMachine::builder("shop::order")
        .states(["paid", "shipped"])
        .initial("paid")
        .allow("paid", ["shipped"])
        .build()
        .expect("valid")
});

// No `From<idem_runtime::Error>`: an invalid transition would have nowhere to go.
#[derive(Debug)]
struct ShopError;

#[transition(machine = ORDER, key = "{id}", to = "shipped")]
async fn ship(id: u64) -> Result<Moved<u64>, ShopError> {
    Ok(id)
}

fn main() {}
