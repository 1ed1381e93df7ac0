//! What every Redis case needs: the store, an `Idem` on it, a namespace of the run's own.

use std::sync::Arc;

use idem_runtime::{Idem, RedisStore};

/// What every Redis case needs.
#[derive(Clone)]
pub struct Ctx {
    pub(crate) url: String,
    pub(crate) store: RedisStore,
    pub(crate) idem: Idem,
    /// Unique per run, so runs never see each other's keys.
    pub(crate) run: Arc<str>,
    pub secs: f64,
    /// The server's process id, when it runs on this machine (for CPU accounting).
    pub server_pid: Option<u32>,
}

impl Ctx {
    pub fn new(url: &str, secs: f64, connections: usize) -> Result<Ctx, String> {
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
            server_pid: None,
        })
    }

    /// Finds the server's process id if it is a Redis on this machine (`INFO server`'s
    /// `process_id`, checked against `/proc`), for the CPU-per-operation figures.
    pub async fn find_server(&mut self) {
        use idem_runtime::store::redis::redis;
        let Ok(info) = self
            .store
            .command::<String>(redis::cmd("INFO").arg("server"))
            .await
        else {
            return;
        };
        let pid = info
            .lines()
            .find_map(|l| l.strip_prefix("process_id:"))
            .and_then(|p| p.trim().parse::<u32>().ok());
        let local = |pid: u32| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.starts_with("redis"))
        };
        self.server_pid = pid.filter(|p| local(*p));
    }
}
