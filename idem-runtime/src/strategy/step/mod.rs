//! Durable steps: a body with several effects resumes where it stopped, and never
//! repeats a finished one.
//!
//! Inside a body that holds a claim (an `#[idempotent]` dedup or token function,
//! [`Idem::dedup`](crate::Idem::dedup), a handler behind idem-http's layer or an
//! idem-consumer handler), [`step`] runs its closure at most once per key while the
//! key's record lives, and journals its `Ok` value in the store, owner-checked, in one
//! write. An `Err` is not journaled, so the step runs again on the next attempt.
//!
//! The journal survives a release: if the body fails after two steps, or its future is
//! dropped, or its process dies (past its lease), the next attempt gets the journal with
//! its claim and replays those two steps from it, running only
//! what is left. It is dropped when the call completes, when the key is forgotten, or
//! the record's lease plus its ttl after the last step written (so a body slower than
//! its ttl that then fails still leaves its journal; on Redis up to one lease later,
//! since only the first step of each lease sets the expiry). A journal belongs to the payload
//! whose effects it records: while it lives, a call with another fingerprint under the
//! same key is refused with [`Error::PayloadMismatch`], and the original resumes.
//!
//! [`StepCtx::key`] is a stable downstream idempotency key per (record, step): pass it
//! to a gateway, so that a crash *inside* a step (after the gateway charged, before the
//! journal write) is deduplicated downstream too. For a downstream without such a key,
//! a [`Verified`] step records its intent before it runs, and on resume asks its
//! `verify` closure whether the effect happened.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), idem_runtime::Error> {
//! use idem_runtime::{Error, Idem, Options, step};
//! static CHECKOUT: Options = Options::dedup("shop::checkout");
//! let idem = Idem::builder().build();
//! let receipt = idem
//!     .dedup(&CHECKOUT, "order-7", async {
//!         let charge: String = step("charge", |s| async move {
//!             // gateway.charge(cents).idempotency_key(s.key())...
//!             Ok::<_, Error>(format!("ch_{}", &s.key()[5..13]))
//!         })
//!         .await?;
//!         let coupon: u32 = step("coupon", |_| async { Ok::<_, Error>(42) }).await?;
//!         Ok::<_, Error>((charge, coupon))
//!     })
//!     .await?;
//! assert_eq!(receipt.1, 42);
//! // Outside a claimed body, a step is an error, never a plain run.
//! let outside = step("charge", |_| async { Ok::<_, Error>(1u8) }).await;
//! assert!(matches!(outside, Err(Error::StepOutsideClaim { .. })));
//! # Ok(()) }
//! ```

use std::fmt;
use std::future::Future;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::Instrument as _;

use self::frame::{Journaled, StepStart};
use super::claiming::Finishing;
use crate::codec::{decode_step, decodes_as, encode_step};
use crate::observe::{self, StepOutcome};
use crate::store::BoxFuture;
use crate::{Error, Key};

pub(crate) mod frame;

/// What a step's closure gets: its downstream idempotency key.
#[derive(Clone)]
pub struct StepCtx {
    record: Key,
    name: Arc<str>,
    /// The downstream key, derived on the first [`key`](Self::key): most steps never
    /// ask for it, and deriving it costs a few thousand instructions.
    key: OnceLock<String>,
}

impl fmt::Debug for StepCtx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StepCtx").field("key", &self.key()).finish()
    }
}

impl PartialEq for StepCtx {
    fn eq(&self, other: &Self) -> bool {
        self.record.digest() == other.record.digest() && self.name == other.name
    }
}

impl Eq for StepCtx {}

impl StepCtx {
    fn new(record: Key, name: Arc<str>) -> Self {
        StepCtx {
            record,
            name,
            key: OnceLock::new(),
        }
    }

    /// A stable downstream idempotency key for this (record, step): the same on every
    /// attempt and, on a shared store (Redis, SQL), in every process; different for
    /// every step and every key. `idem-` and 32 lowercase hex digits (37 printable ASCII
    /// characters, well under Stripe's 255), derived one-way from the record's digest
    /// and the step's name, so it carries no raw key material. On an in-process store
    /// ([`MemoryStore`](crate::MemoryStore)) it is stable within the process.
    pub fn key(&self) -> &str {
        self.key.get_or_init(|| step_key(&self.record, &self.name))
    }
}

/// Runs `f` as the durable step `name` of the claimed body running in this task, and
/// returns its value: from the journal if an earlier attempt at this key finished the
/// step, else by running `f` and journaling its `Ok` value (one owner-checked store
/// write). An `Err` from `f` is returned and not journaled.
///
/// Errors (as `E`, through `From<Error>`), each before `f` runs:
/// [`Error::StepOutsideClaim`] outside a claimed dedup or token body (no silent plain
/// run); [`Error::StepReused`] for a name this call already used for a step that did
/// not fail (loops name their steps: `&format!("mail:{i}")`); [`Error::LeaseLost`] once
/// the call no longer owns its claim (the store refused one of its writes, or its lease
/// ran out by this process's clock without a renewal: a process paused past its lease);
/// [`Error::Unsupported`] on a store without a step journal; a [`Error::Codec`] naming
/// the step if a journaled value does not decode as `T`.
///
/// Within one call, a step that did not finish (it returned `Err`, or a `select!` in
/// the body dropped it) may be tried again under its own name, with the same
/// [`StepCtx::key`]; an outer step tried again replays the inner steps that finished
/// inside it.
///
/// `f`'s value is encoded and decoded back before it is journaled: a value that does
/// not round-trip (a field skipped when serialized and required when deserialized) is
/// an [`Error::Codec`] naming the step, and nothing is journaled. The journal write
/// finishes even if the call is dropped meanwhile (and a release the drop makes waits
/// for it). A write that still cannot land (the store is down) is logged and counted as
/// `idem_steps_total{outcome="unjournaled"}`, and the value returned: the effect
/// happened, and [`StepCtx::key`] lets the downstream deduplicate the step should a
/// later attempt run it again. A write refused because the claim was lost returns the
/// value too, and no later step of the call runs.
pub async fn step<T, E, F, Fut>(name: &str, f: F) -> Result<T, E>
where
    F: FnOnce(StepCtx) -> Fut,
    Fut: Future<Output = Result<T, E>>,
    T: Serialize + DeserializeOwned,
    E: From<Error>,
{
    run::<T, E, F, Fut, NoVerify<T, E>, _>(name, None, f).await
}

type NoVerify<T, E> = fn(StepCtx) -> std::future::Ready<Result<Option<T>, E>>;

/// A step whose downstream has no idempotency key: it records its *intent* before it
/// runs (one more write), and an attempt that finds the intent without a result asks
/// `verify` first: `Some(v)` is journaled as the step's value without running it,
/// `None` runs it.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), idem_runtime::Error> {
/// use idem_runtime::{Error, Idem, Options, Verified};
/// static SHIP: Options = Options::dedup("shop::ship");
/// let idem = Idem::builder().build();
/// let parcel: u64 = idem
///     .dedup(&SHIP, "order-7", async {
///         Verified::new("ship")
///             .verify(|s| async move {
///                 // carrier.find(s.key()).await: Some(parcel) if it shipped
///                 let _ = s.key();
///                 Ok::<_, Error>(None)
///             })
///             .run(|_| async { Ok::<_, Error>(4711) })
///             .await
///     })
///     .await?;
/// assert_eq!(parcel, 4711);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy)]
#[must_use = "a verified step does nothing until `.verify(..).run(..)` is awaited"]
pub struct Verified<'n, V = ()> {
    name: &'n str,
    verify: V,
}

impl<'n> Verified<'n> {
    /// The verified step `name` (same naming rules as [`step`]).
    pub fn new(name: &'n str) -> Self {
        Verified { name, verify: () }
    }

    /// How to find out whether an earlier attempt's effect happened: called with the
    /// step's [`StepCtx`] when its intent is journaled without a result; `Ok(Some(v))`
    /// if it did (`v` becomes the step's value), `Ok(None)` if it did not (the step
    /// runs).
    pub fn verify<V, VFut>(self, verify: V) -> Verified<'n, V>
    where
        V: FnOnce(StepCtx) -> VFut,
    {
        Verified {
            name: self.name,
            verify,
        }
    }
}

impl<V> Verified<'_, V> {
    /// Runs the step: as [`step`], with the intent written before `f` runs (if that write
    /// fails, or the claim was lost, `f` does not run and the error is returned), and
    /// `verify` asked first on an attempt that finds the intent without a result.
    pub async fn run<T, E, F, Fut, VFut>(self, f: F) -> Result<T, E>
    where
        V: FnOnce(StepCtx) -> VFut,
        VFut: Future<Output = Result<Option<T>, E>>,
        F: FnOnce(StepCtx) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        T: Serialize + DeserializeOwned,
        E: From<Error>,
    {
        run(self.name, Some(self.verify), f).await
    }
}

async fn run<T, E, F, Fut, V, VFut>(name: &str, verify: Option<V>, f: F) -> Result<T, E>
where
    F: FnOnce(StepCtx) -> Fut,
    Fut: Future<Output = Result<T, E>>,
    V: FnOnce(StepCtx) -> VFut,
    VFut: Future<Output = Result<Option<T>, E>>,
    T: Serialize + DeserializeOwned,
    E: From<Error>,
{
    observed(name, |start| attempt(start, name, verify, f)).await
}

/// Starts step `name` in this task's claimed body and runs `attempt` with it, in the
/// step's span, counting its outcome.
async fn observed<T, E, A>(name: &str, attempt: impl FnOnce(StepStart) -> A) -> Result<T, E>
where
    A: Future<Output = Result<(T, StepOutcome), E>>,
    E: From<Error>,
{
    let start = match frame::start(name) {
        Ok(start) => start,
        Err(e) => {
            tracing::error!(step = name, error = %e, "durable step refused");
            return Err(e.into());
        }
    };
    let function = start.function;
    // A step that does not finish (an `Err`, a drop) frees its name for another try.
    let mut running = Running(Some(start.id));
    let span = observe::step_span(function, name);
    // Boxed: a step's future (its closure's, its journal write's) is large, and the
    // body holding it inline is moved whole into each wrapper of the call, which cost
    // more than one allocation (counted with callgrind: bench/examples/profile_replay).
    let out = Box::pin(attempt(start)).instrument(span.clone()).await;
    let _entered = span.enter();
    match out {
        Ok((value, outcome)) => {
            running.0 = None;
            observe::step_ended(function, outcome);
            Ok(value)
        }
        Err(e) => {
            observe::step_ended(function, StepOutcome::Failed);
            Err(e)
        }
    }
}

/// A step that has not finished: dropped, it frees its name (see [`frame::stopped`]).
struct Running(Option<u32>);

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(id) = self.0 {
            frame::stopped(id);
        }
    }
}

/// One step: replay, verify, or run and journal.
async fn attempt<T, E, F, Fut, V, VFut>(
    start: StepStart,
    name: &str,
    verify: Option<V>,
    f: F,
) -> Result<(T, StepOutcome), E>
where
    F: FnOnce(StepCtx) -> Fut,
    Fut: Future<Output = Result<T, E>>,
    V: FnOnce(StepCtx) -> VFut,
    VFut: Future<Output = Result<Option<T>, E>>,
    T: Serialize + DeserializeOwned,
    E: From<Error>,
{
    let key = start.key;
    if start.store.journal().is_none() {
        return Err(Error::Unsupported("durable steps (a step journal)").into());
    }
    let ctx = || StepCtx::new(key, start.name.clone());
    match (&start.journaled, verify) {
        (Journaled::Done(bytes), _) => {
            let value = decode_step::<T>(&key, bytes).map_err(|e| named(e, name))?;
            return Ok((value, StepOutcome::Replayed));
        }
        (Journaled::Intent, Some(verify)) => {
            // An earlier try (of this call or another) started the effect; whether it
            // landed is unknown: ask before running it again.
            frame::check_owned()?;
            if let Some(value) = frame::within(&start, verify(ctx())).await? {
                let outcome = journal(&start, name, &value).await?;
                return Ok((value, outcome.unless(StepOutcome::Verified)));
            }
        }
        // An intent left by a verified step of an older build: run it, as asked.
        (Journaled::Intent, None) => {}
        (Journaled::Absent, Some(_)) => {
            // The intent must be recorded before the effect can start: without it a
            // later try could not know to ask `verify`.
            frame::check_owned()?;
            match write(&start, name, None).await {
                Ok(true) => frame::remember(&start.name, Journaled::Intent),
                Ok(false) => {
                    frame::claim_lost();
                    return Err(Error::LeaseLost { key }.into());
                }
                Err(e) => return Err(e.into()),
            }
        }
        (Journaled::Absent, None) => {}
    }
    frame::check_owned()?;
    let value = frame::within(&start, f(ctx())).await?;
    let outcome = journal(&start, name, &value).await?;
    Ok((value, outcome.unless(StepOutcome::Ran)))
}

/// The step's value as the journal would hold it: encoded, and checked to decode back,
/// so that nothing unreadable is ever journaled.
fn sealed<T: Serialize + DeserializeOwned>(
    key: &Key,
    name: &str,
    value: &T,
) -> Result<Bytes, Error> {
    let bytes = encode_step(key, value).map_err(|e| named(e, name))?;
    match decodes_as::<T>(key, &bytes) {
        Ok(()) => Ok(bytes),
        Err(e) => Err(named(
            Error::Codec {
                key: *key,
                message: format!(
                    "its value does not deserialize from what it serialized to, so it \
                     cannot be replayed; not journaled ({e})"
                ),
            },
            name,
        )),
    }
}

/// A codec error that names the step it is about.
fn named(e: Error, name: &str) -> Error {
    match e {
        Error::Codec { key, message } => Error::Codec {
            key,
            message: format!("step {name:?}: {message}"),
        },
        e => e,
    }
}

/// Whether a finished step's write reached the journal.
#[derive(Clone, Copy)]
enum Written {
    Yes,
    /// The store could not be reached: counted as `unjournaled`.
    No,
}

impl Written {
    fn unless(self, outcome: StepOutcome) -> StepOutcome {
        match self {
            Written::Yes => outcome,
            Written::No => StepOutcome::Unjournaled,
        }
    }
}

/// Journals a finished step's value: the call knows it at once (a retry within the call
/// replays it), and the write finishes even if the call is dropped. A value that does
/// not round-trip is the step's error. A write that fails is logged, not returned: the
/// effect happened, and the caller gets its value.
async fn journal<T: Serialize + DeserializeOwned>(
    start: &StepStart,
    name: &str,
    value: &T,
) -> Result<Written, Error> {
    let bytes = sealed(&start.key, name, value)?;
    frame::remember(&start.name, Journaled::Done(bytes.clone()));
    let done = write(start, name, Some(bytes)).await;
    Ok(written(start.key, name, start.function, done, true))
}

/// What a journal write's answer means, logged and counted. `in_call`: the call is still
/// there to learn that its claim is lost.
fn written(
    key: Key,
    name: &str,
    function: &'static str,
    done: Result<bool, Error>,
    in_call: bool,
) -> Written {
    match done {
        Ok(true) => Written::Yes,
        Ok(false) => {
            observe::lease_lost();
            if in_call {
                frame::claim_lost();
            }
            tracing::warn!(%key, step = name, "the claim was lost before the step was \
                journaled; no later step of this call runs");
            Written::Yes
        }
        Err(e) => {
            if !in_call {
                observe::step_ended(function, StepOutcome::Unjournaled);
            }
            tracing::warn!(%key, step = name, error = %e, "could not journal the step; a later \
                attempt runs it again (its downstream key lets the downstream deduplicate it)");
            Written::No
        }
    }
}

/// One owner-checked journal write, that finishes even if the call is dropped.
///
/// A remote store applies a write once the request has left, whether or not anyone
/// reads the answer; and a step's effect has happened, so its entry must land. Dropped
/// before the answer, the write goes on in a task of its own, holding a share of the
/// call's in-flight writes: the release that the drop makes waits for it (see
/// [`frame::write_permit`]). An in-process store answers on the first poll, so its
/// write is awaited directly.
async fn write(start: &StepStart, name: &str, value: Option<Bytes>) -> Result<bool, Error> {
    let Some(journal) = start.store.journal() else {
        return Err(Error::Unsupported("durable steps (a step journal)"));
    };
    if start.store.local().is_some() {
        return journal
            .write_step(&start.key, start.owner, name, value, start.ttl)
            .await;
    }
    let permit = frame::write_permit();
    // The step's one copy of its name, for the write and for its report after a drop.
    let step = start.name.clone();
    let (store, key, owner, ttl, sending) = (
        start.store.clone(),
        start.key,
        start.owner,
        start.ttl,
        step.clone(),
    );
    let sent: BoxFuture<'static, Result<bool, Error>> = Box::pin(async move {
        let _permit = permit;
        match store.journal() {
            Some(j) => j.write_step(&key, owner, &sending, value, ttl).await,
            None => Err(Error::Unsupported("durable steps (a step journal)")),
        }
    });
    let function = start.function;
    Finishing::new(sent, move |done| {
        written(key, &step, function, done, false);
    })
    .await
}

/// Runs `f` as the *transactional* durable step `name`: in a transaction of the store's
/// own SQL database, whose writes commit together with the step's journal entry. The
/// entry is written inside that transaction, owner-checked under the record's row lock,
/// just before the commit: a crash at any moment leaves both the step's writes and its
/// entry, or neither. This is exactly-once for a step whose effect is a write in the
/// same database as the store.
///
/// `f` gets the step's [`StepCtx`] and the open transaction, and returns its future
/// boxed (as [`SqlStore::transaction`](crate::SqlStore::transaction) bodies do, so the
/// future may borrow the transaction). An `Err` from `f` rolls the transaction back and
/// is returned, not journaled. A step already journaled replays its value without
/// opening a transaction.
///
/// Errors, besides those of [`step`]: [`Error::Unsupported`] if the store is not a SQL
/// store; [`Error::Config`] if `DB` is not the store's database; [`Error::LeaseLost`] if
/// the claim was lost before the entry was written (the transaction is rolled back, so
/// the step's writes are undone); a store error if the commit fails (its outcome is then
/// unknown, and a later attempt replays the step or runs it again: never both).
///
/// ```no_run
/// # async fn demo(store: idem_runtime::SqlStore) -> Result<(), idem_runtime::Error> {
/// use idem_runtime::store::sql::sqlx;
/// use idem_runtime::{Error, Idem, Options, step_tx};
/// static RESERVE: Options = Options::dedup("shop::reserve");
/// let idem = Idem::builder().store(store).build();
/// idem.dedup(&RESERVE, "order-7", async {
///     step_tx("reserve", |_s, tx: &mut sqlx::Transaction<'static, sqlx::Postgres>| {
///         Box::pin(async move {
///             sqlx::query("INSERT INTO reservations (order_id) VALUES (7)")
///                 .execute(&mut **tx)
///                 .await
///                 .map_err(Error::store)?;
///             Ok::<_, Error>(())
///         })
///     })
///     .await
/// })
/// .await?;
/// # Ok(()) }
/// ```
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite")))
)]
pub async fn step_tx<DB, T, E, F>(name: &str, f: F) -> Result<T, E>
where
    DB: crate::store::sql::TxDatabase,
    F: for<'c> FnOnce(
        StepCtx,
        &'c mut sqlx::Transaction<'static, DB>,
    ) -> crate::store::sql::TxFuture<'c, T, E>,
    T: Serialize + DeserializeOwned,
    E: From<Error>,
{
    observed(name, |start| tx_attempt(start, name, f)).await
}

/// One transactional step: replay, or run, journal and commit in one transaction.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
async fn tx_attempt<DB, T, E, F>(start: StepStart, name: &str, f: F) -> Result<(T, StepOutcome), E>
where
    DB: crate::store::sql::TxDatabase,
    F: for<'c> FnOnce(
        StepCtx,
        &'c mut sqlx::Transaction<'static, DB>,
    ) -> crate::store::sql::TxFuture<'c, T, E>,
    T: Serialize + DeserializeOwned,
    E: From<Error>,
{
    let key = start.key;
    if let Journaled::Done(bytes) = &start.journaled {
        let value = decode_step::<T>(&key, bytes).map_err(|e| named(e, name))?;
        return Ok((value, StepOutcome::Replayed));
    }
    let Some(store) = start.store.journal().and_then(|j| j.in_tx()) else {
        return Err(Error::Unsupported("transactional steps (a SQL store)").into());
    };
    frame::check_owned()?;
    let Some(mut tx) = DB::from_step(store.begin().await?) else {
        return Err(Error::Config(format!(
            "step {name:?} asks for a transaction of another database than the store's ({})",
            start.store.name()
        ))
        .into());
    };
    let ctx = StepCtx::new(key, start.name.clone());
    // An `Err`, or a panic, drops the transaction: rolled back.
    let value = frame::within(&start, f(ctx, &mut tx)).await?;
    let bytes = sealed(&key, name, &value)?;
    let conn = DB::tx_connection(&mut tx);
    if !store
        .write_step_in(conn, &key, start.owner, name, &bytes, start.ttl)
        .await?
    {
        observe::lease_lost();
        frame::claim_lost();
        return Err(Error::LeaseLost { key }.into());
    }
    tx.commit().await.map_err(Error::store)?;
    frame::remember(&start.name, Journaled::Done(bytes));
    Ok((value, StepOutcome::Ran))
}

/// The downstream idempotency key of step `name` of the record `key`: `idem-` and 32
/// lowercase hex digits of BLAKE3 in key-derivation mode (a context of its own, so it is
/// neither the call's key nor the record's name) over the record's digest and the
/// step's name, length-prefixed so that no two (record, name) pairs share an input.
fn step_key(key: &Key, name: &str) -> String {
    let mut h = blake3::Hasher::new_derive_key("idem 2026 step downstream idempotency key");
    h.update(key.digest());
    h.update(&(name.len() as u64).to_le_bytes());
    h.update(name.as_bytes());
    crate::key::downstream(h.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Downstream keys reach gateways and other services, which deduplicate by them:
    /// they must never change from one release to the next.
    #[test]
    fn downstream_keys_are_pinned() {
        let key = Key::from_parts("shop", "shop::checkout", [7; 16]);
        let ctx = StepCtx::new(key, "charge".into());
        assert_eq!(ctx.key(), "idem-486d480c43b1b01c0e3d5e657a3b2290");
        assert_eq!(ctx.key(), step_key(&key, "charge"));
        assert_ne!(StepCtx::new(key, "mail".into()).key(), ctx.key());
        assert_eq!(StepCtx::new(key, "charge".into()), ctx);
    }
}
