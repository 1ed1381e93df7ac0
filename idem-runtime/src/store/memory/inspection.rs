//! What operators do with in-process records: read one, remove one.

use tokio::time::Instant;

use super::{MemoryStore, State};
use crate::Key;
use crate::store::ClaimKind;
use crate::store::{RecordInfo, RecordState};

impl MemoryStore {
    /// The live record under `key`, read under its shard's lock.
    pub(super) fn inspect_now(&self, key: &Key) -> Option<RecordInfo> {
        let now = Instant::now();
        let mut shard = self.shard(key);
        let e = shard.live(key, now)?;
        let mut info = match &e.state {
            State::Issued => {
                let mut info = RecordInfo::new(RecordState::Issued);
                info.kind = Some(ClaimKind::Token);
                info
            }
            State::InProgress {
                owner,
                lease_until,
                token_expires,
                fence,
            } => {
                let mut info = RecordInfo::new(RecordState::InProgress);
                info.kind = Some(match (token_expires, fence) {
                    (Some(_), _) => ClaimKind::Token,
                    (None, 0) => ClaimKind::Dedup,
                    (None, _) => ClaimKind::Lock,
                });
                info.owner = Some(*owner);
                info.lease_left = Some(lease_until.saturating_duration_since(now));
                info.fence = (*fence > 0).then_some(*fence);
                info
            }
            State::Completed { value, .. } => {
                let mut info = RecordInfo::new(RecordState::Completed);
                info.value_size = Some(value.len());
                info
            }
        };
        info.fingerprint = e.fingerprint.is_some();
        info.ttl_left = Some(e.expires_at.saturating_duration_since(now));
        Some(info)
    }

    /// Removes the live record under `key`. Dropping it drops its waiters' senders,
    /// which wakes them; the fence counter is the store's, so fences keep growing.
    pub(super) fn forget_now(&self, key: &Key) -> bool {
        let now = Instant::now();
        let mut shard = self.shard(key);
        shard.journals.drop_journal(key);
        shard.pending.finished(key);
        if shard.live(key, now).is_none() {
            return false;
        }
        shard.map.remove(key.digest()).is_some()
    }
}
