use std::sync::LazyLock;

use idem_runtime::{Error, transition};
use idem_runtime::toolbox::StateMachine;

static ORDER: LazyLock<StateMachine> = LazyLock::new(|| {
    StateMachine::builder("shop::order")
        .states(["paid", "shipped"])
        .initial("paid")
        .allow("paid", ["shipped"])
        .build()
        .expect("valid")
});

// The body yields the value; the function says whether this call moved the key.
#[transition(machine = ORDER, key = "{id}", to = "shipped")]
async fn ship(id: u64) -> Result<u64, Error> {
    Ok(id)
}

fn main() {}
