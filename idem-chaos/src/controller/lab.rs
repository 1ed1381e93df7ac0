//! The virtual hosts of a partition run (`--faults partition`): one per worker slot and
//! per private server, the forwarders that lead a URL store's and the ledger's traffic
//! out of them, and the cuts between them; and how a URL is pointed at a forwarder.

use std::net::{Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::time::Instant;

use super::fleet::Fleet;
use crate::Opts;
use crate::ledger::Ledger;
use crate::netns::{Forward, Host, Net, Peer};

/// The virtual hosts of a partition run (`--faults partition`).
pub(super) struct Lab {
    /// One host per worker slot; a replaced worker runs on its predecessor's host.
    pub(super) slots: Vec<Host>,
    /// The private servers' hosts (none for a URL store).
    pub(super) servers: Vec<Host>,
    /// A URL store's forwarder (the workers' only way to it) and the ledger's.
    pub(super) store_fwd: Option<Forward>,
    pub(super) ledger_fwd: Forward,
    /// Worker slots cut from the store now, and when they heal.
    pub(super) cut: Vec<usize>,
    pub(super) heal_at: Option<Instant>,
    /// Counts for the summary.
    pub(super) cuts: usize,
    pub(super) slots_cut: usize,
    pub(super) splits: usize,
    // Last: dropped after the forwarders, servers and workers of the run.
    pub(super) net: Net,
}

/// `host:port` of a `scheme://[user@]host:port/…` URL (default port by scheme).
pub(super) fn host_port(url: &str) -> Result<(String, u16), String> {
    let (scheme, rest) = url.split_once("://").ok_or(format!("{url}: not a URL"))?;
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let default = if scheme.starts_with("redis") {
        6379
    } else {
        5432
    };
    match hostport.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => Ok((
            h.trim_matches(['[', ']']).to_owned(),
            p.parse().map_err(|e| format!("{url}: port: {e}"))?,
        )),
        _ => Ok((hostport.trim_matches(['[', ']']).to_owned(), default)),
    }
}

/// `url` with its host and port replaced by `addr:port`.
pub(super) fn rehost(url: &str, addr: Ipv4Addr, port: u16) -> Result<String, String> {
    let (scheme, rest) = url.split_once("://").ok_or(format!("{url}: not a URL"))?;
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let user = authority.rsplit_once('@').map(|(u, _)| format!("{u}@"));
    Ok(format!(
        "{scheme}://{}{addr}:{port}{tail}",
        user.unwrap_or_default()
    ))
}

/// The loopback address a URL's server listens on.
fn target(url: &str) -> Result<SocketAddr, String> {
    let (host, port) = host_port(url)?;
    (host.as_str(), port)
        .to_socket_addrs()
        .map_err(|e| format!("{url}: {e}"))?
        .find(SocketAddr::is_ipv4)
        .ok_or(format!("{url}: no IPv4 address"))
}

impl Lab {
    /// `through`: where a URL store's forwarder leads instead of the store (the netem
    /// proxy in front of it).
    pub(super) async fn start(o: &Opts, through: Option<SocketAddr>) -> Result<Lab, String> {
        let mut net = Net::new()?;
        let servers = match o.store.as_str() {
            "redis-sentinel" => vec![net.add_host("a")?, net.add_host("b")?, net.add_host("c")?],
            "redis-aof" => vec![net.add_host("a")?],
            _ => Vec::new(),
        };
        let slots = (1..=o.workers)
            .map(|i| net.add_host(&format!("w{i}")))
            .collect::<Result<Vec<_>, _>>()?;
        let root = net.root_addr();
        let store_fwd = if servers.is_empty() {
            let to = match through {
                Some(addr) => addr,
                None => target(&o.store)?,
            };
            Some(Forward::start(root, to).await?)
        } else {
            None
        };
        let ledger_fwd = Forward::start(root, target(&o.ledger)?).await?;
        Ok(Lab {
            slots,
            servers,
            store_fwd,
            ledger_fwd,
            cut: Vec::new(),
            heal_at: None,
            cuts: 0,
            slots_cut: 0,
            splits: 0,
            net,
        })
    }

    /// What the workers of `slots` cannot reach while cut from the store.
    fn store_peers(&self) -> Vec<Peer> {
        match &self.store_fwd {
            Some(f) => vec![Peer {
                addr: self.net.root_addr(),
                port: Some(f.port),
            }],
            None => self
                .servers
                .iter()
                .map(|h| Peer {
                    addr: h.addr,
                    port: None,
                })
                .collect(),
        }
    }

    /// Cuts `slots` from the store until `heal_at`; records a `partition` event per
    /// worker cut, once the rules are in force.
    pub(super) async fn cut_from_store(
        &mut self,
        slots: Vec<usize>,
        heal_at: Instant,
        fleet: &Fleet,
        ledger: &Ledger,
    ) -> Result<(), String> {
        let peers = self.store_peers();
        let hosts: Vec<&Host> = slots.iter().map(|&i| &self.slots[i]).collect();
        self.net.cut(&hosts, &peers)?;
        for w in fleet.workers.iter().filter(|w| slots.contains(&w.slot)) {
            ledger.event("partition", w.inc).await?;
        }
        self.cuts += 1;
        self.slots_cut += slots.len();
        self.cut = slots;
        self.heal_at = Some(heal_at);
        Ok(())
    }

    /// Heals a cut; records a `heal` event per worker first, so a call that ended
    /// before it was cut all along.
    pub(super) async fn heal(&mut self, fleet: &Fleet, ledger: &Ledger) -> Result<(), String> {
        if self.heal_at.take().is_none() {
            return Ok(());
        }
        for w in fleet.workers.iter().filter(|w| self.cut.contains(&w.slot)) {
            ledger.event("heal", w.inc).await?;
        }
        self.cut.clear();
        self.net.heal()
    }
}
