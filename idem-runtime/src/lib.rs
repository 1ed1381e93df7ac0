//! Make async functions idempotent with one attribute.
//!
//! ```
//! use idem_runtime::idempotent;
//! # #[derive(Debug)] struct ShopError(idem_runtime::Error);
//! # impl From<idem_runtime::Error> for ShopError { fn from(e: idem_runtime::Error) -> Self { ShopError(e) } }
//! # struct Order { id: u64 }
//! # #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)] struct Receipt { cents: u64 }
//!
//! #[idempotent(key = "charge:{order.id}", ttl = "24h")]
//! async fn charge(order: &Order, cents: u64) -> Result<Receipt, ShopError> {
//!     // talk to the payment gateway: runs once per order id
//!     Ok(Receipt { cents })
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), ShopError> {
//! let order = Order { id: 42 };
//! let first = charge(&order, 100).await?;
//! let retry = charge(&order, 100).await?; // replayed, not charged again
//! assert_eq!(first, retry);
//! # Ok(()) }
//! ```
//!
//! Called once or a thousand times, concurrently or as retries, from one process or
//! many (with a shared store), the body runs once per key and every caller gets the
//! same answer. [`idempotent`] lists the attribute's options; each strategy's module
//! ([`strategy::dedup`], [`lock`](strategy::lock), [`token`](strategy::token),
//! [`optimistic`](strategy::optimistic), [`state_machine`](strategy::state_machine),
//! [`bloom`](strategy::bloom)) explains it in depth, with examples.
//!
//! # Pieces
//!
//! - [`idempotent`]: the attribute. Two siblings tie toolbox pieces to a function:
//!   [`macro@retry_on_conflict`] re-runs a body that lost an optimistic race (the
//!   [`fn@retry_on_conflict`] helper, as an attribute), and [`transition`] runs a body as
//!   a state-machine move ([`Idem::transition_with`], as an attribute).
//! - [`Idem`]: the runtime (a [`Store`] and a namespace), with a direct API for each
//!   strategy: [`Idem::dedup`], [`Idem::lock`], [`Idem::issue_token`],
//!   [`Idem::consume_token`].
//! - [`Store`]: the one trait a backend implements; [`MemoryStore`] is built in. The
//!   types only a backend's implementor needs live in [`store`].
//! - [`Error`]: every failure, naming the key's digest, never the key.
#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod codec;
mod error;
mod fingerprint;
mod inspect;
mod intern;
mod key;
pub mod observe;
mod options;
mod runtime;
pub mod store;
pub mod strategy;
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;

pub use codec::{CloneReplay, Codec, NoReplay, NoReplayResult, ReplayOk, ReplayResult};
pub use error::{BoxError, Error};
pub use fingerprint::{Fingerprint, FingerprintBuilder};
pub use idem_macros::{idempotent, retry_on_conflict, transition};
pub use key::Key;
pub use options::{DEFAULT_LEASE, DEFAULT_TTL, DEFAULT_WAIT, OnDuplicate, Options, Strategy};
pub use runtime::{Builder, DEFAULT_NAMESPACE, Idem, Stats, current, init, issue_token};
pub use store::memory::MemoryStore;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use store::redis::RedisStore;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite")))
)]
pub use store::sql::SqlStore;
pub use store::{RecordCount, RecordCounts, RecordInfo, RecordState, Store};
pub use strategy::bloom::{BloomFilter, BloomStats, Filtered, Verdict};
pub use strategy::lock::fence;
pub use strategy::optimistic::{IsConflict, Optimistic, Retry, Versioned, retry_on_conflict};
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite")))
)]
pub use strategy::state_machine::StateColumn;
pub use strategy::state_machine::{StateMachine, StateMachineBuilder, Step};

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeDoctests;

#[doc(hidden)]
#[path = "private/mod.rs"]
pub mod __private;
