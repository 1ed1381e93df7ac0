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

#[transition(machine = ORDER, key = "{id}", to = "shipped")]
async fn ship(id: u64) -> Moved<u64> {
    Moved::Performed { from: None, value: id }
}

// A one-parameter alias hides the error type the body needs.
type ShopResult<T> = Result<T, idem_runtime::Error>;

#[transition(machine = ORDER, key = "{id}", to = "shipped")]
async fn ship_alias(id: u64) -> ShopResult<Moved<u64>> {
    Ok(Moved::Performed { from: None, value: id })
}

fn main() {}
