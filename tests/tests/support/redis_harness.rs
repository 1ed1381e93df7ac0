//! Test harness for the Redis store: private `redis-server` processes on free loopback
//! ports, a 3-master Cluster, and a fault-injecting TCP proxy. Everything it starts is
//! killed on drop, and also by a watchdog when the test process dies without dropping
//! (a static, a panic across threads), so no server outlives its test run.
//!
//! Included by each `redis_*` test file with `#[path = "support/redis_harness.rs"] mod harness;`.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The machine's shared server, used with a unique namespace per test.
pub const SHARED_URL: &str = "redis://127.0.0.1:6379";

/// A plain connection for a test to look at (or write to) a server directly.
///
/// Without redis-rs' default 500 ms response timeout: while every test of a binary runs
/// at once (Bloom bitmaps, races, scripts), the shared server may take longer than that
/// to get to a `KEYS` or `MEMORY USAGE`, which is load, not a failure of the code under
/// test. The connection attempt itself is still bounded.
pub async fn raw_connection(
    url: &str,
) -> idem_runtime::store::redis::redis::aio::MultiplexedConnection {
    use idem_runtime::store::redis::redis;
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(10)))
        .set_response_timeout(None);
    redis::Client::open(url)
        .expect("redis url")
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .expect("connect to Redis")
}

/// Fails loudly, saying how to start it, if the shared server is not there.
pub fn shared_url() -> &'static str {
    if !ping(6379, Duration::from_secs(2)) {
        panic!(
            "no Redis on 127.0.0.1:6379: the Redis tests need one. Start it with \
             `redis-server --daemonize yes --save '' --appendonly no` \
             (Debian: `apt-get install redis-server`)."
        );
    }
    SHARED_URL
}

/// A unique namespace/prefix fragment for one test.
pub fn unique(name: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "{name}-{}-{t:x}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

fn redis_server_bin() -> &'static str {
    if Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_err()
    {
        panic!(
            "redis-server is not installed: the Redis fault and Cluster tests start private \
             servers. Install it with `apt-get install redis-server` (it provides \
             redis-server and redis-cli)."
        );
    }
    "redis-server"
}

/// A loopback port that is free, and (for Cluster nodes) whose bus port +10000 is too.
pub fn free_port(with_bus: bool) -> u16 {
    for _ in 0..200 {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let p = l.local_addr().unwrap().port();
        if p > 55000 {
            continue;
        }
        if with_bus && TcpListener::bind(("127.0.0.1", p + 10000)).is_err() {
            continue;
        }
        return p;
    }
    panic!("no free loopback port");
}

/// Sends `PING` over a raw socket; true on `+PONG`.
pub fn ping(port: u16, within: Duration) -> bool {
    let until = Instant::now() + within;
    loop {
        if let Ok(mut s) = TcpStream::connect_timeout(
            &format!("127.0.0.1:{port}").parse().unwrap(),
            Duration::from_millis(200),
        ) {
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

/// Runs `redis-cli` against `port` and returns its stdout.
pub fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli (apt-get install redis-server)");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A private `redis-server` on a loopback port, killed on drop.
pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
    dir: PathBuf,
    extra: Vec<String>,
    /// A config file's text, written once and passed first (a sentinel needs a file it
    /// can rewrite; a restart keeps what it wrote).
    conf: Option<String>,
}

impl RedisServer {
    /// A throwaway server: no persistence.
    pub fn start() -> RedisServer {
        Self::start_with(free_port(false), &["--save", "", "--appendonly", "no"])
    }

    /// A server that fsyncs every write to its append-only file before answering, so
    /// that `kill -9` loses no acknowledged write (for restart tests).
    pub fn start_durable() -> RedisServer {
        Self::start_with(
            free_port(false),
            &[
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
            ],
        )
    }

    pub fn start_with(port: u16, extra: &[&str]) -> RedisServer {
        Self::start_with_conf(port, None, extra)
    }

    /// A server started from a config file holding `conf` (then `extra` arguments).
    pub fn start_with_conf(port: u16, conf: Option<&str>, extra: &[&str]) -> RedisServer {
        let dir = std::env::temp_dir().join(format!("idem-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut s = RedisServer {
            port,
            child: None,
            dir,
            extra: extra.iter().map(|s| (*s).to_owned()).collect(),
            conf: conf.map(str::to_owned),
        };
        s.spawn();
        s
    }

    fn spawn(&mut self) {
        let bin = redis_server_bin();
        let mut args: Vec<String> = Vec::new();
        if let Some(text) = &self.conf {
            let file = self.dir.join("node.conf");
            if !file.exists() {
                std::fs::write(&file, text).unwrap();
            }
            args.push(file.display().to_string());
        }
        args.extend([
            "--port".into(),
            self.port.to_string(),
            "--bind".into(),
            "127.0.0.1".into(),
            "--protected-mode".into(),
            "no".into(),
            "--dir".into(),
            self.dir.display().to_string(),
            "--logfile".into(),
            self.dir.join("redis.log").display().to_string(),
        ]);
        args.extend(self.extra.iter().cloned());
        // A watchdog shell owns the server and kills it if this test process dies
        // without running our destructors. `exec` is avoided so the shell stays to watch.
        let quoted: Vec<String> = args.iter().map(|a| format!("'{a}'")).collect();
        let script = format!(
            "{bin} {} & s=$!; echo $s > '{pidfile}'; trap 'kill -9 $s 2>/dev/null; exit 0' TERM INT; \
             while kill -0 {parent} 2>/dev/null && kill -0 $s 2>/dev/null; do sleep 0.3; done; \
             kill -9 $s 2>/dev/null",
            quoted.join(" "),
            parent = std::process::id(),
            pidfile = self.dir.join("server.pid").display()
        );
        let _ = std::fs::remove_file(self.dir.join("server.pid"));
        let child = Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("sh");
        self.child = Some(child);
        if !ping(self.port, Duration::from_secs(10)) {
            let log = std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default();
            panic!("redis-server on port {} did not start:\n{log}", self.port);
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// `kill -9` of the server (not a clean shutdown).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            // Kill the server first (its pid, written by the watchdog shell), then the shell.
            if let Ok(pid) = std::fs::read_to_string(self.dir.join("server.pid")) {
                let _ = Command::new("kill").args(["-9", pid.trim()]).status();
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        let until = Instant::now() + Duration::from_secs(5);
        while ping(self.port, Duration::ZERO) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts the server again on the same port (with the same data directory).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    pub fn cli(&self, args: &[&str]) -> String {
        cli(self.port, args)
    }

    /// `INFO commandstats` call count of `cmd` (lowercase), 0 if never called.
    pub fn calls(&self, cmd: &str) -> u64 {
        let info = self.cli(&["INFO", "commandstats"]);
        let tag = format!("cmdstat_{cmd}:calls=");
        info.lines()
            .find_map(|l| l.strip_prefix(&tag))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Every command a server receives, as `MONITOR` reports it, read on a thread: what
/// clients sent (one per round trip) and what scripts ran inside (marked `lua`).
pub struct Monitor {
    port: u16,
    lines: Arc<std::sync::Mutex<Vec<String>>>,
    stream: TcpStream,
    seq: AtomicU64,
}

/// One command seen by a [`Monitor`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// Sent by a client (a round trip), not run by a script.
    pub top: bool,
    /// The command's name, lowercase.
    pub name: String,
}

impl Monitor {
    pub fn start(port: u16) -> Monitor {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream.write_all(b"MONITOR\r\n").unwrap();
        let reader = stream.try_clone().unwrap();
        let lines: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
        let sink = lines.clone();
        std::thread::spawn(move || {
            use std::io::BufRead;
            let mut r = std::io::BufReader::new(reader);
            let mut line = String::new();
            loop {
                line.clear();
                match r.read_line(&mut line) {
                    Ok(0) | Err(_) => return,
                    Ok(_) => sink.lock().unwrap().push(line.trim_end().to_owned()),
                }
            }
        });
        let m = Monitor {
            port,
            lines,
            stream,
            seq: AtomicU64::new(0),
        };
        m.take();
        m
    }

    /// Everything seen since the last call. Waits for a marker sent after the caller's
    /// commands, so nothing the caller already sent is missed.
    pub fn take(&self) -> Vec<Seen> {
        let marker = format!(
            "idem-monitor-marker-{}",
            self.seq.fetch_add(1, Ordering::Relaxed)
        );
        cli(self.port, &["ECHO", &marker]);
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            {
                let mut lines = self.lines.lock().unwrap();
                if let Some(at) = lines.iter().position(|l| l.contains(&marker)) {
                    let taken: Vec<String> = lines.drain(..=at).collect();
                    return taken[..taken.len() - 1]
                        .iter()
                        .filter_map(|l| parse_monitor_line(l))
                        .collect();
                }
            }
            assert!(Instant::now() < until, "MONITOR never showed the marker");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}

/// `1700000000.123456 [0 127.0.0.1:5555] "SET" "k" …` (a client) or `[0 lua] "get" …`.
fn parse_monitor_line(l: &str) -> Option<Seen> {
    let open = l.find('[')?;
    let close = open + l[open..].find(']')?;
    let top = !l[open..close].ends_with("lua");
    let rest = l[close + 1..].trim_start().strip_prefix('"')?;
    let name = rest[..rest.find('"')?].to_ascii_lowercase();
    Some(Seen { top, name })
}

/// A 3-master Redis Cluster of private servers.
pub struct Cluster {
    pub nodes: Vec<RedisServer>,
}

impl Cluster {
    pub fn start() -> Cluster {
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| {
                let port = free_port(true);
                RedisServer::start_with(
                    port,
                    &[
                        "--save",
                        "",
                        "--appendonly",
                        "no",
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        &format!("nodes-{port}.conf"),
                        "--cluster-node-timeout",
                        "2000",
                    ],
                )
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let mut args = vec!["--cluster", "create"];
        args.extend(addrs.iter().map(String::as_str));
        args.extend(["--cluster-replicas", "0", "--cluster-yes"]);
        let out = Command::new("redis-cli")
            .args(&args)
            .output()
            .expect("redis-cli (apt-get install redis-server)");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            let ok = nodes.iter().all(|n| {
                n.cli(&["CLUSTER", "INFO"])
                    .lines()
                    .any(|l| l.trim() == "cluster_state:ok")
            });
            if ok {
                break;
            }
            assert!(
                Instant::now() < until,
                "cluster did not reach cluster_state:ok"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Cluster { nodes }
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }
}

const PASS: u8 = 0;
const BLACKHOLE: u8 = 1;

/// A TCP proxy on loopback in front of a server, on its own thread and runtime. It can
/// cut every open connection, or blackhole traffic (accept and read, forward nothing).
pub struct Proxy {
    pub port: u16,
    mode: Arc<AtomicU8>,
    cut: tokio::sync::watch::Sender<u64>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Proxy {
    pub fn start(target_port: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let mode = Arc::new(AtomicU8::new(PASS));
        let (cut, cut_rx) = tokio::sync::watch::channel(0u64);
        let (stop, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
        let m = mode.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                loop {
                    tokio::select! {
                        _ = &mut stop_rx => return,
                        acc = listener.accept() => {
                            let Ok((client, _)) = acc else { continue };
                            let (m, cut_rx) = (m.clone(), cut_rx.clone());
                            tokio::spawn(relay(client, target_port, m, cut_rx));
                        }
                    }
                }
            });
        });
        Proxy {
            port,
            mode,
            cut,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Closes every connection open through the proxy (new ones are accepted).
    pub fn cut_all(&self) {
        self.cut.send_modify(|n| *n += 1);
    }

    /// Stops forwarding: bytes are read and dropped, nothing is answered.
    pub fn blackhole(&self) {
        self.mode.store(BLACKHOLE, Ordering::SeqCst);
    }

    /// Forwards again (connections opened while blackholed stay silent: cut them).
    pub fn pass(&self) {
        self.mode.store(PASS, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        self.cut_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn relay(
    client: tokio::net::TcpStream,
    target_port: u16,
    mode: Arc<AtomicU8>,
    mut cut: tokio::sync::watch::Receiver<u64>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    cut.borrow_and_update();
    if mode.load(Ordering::SeqCst) == BLACKHOLE {
        // Hold the connection open and answer nothing until cut.
        let (mut r, _w) = client.into_split();
        let mut buf = [0u8; 4096];
        loop {
            tokio::select! {
                _ = cut.changed() => return,
                n = r.read(&mut buf) => if matches!(n, Ok(0) | Err(_)) { return },
            }
        }
    }
    let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", target_port)).await else {
        return;
    };
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let mut a = [0u8; 16384];
    let mut b = [0u8; 16384];
    loop {
        tokio::select! {
            _ = cut.changed() => return,
            n = cr.read(&mut a) => {
                let Ok(n) = n else { return };
                if n == 0 { return }
                if mode.load(Ordering::SeqCst) == BLACKHOLE { continue }
                if sw.write_all(&a[..n]).await.is_err() { return }
            }
            n = sr.read(&mut b) => {
                let Ok(n) = n else { return };
                if n == 0 { return }
                if mode.load(Ordering::SeqCst) == BLACKHOLE { continue }
                if cw.write_all(&b[..n]).await.is_err() { return }
            }
        }
    }
}
