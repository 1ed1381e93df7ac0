//! A private replicated Redis behind Sentinel: a primary, one replica and three sentinels
//! (quorum 2, `down-after-milliseconds` 1000) on free loopback ports, built from the
//! plain harness's servers, so each is killed on drop and by its watchdog.
//!
//! Included after the plain harness:
//! `#[path = "support/redis_harness.rs"] mod harness;` then
//! `#[path = "support/sentinel_harness.rs"] mod sentinel;`.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use crate::harness::{Proxy, RedisServer, free_port};

/// How the data nodes keep their data (arguments to `redis-server`).
pub const NO_PERSISTENCE: &[&str] = &["--save", "", "--appendonly", "no"];

/// A primary, a replica and three sentinels watching them as one service.
pub struct SentinelSet {
    pub service: String,
    /// `nodes[0]` starts as the primary, `nodes[1]` as its replica; after a failover the
    /// roles are whatever Sentinel made them ([`primary`](Self::primary) asks).
    pub nodes: Vec<RedisServer>,
    pub sentinels: Vec<RedisServer>,
    /// When the replica replicates through a proxy ([`start_with_proxy`](Self::start_with_proxy)).
    pub link: Option<Proxy>,
}

impl SentinelSet {
    /// Data nodes without persistence, replicating directly.
    pub fn start() -> SentinelSet {
        Self::start_inner(NO_PERSISTENCE, false)
    }

    /// As [`start`](Self::start), but the replica reaches the primary through a proxy, so
    /// a test can hold replication back ([`Proxy::blackhole`]) while clients still write.
    pub fn start_with_proxy() -> SentinelSet {
        Self::start_inner(NO_PERSISTENCE, true)
    }

    fn start_inner(persistence: &[&str], proxied: bool) -> SentinelSet {
        let service = format!("idem{}", free_port(false));
        let fast_sync = ["--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0"];
        let mut args: Vec<&str> = persistence.to_vec();
        args.extend(fast_sync);
        let primary = RedisServer::start_with(free_port(false), &args);
        let link = proxied.then(|| Proxy::start(primary.port));
        let upstream = link.as_ref().map_or(primary.port, |p| p.port).to_string();
        let replica_port = free_port(false);
        let announce = replica_port.to_string();
        let mut rargs = args.clone();
        rargs.extend(["--replicaof", "127.0.0.1", &upstream]);
        rargs.extend(["--replica-announce-ip", "127.0.0.1"]);
        rargs.extend(["--replica-announce-port", &announce]);
        let replica = RedisServer::start_with(replica_port, &rargs);
        let conf = format!(
            "sentinel resolve-hostnames no\n\
             sentinel monitor {service} 127.0.0.1 {port} 2\n\
             sentinel down-after-milliseconds {service} 1000\n\
             sentinel failover-timeout {service} 3000\n\
             sentinel parallel-syncs {service} 1\n",
            port = primary.port
        );
        let sentinels = (0..3)
            .map(|_| RedisServer::start_with_conf(free_port(false), Some(&conf), &["--sentinel"]))
            .collect();
        let set = SentinelSet {
            service,
            nodes: vec![primary, replica],
            sentinels,
            link,
        };
        set.wait_ready(Duration::from_secs(30));
        set
    }

    /// `redis+sentinel://` URL of the three sentinels and the service.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect();
        format!("redis+sentinel://{}/{}", hosts.join(","), self.service)
    }

    /// The primary's port as a majority of the sentinels report it, if they agree.
    pub fn reported_primary(&self) -> Option<u16> {
        let mut votes: Vec<u16> = self
            .sentinels
            .iter()
            .filter_map(|s| {
                let out = s.cli(&["SENTINEL", "get-master-addr-by-name", &self.service]);
                out.lines().nth(1).and_then(|p| p.trim().parse().ok())
            })
            .collect();
        votes.sort_unstable();
        let (first, last) = (votes.first().copied(), votes.last().copied());
        if votes.len() >= 2 && first == last {
            first
        } else {
            None
        }
    }

    /// Index into `nodes` of the node every sentinel names as primary and which says it
    /// is one itself.
    pub fn primary(&self) -> Option<usize> {
        let port = self.reported_primary()?;
        let i = self.nodes.iter().position(|n| n.port == port)?;
        self.nodes[i]
            .cli(&["ROLE"])
            .lines()
            .next()
            .is_some_and(|l| l.trim() == "master")
            .then_some(i)
    }

    /// Waits until the sentinels know each other and the replica, and the replica is in
    /// sync: only then can they agree on a failover.
    pub fn wait_ready(&self, within: Duration) {
        let until = Instant::now() + within;
        loop {
            if self.ready() {
                return;
            }
            assert!(
                Instant::now() < until,
                "sentinel set not ready: {}",
                self.sentinels[0].cli(&["SENTINEL", "master", &self.service])
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn ready(&self) -> bool {
        let Some(p) = self.primary() else {
            return false;
        };
        let sentinels_ok = self.sentinels.iter().all(|s| {
            let out = s.cli(&["SENTINEL", "master", &self.service]);
            field(&out, "num-other-sentinels") == Some(2)
                && field(&out, "num-slaves").is_some_and(|n| n >= 1)
                && !out.contains("s_down")
        });
        sentinels_ok && self.replicas_in_sync(p) >= 1
    }

    /// How many replicas of `nodes[primary]` have acknowledged its whole stream.
    pub fn replicas_in_sync(&self, primary: usize) -> usize {
        let info = self.nodes[primary].cli(&["INFO", "replication"]);
        let Some(offset) = info_value(&info, "master_repl_offset") else {
            return 0;
        };
        info.lines()
            .filter(|l| l.starts_with("slave") && l.contains("state=online"))
            .filter(|l| {
                l.split(',')
                    .find_map(|kv| kv.strip_prefix("offset="))
                    .and_then(|v| v.trim().parse::<i64>().ok())
                    == Some(offset)
            })
            .count()
    }

    /// `kill -9` of the current primary; returns its index.
    pub fn kill_primary(&mut self) -> usize {
        let p = self.primary().expect("a primary to kill");
        self.nodes[p].kill();
        p
    }

    /// Waits for the sentinels to promote a node other than `old`, and returns it.
    pub fn wait_failover(&self, old: usize, within: Duration) -> usize {
        let until = Instant::now() + within;
        loop {
            if let Some(p) = self.primary()
                && p != old
            {
                return p;
            }
            assert!(
                Instant::now() < until,
                "no failover within {within:?}: {}",
                self.sentinels[0].cli(&["SENTINEL", "master", &self.service])
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Restarts a killed node; Sentinel turns it into a replica of the current primary.
    /// Returns once it is in sync with the primary.
    pub fn rejoin(&mut self, node: usize, within: Duration) {
        self.nodes[node].restart();
        let until = Instant::now() + within;
        loop {
            if let Some(p) = self.primary()
                && p != node
                && self.replicas_in_sync(p) >= 1
            {
                return;
            }
            assert!(
                Instant::now() < until,
                "node {node} did not rejoin as a replica"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// A numeric field of `SENTINEL master` output (alternating name and value lines).
fn field(out: &str, name: &str) -> Option<i64> {
    let mut lines = out.lines();
    while let Some(l) = lines.next() {
        if l.trim() == name {
            return lines.next().and_then(|v| v.trim().parse().ok());
        }
    }
    None
}

fn info_value(info: &str, name: &str) -> Option<i64> {
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse().ok())
}
