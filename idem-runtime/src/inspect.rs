//! What an operator reads about records: one record ([`Idem::inspect`](crate::Idem::inspect),
//! [`Idem::steps`](crate::Idem::steps)), counts by function and state, and the process's
//! counters of rare events ([`Idem::stats`](crate::Idem::stats)).

pub use crate::runtime::Stats;
pub use crate::store::{RecordCount, RecordCounts, RecordInfo, RecordState, StepInfo};
