//! The controller: starts the store (when it is ours), the ledger and the workers; kills
//! and replaces workers at random; restarts, fails over or cuts the store, or partitions
//! the network (`--faults partition`); at the end heals everything, lets the leases
//! pass, calls every key once more, checks the ledger and the history and prints the
//! summary.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use super::check::{Verdict, check};
use super::ledger::{History, Ledger};
use super::netns::{Forward, Host, Net, Peer};
use super::proxy::Proxy;
use super::rng::Rng;
use super::servers::{Node, Sentinels};
use super::worker::{self, LEASE, Outcome};
use super::{Fault, GRACE, Opts};

/// The virtual hosts of a partition run (`--faults partition`).
struct Lab {
    /// One host per worker slot; a replaced worker runs on its predecessor's host.
    slots: Vec<Host>,
    /// The private servers' hosts (none for a URL store).
    servers: Vec<Host>,
    /// A URL store's forwarder (the workers' only way to it) and the ledger's.
    store_fwd: Option<Forward>,
    ledger_fwd: Forward,
    /// Worker slots cut from the store now, and when they heal.
    cut: Vec<usize>,
    heal_at: Option<Instant>,
    /// Counts for the summary.
    cuts: usize,
    slots_cut: usize,
    splits: usize,
    // Last: dropped after the forwarders, servers and workers of the run.
    net: Net,
}

/// `host:port` of a `scheme://[user@]host:port/…` URL (default port by scheme).
fn host_port(url: &str) -> Result<(String, u16), String> {
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
fn rehost(url: &str, addr: Ipv4Addr, port: u16) -> Result<String, String> {
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
    async fn start(o: &Opts, through: Option<SocketAddr>) -> Result<Lab, String> {
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
    async fn cut_from_store(
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
    async fn heal(&mut self, fleet: &Fleet, ledger: &Ledger) -> Result<(), String> {
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

/// The store under test, and what the controller can do to it.
enum Backend {
    /// A server someone else runs; for PostgreSQL, its connections can be cut.
    Url { url: String, postgres: bool },
    /// A private Redis with an append-only file fsynced on every write.
    Aof(Node),
    /// A private primary, replica and three sentinels.
    Sentinel(Sentinels),
}

impl Backend {
    fn start(o: &Opts, run: &str, lab: Option<&Lab>) -> Result<Backend, String> {
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

    fn url(&self) -> String {
        match self {
            Backend::Url { url, .. } => url.clone(),
            Backend::Aof(node) => format!("redis://{}:{}", node.addr, node.port),
            Backend::Sentinel(s) => s.url(),
        }
    }

    /// The URL the worker of `slot` uses: through the forwarder for a URL store; for
    /// Sentinel, its own site's sentinel first (slots alternate between the data
    /// nodes' sites).
    fn worker_url(&self, slot: usize, lab: Option<&Lab>) -> Result<String, String> {
        match (self, lab) {
            (Backend::Url { url, .. }, Some(lab)) => {
                let fwd = lab.store_fwd.as_ref().ok_or("no forwarder")?;
                rehost(url, lab.net.root_addr(), fwd.port)
            }
            (Backend::Sentinel(s), Some(_)) => Ok(s.url_from(slot % 2)),
            _ => Ok(self.url()),
        }
    }

    fn describe(&self, o: &Opts, replicas: usize) -> String {
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
    async fn fault(&mut self, ledger: &Ledger, run: &str) -> Result<Option<&'static str>, String> {
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

/// A worker process and what it last reported.
struct Worker {
    inc: i32,
    /// Its place: the same host (in a partition run) and store URL as its predecessor's.
    slot: usize,
    child: Child,
}

#[derive(Default)]
struct Reports {
    /// The last `stat` line's numbers, per incarnation (the seventh: leases lost).
    stats: HashMap<i32, [u64; 7]>,
    unexpected: Vec<String>,
}

struct Fleet {
    o: Opts,
    run: String,
    /// The controller's own store URL (the final sweep's).
    url: String,
    /// Per slot: the store URL and the host (partition runs).
    slot_urls: Vec<String>,
    slot_hosts: Vec<Option<Host>>,
    /// The ledger as workers reach it.
    ledger_url: String,
    history: PathBuf,
    small: bool,
    replicas: usize,
    keys: u64,
    until_ms: u64,
    next_inc: i32,
    workers: Vec<Worker>,
    reports: Arc<Mutex<Reports>>,
    failed_starts: usize,
}

impl Fleet {
    /// Starts a worker in `slot`; returns its incarnation.
    fn spawn(&mut self, slot: usize) -> Result<i32, String> {
        let inc = self.next_inc;
        self.next_inc += 1;
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let exe = exe.to_str().ok_or("the program's path is not UTF-8")?;
        let mut cmd = match &self.slot_hosts[slot] {
            Some(h) => h.tokio_command(exe),
            None => Command::new(exe),
        };
        let mut child = cmd
            .arg("--worker")
            .env("IDEM_CHAOS_STORE", &self.slot_urls[slot])
            .env("IDEM_CHAOS_LEDGER", &self.ledger_url)
            .env("IDEM_CHAOS_HISTORY", &self.history)
            .env("IDEM_CHAOS_SMALL", u8::from(self.small).to_string())
            .env("IDEM_CHAOS_RUN", &self.run)
            .env("IDEM_CHAOS_INC", inc.to_string())
            .env("IDEM_CHAOS_KEYS", self.keys.to_string())
            .env("IDEM_CHAOS_TASKS", self.o.tasks.to_string())
            .env("IDEM_CHAOS_UNTIL", self.until_ms.to_string())
            .env("IDEM_CHAOS_REPLICAS", self.replicas.to_string())
            .env(
                "IDEM_CHAOS_SHORT_LEASE",
                if self.o.has(Fault::Netem) { "1" } else { "0" },
            )
            .env("RUST_LOG", "off")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("starting a worker: {e}"))?;
        let out = child.stdout.take().ok_or("worker stdout")?;
        let reports = self.reports.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(out).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let mut r = reports.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(rest) = line.strip_prefix("stat ") {
                    let mut n = [0u64; 7];
                    for (slot, v) in n.iter_mut().zip(rest.split(' ')) {
                        *slot = v.parse().unwrap_or(0);
                    }
                    r.stats.insert(inc, n);
                } else if let Some(why) = line.strip_prefix("unexpected ") {
                    r.unexpected.push(format!("worker {inc}: {why}"));
                }
            }
        });
        self.workers.push(Worker { inc, slot, child });
        Ok(inc)
    }

    /// SIGKILLs worker `i` and records it; returns its slot.
    async fn kill(&mut self, i: usize, ledger: &Ledger) -> Result<usize, String> {
        let mut w = self.workers.swap_remove(i);
        let _ = w.child.start_kill();
        let _ = w.child.wait().await;
        ledger.event("kill", w.inc).await?;
        Ok(w.slot)
    }

    /// Replaces workers that exited on their own before the end (counted); returns the
    /// new incarnations with their slots.
    fn reap(&mut self) -> Result<Vec<(i32, usize)>, String> {
        let mut i = 0;
        let mut new = Vec::new();
        while i < self.workers.len() {
            if let Ok(Some(_)) = self.workers[i].child.try_wait() {
                let w = self.workers.swap_remove(i);
                if worker::now_ms() + 1000 < self.until_ms {
                    self.failed_starts += 1;
                    new.push((self.spawn(w.slot)?, w.slot));
                }
            } else {
                i += 1;
            }
        }
        Ok(new)
    }
}

/// Runs the whole chaos run; returns the number of violations.
pub(crate) async fn run(mut o: Opts) -> Result<usize, String> {
    if o.has(Fault::Netem)
        && let Some(why) = no_netem(&o)
    {
        if !o.all_faults {
            return Err(format!("--faults netem: {why}"));
        }
        println!("--faults all: netem skipped: {why}");
        o.faults.retain(|&f| f != Fault::Netem);
    }
    let run = format!(
        "idem_chaos_{}_{}",
        std::process::id(),
        worker::now_ms() % 1_000_000_000
    );
    // `--faults netem` on a URL store: the proxy first, so that a partition run's
    // forwarder leads the workers into it.
    let mut netem = if o.has(Fault::Netem) && o.store.contains("://") {
        Some(super::proxy::netem(&o.store, o.seed).await?.0)
    } else {
        None
    };
    let mut lab = if o.has(Fault::Partition) {
        let through = netem
            .as_ref()
            .map(|p| SocketAddr::from((Ipv4Addr::LOCALHOST, p.port)));
        Some(Lab::start(&o, through).await?)
    } else {
        None
    };
    let mut backend = Backend::start(&o, &run, lab.as_ref())?;
    if o.has(Fault::Netem) && netem.is_none() {
        // `redis-aof` (no partitions): in front of its private server.
        netem = Some(super::proxy::netem(&backend.url(), o.seed).await?.0);
    }
    let replicas = usize::from(o.store == "redis-sentinel" && !o.no_wait);
    let history = std::env::temp_dir().join(format!("{run}_history"));
    std::fs::create_dir_all(&history).map_err(|e| format!("{}: {e}", history.display()))?;
    let ledger = Ledger::open(&o.ledger, &run, 8).await?;
    ledger.create().await?;
    // On an error too, the servers, workers and namespaces are dropped below; a run
    // killed by a signal leaves its namespaces to the next run's `remove_stale`.
    let result = chaos(
        &o,
        &run,
        &mut backend,
        lab.as_mut(),
        netem.as_ref(),
        replicas,
        &ledger,
        &history,
    )
    .await;
    if !o.keep {
        let _ = ledger.drop_tables().await;
        let _ = std::fs::remove_dir_all(&history);
    } else {
        println!("history kept in {}", history.display());
    }
    drop(backend);
    drop(lab);
    drop(netem);
    result
}

/// Why `--faults netem` cannot run on this store, if it cannot: its proxy stands in
/// front of one server the controller can reach.
fn no_netem(o: &Opts) -> Option<String> {
    match o.store.as_str() {
        "redis-sentinel" => Some(
            "the proxy needs a single-host store, and Sentinel hands the workers its servers' own addresses"
                .into(),
        ),
        "redis-aof" if o.has(Fault::Partition) => Some(
            "with partitions, redis-aof's server is on a virtual host, out of the proxy's way"
                .into(),
        ),
        "redis-aof" => None,
        url => super::proxy::through(url)
            .is_none()
            .then(|| format!("{url} is not a single-host URL")),
    }
}

#[allow(clippy::too_many_arguments)]
async fn chaos(
    o: &Opts,
    run: &str,
    backend: &mut Backend,
    mut lab: Option<&mut Lab>,
    netem: Option<&Proxy>,
    replicas: usize,
    ledger: &Ledger,
    history: &std::path::Path,
) -> Result<usize, String> {
    let keys = o.keys.unwrap_or(o.seconds * 100).max(100);
    let started = Instant::now();
    // `--faults netem`: the workers reach the store through the slow, lossy proxy (in a
    // partition run, through their forwarder and then the proxy); the final sweep goes
    // direct.
    let slot_urls = (0..o.workers)
        .map(|i| match (netem, lab.as_deref()) {
            (Some(p), None) => rehost(&backend.url(), Ipv4Addr::LOCALHOST, p.port),
            (_, lab) => backend.worker_url(i, lab),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let ledger_url = match lab.as_deref() {
        Some(l) => rehost(&o.ledger, l.net.root_addr(), l.ledger_fwd.port)?,
        None => o.ledger.clone(),
    };
    let mut fleet = Fleet {
        o: o.clone(),
        run: run.to_owned(),
        url: backend.url(),
        slot_urls,
        slot_hosts: (0..o.workers)
            .map(|i| lab.as_deref().map(|l| l.slots[i].clone()))
            .collect(),
        ledger_url,
        history: history.to_owned(),
        small: lab.is_some(),
        replicas,
        keys,
        until_ms: worker::now_ms() + o.seconds * 1000,
        next_inc: 1,
        workers: Vec::new(),
        reports: Arc::default(),
        failed_starts: 0,
    };
    println!(
        "idem-chaos: store {}, {} s, {} workers x {} tasks, {keys} keys, seed {}{}",
        backend.describe(o, replicas),
        o.seconds,
        o.workers,
        o.tasks,
        o.seed,
        if o.faults.is_empty() {
            String::new()
        } else {
            let named: Vec<String> = o
                .faults
                .iter()
                .map(|&f| {
                    let how = match f {
                        Fault::Partition => "network namespaces, nftables drop",
                        Fault::Pause => "SIGSTOP past the lease",
                        Fault::Netem => "a slow, lossy proxy",
                    };
                    format!("{} ({how})", f.name())
                })
                .collect();
            format!(", faults: {}", named.join(", "))
        }
    );
    for slot in 0..o.workers {
        fleet.spawn(slot)?;
    }
    let mut rng = Rng::new(o.seed);
    let end = started + Duration::from_secs(o.seconds);
    let (mut killed, mut faults) = (0usize, 0usize);
    let mut fault_kind = "";
    let mut next_kill = Instant::now() + Duration::from_millis(1000 + rng.below(1500));
    let mut next_fault = Instant::now() + Duration::from_millis(4000 + rng.below(3000));
    // `--faults pause`: a worker stopped past its lease every few seconds.
    let mut pauses = Vec::new();
    // (The seed draws nothing for it otherwise, so a run without pauses repeats.)
    let mut next_pause = Instant::now();
    if o.has(Fault::Pause) {
        next_pause += Duration::from_millis(2000 + rng.below(2000));
    }
    while Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut new = fleet.reap()?;
        let now = Instant::now();
        if now >= next_kill && !fleet.workers.is_empty() && now + Duration::from_secs(1) < end {
            let i = usize::try_from(rng.below(fleet.workers.len() as u64)).unwrap_or(0);
            let slot = fleet.kill(i, ledger).await?;
            killed += 1;
            new.push((fleet.spawn(slot)?, slot));
            next_kill = Instant::now() + Duration::from_millis(800 + rng.below(2000));
        }
        if let Some(lab) = lab.as_deref_mut() {
            // A worker started on a cut host is cut too.
            for (inc, slot) in new {
                if lab.cut.contains(&slot) {
                    ledger.event("partition", inc).await?;
                }
            }
            if lab.heal_at.is_some_and(|t| now >= t) {
                lab.heal(&fleet, ledger).await?;
                next_fault = Instant::now() + Duration::from_millis(2000 + rng.below(4000));
            }
            if lab.heal_at.is_none() && now >= next_fault && now + Duration::from_secs(8) < end {
                // Sentinel: a split brain first (so a short run has one), then cuts
                // and split brains in turn.
                let split = matches!(backend, Backend::Sentinel(_)) && faults % 2 == 0;
                if split {
                    if let Backend::Sentinel(s) = backend {
                        split_brain(s, lab, &fleet, ledger, &mut rng).await?;
                    }
                } else {
                    // Some workers (at least one, at times all) cut for 0.5 to 5 s: shorter
                    // and longer than the lease.
                    let n = 1 + rng.below(o.workers as u64) as usize;
                    let mut slots: Vec<usize> = (0..o.workers).collect();
                    for i in 0..slots.len() {
                        let j = i + rng.below((slots.len() - i) as u64) as usize;
                        slots.swap(i, j);
                    }
                    slots.truncate(n);
                    let heal_at = Instant::now() + Duration::from_millis(500 + rng.below(4500));
                    lab.cut_from_store(slots, heal_at, &fleet, ledger).await?;
                }
                faults += 1;
                fault_kind = "partition";
                next_fault = Instant::now() + Duration::from_millis(2000 + rng.below(4000));
            }
        } else if now >= next_fault && now + Duration::from_secs(3) < end {
            if let Some(kind) = backend.fault(ledger, run).await? {
                faults += 1;
                fault_kind = kind;
            }
            next_fault = Instant::now() + Duration::from_millis(6000 + rng.below(6000));
        }
        if o.has(Fault::Pause)
            && now >= next_pause
            && !fleet.workers.is_empty()
            && now + super::pause::HOLD + Duration::from_secs(2) < end
        {
            let i = usize::try_from(rng.below(fleet.workers.len() as u64)).unwrap_or(0);
            let w = &fleet.workers[i];
            if let Some(pid) = w.child.id() {
                let (inc, ledger) = (w.inc, ledger.clone());
                pauses.push(tokio::spawn(async move {
                    super::pause::pause(pid, inc, super::pause::HOLD, &ledger).await
                }));
            }
            next_pause = Instant::now() + Duration::from_millis(3000 + rng.below(3000));
        }
    }
    // No worker stays stopped.
    for p in pauses {
        p.await.map_err(|e| e.to_string())??;
    }
    if let Some(lab) = lab.as_deref_mut() {
        lab.heal(&fleet, ledger).await?;
    }
    // Workers stop at the deadline by themselves; a straggler is killed (and recorded).
    let grace = Instant::now() + GRACE;
    while !fleet.workers.is_empty() && Instant::now() < grace {
        let mut i = 0;
        while i < fleet.workers.len() {
            if let Ok(Some(_)) = fleet.workers[i].child.try_wait() {
                fleet.workers.swap_remove(i);
            } else {
                i += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let stragglers = fleet.workers.len();
    while !fleet.workers.is_empty() {
        fleet.kill(0, ledger).await?;
    }
    // Every claim a killed or cut worker left ends with its lease; then each key is
    // called once more and must answer.
    tokio::time::sleep(LEASE + Duration::from_secs(1)).await;
    let sweep_history = History::create(&history.display().to_string(), 0)?;
    let (stuck, unanswered) = sweep(
        &fleet.url,
        replicas,
        run,
        ledger,
        &sweep_history,
        keys,
        lab.is_some(),
    )
    .await?;
    let contents = ledger.contents(history).await?;
    let verdict = check(&contents, replicas == 0 && o.store == "redis-sentinel");

    let reports = fleet.reports.lock().unwrap_or_else(|p| p.into_inner());
    let mut total = [0u64; 7];
    for s in reports.stats.values() {
        for (t, v) in total.iter_mut().zip(s) {
            *t += v;
        }
    }
    // The checker's violations are printed with their operations; these without.
    let mut violations: Vec<String> = reports.unexpected.clone();
    violations.extend((0..stuck).map(|_| "a key still in progress after its lease".to_owned()));
    violations.extend(
        unanswered
            .iter()
            .map(|k| format!("key {k}: no answer from the store in the final sweep")),
    );
    if lab.is_some() {
        // A call outlives its bounds only if it hangs; a hung worker does not stop.
        violations.extend((0..stragglers).map(|_| {
            format!(
                "a worker still calling {} s after the deadline (a call not bounded by its timeout)",
                GRACE.as_secs()
            )
        }));
    }

    println!(
        "workers killed: {killed} (SIGKILL), {} more exited early and were replaced",
        fleet.failed_starts
    );
    let fault_name = match fault_kind {
        "cut" => "connection cuts",
        "restart" => "restarts (SIGKILL)",
        "failover" => "failovers (primary SIGKILLed, replica promoted)",
        "partition" => "partitions (nftables drop, healed)",
        _ => "store faults",
    };
    println!("store faults: {faults} {fault_name}");
    if let Some(lab) = lab.as_deref() {
        println!(
            "partitions: {} app-store cuts ({} worker hosts cut in all), {} split brains (primary cut from its replica and two sentinels, replica promoted, healed)",
            lab.cuts, lab.slots_cut, lab.splits
        );
    }
    println!(
        "failovers: {}",
        if fault_kind == "failover" {
            faults
        } else {
            lab.as_deref().map_or(0, |l| l.splits)
        }
    );
    println!(
        "calls: {} (body ran {}, replayed {}, store errors {}, in progress {}, unexpected {})",
        total[0], total[1], total[2], total[3], total[4], total[5]
    );
    summary(&verdict);
    if o.has(Fault::Pause) {
        let p = super::pause::summary(&contents);
        println!(
            "pauses: {} workers stopped {} ms (past their {} ms lease); {} keys taken over; \
             {} effects of paused workers landed after the stop, {} of them made after waking \
             (plain dedup: a body goes on when it wakes)",
            p.pauses,
            super::pause::HOLD.as_millis(),
            LEASE.as_millis(),
            p.taken_over,
            p.late_effects,
            p.after_waking
        );
    }
    if let Some(proxy) = netem {
        println!(
            "netem: 50-200 ms each way, 5% loss, 1 s leases; {}",
            proxy.stats.line()
        );
    }
    println!(
        "leases lost: {} (completions refused, idem_lease_lost_total); {} keys ran again after a lost lease, each counted",
        total[6],
        super::pause::lost_lease_doubles(&contents)
    );
    println!("stuck keys: {stuck}");
    for v in verdict.violations.iter().take(10) {
        println!("violation: {v}");
        print!("{}", v.ops(&contents));
    }
    for v in verdict.violations.iter().skip(10).take(20) {
        println!("violation: {v}");
    }
    for v in violations.iter().take(20) {
        println!("violation: {v}");
    }
    let n = verdict.violations.len() + violations.len();
    println!("violations: {n}");
    Ok(n)
}

/// The checker's counts.
fn summary(verdict: &Verdict) {
    if verdict.longest_cut_call_us == 0 {
        println!("history: {} calls recorded", verdict.calls);
    } else {
        println!(
            "history: {} calls recorded; {} made wholly within a cut by a cut worker, {} of them Error::Store; the longest call overlapping a cut took {} ms",
            verdict.calls,
            verdict.cut_calls,
            verdict.cut_calls_failed,
            verdict.longest_cut_call_us / 1000
        );
    }
    println!(
        "effects: {} for {} keys; {} keys ran more than once, each after a kill or store fault in flight",
        verdict.effects, verdict.keys, verdict.explained
    );
    if !verdict.lost_in_failover.is_empty() {
        let max = verdict.lost_in_failover.iter().max().copied().unwrap_or(0);
        println!(
            "lost in failovers (no wait_for_replicas): {} completed keys ran again; the oldest was confirmed {} ms before the primary was lost",
            verdict.lost_in_failover.len(),
            max / 1000
        );
    }
    if verdict.lost_in_split > 0 {
        println!(
            "lost in split brains (no wait_for_replicas): {} completed keys ran again (completions the old primary acknowledged before it was demoted)",
            verdict.lost_in_split
        );
    }
    if verdict.doubled_in_split > 0 {
        println!(
            "doubled in split brains (no wait_for_replicas): {} keys ran on both sides",
            verdict.doubled_in_split
        );
    }
}

/// A Sentinel split brain: the primary's host (its server and one sentinel) and the
/// workers of its site are cut from the replica's site, the third sentinel and the
/// other workers. The majority promotes the replica; both sides keep calling for 1 to
/// 3 s more; then the network heals and the old primary rejoins as a replica.
async fn split_brain(
    s: &Sentinels,
    lab: &mut Lab,
    fleet: &Fleet,
    ledger: &Ledger,
    rng: &mut Rng,
) -> Result<(), String> {
    let old = tokio::task::block_in_place(|| s.primary()).ok_or("no primary to split off")?;
    // Data node i runs on server host i; worker slot j's site is j % 2.
    let minority: Vec<&Host> = std::iter::once(&lab.servers[old])
        .chain(
            lab.slots
                .iter()
                .enumerate()
                .filter(|(j, _)| j % 2 == old)
                .map(|(_, h)| h),
        )
        .collect();
    let majority: Vec<&Host> = lab
        .servers
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != old)
        .map(|(_, h)| h)
        .chain(
            lab.slots
                .iter()
                .enumerate()
                .filter(|(j, _)| j % 2 != old)
                .map(|(_, h)| h),
        )
        .collect();
    let (minority, majority): (Vec<Host>, Vec<Host>) = (
        minority.into_iter().cloned().collect(),
        majority.into_iter().cloned().collect(),
    );
    lab.net.partition(
        &minority.iter().collect::<Vec<_>>(),
        &majority.iter().collect::<Vec<_>>(),
    )?;
    ledger.event("split", 0).await?;
    lab.splits += 1;
    let took = tokio::task::block_in_place(|| s.wait_promoted(old));
    let took = match took {
        Ok(t) => t,
        Err(e) => {
            ledger.event("healed", 0).await?;
            lab.net.heal()?;
            return Err(e);
        }
    };
    ledger.event("promoted", 0).await?;
    tokio::time::sleep(Duration::from_millis(1000 + rng.below(2000))).await;
    ledger.event("healed", 0).await?;
    lab.net.heal()?;
    // Healed, the old primary is still a primary until a sentinel demotes it: the split
    // brain lasts until then.
    let healed = Instant::now();
    let rejoined = tokio::task::block_in_place(|| s.wait_rejoined(old));
    ledger.event("rejoined", 0).await?;
    rejoined?;
    println!(
        "split brain: replica promoted {} ms after the cut; healed; the old primary was a primary for {} ms more, then rejoined as a replica ({} workers on its side)",
        took.as_millis(),
        healed.elapsed().as_millis(),
        minority.len() - 1
    );
    let _ = fleet;
    Ok(())
}

async fn sweep(
    url: &str,
    replicas: usize,
    run: &str,
    ledger: &Ledger,
    history: &History,
    keys: u64,
    small: bool,
) -> Result<(usize, Vec<String>), String> {
    let (idem, watched) = worker::open(url, replicas, run, small).await?;
    let outcomes: Vec<(u64, Option<Outcome>)> = futures_util::stream::iter(0..keys)
        .map(|k| {
            let (idem, watched, ledger) = (idem.clone(), watched.clone(), ledger.clone());
            async move {
                let mut rng = Rng::new(k);
                for _ in 0..40 {
                    match worker::pay(&idem, &watched, &ledger, history, 0, k, &mut rng).await {
                        Outcome::StoreError => tokio::time::sleep(Duration::from_millis(100)).await,
                        o => return (k, Some(o)),
                    }
                }
                (k, None)
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    let mut stuck = 0;
    let mut unanswered = Vec::new();
    for (k, o) in outcomes {
        match o {
            Some(Outcome::Busy) => stuck += 1,
            Some(Outcome::Unexpected(why)) => unanswered.push(format!("{k} ({why})")),
            None => unanswered.push(k.to_string()),
            _ => {}
        }
    }
    Ok((stuck, unanswered))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn netem_goes_only_in_front_of_one_server() {
        let o = |s: &str| crate::parse(&s.split(' ').map(str::to_owned).collect::<Vec<_>>());
        for ok in [
            "--store redis://127.0.0.1:6379 --faults all",
            "--store postgres://postgres@127.0.0.1:5432/test --faults netem",
            "--store redis-aof --faults netem,pause",
        ] {
            assert!(no_netem(&o(ok).unwrap()).is_none(), "{ok}");
        }
        for skipped in [
            "--store redis-sentinel --faults all",
            "--store redis-aof --faults all",
            "--store redis+sentinel://127.0.0.1:1,127.0.0.1:2/svc --faults netem",
        ] {
            assert!(no_netem(&o(skipped).unwrap()).is_some(), "{skipped}");
        }
    }

    #[test]
    fn urls_are_rehosted_onto_the_forwarder() {
        let pg = "postgres://postgres@127.0.0.1:5432/test?application_name=x";
        assert_eq!(host_port(pg).unwrap(), ("127.0.0.1".to_owned(), 5432));
        assert_eq!(
            rehost(pg, Ipv4Addr::new(198, 18, 3, 1), 4000).unwrap(),
            "postgres://postgres@198.18.3.1:4000/test?application_name=x"
        );
        assert_eq!(
            host_port("redis://127.0.0.1").unwrap(),
            ("127.0.0.1".to_owned(), 6379)
        );
        assert_eq!(
            rehost("redis://127.0.0.1:6379", Ipv4Addr::new(198, 18, 3, 1), 7).unwrap(),
            "redis://198.18.3.1:7"
        );
        assert_eq!(
            host_port("redis://[::1]:6380/0").unwrap(),
            ("::1".to_owned(), 6380)
        );
    }
}
