//! Dedup: run once per key; later calls replay or reject the stored result.
//!
//! Token consumption is the same flow with a claim that only takes an issued token, so
//! it lives here too.

use std::future::Future;

use std::ops::Deref;

use super::claim::{ClaimGuard, claim_memo, retry_settle, undo_uncertain_claim, with_heartbeat};
use crate::codec::{CloneReplay, Codec, NoReplay};
use crate::key::check_fingerprint;
use crate::options::OnDuplicate;
use crate::store::{ClaimKind, ClaimOutcome, ClaimRequest, Owner};
use crate::{Error, Fingerprint, Idem, Key, Options};

/// Claim, run, then complete (or release on a non-cached `Err`).
///
/// `reuse`: replay by clone on an in-process store (see [`CloneReplay`]).
///
/// `idem` is owned (a reference, or the borrowed-or-scoped current runtime) so that
/// entry points can return this future directly instead of wrapping it in another.
pub(crate) async fn run<C, T, E, F>(
    idem: impl Deref<Target = Idem>,
    opts: &Options,
    kind: ClaimKind,
    key: Key,
    fingerprint: Option<Fingerprint>,
    reuse: Option<CloneReplay<T>>,
    body: F,
) -> Result<T, E>
where
    C: Codec<T, E>,
    E: From<Error>,
    F: Future<Output = Result<T, E>>,
{
    let store = idem.store();
    let owner = Owner::next();
    let req = ClaimRequest::new(kind, owner, opts.lease).with_fingerprint(fingerprint);
    let (outcome, memo) = claim_memo(&**store, &key, &req, opts.wait)
        .await
        .inspect_err(|e| undo_uncertain_claim(store, key, owner, e))?;
    match outcome {
        Some(ClaimOutcome::Claimed { .. }) => {}
        Some(ClaimOutcome::Completed {
            value,
            fingerprint: stored,
        }) => {
            check_fingerprint(&key, fingerprint, stored)?;
            if opts.on_duplicate == OnDuplicate::Reject {
                return Err(Error::Duplicate { key }.into());
            }
            if let (Some(reuse), Some(memo)) = (&reuse, &memo)
                && let Some(v) = reuse.get(&**memo)
            {
                return Ok(v);
            }
            let decoded = C::decode(&key, &value)?;
            if let (Some(reuse), Some(local), Ok(v)) = (&reuse, store.local(), &decoded) {
                // Only a value decoded from the record is kept, so a clone of it is
                // exactly what the next decode would give.
                local.memoize(&key, &value, reuse.make(v));
            }
            return decoded;
        }
        Some(ClaimOutcome::Missing) => return Err(Error::TokenInvalid { key }.into()),
        None | Some(ClaimOutcome::Busy { .. }) => return Err(Error::InProgress { key }.into()),
    }

    // From here until the record is completed or released, a drop (cancellation or panic)
    // releases the claim.
    let mut guard = ClaimGuard::new(store.clone(), key, owner);
    let (result, lost) = with_heartbeat(&**store, &key, owner, opts.lease, body).await;
    let encoded = C::encode(&key, &result).or_else(|e| {
        // The body ran and its effect happened, but its value cannot be stored. Record
        // that the key completed, so a retry is rejected instead of running again.
        tracing::error!(%key, error = %e, "result does not serialize; storing a marker");
        <NoReplay as Codec<(), ()>>::encode(&key, &Ok(()))
    })?;
    let settle = encoded.map(|bytes| (bytes, opts.ttl));
    let outcome = match &settle {
        Some((bytes, ttl)) => store.complete(&key, owner, bytes.clone(), *ttl).await,
        None => store.release(&key, owner).await,
    };
    guard.disarm();
    match outcome {
        Ok(true) => {}
        Ok(false) => idem.lease_lost(&key, lost),
        Err(e) => {
            // The effect happened; the caller gets its result. The claim stays (so
            // duplicates wait rather than run again) while the result is recorded in the
            // background; if the store stays down, the claim ends with its lease.
            idem.count_store_failure();
            tracing::error!(%key, error = %e, "could not record the result; retrying in the background");
            retry_settle(store.clone(), key, owner, settle);
        }
    }
    result
}
