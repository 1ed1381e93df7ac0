//! The strategies, each written once on top of the [`Store`](crate::Store) trait.
//!
//! Each module's page is that strategy's guide: when to use it, what it guarantees, and
//! examples. The types users write are also at the crate root.
//!
//! | module | technique |
//! |---|---|
//! | [`dedup`] | run once per key; later calls replay or reject the stored result |
//! | [`lock`] | mutual exclusion across processes: lease, heartbeat, fencing token |
//! | [`token`] | one-time tokens: issue, then consume exactly once |
//! | [`optimistic`] | versioned compare-and-set, with retry on conflict |
//! | [`state_machine`] | atomic moves through a declared transition table |
//! | [`bloom`] | a pre-filter for message ids that never drops a new one |
//! | [`step`](mod@step) | durable steps: several effects in one call, each run once |

pub mod bloom;
pub(crate) mod call_ctx;
pub(crate) mod claiming;
pub mod dedup;
pub mod lock;
pub mod optimistic;
pub mod state_machine;
pub mod step;
pub mod token;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub(crate) mod transaction;
