//! The store under test, started by the controller when it is its own, and the store
//! fault it makes: a connection cut, a restart or a failover.

use std::time::Duration;

use super::lab::{Lab, rehost};
use crate::Opts;
use crate::ledger::Ledger;
use crate::servers::{Node, Sentinels};

/// The store under test, and what the controller can do to it.
pub(super) enum Backend {
    /// A server someone else runs; for PostgreSQL, its connections can be cut.
    Url { url: String, postgres: bool },
    /// A private Redis with an append-only file fsynced on every write.
    Aof(Node),
    /// A private primary, replica and three sentinels.
    Sentinel(Sentinels),
}

impl Backend {
    pub(super) fn start(o: &Opts, run: &str, lab: Option<&Lab>) -> Result<Backend, String> {
        let host = |i: usize| lab.and_then(|l| l.servers.get(i));
        Ok(match o.store.as_str() {
            "redis-aof" => Backend::Aof(Node::start_on(
                host(0),
                &[
                    "--save",
                    "",
                    "--appendonly",
                    "yes",
                    "--appendfsync",
                    "always",
                ],
                None,
            )?),
            "redis-sentinel" => {
                let hosts = lab.map(|l| {
                    [
                        l.servers[0].clone(),
                        l.servers[1].clone(),
                        l.servers[2].clone(),
                    ]
                });
                let min = o.min_replicas.unwrap_or(u32::from(lab.is_some()));
                Backend::Sentinel(Sentinels::start_on(hosts.as_ref(), min)?)
            }
            url if url.starts_with("postgres") => {
                let sep = if url.contains('?') { '&' } else { '?' };
                Backend::Url {
                    url: format!("{url}{sep}application_name={run}"),
                    postgres: true,
                }
            }
            url => Backend::Url {
                url: url.to_owned(),
                postgres: false,
            },
        })
    }

    pub(super) fn url(&self) -> String {
        match self {
            Backend::Url { url, .. } => url.clone(),
            Backend::Aof(node) => format!("redis://{}:{}", node.addr, node.port),
            Backend::Sentinel(s) => s.url(),
        }
    }

    /// The URL the worker of `slot` uses: through the forwarder for a URL store; for
    /// Sentinel, its own site's sentinel first (slots alternate between the data
    /// nodes' sites).
    pub(super) fn worker_url(&self, slot: usize, lab: Option<&Lab>) -> Result<String, String> {
        match (self, lab) {
            (Backend::Url { url, .. }, Some(lab)) => {
                let fwd = lab.store_fwd.as_ref().ok_or("no forwarder")?;
                rehost(url, lab.net.root_addr(), fwd.port)
            }
            (Backend::Sentinel(s), Some(_)) => Ok(s.url_from(slot % 2)),
            _ => Ok(self.url()),
        }
    }

    pub(super) fn describe(&self, o: &Opts, replicas: usize) -> String {
        match self {
            Backend::Url { url, .. } => url.clone(),
            Backend::Aof(_) => format!("redis-aof ({}, appendfsync always)", self.url()),
            Backend::Sentinel(s) => format!(
                "{} ({}, wait_for_replicas({replicas}), min-replicas-to-write {})",
                o.store,
                self.url(),
                s.min_replicas
            ),
        }
    }

    /// Makes one store fault and records it; `None` when this store takes none.
    pub(super) async fn fault(
        &mut self,
        ledger: &Ledger,
        run: &str,
    ) -> Result<Option<&'static str>, String> {
        match self {
            Backend::Url {
                postgres: false, ..
            } => Ok(None),
            Backend::Url { postgres: true, .. } => {
                ledger.event("cut", 0).await?;
                ledger.cut_connections(run).await?;
                Ok(Some("cut"))
            }
            Backend::Aof(node) => {
                ledger.event("restart", 0).await?;
                tokio::task::block_in_place(|| {
                    node.kill();
                    std::thread::sleep(Duration::from_millis(300));
                    node.restart()
                })?;
                Ok(Some("restart"))
            }
            Backend::Sentinel(s) => {
                ledger.event("failover", 0).await?;
                let took = tokio::task::block_in_place(|| s.fail_over())?;
                // Recorded once the promotion is over (and the old primary is back).
                ledger.event("promoted", 0).await?;
                println!(
                    "failover: replica promoted {} ms after the kill",
                    took.as_millis()
                );
                Ok(Some("failover"))
            }
        }
    }
}
