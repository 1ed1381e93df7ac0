//! The bounds an expansion needs on the user's types, asserted once at the top of the
//! rewritten function, at the user's return type (a fingerprint entry: at the entry),
//! with a message that says what to write. Without them an unmet bound is reported by the runtime function that needs
//! it, in terms of `__private` and `Codec`, and serde's two traits give two errors.
//!
//! rustc reports an unmet bound with the message of the trait that was asked for when
//! the failing bound is on the same type, and then drops the same failure found later
//! at the same span (the runtime calls the expansion spans there too), so the user sees
//! one error per type.

use std::marker::PhantomData;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::Error;

/// `E: From<idem_runtime::Error>`, so idem's own errors reach the caller.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot carry idem's own errors: an idempotent function's error type \
               needs `From<idem_runtime::Error>`",
    label = "`{Self}` has no `From<idem_runtime::Error>`",
    note = "add a variant to `{Self}`: `#[error(transparent)] Idem(#[from] idem_runtime::Error)` \
            (with thiserror), or write `impl From<idem_runtime::Error> for {Self}`; a call \
            that finds its twin in progress, a duplicate or a store that is down returns \
            through it"
)]
pub trait CarriesIdemErrors {}

impl<E: From<Error>> CarriesIdemErrors for E {}

/// The marker of the one impl of [`ReplayableOk`] and [`ReplayableErr`] a type can have.
pub struct Serde;
/// The marker of an impl no type has (see [`ReplayableOk`]).
pub struct Never;

/// A type no one implements: the second impl of [`ReplayableOk`] and [`ReplayableErr`]
/// is for these.
pub trait Unreplayable: Serialize + DeserializeOwned {}

/// `T: Serialize + DeserializeOwned`, where a duplicate gets the first call's `Ok` back.
///
/// Two impls, one unreachable: with two candidates rustc checks each whole, and a type
/// that is neither fails at this trait, in one error with this message; with one impl
/// it would fail at `Serialize` and at `Deserialize`, in two errors with serde's.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be replayed: a duplicate call gets the first call's `Ok` value \
               back from the store, so it must be `Serialize + DeserializeOwned`",
    label = "the `Ok` type `{Self}` is not `Serialize + DeserializeOwned`",
    note = "derive `serde::Serialize` and `serde::Deserialize` for `{Self}`, or write \
            `on_duplicate = \"reject\"` so a duplicate gets `Err(Error::Duplicate)` and \
            nothing is stored"
)]
pub trait ReplayableOk<M>: Serialize + DeserializeOwned {}

impl<T: Serialize + DeserializeOwned> ReplayableOk<Serde> for T {}
impl<T: Unreplayable> ReplayableOk<Never> for T {}

/// `E: Serialize + DeserializeOwned` with `cache_err = true`; see [`ReplayableOk`].
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be stored: with `cache_err = true` a duplicate gets the first \
               call's `Err` back from the store, so it must be `Serialize + DeserializeOwned`",
    label = "the error type `{Self}` is not `Serialize + DeserializeOwned`",
    note = "derive `serde::Serialize` and `serde::Deserialize` for `{Self}`, or remove \
            `cache_err = true` so an `Err` releases the key and a retry runs"
)]
pub trait ReplayableErr<M>: Serialize + DeserializeOwned {}

impl<E: Serialize + DeserializeOwned> ReplayableErr<Serde> for E {}
impl<E: Unreplayable> ReplayableErr<Never> for E {}

/// `S: Serialize`, for an argument named in `fingerprint = [...]`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be fingerprinted: an argument named in `fingerprint = [...]` \
               is hashed from its `Serialize` form",
    label = "not `Serialize`",
    note = "derive `serde::Serialize` for it, or leave this argument out of the fingerprint"
)]
pub trait Fingerprinted {}

impl<S: Serialize + ?Sized> Fingerprinted for S {}

/// Asserts that a fingerprint entry can be hashed.
#[inline(always)]
pub const fn fingerprinted<S: Fingerprinted + ?Sized>(_: &S) {}

/// The function's return type, `Result<T, E>` as written or through an alias. Not a
/// `fn() -> ...`: an elided lifetime there would be a new, unconstrained one, while in
/// `PhantomData::<Result<&str, E>>` it is inferred, as in the function's body.
pub type Returns<T, E> = PhantomData<Result<T, E>>;

/// Asserts that the error type carries idem's errors.
#[inline(always)]
pub const fn carries_idem_errors<T, E: CarriesIdemErrors>(_: Returns<T, E>) {}

/// Asserts that the `Ok` type can be replayed.
#[inline(always)]
pub const fn replayable_ok<T: ReplayableOk<M>, E, M>(_: Returns<T, E>) {}

/// Asserts that the error type can be stored and replayed (`cache_err = true`).
#[inline(always)]
pub const fn replayable_err<T, E: ReplayableErr<M>, M>(_: Returns<T, E>) {}

/// `A: Serialize + DeserializeOwned`, for an argument of a function marked `recover`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be recorded for recovery: a function marked `recover` keeps \
               its arguments with its claim, so each must be `Serialize + DeserializeOwned` \
               (a `&T` is recorded as `T`)",
    label = "not `Serialize + DeserializeOwned`",
    note = "derive `serde::Serialize` and `serde::Deserialize` for it; or, if it is a \
            dependency (a pool, a client) rather than data, name it in `context = [...]` \
            and give the recoverer a value of its type with `Recoverer::provide`"
)]
pub trait Recorded<M>: Serialize + DeserializeOwned {}

impl<A: Serialize + DeserializeOwned> Recorded<Serde> for A {}
impl<A: Unreplayable> Recorded<Never> for A {}

/// Asserts that an argument of a `recover` function can be recorded (`A` is the
/// argument's type with a reference removed).
#[inline(always)]
pub const fn recorded<A: Recorded<M>, M>(_: PhantomData<A>) {}

/// `E: Display`, so a recovered call's error can be logged and kept.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be reported: a recoverer logs the error of a call it ran, so a \
               function marked `recover` needs an error type that is `Display`",
    label = "not `Display`",
    note = "implement `std::fmt::Display` for it (thiserror's `#[error(...)]` does)"
)]
pub trait Reported: std::fmt::Display {}

impl<E: std::fmt::Display> Reported for E {}

/// Asserts that the error type can be reported by a recoverer.
#[inline(always)]
pub const fn reported<T, E: Reported>(_: Returns<T, E>) {}
