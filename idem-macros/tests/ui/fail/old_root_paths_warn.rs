// An old root path compiles, and says where the name went.
#![deny(deprecated)]

use idem_runtime::{DEFAULT_TTL, RecordState, ReplayOk};

fn main() {
    let _ = DEFAULT_TTL;
    let _ = RecordState::Completed;
    let _: Option<ReplayOk> = None;
}
