//! The in-process fast path a store may offer (see [`Store::local`](super::Store::local)).

use std::any::Any;

use bytes::Bytes;

use super::{ClaimOutcome, ClaimRequest};
use crate::{Error, Fingerprint, Key};

/// A decoded value kept beside a completed record by a [`LocalStore`], so that a replay
/// can hand out a clone of it instead of decoding the stored bytes again.
pub type Memo = std::sync::Arc<dyn Any + Send + Sync>;

/// The fast path of a store whose records live in this process (see [`Store::local`](super::Store::local)):
/// answered at once, without a future, and able to keep a decoded value beside a
/// completed record.
///
/// Everything here is an optimisation. The strategies fall back to the [`Store`](super::Store) methods
/// for anything a local store does not answer, and a store that does not implement this
/// trait loses nothing but speed.
pub trait LocalStore: Send + Sync {
    /// The same atomic step as [`Store::claim`](super::Store::claim), answered synchronously. A completed
    /// record comes with the memo kept for it by [`memoize`](Self::memoize), if any.
    fn claim_now(
        &self,
        key: &Key,
        req: &ClaimRequest,
    ) -> Result<(ClaimOutcome, Option<Memo>), Error>;

    /// Keeps `memo` beside the completed record under `key`, if that record still holds
    /// exactly `value` (the bytes `claim_now` returned; `memo` was decoded from them).
    /// A record that has changed since is left alone.
    fn memoize(&self, key: &Key, value: &Bytes, memo: Memo);

    /// Calls `read` with the fingerprint and memo of the completed record under `key`
    /// if it is live and has a memo, and returns whether it did; changes nothing. Lets a
    /// replay skip building a claim at all. `read` runs while the record cannot change
    /// (it only clones the value), so the memo's reference count is never touched: on a
    /// hot key that shared counter would cost as much as the lookup.
    fn peek_memo(
        &self,
        key: &Key,
        read: &mut dyn FnMut(Option<Fingerprint>, &(dyn Any + Send + Sync)),
    ) -> bool;
}
