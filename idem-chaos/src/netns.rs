//! Virtual hosts for idem-chaos: Linux network namespaces on one private bridge, and
//! silent partitions between them.
//!
//! A [`Net`] is a hub namespace holding a bridge, one namespace per host with a veth
//! into the bridge, and one veth from the bridge to the root namespace, so this process
//! (the controller) reaches every host and every host reaches the root side's address
//! without routing: nothing is forwarded by the machine, and no sysctl is touched.
//! Addresses are in 198.18.0.0/15, the range set aside for network tests (RFC 2544), one
//! /24 per run. Traffic between hosts is cut with nftables `drop` rules inside the
//! hosts' namespaces (no reset, no ICMP: the peers see silence) and healed by flushing
//! them.
//!
//! Every namespace is named `idemchaos-<pid>-<host>`. They are removed when the [`Net`]
//! is dropped (end of run, error or panic), and at the start of any later run if the
//! process that made them is gone (a run killed with SIGKILL), together with the
//! processes still inside them. Deleting the hub namespace deletes the root side's veth.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::process::{Command, Stdio};

/// The prefix of every namespace a run makes.
pub(crate) const PREFIX: &str = "idemchaos-";

/// The name of the nftables table each host's rules live in.
const TABLE: &str = "idemchaos";

/// One virtual host.
#[derive(Debug, Clone)]
pub(crate) struct Host {
    /// Its namespace, `idemchaos-<pid>-<name>`.
    pub(crate) ns: String,
    pub(crate) addr: Ipv4Addr,
}

impl Host {
    /// `command` run inside this host's namespace (`ip netns exec`, which execs the
    /// program: the child's pid is the program's).
    pub(crate) fn command(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns, program]);
        c
    }

    /// The same, for tokio.
    pub(crate) fn tokio_command(&self, program: &str) -> tokio::process::Command {
        let mut c = tokio::process::Command::new("ip");
        c.args(["netns", "exec", &self.ns, program]);
        c
    }
}

/// What one side of a cut cannot reach: a host's whole address, or one TCP port of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Peer {
    pub(crate) addr: Ipv4Addr,
    pub(crate) port: Option<u16>,
}

/// A private network of namespaces; removed on drop.
pub(crate) struct Net {
    owner: u32,
    subnet: u8,
    hub: String,
    hosts: Vec<Host>,
    /// Rules in force, per host namespace (for [`heal`](Self::heal) and the report).
    cuts: BTreeMap<String, Vec<Peer>>,
}

/// Runs `ip`/`nft` and friends; their stderr on failure.
fn sh(program: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| {
            format!("{program}: {e} (is it installed? `apt-get install -y iproute2 nftables`)")
        })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Whether this process can make namespaces and cut traffic: root, with `ip` and `nft`.
pub(crate) fn available() -> Result<(), String> {
    let uid = sh("id", &["-u"])?;
    if uid.trim() != "0" {
        return Err("network namespaces need root".into());
    }
    sh("ip", &["netns", "list"])?;
    sh("nft", &["--version"])?;
    Ok(())
}

/// Namespaces of runs whose process is gone: their processes are killed and the
/// namespaces deleted. Namespaces of live runs (another idem-chaos, a test) are kept.
pub(crate) fn remove_stale() {
    let Ok(list) = sh("ip", &["netns", "list"]) else {
        return;
    };
    for ns in list.lines().filter_map(|l| l.split_whitespace().next()) {
        let Some(rest) = ns.strip_prefix(PREFIX) else {
            continue;
        };
        let pid = rest.split('-').next().unwrap_or_default();
        if pid.parse::<u32>().is_ok() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            remove(ns);
        }
    }
}

/// Kills what still runs in `ns` (processes this program started there) and deletes it.
fn remove(ns: &str) {
    if let Ok(pids) = sh("ip", &["netns", "pids", ns]) {
        for pid in pids.split_whitespace() {
            let _ = sh("kill", &["-9", pid]);
        }
    }
    let _ = sh("ip", &["netns", "del", ns]);
}

impl Net {
    /// A new network with no hosts yet; stale namespaces of dead runs are removed first.
    pub(crate) fn new() -> Result<Net, String> {
        available()?;
        remove_stale();
        let owner = std::process::id();
        let hub = format!("{PREFIX}{owner}-hub");
        sh("ip", &["netns", "add", &hub])?;
        let mut net = Net {
            owner,
            subnet: 0,
            hub,
            hosts: Vec::new(),
            cuts: BTreeMap::new(),
        };
        net.in_hub(&["link", "add", "br0", "type", "bridge"])?;
        net.in_hub(&["link", "set", "br0", "up"])?;
        net.in_hub(&["link", "set", "lo", "up"])?;
        // A /24 no other run (and no route of the machine) uses: the root side's veth is
        // named after it, and making it fails if another run holds that number.
        let routes = sh("ip", &["-4", "route", "show"])?;
        let mut last = String::new();
        for subnet in 1..=254u8 {
            if routes.contains(&format!("198.18.{subnet}.")) {
                continue;
            }
            let root_if = format!("idemc{subnet}");
            match sh(
                "ip",
                &[
                    "link", "add", &root_if, "type", "veth", "peer", "name", "uplink", "netns",
                    &net.hub,
                ],
            ) {
                Ok(_) => {
                    net.subnet = subnet;
                    let addr = format!("198.18.{subnet}.1/24");
                    sh("ip", &["addr", "add", &addr, "dev", &root_if])?;
                    sh("ip", &["link", "set", &root_if, "up"])?;
                    net.in_hub(&["link", "set", "uplink", "master", "br0", "up"])?;
                    return Ok(net);
                }
                Err(e) => last = e,
            }
        }
        Err(format!("no free 198.18.x.0/24 for a chaos network: {last}"))
    }

    fn in_hub(&self, args: &[&str]) -> Result<String, String> {
        let mut a = vec!["-n", &self.hub];
        a.extend_from_slice(args);
        sh("ip", &a)
    }

    /// The root namespace's address on the bridge (where this process listens).
    pub(crate) fn root_addr(&self) -> Ipv4Addr {
        Ipv4Addr::new(198, 18, self.subnet, 1)
    }

    /// A new host `name`, up, with an empty nftables table.
    pub(crate) fn add_host(&mut self, name: &str) -> Result<Host, String> {
        let i = u8::try_from(self.hosts.len() + 10).map_err(|_| "too many hosts")?;
        let ns = format!("{PREFIX}{}-{name}", self.owner);
        sh("ip", &["netns", "add", &ns])?;
        let host = Host {
            ns: ns.clone(),
            addr: Ipv4Addr::new(198, 18, self.subnet, i),
        };
        // Pushed before it is set up, so a failure below still removes the namespace.
        self.hosts.push(host.clone());
        let port = format!("p{i}");
        self.in_hub(&[
            "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", &ns,
        ])?;
        self.in_hub(&["link", "set", &port, "master", "br0", "up"])?;
        let addr = format!("{}/24", host.addr);
        sh("ip", &["-n", &ns, "addr", "add", &addr, "dev", "eth0"])?;
        sh("ip", &["-n", &ns, "link", "set", "eth0", "up"])?;
        sh("ip", &["-n", &ns, "link", "set", "lo", "up"])?;
        let table = format!(
            "table inet {TABLE} {{\n\
               chain input {{ type filter hook input priority 0; policy accept; }}\n\
               chain output {{ type filter hook output priority 0; policy accept; }}\n\
             }}\n"
        );
        nft(&ns, &table)?;
        Ok(host)
    }

    /// Cuts `side` off from `peers`: packets either way are dropped inside each host of
    /// `side` (silently: no reset, no ICMP). Adds to the cuts already in force.
    pub(crate) fn cut(&mut self, side: &[&Host], peers: &[Peer]) -> Result<(), String> {
        for h in side {
            let mut rules = String::new();
            for p in peers {
                let (out_port, in_port) = match p.port {
                    Some(port) => (format!(" tcp dport {port}"), format!(" tcp sport {port}")),
                    None => (String::new(), String::new()),
                };
                rules.push_str(&format!(
                    "add rule inet {TABLE} output ip daddr {}{out_port} drop\n\
                     add rule inet {TABLE} input ip saddr {}{in_port} drop\n",
                    p.addr, p.addr
                ));
            }
            nft(&h.ns, &rules)?;
            self.cuts
                .entry(h.ns.clone())
                .or_default()
                .extend_from_slice(peers);
        }
        Ok(())
    }

    /// Cuts the hosts of `a` and of `b` from each other, both ways.
    pub(crate) fn partition(&mut self, a: &[&Host], b: &[&Host]) -> Result<(), String> {
        let peers = |hs: &[&Host]| -> Vec<Peer> {
            hs.iter()
                .map(|h| Peer {
                    addr: h.addr,
                    port: None,
                })
                .collect()
        };
        let (pa, pb) = (peers(a), peers(b));
        self.cut(a, &pb)?;
        self.cut(b, &pa)
    }

    /// Removes every cut.
    pub(crate) fn heal(&mut self) -> Result<(), String> {
        let mut first_err = None;
        for ns in std::mem::take(&mut self.cuts).into_keys() {
            let flush =
                format!("flush chain inet {TABLE} input\nflush chain inet {TABLE} output\n");
            if let Err(e) = nft(&ns, &flush) {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        let _ = self.heal();
        for h in self.hosts.drain(..) {
            remove(&h.ns);
        }
        remove(&self.hub);
        // Gone with the hub, but the kernel does that in the background.
        let _ = sh("ip", &["link", "del", &format!("idemc{}", self.subnet)]);
    }
}

/// A TCP forwarder in this process, from `listen` (the root side's address on a chaos
/// network, port chosen by the system) to `target` (a server on loopback, which never
/// sees a namespace address). Its connections end when either side closes. Stops
/// accepting when dropped.
pub(crate) struct Forward {
    pub(crate) port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl Forward {
    pub(crate) async fn start(listen: Ipv4Addr, target: SocketAddr) -> Result<Forward, String> {
        let listener = tokio::net::TcpListener::bind((listen, 0))
            .await
            .map_err(|e| format!("forwarder on {listen}: {e}"))?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await {
                        let _ = inbound.set_nodelay(true);
                        let _ = outbound.set_nodelay(true);
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        Ok(Forward { port, task })
    }
}

impl Drop for Forward {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Loads `rules` into the nftables of namespace `ns`.
fn nft(ns: &str, rules: &str) -> Result<(), String> {
    use std::io::Write;
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("nft: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(rules.as_bytes())
            .map_err(|e| format!("nft: {e}"))?;
    }
    let out = child.wait_with_output().map_err(|e| format!("nft: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "nft in {ns}: {}\n{rules}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}
