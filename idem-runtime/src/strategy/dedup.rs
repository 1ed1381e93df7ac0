//! Dedup: run once per key; later calls replay or reject the stored result.
//!
//! Token consumption is the same flow with a claim that only takes an issued token, so
//! it lives here too.
//!
#![doc = include_str!("guide/dedup.md")]

use std::future::Future;
use std::ops::Deref;
use std::sync::Arc;

use bytes::Bytes;

use super::call_ctx;
use super::claiming::{
    ClaimGuard, claim_memo, retry_settle, settle, take_journal, undo_uncertain_claim,
    with_heartbeat,
};
use super::step::frame::{self, StepFrame};
use crate::codec::{CloneReplay, Codec, completed_marker};
use crate::fingerprint::check_fingerprint;
use crate::observe::{self, Outcome};
use crate::options::OnDuplicate;
use crate::store::{ClaimKind, ClaimOutcome, ClaimRequest, Memo, Owner, Recover, Store};
use crate::{Error, Fingerprint, Idem, Key, Options};

/// Claim, run, then complete (or release on a non-cached `Err`), in the call's `idem`
/// span (see [`observe`]).
///
/// `recover`: a recoverable dedup call's encoded arguments, recorded with the claim on a
/// store with a recovery index, so that a recoverer can finish the call if its caller
/// never does (see [`crate::recover`]).
///
/// `reuse`: replay by clone on an in-process store (see [`CloneReplay`]).
///
/// `idem` is owned (a reference, or the borrowed-or-scoped current runtime) so that
/// entry points can return this future directly instead of wrapping it in another.
#[allow(clippy::too_many_arguments)] // what a call is, each once
pub(crate) fn run<C, T, E, F>(
    idem: impl Deref<Target = Idem>,
    opts: &Options,
    kind: ClaimKind,
    key: Key,
    fingerprint: Option<Fingerprint>,
    recover: Option<Bytes>,
    reuse: Option<CloneReplay<T>>,
    body: F,
) -> impl Future<Output = Result<T, E>>
where
    C: Codec<T, E>,
    E: From<Error>,
    F: Future<Output = Result<T, E>>,
{
    observe::instrument(
        opts,
        &key,
        call::<C, T, E, F>(idem, opts, kind, key, fingerprint, recover, reuse, body),
    )
}

/// A call in two phases: claiming (a replay or a refusal ends there), then running the
/// claimed body and recording its result in a future of its own. Kept apart, the two
/// phases share their bytes instead of each keeping slots of its own, and that keeps
/// the future of a call (an HTTP request's, say) under a kilobyte: above that size
/// glibc's malloc leaves its per-thread caches for a slower path.
///
/// An `async move` block rather than an `async fn`, here and in [`run_claimed`]: the
/// block holds each argument once, where the function's future held it twice (as
/// passed, and as the local it is moved into).
#[allow(clippy::manual_async_fn)] // see above: the block is the point
#[allow(clippy::too_many_arguments)] // what a call is, each once
fn call<C, T, E, F>(
    idem: impl Deref<Target = Idem>,
    opts: &Options,
    kind: ClaimKind,
    key: Key,
    fingerprint: Option<Fingerprint>,
    recover: Option<Bytes>,
    reuse: Option<CloneReplay<T>>,
    body: F,
) -> impl Future<Output = Result<T, E>>
where
    C: Codec<T, E>,
    E: From<Error>,
    F: Future<Output = Result<T, E>>,
{
    async move {
        if let Err(e) = opts.check_lease() {
            observe::failed(opts, &key, &e);
            return Err(e.into());
        }
        let owner = Owner::next();
        // Recorded only where a recoverer can find it.
        let recover = recover
            .filter(|_| idem.store().recovery().is_some())
            .map(|args| Recover::new(args, opts.ttl));
        let recoverable = recover.is_some();
        let mut claimed = {
            let req = ClaimRequest::new(kind, owner, opts.lease)
                .with_fingerprint(fingerprint)
                .with_recover(recover);
            claim_memo(idem.store(), &key, &req, opts.wait).await
        };
        let journal = take_journal(&mut claimed);
        if let Some(answered) =
            answer::<C, T, E>(idem.store(), opts, key, owner, fingerprint, reuse, claimed)
        {
            return answered;
        }
        run_claimed::<C, T, E, F>(&idem, opts, key, owner, journal, recoverable, body).await
    }
}

/// What a claim's outcome answers without running the body: a replay, a refusal, or
/// the store's error. `None`: the key is claimed, run the body.
fn answer<C, T, E>(
    store: &Arc<dyn Store>,
    opts: &Options,
    key: Key,
    owner: Owner,
    fingerprint: Option<Fingerprint>,
    reuse: Option<CloneReplay<T>>,
    claimed: Result<(Option<ClaimOutcome>, Option<Memo>, bool), Error>,
) -> Option<Result<T, E>>
where
    C: Codec<T, E>,
    E: From<Error>,
{
    let (outcome, memo, waited) = match claimed {
        Ok(claimed) => claimed,
        Err(e) => {
            observe::failed(opts, &key, &e);
            undo_uncertain_claim(store, key, owner, &e);
            return Some(Err(e.into()));
        }
    };
    let refused = match outcome {
        Some(ClaimOutcome::Claimed { .. }) => return None,
        Some(ClaimOutcome::Completed {
            value,
            fingerprint: stored,
        }) => {
            let replayed = if waited {
                Outcome::Waited
            } else {
                Outcome::Replayed
            };
            if let Err(e) = admit(opts, &key, fingerprint, stored) {
                e
            } else {
                if let (Some(reuse), Some(memo)) = (&reuse, &memo)
                    && let Some(v) = reuse.get(&**memo)
                {
                    observe::outcome(opts, &key, replayed);
                    return Some(Ok(v));
                }
                let decoded = match C::decode_shared(&key, &value) {
                    Ok(decoded) => decoded,
                    Err(e) => {
                        observe::failed(opts, &key, &e);
                        return Some(Err(e.into()));
                    }
                };
                if let (Some(reuse), Some(local), Ok(v)) = (&reuse, store.local(), &decoded) {
                    // Only a value decoded from the record is kept, so a clone of it is
                    // exactly what the next decode would give.
                    local.memoize(&key, &value, reuse.make(v));
                }
                observe::outcome(opts, &key, replayed);
                return Some(decoded);
            }
        }
        Some(ClaimOutcome::Missing) => Error::TokenInvalid { key },
        // A journal of another payload's effects: this payload must not resume from it.
        Some(ClaimOutcome::OtherPayload { .. }) => Error::PayloadMismatch { key },
        None | Some(ClaimOutcome::Busy { .. }) => Error::InProgress { key },
    };
    observe::failed(opts, &key, &refused);
    Some(Err(refused.into()))
}

/// Whether a completed record may answer a duplicate: the same payload (when the
/// call has a fingerprint), and `on_duplicate` set to replay. Otherwise the refusal.
pub(crate) fn admit(
    opts: &Options,
    key: &Key,
    fingerprint: Option<Fingerprint>,
    stored: Option<Fingerprint>,
) -> Result<(), Error> {
    check_fingerprint(key, fingerprint, stored)?;
    match opts.on_duplicate {
        OnDuplicate::Reject => Err(Error::Duplicate { key: *key }),
        OnDuplicate::Replay => Ok(()),
    }
}

/// Runs the claimed body, then completes the record (or releases the key).
#[allow(clippy::manual_async_fn)] // an `async move` block, as in `call`
fn run_claimed<C, T, E, F>(
    idem: &Idem,
    opts: &Options,
    key: Key,
    owner: Owner,
    journal: Option<crate::store::Journal>,
    recoverable: bool,
    body: F,
) -> impl Future<Output = Result<T, E>>
where
    C: Codec<T, E>,
    E: From<Error>,
    F: Future<Output = Result<T, E>>,
{
    async move {
        let store = idem.store();
        // While the body runs, a drop (cancellation or panic) releases the claim: the
        // body stopped before its end, and a retry must be able to run it. The guard
        // lives in the body's step frame, so the release waits for the journal writes
        // still in flight.
        let guard = ClaimGuard::new(store.clone(), key, owner).recoverable(recoverable);
        let steps = StepFrame::new(
            key,
            guard,
            store.clone(),
            owner,
            (opts.lease, opts.ttl),
            opts.name(),
            journal,
        );
        let lease = opts.lease;
        // The heartbeat runs inside the frame, so the steps know when it renewed.
        let renewed = |r| frame::heartbeat(owner, r);
        let body = call_ctx::scope(key, true, async {
            let out = with_heartbeat(&**store, &key, owner, lease, renewed, body).await;
            // The body has returned, so its effect has happened: from here a drop never
            // releases. The completion (or the release an `Err` asks for) is finished in
            // the background instead (see `settle`).
            frame::body_returned();
            out
        });
        let (mut result, lost) = frame::scope(Some(steps), body).await;
        // The bytes are handed to the store, not cloned (a clone of fresh `Bytes` allocates);
        // the rare failed call encodes them again below.
        let mut marked = false;
        let bytes = record::<C, T, E>(&key, &result, true)
            .map(|bytes| replayable::<C, T, E>(&key, bytes, &mut result, &mut marked));
        let completing = bytes.is_some();
        let outcome = settle(store, key, owner, bytes.map(|b| (b, opts.ttl)), recoverable).await;
        match outcome {
            Ok(true) => observe::outcome(opts, &key, Outcome::Ran),
            Ok(false) => {
                observe::outcome(opts, &key, Outcome::LeaseLost);
                idem.lease_lost(&key, lost)
            }
            Err(e) => {
                // The effect happened; the caller gets its result. The claim stays (so
                // duplicates wait rather than run again) while the result is recorded in the
                // background; if the store stays down, the claim ends with its lease.
                observe::outcome(opts, &key, Outcome::StoreError);
                idem.count_store_failure();
                tracing::warn!(%key, error = %e, "could not record the result; retrying in the background");
                // Encoding the same result again gives the same record (and should it not,
                // the marker still keeps the key from running again). A result that
                // did not decode back was replaced by an error: its marker is kept.
                let settle = completing.then(|| {
                    let bytes = (!marked)
                        .then(|| record::<C, T, E>(&key, &result, false))
                        .flatten();
                    (bytes.unwrap_or_else(|| completed_marker(&key)), opts.ttl)
                });
                retry_settle(store.clone(), key, owner, settle, recoverable);
            }
        }
        result
    }
}

/// `bytes` if they decode back (into the result, or into a marker's `Duplicate`);
/// otherwise a marker (and `marked` is set), and `result` becomes the [`Error::Codec`] that a replay would
/// have met.
///
/// A value that serializes but does not deserialize (a field skipped on the way out
/// and required on the way in, a float the format cannot carry) would otherwise be
/// stored and answer every duplicate with a codec error for the whole ttl. The body's
/// effect has happened, so the key is not released (a retry would run it again): it is
/// recorded as done without a value, and its first caller learns of the fault at once.
fn replayable<C, T, E>(
    key: &Key,
    bytes: Bytes,
    result: &mut Result<T, E>,
    marked: &mut bool,
) -> Bytes
where
    C: Codec<T, E>,
    E: From<Error>,
{
    match C::decode_shared(key, &bytes) {
        Ok(_) | Err(Error::Duplicate { .. }) => bytes,
        Err(e) => {
            tracing::error!(%key, error = %e, "the result does not decode back; storing a marker");
            *result = Err(Error::Codec {
                key: *key,
                message: format!(
                    "the body ran, but its result does not deserialize from what it \
                     serialized to, so it cannot be replayed; the key is recorded as done \
                     without a value ({e})"
                ),
            }
            .into());
            *marked = true;
            completed_marker(key)
        }
    }
}

/// The record to store for `result` (`None`: release the key instead). A value that
/// does not serialize is recorded as a marker: the body ran and its effect happened, so
/// a retry must be rejected rather than run again. `log` says whether to report that.
fn record<C, T, E>(key: &Key, result: &Result<T, E>, log: bool) -> Option<Bytes>
where
    C: Codec<T, E>,
{
    C::encode(key, result).unwrap_or_else(|e| {
        if log {
            tracing::error!(%key, error = %e, "result does not serialize; storing a marker");
        }
        Some(completed_marker(key))
    })
}
