use idem_runtime::idempotent;

#[idempotent(key = "charge:{id}")]
struct Charge {
    id: u64,
}

fn main() {
    let _ = Charge { id: 1 }.id;
}
