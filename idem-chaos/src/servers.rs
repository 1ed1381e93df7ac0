//! The store servers the chaos program runs itself: a Redis with an append-only file, or
//! a primary, a replica and three sentinels. Each `redis-server` runs under a small shell
//! that kills it when this process dies, so no server outlives a run, even a killed one.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::netns::Host;

/// A free loopback port.
pub(crate) fn free_port() -> Result<u16, String> {
    for _ in 0..100 {
        let l = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind: {e}"))?;
        let p = l.local_addr().map_err(|e| e.to_string())?.port();
        if p < 55000 {
            return Ok(p);
        }
    }
    Err("no free loopback port".into())
}

/// `PING` over a raw socket until `+PONG` or `within` passes.
pub(crate) fn ping(ip: Ipv4Addr, port: u16, within: Duration) -> bool {
    let until = Instant::now() + within;
    loop {
        let addr = std::net::SocketAddr::from((IpAddr::V4(ip), port));
        if let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
            let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
            let mut buf = [0u8; 7];
            if s.write_all(b"PING\r\n").is_ok()
                && s.read_exact(&mut buf).is_ok()
                && &buf == b"+PONG\r\n"
            {
                return true;
            }
        }
        if Instant::now() >= until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `redis-cli` against a server; its stdout.
pub(crate) fn cli(ip: Ipv4Addr, port: u16, args: &[&str]) -> String {
    Command::new("redis-cli")
        .args(["-h", &ip.to_string(), "-p", &port.to_string()])
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// One private `redis-server` (or sentinel) on a loopback port, or on a virtual host.
pub(crate) struct Node {
    pub(crate) port: u16,
    /// 127.0.0.1, or the address of its host.
    pub(crate) addr: Ipv4Addr,
    /// The host it runs on, if not on loopback.
    pub(crate) host: Option<Host>,
    dir: PathBuf,
    args: Vec<String>,
    conf: Option<String>,
    child: Option<Child>,
}

impl Node {
    /// A server on `host` (listening on its address only), or on loopback.
    pub(crate) fn start_on(
        host: Option<&Host>,
        args: &[&str],
        conf: Option<String>,
    ) -> Result<Node, String> {
        let port = free_port()?;
        let dir = std::env::temp_dir().join(format!("idem-chaos-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut n = Node {
            port,
            addr: host.map_or(Ipv4Addr::LOCALHOST, |h| h.addr),
            host: host.cloned(),
            dir,
            args: args.iter().map(|s| (*s).to_owned()).collect(),
            conf,
            child: None,
        };
        n.spawn()?;
        Ok(n)
    }

    fn spawn(&mut self) -> Result<(), String> {
        let mut args = Vec::new();
        if let Some(text) = &self.conf {
            // A sentinel rewrites its file; a restart keeps what it learnt.
            let file = self.dir.join("node.conf");
            if !file.exists() {
                std::fs::write(&file, text).map_err(|e| e.to_string())?;
            }
            args.push(file.display().to_string());
        }
        args.extend([
            "--port".to_owned(),
            self.port.to_string(),
            "--bind".to_owned(),
            self.addr.to_string(),
            "--protected-mode".to_owned(),
            "no".to_owned(),
            "--dir".to_owned(),
            self.dir.display().to_string(),
            "--logfile".to_owned(),
            self.dir.join("redis.log").display().to_string(),
        ]);
        args.extend(self.args.iter().cloned());
        let quoted: Vec<String> = args.iter().map(|a| format!("'{a}'")).collect();
        let pidfile = self.dir.join("server.pid");
        let _ = std::fs::remove_file(&pidfile);
        // The shell stays to watch: it kills the server when this process is gone.
        let script = format!(
            "redis-server {} & s=$!; echo $s > '{}'; trap 'kill -9 $s 2>/dev/null; exit 0' TERM INT; \
             while kill -0 {} 2>/dev/null && kill -0 $s 2>/dev/null; do sleep 0.3; done; \
             kill -9 $s 2>/dev/null",
            quoted.join(" "),
            pidfile.display(),
            std::process::id()
        );
        let mut cmd = match &self.host {
            Some(h) => h.command("sh"),
            None => Command::new("sh"),
        };
        let child = cmd
            .args(["-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("sh: {e}"))?;
        self.child = Some(child);
        if !ping(self.addr, self.port, Duration::from_secs(10)) {
            let log = std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default();
            return Err(format!(
                "redis-server on port {} did not start (is redis-server installed?):\n{log}",
                self.port
            ));
        }
        Ok(())
    }

    /// `kill -9` of the server, then of its watchdog.
    pub(crate) fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            if let Ok(pid) = std::fs::read_to_string(self.dir.join("server.pid")) {
                let _ = Command::new("kill").args(["-9", pid.trim()]).status();
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        let until = Instant::now() + Duration::from_secs(5);
        while ping(self.addr, self.port, Duration::ZERO) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts the killed server again, same port and data directory.
    pub(crate) fn restart(&mut self) -> Result<(), String> {
        self.kill();
        self.spawn()
    }

    pub(crate) fn cli(&self, args: &[&str]) -> String {
        cli(self.addr, self.port, args)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A primary and a replica watched by three sentinels (quorum 2, down after 1 s).
pub(crate) struct Sentinels {
    pub(crate) service: String,
    pub(crate) nodes: Vec<Node>,
    pub(crate) sentinels: Vec<Node>,
    /// The data nodes' `min-replicas-to-write` (0: off).
    pub(crate) min_replicas: u32,
}

impl Sentinels {
    /// On loopback, or on three hosts: the primary and a sentinel on the first, the
    /// replica and a sentinel on the second, a sentinel alone on the third, so that
    /// either data node can be cut off with one sentinel while two stay together.
    /// `min_replicas`: the data nodes' `min-replicas-to-write` (with a lag of 1 s), 0 for
    /// Redis' default (off).
    pub(crate) fn start_on(
        hosts: Option<&[Host; 3]>,
        min_replicas: u32,
    ) -> Result<Sentinels, String> {
        let host = |i: usize| hosts.map(|h| &h[i]);
        let min = min_replicas.to_string();
        let mut data = vec![
            "--save",
            "",
            "--appendonly",
            "no",
            "--repl-diskless-sync",
            "yes",
            "--repl-diskless-sync-delay",
            "0",
        ];
        if min_replicas > 0 {
            data.extend([
                "--min-replicas-to-write",
                &min,
                "--min-replicas-max-lag",
                "1",
            ]);
        }
        let primary = Node::start_on(host(0), &data, None)?;
        let upstream = primary.port.to_string();
        let upstream_ip = primary.addr.to_string();
        let mut rargs = data.clone();
        rargs.extend(["--replicaof", &upstream_ip, &upstream]);
        let replica = Node::start_on(host(1), &rargs, None)?;
        let service = format!("chaos{}", primary.port);
        let conf = format!(
            "sentinel resolve-hostnames no\n\
             sentinel monitor {service} {ip} {port} 2\n\
             sentinel down-after-milliseconds {service} 1000\n\
             sentinel failover-timeout {service} 3000\n\
             sentinel parallel-syncs {service} 1\n",
            ip = primary.addr,
            port = primary.port
        );
        let sentinels = (0..3)
            .map(|i| Node::start_on(host(i), &["--sentinel"], Some(conf.clone())))
            .collect::<Result<Vec<_>, _>>()?;
        let set = Sentinels {
            service,
            nodes: vec![primary, replica],
            sentinels,
            min_replicas,
        };
        set.wait(Duration::from_secs(30), |s| s.ready())
            .map_err(|()| {
                "the sentinels did not see the primary, its replica and each other".to_owned()
            })?;
        Ok(set)
    }

    pub(crate) fn url(&self) -> String {
        self.url_from(0)
    }

    /// The URL with the sentinels listed from the `first`-th on (a client asks them in
    /// order and takes the first answer in that order: an application lists the
    /// sentinel of its own site first).
    pub(crate) fn url_from(&self, first: usize) -> String {
        let n = self.sentinels.len();
        let hosts: Vec<String> = (0..n)
            .map(|i| &self.sentinels[(first + i) % n])
            .map(|s| format!("{}:{}", s.addr, s.port))
            .collect();
        format!("redis+sentinel://{}/{}", hosts.join(","), self.service)
    }

    /// The node a majority of sentinels names as primary and that says it is one.
    pub(crate) fn primary(&self) -> Option<usize> {
        let mut votes: Vec<u16> = self
            .sentinels
            .iter()
            .filter_map(|s| {
                s.cli(&["SENTINEL", "get-master-addr-by-name", &self.service])
                    .lines()
                    .nth(1)
                    .and_then(|p| p.trim().parse().ok())
            })
            .collect();
        votes.sort_unstable();
        let port = match votes.as_slice() {
            [a, b, ..] if a == b => *a,
            [_, a, b] if a == b => *a,
            _ => return None,
        };
        let i = self.nodes.iter().position(|n| n.port == port)?;
        let role = self.nodes[i].cli(&["ROLE"]);
        (role.lines().next().map(str::trim) == Some("master")).then_some(i)
    }

    /// Replicas of `primary` past their initial sync, streaming its writes.
    pub(crate) fn online(&self, primary: usize) -> usize {
        online_replicas(&self.nodes[primary].cli(&["INFO", "replication"])).count()
    }

    /// Replicas of `primary` that have acknowledged its whole stream.
    pub(crate) fn in_sync(&self, primary: usize) -> usize {
        let info = self.nodes[primary].cli(&["INFO", "replication"]);
        let offset = info
            .lines()
            .find_map(|l| l.strip_prefix("master_repl_offset:"))
            .map(|v| v.trim().to_owned());
        online_replicas(&info)
            .filter(|l| {
                l.split(',')
                    .find_map(|kv| kv.strip_prefix("offset="))
                    .map(str::trim)
                    == offset.as_deref()
            })
            .count()
    }

    fn ready(&self) -> bool {
        let Some(p) = self.primary() else {
            return false;
        };
        self.sentinels.iter().all(|s| {
            let out = s.cli(&["SENTINEL", "master", &self.service]);
            field(&out, "num-other-sentinels") == Some(2) && field(&out, "num-slaves") >= Some(1)
        }) && self.in_sync(p) >= 1
    }

    fn wait(&self, within: Duration, ok: impl Fn(&Self) -> bool) -> Result<(), ()> {
        let until = Instant::now() + within;
        while !ok(self) {
            if Instant::now() >= until {
                return Err(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// Kills the primary, waits for Sentinel to promote the replica, then starts the old
    /// primary again and waits until it is a replica in sync. Returns how long the
    /// promotion took.
    pub(crate) fn fail_over(&mut self) -> Result<Duration, String> {
        let old = self.primary().ok_or("no primary to fail over")?;
        let t = Instant::now();
        self.nodes[old].kill();
        self.wait(Duration::from_secs(30), |s| {
            s.primary().is_some_and(|p| p != old)
        })
        .map_err(|()| "no failover within 30 s".to_owned())?;
        let took = t.elapsed();
        let new = self.primary().ok_or("the new primary vanished")?;
        self.nodes[old].restart()?;
        // Point the restarted node at the new primary ourselves, as an orchestrator that
        // restarts a server does. Sentinel would convert it too, but not while it is in
        // TILT mode, which a busy 2-core machine can trigger for 30 s; what this harness
        // tests is idem across the failover, not how fast Sentinel cleans up after it.
        let (addr, port) = (self.nodes[new].addr.to_string(), self.nodes[new].port);
        self.nodes[old].cli(&["REPLICAOF", &addr, &port.to_string()]);
        // Online, not offset-equal: the workload keeps writing, so a replica that
        // streams is almost always a few bytes behind at the moment it is asked.
        self.wait(Duration::from_secs(30), |s| {
            s.primary().is_some_and(|p| p != old && s.online(p) >= 1)
        })
        .map_err(|()| "the old primary did not rejoin as a replica".to_owned())?;
        Ok(took)
    }
}

impl Sentinels {
    /// After the primary `old` was cut off with one sentinel: waits for the other two to
    /// promote the replica. Returns how long it took.
    pub(crate) fn wait_promoted(&self, old: usize) -> Result<Duration, String> {
        let t = Instant::now();
        self.wait(Duration::from_secs(30), |s| {
            s.primary().is_some_and(|p| p != old)
        })
        .map_err(|()| "no promotion within 30 s of the split".to_owned())?;
        Ok(t.elapsed())
    }

    /// After a split healed: waits until the old primary `old` streams from the new one.
    pub(crate) fn wait_rejoined(&self, old: usize) -> Result<(), String> {
        self.wait(Duration::from_secs(30), |s| {
            s.primary().is_some_and(|p| p != old && s.online(p) >= 1)
        })
        .map_err(|()| "the old primary did not rejoin as a replica within 30 s".to_owned())
    }
}

fn field(out: &str, name: &str) -> Option<i64> {
    let mut lines = out.lines();
    while let Some(l) = lines.next() {
        if l.trim() == name {
            return lines.next().and_then(|v| v.trim().parse().ok());
        }
    }
    None
}

/// The lines of a primary's `INFO replication` that describe a replica past its
/// initial sync.
fn online_replicas(info: &str) -> impl Iterator<Item = &str> {
    info.lines()
        .filter(|l| l.starts_with("slave") && l.contains("state=online"))
}
