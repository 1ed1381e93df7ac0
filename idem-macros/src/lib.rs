//! The `#[idempotent]` attribute of [idem](https://docs.rs/idem-runtime).
//!
//! Depend on `idem-runtime`, which re-exports this attribute as
//! `idem_runtime::idempotent`; this crate only rewrites the function, all behaviour lives
//! in the runtime.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod attr;
mod expand;
mod key;

use proc_macro::TokenStream;

/// Makes an `async fn` idempotent: per key, the body runs once and every caller gets the
/// same answer, across concurrent tasks, retries and processes.
///
/// ```
/// use idem_runtime::idempotent;
/// # #[derive(serde::Serialize, serde::Deserialize)] struct Receipt { id: u64 }
/// # struct Order { id: u64 }
/// # #[derive(Debug)] struct ShopError;
/// # impl From<idem_runtime::Error> for ShopError { fn from(_: idem_runtime::Error) -> Self { ShopError } }
/// # async fn gateway_charge(id: u64, cents: u64) -> Result<Receipt, ShopError> { Ok(Receipt { id }) }
///
/// #[idempotent(key = "charge:{order.id}", ttl = "24h")]
/// async fn charge(order: &Order, cents: u64) -> Result<Receipt, ShopError> {
///     gateway_charge(order.id, cents).await
/// }
/// ```
///
/// The signature is unchanged, so call sites do not change. The function must be an
/// `async fn` (free, or a method taking `self` in any form) returning `Result<T, E>`
/// written out in full, with `E: From<idem_runtime::Error>` so idem's own errors
/// (`InProgress`, `Duplicate`, a store that is down, ...) reach the caller.
///
/// # Options
///
/// | option | meaning | default |
/// |---|---|---|
/// | `key = "tmpl"` | required. `{arg}` and `{arg.field.field}` render that value with `Display`; `{{` and `}}` are literal braces | — |
/// | `strategy = "dedup" \| "lock" \| "token"` | run once and replay; mutual exclusion only; consume a one-time token | `"dedup"` |
/// | `ttl = "24h"` | how long a completed record is kept (not for `lock`); must be above zero | `"24h"` |
/// | `lease = "30s"` | in-progress lease, renewed while the body runs; must be above zero | `"30s"` |
/// | `wait = "10s"` | how long a duplicate waits for its in-flight twin, or for the lock; `"0s"` fails at once | `"10s"` |
/// | `on_duplicate = "replay" \| "reject"` | a completed key returns the stored `Ok`, or `Err(Error::Duplicate)` (not for `lock`) | dedup: replay, token: reject |
/// | `fingerprint = [arg, ...]` | hash these (`Serialize`) arguments; the same key with other values is `Error::PayloadMismatch` (not for `lock`) | none |
/// | `cache_err = true` | store `Err` results too instead of releasing the key (not for `lock`) | `false` |
/// | `crate = "path"` | where the runtime is, for a renamed dependency | `::idem_runtime` |
///
/// Durations are an integer and a unit: `ms`, `s`, `m`, `h` or `d` (`"250ms"`, `"7d"`).
///
/// Replaying needs `T: Serialize + DeserializeOwned` (and `E` too with `cache_err`); with
/// `on_duplicate = "reject"` or `strategy = "lock"` the `Ok` type needs no serde bounds.
///
/// Records are named by the function's module path and name plus a digest of the rendered
/// key. A method is named by its module and method name only (an attribute cannot see the
/// `impl` it is in), so two methods of the same name in one module should use keys with
/// distinct literal prefixes.
///
/// Misuse is a compile error at the offending token: a non-async function, a missing
/// `key`, a placeholder that names no parameter, an unknown option or value, an option
/// given twice, a malformed duration, a return type that is not `Result<T, E>`, a
/// replayed type without serde, and options that do not apply to the strategy.
#[proc_macro_attribute]
pub fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::idempotent(args.into(), item.into()).into()
}
