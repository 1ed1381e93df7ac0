//! The attributes of [idem](https://docs.rs/idem-runtime): `#[idempotent]`, and its
//! siblings `#[retry_on_conflict]` and `#[transition]`.
//!
//! Depend on `idem-runtime`, which re-exports them (`idem_runtime::idempotent`, ...);
//! this crate only rewrites the function, all behaviour lives in the runtime.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

// By phase: how mistakes are reported, how options are parsed, what the function must
// look like, and what every rewrite shares; then one module per attribute.
mod diagnostics;
mod key;
mod options;
mod recover;
mod rewrite;
mod signature;

mod idempotent;
mod retry_on_conflict;
mod transition;

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
/// `async fn` (free, or a method taking `self` in any form) returning `Result<T, E>`, or
/// an alias of it whose name ends in `Result` (`std::result::Result<T, E>`,
/// `AppResult<T>`), with `E: From<idem_runtime::Error>` so idem's own errors
/// (`InProgress`, `Duplicate`, a store that is down, ...) reach the caller.
///
/// # Options
///
/// This is the one list of the options; the macro is tested to declare exactly these.
///
/// | option | meaning | default |
/// |---|---|---|
/// | `key = "tmpl"` | required. What identifies one operation. `{arg}` and `{arg.field.0}` render that value with `Display` (no format specs); each placeholder starts at a parameter bound to a plain name, or `self` in a method; `{{` and `}}` are literal braces. With `strategy = "token"` the key is one placeholder and nothing else, the argument carrying the token (`"{token}"`) | — |
/// | `strategy = "dedup" \| "lock" \| "token"` | run once and replay; mutual exclusion only; consume a one-time token from `Idem::issue_token` | `"dedup"` |
/// | `ttl = "24h"` | how long a completed record (with `token`, the consumed token) is kept; above zero; not for `lock` | `"24h"` |
/// | `lease = "30s"` | in-progress lease, renewed while the body runs (every third of it), so it only decides how soon a crashed holder's key is taken over; at least `"100ms"`, the shortest the heartbeat can keep (a shorter one is a compile error) | `"30s"` |
/// | `wait = "10s"` | how long a duplicate waits for its in-flight twin, or for the lock; `"0s"` fails at once with `Error::InProgress` | `"10s"` |
/// | `on_duplicate = "replay" \| "reject"` | a completed key returns the stored `Ok`, or `Err(Error::Duplicate)`; not for `lock` | dedup: replay, token: reject |
/// | `fingerprint = [arg, ...]` | hash these parameters (`Serialize`; `self` in a method), each named once; the same key with other values is `Error::PayloadMismatch`; not for `lock` | none |
/// | `cache_err = true` | store `Err` results too (`E: Serialize + DeserializeOwned`) instead of releasing the key; not for `lock`, nor with `transaction` | `false` |
/// | `transaction = tx` | on a `SqlStore` (a feature `postgres`, `mysql` or `sqlite` of idem-runtime): claim, run and record inside the caller's open transaction, the parameter `tx` (`&mut sqlx::Transaction<'_, DB>`); they commit together with its writes. An `Err` rolls back to before the call. `dedup` only | none |
/// | `idem = expr` | the runtime this function uses: any expression giving an `Idem` or `&Idem`, which may read the parameters (`self.idem`, `&state.idem`); then neither `init` nor `Idem::scope` is needed, and an enclosing scope is ignored | the current runtime: the enclosing `Idem::scope`, else `init`'s, else a process-local `MemoryStore` (said once on stderr) |
/// | `recover` | the arguments are recorded with the claim, and a recoverer finishes the call if its caller goes away (see `idem_runtime::recover`); a free `async fn` without generics, `dedup` only, every argument `Serialize + DeserializeOwned` (a `&T` recorded as `T`) unless named in `context` | off |
/// | `context = [a, b]` | with `recover`: the arguments that are dependencies, not data (a pool, a client); a recoverer gives them by type from `Recoverer::provide` (`&T` a reference to it, `T` a clone) | none |
/// | `crate = "path"` | where the runtime is, for a renamed dependency | `::idem_runtime` |
///
/// Durations are an integer and a unit: `ms`, `s`, `m`, `h` or `d` (`"250ms"`, `"7d"`).
///
/// A runtime kept in the application's state (axum's `State`, a service struct) is named
/// with `idem`:
///
/// ```
/// use idem_runtime::{Error, Idem, idempotent};
///
/// struct Payments {
///     idem: Idem,
/// }
///
/// impl Payments {
///     #[idempotent(key = "charge:{order}", idem = self.idem)]
///     async fn charge(&self, order: u64, cents: u64) -> Result<u64, Error> {
///         Ok(cents) // call the gateway: runs once per order
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Error> {
/// let payments = Payments { idem: Idem::builder().namespace("shop").build() };
/// assert_eq!(payments.charge(7, 100).await?, 100);
/// assert_eq!(payments.charge(7, 999).await?, 100); // replayed: no init, no scope
/// # Ok(()) }
/// ```
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
/// given twice, a malformed duration, a return type that is not a `Result`, a replayed
/// type without serde, and options that do not apply to the strategy or to each other.
#[proc_macro_attribute]
pub fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    idempotent::expand(args.into(), item.into()).into()
}

/// Re-runs an `async fn` whose body lost an optimistic race: while it returns an `Err`
/// whose `is_conflict()` is true, the whole body runs again, at most `attempts` times in
/// all, with jittered backoff between runs. The attribute form of
/// `idem_runtime::retry_on_conflict(&Retry, || async { ... })`.
///
/// ```
/// use idem_runtime::{Error, Idem, IsConflict, retry_on_conflict};
/// use idem_runtime::toolbox::Optimistic;
///
/// #[derive(Debug)]
/// enum BankError { Idem(Error), Overdrawn }
/// impl From<Error> for BankError {
///     fn from(e: Error) -> Self { BankError::Idem(e) }
/// }
/// impl IsConflict for BankError {
///     fn is_conflict(&self) -> bool { matches!(self, BankError::Idem(e) if e.is_conflict()) }
/// }
///
/// static BALANCE: Optimistic = Optimistic::new("bank::balance");
///
/// // Read, compute, compare-and-set; a lost race re-runs all three.
/// #[retry_on_conflict(attempts = 50, backoff = "1ms", max_backoff = "50ms")]
/// async fn deposit(idem: &Idem, account: &str, cents: i64) -> Result<i64, BankError> {
///     let current = idem.load::<i64>(&BALANCE, account).await?;
///     let (balance, version) = current.map_or((0, 0), |v| (v.value, v.version));
///     if balance + cents < 0 {
///         return Err(BankError::Overdrawn); // not a conflict: returned at once
///     }
///     idem.compare_and_set(&BALANCE, account, version, balance + cents).await?;
///     Ok(balance + cents)
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), BankError> {
/// let idem = Idem::builder().namespace("bank").build();
/// let (a, b) = tokio::join!(deposit(&idem, "acct-7", 100), deposit(&idem, "acct-7", 50));
/// let (a, b) = (a?, b?);
/// assert!(a == 100 && b == 150 || b == 50 && a == 150); // both landed, one after the other
/// assert!(matches!(deposit(&idem, "acct-7", -1000).await, Err(BankError::Overdrawn)));
/// # Ok(()) }
/// ```
///
/// The same name is also the runtime function (`use idem_runtime::retry_on_conflict;`
/// imports both: attributes and functions live in separate namespaces), so the closure
/// form keeps working next to the attribute.
///
/// The function must be an `async fn` (free, or a method taking `self` in any form)
/// returning `Result<T, E>` with `E: idem_runtime::IsConflict`; the signature and the call
/// sites do not change.
///
/// # Options
///
/// | option | meaning | default |
/// |---|---|---|
/// | `attempts = 50` | runs in all, the first included; at least 1 | `10` |
/// | `backoff = "1ms"` | base of the backoff: retry n sleeps a random time up to `min(max_backoff, backoff · 2ⁿ)` | `"2ms"` |
/// | `max_backoff = "50ms"` | cap of one sleep; at least `backoff` | `"100ms"` (or `backoff` if larger) |
/// | `crate = "path"` | where the runtime is, for a renamed dependency | `::idem_runtime` |
///
/// The defaults are `idem_runtime::toolbox::Retry::DEFAULT`. When every run loses, the last
/// conflict is returned.
///
/// # The body runs again
///
/// Each run starts the body afresh, so it must redo the whole read-compute-write (load
/// the value again, then write with the version just read), and it must not consume its
/// arguments: it borrows them, once per run. A body that moves an argument out (passes a
/// `String` argument by value, moves it into a spawned task) is refused by the compiler
/// with "cannot move out of ..., a captured variable in an `FnMut` closure": the closure
/// is this attribute ("captured by this `FnMut` closure"), and the move is labelled in the
/// body ("variable moved due to use in coroutine"). Borrow the argument there, or clone
/// it.
///
/// # With `#[idempotent]` or `#[transition]`
///
/// Write `#[retry_on_conflict]` **above** the other attribute: the retries then run inside
/// its claim (or held move), and the result is recorded once.
///
/// ```
/// # use idem_runtime::{Error, Idem, Optimistic, idempotent, retry_on_conflict};
/// # static POINTS: Optimistic = Optimistic::new("loyalty::points");
/// // Credits an order's points exactly once, racing other writers of the same balance.
/// #[retry_on_conflict(attempts = 20)]
/// #[idempotent(key = "points-for:{order_id}")]
/// async fn credit_points(idem: &Idem, customer: &str, order_id: u64) -> Result<u64, Error> {
///     let current = idem.load::<u64>(&POINTS, customer).await?;
///     let (points, version) = current.map_or((0, 0), |v| (v.value, v.version));
///     idem.compare_and_set(&POINTS, customer, version, points + 10).await?;
///     Ok(points + 10)
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Error> {
/// # let idem = Idem::builder().build();
/// # assert_eq!(idem.scope(credit_points(&idem, "alice", 1)).await?, 10);
/// # assert_eq!(idem.scope(credit_points(&idem, "alice", 1)).await?, 10); // replayed
/// # assert_eq!(idem.scope(credit_points(&idem, "alice", 2)).await?, 20);
/// # Ok(()) }
/// ```
///
/// Written below one of them it is a compile error (attributes expand from the top down,
/// and below, every retry would claim the key again). It is also an error given twice.
///
/// Misuse is a compile error at the offending token: a non-async function, a return type
/// that is not a `Result`, an error type without `IsConflict`, an unknown option, an option
/// given twice, `attempts = 0`, a malformed duration, `max_backoff` below `backoff`.
#[proc_macro_attribute]
pub fn retry_on_conflict(args: TokenStream, item: TokenStream) -> TokenStream {
    retry_on_conflict::expand(args.into(), item.into()).into()
}

/// Runs an `async fn` as a state-machine move: the key moves to `to` and the body runs
/// only for the caller that performs the move. The attribute form of
/// `Idem::transition_with(&machine, key, to, body)`, on the current runtime (like
/// `#[idempotent]`).
///
/// ```
/// use std::sync::LazyLock;
/// use idem_runtime::{Error, Idem, transition};
/// use idem_runtime::toolbox::{StateMachine, Moved};
///
/// static ORDER: LazyLock<StateMachine> = LazyLock::new(|| {
///     StateMachine::builder("shop::order")
///         .states(["created", "paid", "shipped", "cancelled"])
///         .initial("created")
///         .allow("created", ["paid", "cancelled"])
///         .allow("paid", ["shipped", "cancelled"])
///         .terminal(["shipped", "cancelled"])
///         .build()
///         .expect("a valid table")
/// });
///
/// #[derive(Debug, PartialEq)]
/// struct Parcel(u64);
///
/// // The function returns `Result<Moved<T>, E>`; the body yields `Result<T, E>`.
/// #[transition(machine = ORDER, key = "{order_id}", to = "shipped")]
/// async fn ship(order_id: u64) -> Result<Moved<Parcel>, Error> {
///     // call the carrier: runs once per order, for the caller that ships it
///     Ok(Parcel(order_id * 10))
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Error> {
/// let idem = Idem::builder().namespace("shop").build();
/// idem.scope(async {
///     idem.transition(&ORDER, 42, "created").await?;
///     idem.transition(&ORDER, 42, "paid").await?;
///     let first = ship(42).await?;
///     let again = ship(42).await?; // a redelivered event
///     assert_eq!(first, Moved::Performed { from: Some("paid".into()), value: Parcel(420) });
///     assert_eq!(again, Moved::AlreadyThere); // shipped once
///
///     idem.transition(&ORDER, 7, "created").await?;
///     let early = ship(7).await; // not paid: refused, the body did not run
///     assert!(matches!(early, Err(Error::InvalidTransition { from: Some(ref s), .. }) if s == "created"));
///     Ok(())
/// })
/// .await
/// # }
/// ```
///
/// The function must be an `async fn` (free, or a method taking `self` in any form)
/// returning `Result<Moved<T>, E>` (`Result<Moved, E>` for `T = ()`) with
/// `E: From<idem_runtime::Error>`. The body is written as returning `Result<T, E>`:
/// `Ok(value)`, `?` and early `return` work as usual. Callers get:
///
/// - `Ok(Moved::Performed { from, value })`: this call moved the key from `from` to `to`
///   and its body returned `Ok(value)`;
/// - `Ok(Moved::AlreadyThere)`: the key already was at `to`; the body did not run;
/// - `Err(Error::InvalidTransition { from, to }.into())`: the table does not allow the
///   move from the current state; the body did not run;
/// - the body's own `Err`: the move is dropped, the key stays where it was, and a retry
///   can perform it.
///
/// While one caller's body runs, the move is held on the key: other callers (of this
/// function or any other move on the key) wait, up to the machine's `wait`, for it to
/// settle, then see `AlreadyThere` (or perform the move themselves if the body failed),
/// or `Error::InProgress` if it did not settle in time.
///
/// # Options
///
/// | option | meaning |
/// |---|---|
/// | `machine = PATH` | required. A `static` `StateMachine`, or a static that derefs to one (`LazyLock<StateMachine>`) |
/// | `key = "tmpl"` | required. Which record moves; the template of `#[idempotent]`: `{arg}` and `{arg.field.field}` render that value with `Display`, `{{`/`}}` are literal braces |
/// | `to = "state"` | required. The state the move enters; a state the machine does not declare is `Error::Config` at run time |
/// | `crate = "path"` | where the runtime is, for a renamed dependency (default `::idem_runtime`) |
///
/// The lease of a held move, how long others wait for it and the record's ttl belong to
/// the machine (`StateMachine::builder(..).lease(..).wait(..).ttl(..)`), not to a move.
///
/// Misuse is a compile error at the offending token: a non-async function, a missing,
/// unknown or repeated option, a `machine` that is not a path to a `StateMachine`, a `to`
/// that is not a string, a key placeholder that names no parameter, a return type that is
/// not `Result<Moved<T>, E>`, an error type without `From<idem_runtime::Error>`.
#[proc_macro_attribute]
pub fn transition(args: TokenStream, item: TokenStream) -> TokenStream {
    transition::expand(args.into(), item.into()).into()
}

#[cfg(test)]
mod tests {
    /// The option names in the table of the docs of `pub fn {attribute}`, in order.
    fn documented(attribute: &str) -> Vec<String> {
        let source = include_str!("lib.rs");
        let end = source
            .find(&format!("pub fn {attribute}("))
            .unwrap_or_else(|| panic!("no entry point `{attribute}`"));
        // The docs between the previous entry point's closing brace and this one.
        let docs = source[..end].rsplit("\n}\n").next().unwrap_or_default();
        docs.lines()
            .filter_map(|line| line.trim().strip_prefix("/// | `"))
            .map(|row| row.split([' ', '`']).next().unwrap_or_default().to_owned())
            .collect()
    }

    /// Every identifier in an expansion, at any depth.
    fn idents(tokens: proc_macro2::TokenStream, out: &mut Vec<String>) {
        for tree in tokens {
            match tree {
                proc_macro2::TokenTree::Ident(ident) => out.push(ident.to_string()),
                proc_macro2::TokenTree::Group(group) => idents(group.stream(), out),
                _ => {}
            }
        }
    }

    fn setters(args: proc_macro2::TokenStream) -> Vec<String> {
        let item = quote::quote! {
            async fn charge(id: u64) -> Result<u64, idem_runtime::Error> { Ok(id) }
        };
        let mut found = Vec::new();
        idents(crate::idempotent::expand(args, item), &mut found);
        found.retain(|name| ["ttl", "lease", "wait", "on_duplicate"].contains(&name.as_str()));
        found
    }

    /// An option the user did not write is left out of the expansion, so the runtime's
    /// defaults (`idem_runtime::options::DEFAULT_TTL`, ... and each strategy's policy) apply and
    /// the macro keeps no copy of them; one that was written is passed on.
    #[test]
    fn unset_options_leave_the_runtime_defaults() {
        for args in [
            quote::quote!(key = "k:{id}"),
            quote::quote!(key = "k:{id}", strategy = "token"),
            quote::quote!(key = "k:{id}", strategy = "lock"),
        ] {
            assert_eq!(setters(args.clone()), Vec::<String>::new(), "{args}");
        }
        let all = quote::quote!(
            key = "k:{id}",
            ttl = "1h",
            lease = "5s",
            wait = "0s",
            on_duplicate = "reject"
        );
        assert_eq!(setters(all), ["ttl", "lease", "wait", "on_duplicate"]);
    }

    /// Each attribute's options table lists exactly the options the macro declares, so
    /// the docs and the parser cannot drift apart.
    #[test]
    fn the_option_tables_are_the_declared_options() {
        assert_eq!(documented("idempotent"), crate::idempotent::OPTIONS);
        assert_eq!(
            documented("retry_on_conflict"),
            crate::retry_on_conflict::OPTIONS
        );
        assert_eq!(documented("transition"), crate::transition::OPTIONS);
    }
}
