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
//! (`strategy::dedup`, `lock`, `token`, `optimistic`, `state_machine`, `bloom`) explains
//! it in depth, with examples.
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
//! - [`Store`]: the one trait a backend implements; [`MemoryStore`] is built in.
//! - [`Error`]: every failure, naming the key's digest, never the key.
#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod codec;
mod error;
mod inspect;
mod key;
pub mod observe;
mod options;
mod runtime;
pub mod store;
mod strategy;
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;

pub use codec::{CloneReplay, Codec, NoReplay, NoReplayResult, ReplayOk, ReplayResult};
pub use error::{BoxError, Error};
pub use idem_macros::{idempotent, retry_on_conflict, transition};
pub use inspect::{RecordCount, RecordCounts, RecordInfo, RecordState};
pub use key::{Fingerprint, FingerprintBuilder, Key, TOKEN_SCOPE, intern};
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
pub use store::{
    ClaimKind, ClaimOutcome, ClaimRequest, LocalStore, Memo, Owner, Store, Subscription,
};
pub use strategy::bloom::{BloomFilter, BloomStats, Filtered, Verdict};
pub use strategy::lock::fence;
pub use strategy::optimistic::{IsConflict, Optimistic, Retry, Versioned, retry_on_conflict};
pub use strategy::state_machine::{StateMachine, StateMachineBuilder, Step};

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeDoctests;

/// What the expansions of `#[idempotent]`, `#[retry_on_conflict]` and `#[transition]`
/// refer to. Not a public API: it may change in any release.
#[doc(hidden)]
pub mod __private {
    pub use crate::codec::{
        ByClone, ByDecode, NoReplay, NoReplayResult, Probe, ReplayOk, ReplayResult,
    };
    pub use crate::key::FingerprintBuilder;
    pub use crate::key::KeyWriter;
    pub use crate::key::parts::{Part, ViaDisplay, ViaFast};
    pub use crate::options::{OnDuplicate, Options};
    pub use crate::runtime::Current;

    /// The runtime a call under `#[idempotent]` uses.
    pub fn current() -> Current {
        Current::get()
    }
    pub use crate::runtime::private::{dedup, lock, replay_now, token};
    #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
    pub use crate::store::sql::{TxBegun, tx_begin, tx_end};
    #[cfg(not(any(feature = "postgres", feature = "mysql", feature = "sqlite")))]
    pub use no_sql::{TxBegun, tx_begin, tx_end};

    /// Without a SQL feature, `transaction = ...` still expands, and fails to compile
    /// with a message that says which feature to enable.
    #[cfg(not(any(feature = "postgres", feature = "mysql", feature = "sqlite")))]
    mod no_sql {
        use crate::{Error, Fingerprint, Idem, Key, Options};

        #[diagnostic::on_unimplemented(
            message = "`transaction = ...` needs a SQL store: enable idem-runtime's feature \
                       `postgres`, `mysql` or `sqlite`"
        )]
        pub trait SqlFeature {}

        pub enum TxBegun<R> {
            Replayed(R),
            Claimed(TxClaim),
        }

        pub struct TxClaim;

        const NO_SQL: Error = Error::Unsupported("transactional mode without a SQL feature");

        pub async fn tx_begin<C, X: SqlFeature + ?Sized, T, E>(
            _: &Idem,
            _: &Options,
            _: &mut X,
            _: Key,
            _: Option<Fingerprint>,
        ) -> Result<TxBegun<Result<T, E>>, Error> {
            Err(NO_SQL)
        }

        pub async fn tx_end<C, X: SqlFeature + ?Sized, T, E>(
            _: TxClaim,
            _: &mut X,
            _: &Result<T, E>,
        ) -> Result<(), Error> {
            Err(NO_SQL)
        }
    }
    pub use crate::strategy::optimistic::{
        Retry, attribute_policy as retry_policy, retry_on_conflict,
    };
    pub use crate::strategy::state_machine::{StateMachine, attribute_move as transition};
    pub use std::time::Duration;

    /// Compile-time check that a replayed `Ok` type can be stored.
    pub fn assert_replayable<T: serde::Serialize + serde::de::DeserializeOwned>() {}

    /// Compile-time check that the function's error type can carry idem's errors.
    pub fn assert_error<E: From<crate::Error>>() {}
}
