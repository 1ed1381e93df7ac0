//! The toolbox beside the three strategies: Bloom pre-filters, optimistic (versioned)
//! values and state machines, each with its guide in [`strategy`](crate::strategy).

pub use crate::strategy::bloom::{BloomFilter, BloomStats, Filtered, Verdict};
pub use crate::strategy::optimistic::{
    IsConflict, Optimistic, Retry, Versioned, retry_on_conflict,
};
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite")))
)]
pub use crate::strategy::state_machine::StateColumn;
#[allow(deprecated)]
pub use crate::strategy::state_machine::Step;
pub use crate::strategy::state_machine::{Moved, StateMachine, StateMachineBuilder};
