//! The functions an expansion calls. Each returns the strategy's future itself, so the
//! expansion awaits one future, not a wrapper around it; the logic stays with its
//! strategy.

use std::future::Future;
use std::time::Duration;

use crate::codec::{CloneReplay, Codec};
use crate::options::Strategy;
use crate::runtime::Current;
use crate::store::ClaimKind;
use crate::strategy::optimistic::{Retry, attribute_policy};
use crate::strategy::state_machine::{Moved, StateMachine, run_move};
use crate::strategy::{dedup, lock};
use crate::{Error, Fingerprint, Idem, Key, Options};

/// The runtime a call under `#[idempotent]` uses.
pub fn current() -> Current {
    Current::get()
}

/// A runtime an `idem = ...` option can name: an [`Idem`], or a reference to one.
#[diagnostic::on_unimplemented(
    message = "`idem = ...` must give the runtime, an `Idem` or `&Idem`, not `{Self}`",
    label = "not an `Idem`",
    note = "name the runtime the function should use, e.g. `idem = self.idem` or \
            `idem = &state.idem`"
)]
pub trait GivenRuntime {
    /// The runtime.
    fn runtime(&self) -> &Idem;
}

impl GivenRuntime for Idem {
    fn runtime(&self) -> &Idem {
        self
    }
}

impl<R: GivenRuntime + ?Sized> GivenRuntime for &R {
    fn runtime(&self) -> &Idem {
        (**self).runtime()
    }
}

/// The runtime a call under `#[idempotent(idem = ...)]` uses: the one it names, for this
/// call only (as if in an [`Idem::scope`]), so a runtime kept in the application's
/// state needs neither `init` nor `scope`.
pub fn given(idem: &impl GivenRuntime) -> Current {
    Current::Scoped(idem.runtime().clone())
}

/// Dedup, as expanded from the attribute. Returns the strategy's future itself, so the
/// expansion awaits one future, not a wrapper around it.
pub fn dedup<C, T, E, F>(
    rt: Current,
    opts: &'static Options,
    key: Key,
    fp: Option<Fingerprint>,
    reuse: Option<CloneReplay<T>>,
    body: F,
) -> impl Future<Output = Result<T, E>>
where
    C: Codec<T, E>,
    E: From<Error>,
    F: Future<Output = Result<T, E>>,
{
    debug_assert_eq!(opts.strategy, Strategy::Dedup);
    dedup::run::<C, T, E, F>(rt, opts, ClaimKind::Dedup, key, fp, None, reuse, body)
}

/// Dedup of a function marked `recover`: `args` are its arguments as recorded with the
/// claim (an `Err`: they did not serialize, and the call fails with it before claiming).
pub fn dedup_recoverable<C, T, E, F>(
    rt: Current,
    opts: &'static Options,
    key: Key,
    fp: Option<Fingerprint>,
    args: Result<bytes::Bytes, Error>,
    reuse: Option<CloneReplay<T>>,
    body: F,
) -> impl Future<Output = Result<T, E>>
where
    C: Codec<T, E>,
    E: From<Error>,
    F: Future<Output = Result<T, E>>,
{
    debug_assert_eq!(opts.strategy, Strategy::Dedup);
    async move {
        let args = args.map_err(E::from)?;
        let kind = ClaimKind::Dedup;
        dedup::run::<C, T, E, F>(rt, opts, kind, key, fp, Some(args), reuse, body).await
    }
}

/// A replay answered on the spot from a decoded value kept beside the record by an
/// in-process store (see [`CloneReplay`]), before any claim or future is built.
/// `None`: take the normal path (which decodes, and keeps the value for next time).
#[inline]
pub fn replay_now<T, E: From<Error>>(
    rt: &Idem,
    key: &Key,
    fp: Option<Fingerprint>,
    reuse: Option<CloneReplay<T>>,
) -> Option<Result<T, E>> {
    let reuse = reuse?;
    let mut found: Option<Result<T, Error>> = None;
    rt.store().local()?.peek_memo(key, &mut |stored, memo| {
        found = match crate::fingerprint::check_fingerprint(key, fp, stored) {
            Err(e) => Some(Err(e)),
            Ok(()) => reuse.get(memo).map(Ok),
        };
    });
    let outcome = match found.as_ref()? {
        Ok(_) => crate::observe::Outcome::Replayed,
        Err(_) => crate::observe::Outcome::Mismatch,
    };
    crate::observe::answered_now(key, outcome);
    // The caller's error conversion runs here, outside the store's lock.
    found.map(|r| r.map_err(E::from))
}

/// The `idem` span a call in transactional mode runs in: the expansion runs the claim,
/// the body and the record inside it (they borrow the caller's transaction, so no
/// strategy future can own them), and `tx_begin`/`tx_end` set its outcome.
pub fn tx_span(opts: &Options, key: &Key) -> tracing::Span {
    crate::observe::span(opts, key)
}

/// Token consumption, as expanded from the attribute.
pub fn token<C, T, E, F>(
    rt: Current,
    opts: &'static Options,
    key: Key,
    fp: Option<Fingerprint>,
    reuse: Option<CloneReplay<T>>,
    body: F,
) -> impl Future<Output = Result<T, E>>
where
    C: Codec<T, E>,
    E: From<Error>,
    F: Future<Output = Result<T, E>>,
{
    dedup::run::<C, T, E, F>(rt, opts, ClaimKind::Token, key, fp, None, reuse, body)
}

/// Lock, as expanded from the attribute.
pub fn lock<T, E, F>(
    rt: Current,
    opts: &'static Options,
    key: Key,
    body: F,
) -> impl Future<Output = Result<T, E>>
where
    E: From<Error>,
    F: Future<Output = Result<T, E>>,
{
    lock::run(rt, opts, key, body)
}

/// `#[retry_on_conflict(...)]`'s policy (the optimistic strategy's `attribute_policy`).
pub const fn retry_policy(
    attempts: Option<u32>,
    base: Option<Duration>,
    max: Option<Duration>,
) -> Retry {
    attribute_policy(attempts, base, max)
}

/// `#[transition(...)]`: the move and its body on the current runtime, `key` already
/// rendered with [`Idem::state_key`].
pub fn transition<'a, T, E, F>(
    rt: Current,
    machine: &'a StateMachine,
    key: Key,
    to: &'static str,
    body: F,
) -> impl Future<Output = Result<Moved<T>, E>> + 'a
where
    E: From<Error> + 'a,
    F: Future<Output = Result<T, E>> + 'a,
    T: 'a,
{
    run_move(rt, machine, key, to, body)
}

/// Transactional mode's claim, as expanded from the attribute: on the store of the
/// runtime `idem`. Runs inside the call's span ([`tx_span`]) and sets its outcome when
/// the call ends here (replayed, or failed).
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub async fn tx_begin<C, X, T, E>(
    idem: &Idem,
    opts: &Options,
    conn: &mut X,
    key: Key,
    fingerprint: Option<Fingerprint>,
) -> Result<crate::strategy::transaction::TxBegun<Result<T, E>>, Error>
where
    C: Codec<T, E>,
    X: crate::store::sql::TxConn + ?Sized,
{
    use crate::observe::{self, Outcome};
    use crate::strategy::transaction::TxBegun;
    let begun = crate::strategy::transaction::tx_begin::<C, X, T, E>(
        idem.store().as_ref(),
        opts,
        conn,
        key,
        fingerprint,
    )
    .await;
    match &begun {
        Ok(TxBegun::Replayed(_)) => observe::outcome(opts, &key, Outcome::Replayed),
        Ok(TxBegun::Claimed(_)) => {}
        Err(e) => observe::failed(opts, &key, e),
    }
    begun
}

/// Transactional mode's record, as expanded from the attribute: sets the outcome of the
/// call's span (`ran`, `lease_lost` or `store_error`).
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub async fn tx_end<C, X, T, E>(
    idem: &Idem,
    opts: &Options,
    claim: crate::strategy::transaction::TxClaim,
    conn: &mut X,
    result: &Result<T, E>,
) -> Result<(), Error>
where
    C: Codec<T, E>,
    X: crate::store::sql::TxConn + ?Sized,
{
    use crate::observe::{self, Outcome};
    let key = claim.key();
    let ended = crate::strategy::transaction::tx_end::<C, X, T, E>(
        idem.store().as_ref(),
        claim,
        conn,
        result,
    )
    .await;
    match &ended {
        Ok(()) => observe::outcome(opts, &key, Outcome::Ran),
        Err(e @ Error::LeaseLost { .. }) => {
            observe::failed(opts, &key, e);
            idem.lease_lost(&key, false);
        }
        Err(e) => observe::failed(opts, &key, e),
    }
    ended
}
