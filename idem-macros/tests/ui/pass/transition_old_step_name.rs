// `Step`, the old name of `Moved`, still compiles for one release (with a deprecation
// warning, allowed here), and `#[transition]` accepts it.
#![allow(deprecated)]

use std::sync::LazyLock;

use idem_runtime::{Error, transition};
use idem_runtime::toolbox::{StateMachine, Step};

static ORDER: LazyLock<StateMachine> = LazyLock::new(|| {
    StateMachine::builder("shop::order_old_name")
        .states(["created", "paid"])
        .initial("created")
        .allow("created", ["paid"])
        .build()
        .expect("valid")
});

#[transition(machine = ORDER, key = "order:{id}", to = "paid")]
async fn pay(id: u64) -> Result<Step<u64>, Error> {
    Ok(id)
}

fn main() {
    let _ = pay(7);
    let already: Step<u64> = Step::AlreadyThere;
    assert!(!already.performed());
}
