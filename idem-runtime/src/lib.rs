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
//! - [`call_key`]: inside a claimed body, a downstream idempotency key for the call.
//!
//! # Cancellation, leases and results
//!
//! What the attribute (and the direct API) does when a call is cut short or misused:
//!
//! - **A call dropped before its body returned** (a `timeout`, a `select!`, an aborted
//!   task) gives its claim back at once, so a retry runs. A claim still in flight when
//!   the call is dropped is finished in the background and given back: the key is never
//!   left held for a lease by a call that is gone.
//! - **A call dropped after its body returned** never gives the key back: its effect
//!   has happened. The completion is finished in the background (retried on a store
//!   error, as when the store fails after the body), and duplicates wait for it and
//!   replay it.
//! - **An effect in flight when a body is dropped** (a statement sent, a gateway
//!   called) may still land after the release, beside the retry. Pass [`call_key`] to
//!   the downstream API so that it deduplicates the retry, or commit the effect with the
//!   record (transactional mode).
//! - **The lease is renewed by a heartbeat polled with an async body**, every third of
//!   the lease. A body that blocks its thread (`std::thread::sleep`, blocking I/O)
//!   stops the heartbeat and may lose its lease, after which a duplicate can run beside
//!   it: run blocking work in `tokio::task::spawn_blocking` and await it. A lease below
//!   [`MIN_LEASE`] (100 ms) is refused, since the heartbeat could not keep it.
//! - **A function that calls itself with its own key** (directly or through other
//!   idempotent functions, in one task) would wait for itself: the inner call fails at
//!   once with [`Error::InProgress`] (lock: [`Error::Locked`]), and an error is logged.
//!   A call made from another task (`tokio::spawn`) cannot be told from a real twin
//!   and waits as one.
//! - **A result that does not serialize** is recorded as done without a value: its
//!   first caller gets its `Ok`, later callers [`Error::Duplicate`] (the body never runs
//!   again). **A result that serializes but does not deserialize** (a field skipped on
//!   the way out and required on the way in, say) is caught before it is stored: the key
//!   is recorded the same way, and its first caller gets [`Error::Codec`], so the fault
//!   shows at once instead of as a codec error on every replay.
#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod codec;
mod error;
mod fingerprint;
mod handle;
pub mod inspect;
mod intern;
mod key;
pub mod observe;
mod operator;
pub mod options;
pub mod recover;
mod runtime;
pub mod store;
pub mod strategy;
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;
pub mod toolbox;

// The root holds what a user writes in their first hour; the rest is in the public
// modules above (`codec`, `inspect`, `options`, `store`, `toolbox`), with its old root
// paths kept below as deprecated aliases for one release.
pub use codec::Codec;
pub use error::Error;
pub use fingerprint::Fingerprint;
pub use handle::Idem;
pub use idem_macros::{idempotent, retry_on_conflict, transition};
pub use key::Key;
pub use options::{OnDuplicate, Options};
pub use runtime::{IdemBuilder, current, init};
pub use store::Store;
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
pub use strategy::call_ctx::call_key;
pub use strategy::lock::fence;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite")))
)]
pub use strategy::step::step_tx;
pub use strategy::step::{StepCtx, Verified, step};
// The attribute and the function it expands to share one name (and one import).
pub use toolbox::{IsConflict, retry_on_conflict};

include!("moved_names.rs");

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeDoctests;

#[doc(hidden)]
#[path = "private/mod.rs"]
pub mod __private;
