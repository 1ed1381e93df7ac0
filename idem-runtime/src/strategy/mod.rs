//! The strategies, each written once on top of the [`Store`](crate::Store) trait.

pub(crate) mod bloom;
pub(crate) mod claim;
pub(crate) mod dedup;
pub(crate) mod lock;
pub(crate) mod optimistic;
pub(crate) mod state_machine;
pub(crate) mod token;
