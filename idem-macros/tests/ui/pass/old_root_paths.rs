// The names that left idem_runtime's root still compile at their old paths for one
// release (each use warns: see tests/ui/fail/old_root_paths_warn.rs).
#![allow(deprecated)]

use idem_runtime::{
    BloomFilter, BoxError, Builder, DEFAULT_LEASE, DEFAULT_NAMESPACE, DEFAULT_TTL, DEFAULT_WAIT,
    FingerprintBuilder, MIN_LEASE, NoReplay, Optimistic, RecordState, ReplayOk, ReplayResult, Retry,
    StateMachine, Stats, Step, Strategy, Verdict,
};

fn main() {
    let _: Builder = idem_runtime::Idem::builder();
    let _ = (DEFAULT_LEASE, DEFAULT_TTL, DEFAULT_WAIT, MIN_LEASE, DEFAULT_NAMESPACE);
    let _ = FingerprintBuilder::new();
    let _ = RecordState::Completed;
    let _ = Verdict::New;
    let _ = Strategy::Dedup;
    let _: Option<(ReplayOk, ReplayResult, NoReplay, Stats, Retry)> = None;
    let _: Option<(BloomFilter, Optimistic, StateMachine, BoxError)> = None;
    let _: Step = Step::AlreadyThere;
}
