//! Lock: mutual exclusion per key with a fencing token; nothing is stored.
//!
#![doc = include_str!("guide/lock.md")]

use super::step::frame;
use std::future::Future;

use std::ops::Deref;

use super::call_ctx;
use super::claiming::{
    ClaimGuard, claim, retry_settle, settle, undo_uncertain_claim, with_heartbeat,
};
use crate::observe::{self, Outcome};
use crate::store::{ClaimKind, ClaimOutcome, ClaimRequest, Owner};
use crate::{Error, Idem, Key, Options};

tokio::task_local! {
    static FENCE: u64;
}

/// The fencing token of the lock held by the current task, inside a lock-strategy body.
///
/// Strictly increasing per key: pass it to downstream writes (a `WHERE fence < $1`
/// guard, an API's precondition) so a holder that lost its lease during a pause cannot
/// overwrite the work of the next holder.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), idem_runtime::Error> {
/// use idem_runtime::{Idem, Options};
/// static RESTOCK: Options = Options::lock("warehouse::restock");
/// let idem = Idem::builder().build();
/// let fence = idem
///     .lock(&RESTOCK, "sku-1", async { Ok::<_, idem_runtime::Error>(idem_runtime::fence()) })
///     .await?;
/// assert!(fence.is_some());
/// assert_eq!(idem_runtime::fence(), None); // outside the body
/// # Ok(()) }
/// ```
pub fn fence() -> Option<u64> {
    FENCE.try_with(|f| *f).ok()
}

/// Acquire, run, release, in the call's `idem` span (see [`observe`]).
pub(crate) fn run<T, E, F>(
    idem: impl Deref<Target = Idem>,
    opts: &Options,
    key: Key,
    body: F,
) -> impl Future<Output = Result<T, E>>
where
    E: From<Error>,
    F: Future<Output = Result<T, E>>,
{
    observe::instrument(opts, &key, call(idem, opts, key, body))
}

async fn call<T, E, F>(
    idem: impl Deref<Target = Idem>,
    opts: &Options,
    key: Key,
    body: F,
) -> Result<T, E>
where
    E: From<Error>,
    F: Future<Output = Result<T, E>>,
{
    if let Err(e) = opts.check_lease() {
        observe::failed(opts, &key, &e);
        return Err(e.into());
    }
    let store = idem.store();
    let owner = Owner::next();
    let req = ClaimRequest::new(ClaimKind::Lock, owner, opts.lease);
    let claimed = claim(store, &key, &req, opts.wait)
        .await
        .inspect_err(|e| undo_uncertain_claim(store, key, owner, e));
    let fence = match claimed {
        Ok((Some(ClaimOutcome::Claimed { fence, .. }), _)) => fence,
        Ok((None | Some(ClaimOutcome::Busy { .. }), _)) => {
            let e = Error::Locked { key };
            observe::failed(opts, &key, &e);
            return Err(e.into());
        }
        Ok((Some(_), _)) => {
            let e = Error::Corrupt {
                key,
                reason: "a lock key holds a record that is not a lock".into(),
            };
            observe::failed(opts, &key, &e);
            return Err(e.into());
        }
        Err(e) => {
            observe::failed(opts, &key, &e);
            return Err(e.into());
        }
    };
    let mut guard = ClaimGuard::new(store.clone(), key, owner);
    let (result, lost) = with_heartbeat(
        &**store,
        &key,
        owner,
        opts.lease,
        |_| {},
        // A lock's body runs on every call and keeps no journal: steps there are refused.
        frame::scope(None, FENCE.scope(fence, call_ctx::scope(key, false, body))),
    )
    .await;
    // A lock stores nothing, so giving it back early after the body would be harmless;
    // the unlock is still finished in the background like a completion, so a dropped
    // call's unlock is sent once, in order.
    guard.disarm();
    let released = settle(store, key, owner, None, false).await;
    match released {
        Ok(true) => observe::outcome(opts, &key, Outcome::Ran),
        Ok(false) => {
            observe::outcome(opts, &key, Outcome::LeaseLost);
            idem.lease_lost(&key, lost)
        }
        Err(e) => {
            observe::outcome(opts, &key, Outcome::StoreError);
            idem.count_store_failure();
            tracing::warn!(%key, error = %e, "unlock failed; retrying in the background");
            retry_settle(store.clone(), key, owner, None, false);
        }
    }
    result
}
