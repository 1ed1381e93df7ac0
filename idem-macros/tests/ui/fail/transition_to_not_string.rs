use std::sync::LazyLock;

use idem_runtime::{Error, transition};
use idem_runtime::toolbox::{StateMachine, Moved};

static ORDER: LazyLock<StateMachine> = LazyLock::new(|| {
    StateMachine::builder("shop::order")
        .states(["paid", "shipped"])
        .initial("paid")
        .allow("paid", ["shipped"])
        .build()
        .expect("valid")
});

#[transition(machine = ORDER, key = "{id}", to = shipped)]
async fn ship(id: u64) -> Result<Moved<u64>, Error> {
    Ok(id)
}

#[transition(machine = ORDER, key = "{id}", to = "")]
async fn nowhere(id: u64) -> Result<Moved<u64>, Error> {
    Ok(id)
}

fn main() {}
