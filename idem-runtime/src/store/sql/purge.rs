//! Deleting expired records in bounded batches, on demand or from a background task.

use std::time::Duration;

use super::SqlStore;
use crate::Error;

impl SqlStore {
    /// Deletes up to `batch` expired records (oldest first) and returns how many it
    /// deleted. Call it until it returns less than `batch` to purge everything expired;
    /// bounded batches keep each statement's locks and undo log small.
    ///
    /// ```no_run
    /// # async fn demo(store: idem_runtime::SqlStore) -> Result<(), idem_runtime::Error> {
    /// while store.purge_expired(1000).await? == 1000 {}
    /// # Ok(()) }
    /// ```
    pub async fn purge_expired(&self, batch: u32) -> Result<u64, Error> {
        let batch = i64::from(batch.max(1));
        self.bounded(self.dialect.purge(batch)).await
    }

    /// Spawns a task (on the current tokio runtime) that purges expired records every
    /// `every`, in batches of `batch` rows until none is left. Errors are logged and the
    /// task carries on; it stops when the returned handle is dropped.
    pub fn spawn_purge(&self, every: Duration, batch: u32) -> PurgeTask {
        let store = self.clone();
        let handle = tokio::spawn(async move {
            let mut tick = tokio::time::interval(every.max(Duration::from_millis(10)));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                loop {
                    match store.purge_expired(batch).await {
                        Ok(n) => {
                            if n > 0 {
                                tracing::debug!(deleted = n, "purged expired idem records");
                            }
                            if n < u64::from(batch.max(1)) {
                                break;
                            }
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "purging expired idem records failed");
                            break;
                        }
                    }
                }
            }
        });
        PurgeTask(handle)
    }
}

/// The background purge started by [`SqlStore::spawn_purge`]; dropping it stops the task.
#[derive(Debug)]
pub struct PurgeTask(tokio::task::JoinHandle<()>);

impl PurgeTask {
    /// Stops the task now.
    pub fn stop(self) {}
}

impl Drop for PurgeTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}
