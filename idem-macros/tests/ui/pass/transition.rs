use std::sync::LazyLock;

use idem_runtime::{Error, IsConflict, retry_on_conflict, transition};
use idem_runtime::toolbox::{StateMachine, Moved};

#[derive(Debug)]
enum ShopError {
    Idem(Error),
    CarrierDown,
}

impl From<Error> for ShopError {
    fn from(e: Error) -> Self {
        ShopError::Idem(e)
    }
}

impl IsConflict for ShopError {
    fn is_conflict(&self) -> bool {
        matches!(self, ShopError::Idem(e) if e.is_conflict())
    }
}

static ORDER: LazyLock<StateMachine> = LazyLock::new(|| {
    StateMachine::builder("shop::order")
        .states(["created", "paid", "shipped"])
        .initial("created")
        .allow("created", ["paid"])
        .allow("paid", ["shipped"])
        .build()
        .expect("valid")
});

mod machines {
    pub static TICKET: std::sync::LazyLock<idem_runtime::toolbox::StateMachine> =
        std::sync::LazyLock::new(|| {
            idem_runtime::toolbox::StateMachine::builder("help::ticket")
                .states(["open", "closed"])
                .initial("open")
                .allow("open", ["closed"])
                .build()
                .expect("valid")
        });
}

struct Parcel {
    id: u64,
}

struct Order {
    id: u64,
}

// `Moved<T>`: the body yields `Result<T, E>`, with `?` and early `return`.
#[transition(machine = ORDER, key = "order:{order.id}", to = "shipped")]
async fn ship(order: &Order, carrier_up: bool) -> Result<Moved<Parcel>, ShopError> {
    if !carrier_up {
        return Err(ShopError::CarrierDown);
    }
    let id = "7".parse::<u64>().map_err(|_| ShopError::CarrierDown)?;
    Ok(Parcel { id: id + order.id })
}

// `Moved` alone is `Moved<()>`; a path to the machine; the full path of `Moved`.
#[transition(machine = machines::TICKET, key = "{ticket}", to = "closed")]
async fn close(ticket: String) -> Result<Moved, Error> {
    drop(ticket); // consumed: the body runs once per call
    Ok(())
}

#[transition(machine = ORDER, key = "{id}", to = "paid")]
async fn pay(id: u64) -> Result<idem_runtime::toolbox::Moved<u64>, Error> {
    Ok(id)
}

struct Shop {
    name: String,
}

impl Shop {
    #[transition(machine = ORDER, key = "{self.name}:{id}", to = "paid")]
    async fn pay(&self, id: u64) -> Result<Moved<String>, ShopError> {
        Ok(format!("{} paid {id}", self.name))
    }
}

// Above #[transition]: the retries run inside one held move.
#[retry_on_conflict(attempts = 3)]
#[transition(machine = ORDER, key = "{id}", to = "shipped")]
async fn ship_retrying(id: u64) -> Result<Moved<u64>, ShopError> {
    Ok(id)
}

fn assert_send<T: Send>(_: T) {}

fn main() {
    let order = Order { id: 1 };
    assert_send(ship(&order, true));
    assert_send(close("t-1".into()));
    assert_send(pay(1));
    assert_send(Shop { name: "s".into() }.pay(1));
    assert_send(ship_retrying(1));
    let _ = |p: Parcel| p.id;
}
