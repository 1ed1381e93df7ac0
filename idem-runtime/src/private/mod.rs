//! What the expansions of `#[idempotent]`, `#[retry_on_conflict]` and `#[transition]`
//! refer to, all in this one module (exported as `__private`, hidden). Not a public
//! API: it may change in any release, together with the macros that emit these paths.
//!
//! - The functions an expansion calls are in `entry`; the bounds it asserts on the user's
//!   types, with messages that say what to write, in `bounds`.
//! - The types it names are re-exported here under the names it uses.
//! - Without a SQL feature, `transaction = ...` expands against the stub in `no_sql`.
//! - One helper is for the workspace's own tests instead (`without_returning`), so that
//!   `SqlStore` has no hidden method of its own.

mod args;
mod bounds;
mod entry;
#[cfg(not(any(feature = "postgres", feature = "mysql", feature = "sqlite")))]
mod no_sql;
mod probe;

pub use crate::recover::{Context, Ran, Recoverable, decode_args, encode_args, ran};
pub use crate::store::BoxFuture;
pub use args::{ArgsReader, ArgsWriter};
pub use bounds::{
    CarriesIdemErrors, Fingerprinted, Recorded, ReplayableErr, ReplayableOk, Reported, Returns,
    carries_idem_errors, fingerprinted, recorded, replayable_err, replayable_ok, reported,
};
pub use bytes::Bytes;
pub use entry::{
    GivenRuntime, current, dedup, dedup_recoverable, given, lock, replay_now, retry_policy, token,
    transition, tx_span,
};
pub use inventory::submit;
pub use std::any::TypeId;
pub use std::sync::Arc;

pub use crate::codec::{NoReplay, NoReplayResult, ReplayOk, ReplayResult};
pub use crate::fingerprint::FingerprintBuilder;
pub use crate::key::KeyWriter;
pub use crate::key::parts::{Part, ViaDisplay, ViaFast};
pub use crate::options::{OnDuplicate, Options};
pub use crate::runtime::Current;
pub use crate::strategy::optimistic::{Retry, retry_on_conflict};
pub use crate::strategy::state_machine::StateMachine;
pub use probe::{ByClone, ByDecode, Probe};
pub use std::time::Duration;
pub use tracing::Instrument;

#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub use crate::strategy::transaction::TxBegun;

/// For the workspace's own tests, not the macros: `store` taking the two-statement claim
/// that MySQL needs even on MariaDB (which can do it in one), so that path runs on the
/// server at hand. Only a MySQL store changes.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub fn without_returning(store: crate::SqlStore) -> crate::SqlStore {
    store.without_returning()
}
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub use entry::{tx_begin, tx_end};
#[cfg(not(any(feature = "postgres", feature = "mysql", feature = "sqlite")))]
pub use no_sql::{TxBegun, tx_begin, tx_end};
