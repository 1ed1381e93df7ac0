//! Lock: mutual exclusion per key with a fencing token; nothing is stored.

use std::future::Future;

use std::ops::Deref;

use super::claim::{ClaimGuard, claim, retry_settle, undo_uncertain_claim, with_heartbeat};
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

pub(crate) async fn run<T, E, F>(
    idem: impl Deref<Target = Idem>,
    opts: &Options,
    key: Key,
    body: F,
) -> Result<T, E>
where
    E: From<Error>,
    F: Future<Output = Result<T, E>>,
{
    let store = idem.store();
    let owner = Owner::next();
    let req = ClaimRequest::new(ClaimKind::Lock, owner, opts.lease);
    let fence = match claim(&**store, &key, &req, opts.wait)
        .await
        .inspect_err(|e| undo_uncertain_claim(store, key, owner, e))?
    {
        Some(ClaimOutcome::Claimed { fence }) => fence,
        None | Some(ClaimOutcome::Busy { .. }) => return Err(Error::Locked { key }.into()),
        Some(_) => {
            return Err(Error::Corrupt {
                key,
                reason: "a lock key holds a record that is not a lock".into(),
            }
            .into());
        }
    };
    let mut guard = ClaimGuard::new(store.clone(), key, owner);
    let (result, lost) =
        with_heartbeat(&**store, &key, owner, opts.lease, FENCE.scope(fence, body)).await;
    let released = store.release(&key, owner).await;
    guard.disarm();
    match released {
        Ok(true) => {}
        Ok(false) => idem.lease_lost(&key, lost),
        Err(e) => {
            idem.count_store_failure();
            tracing::warn!(%key, error = %e, "unlock failed; retrying in the background");
            retry_settle(store.clone(), key, owner, None);
        }
    }
    result
}
