//! The Redis cases: raw baselines, idem's operations through `RedisStore`, the
//! connection-use designs, and wake-up latency.

pub(crate) mod baseline;
pub(crate) mod connections;
pub(crate) mod idem_ops;
pub(crate) mod wake;

use std::sync::Arc;

use idem_runtime::{Idem, RedisStore};

/// What every Redis case needs.
#[derive(Clone)]
pub(crate) struct Ctx {
    pub(crate) url: String,
    pub(crate) store: RedisStore,
    pub(crate) idem: Idem,
    /// Unique per run, so runs never see each other's keys.
    pub(crate) run: Arc<str>,
    pub(crate) secs: f64,
}

impl Ctx {
    pub(crate) fn new(url: &str, secs: f64, connections: usize) -> Result<Ctx, String> {
        let store = RedisStore::builder()
            .connections(connections)
            .connect(url)
            .map_err(|e| e.to_string())?;
        let run: Arc<str> = Arc::from(format!(
            "bench-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis())
                .unwrap_or(0)
        ));
        let idem = Idem::builder()
            .store(store.clone())
            .namespace(run.to_string())
            .build();
        Ok(Ctx {
            url: url.to_owned(),
            store,
            idem,
            run,
            secs,
        })
    }
}
