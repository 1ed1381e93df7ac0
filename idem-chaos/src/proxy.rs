//! `--faults netem`: a slow and lossy link between the workers and the store.
//!
//! This kernel has no `tc netem` qdisc, so the link is a TCP proxy on loopback: every
//! chunk read from one side is written to the other after 50 to 200 ms (uniform jitter),
//! never reordered (TCP delivers a byte stream in order, so jitter shows as a varying
//! delay, not as a reordering). Loss is modelled as TCP sees it: a lost segment is
//! retransmitted after the retransmission timeout (200 ms, Linux's minimum), doubled
//! for each further loss of the same segment, and the stream behind it waits. 5% of
//! chunks are lost once, 0.25% twice, and so on. Bytes are never dropped: a TCP
//! connection that loses packets delivers late, not less. (Loss that TCP cannot hide,
//! a silent partition, is the partition fault's `nftables` drop.)
//!
//! The `noxious` crate (a Rust port of Toxiproxy) was considered: its last release
//! (1.0.4) is from 2021, on tokio-util 0.6 and rand 0.8, and it is a server to drive
//! over HTTP; a hundred lines of tokio do what the chaos run needs.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::rng::Rng;

/// A link's delay and loss.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Link {
    pub(crate) min: Duration,
    pub(crate) max: Duration,
    /// Chance, in percent, that a chunk is lost (and retransmitted after the RTO).
    pub(crate) loss_percent: u64,
}

impl Link {
    /// The slow, lossy link: 50 to 200 ms one way, 5% loss.
    pub(crate) const NETEM: Link = Link {
        min: Duration::from_millis(50),
        max: Duration::from_millis(200),
        loss_percent: 5,
    };
}

/// Linux TCP's minimum retransmission timeout.
const RTO: Duration = Duration::from_millis(200);

/// What went through a proxy.
#[derive(Debug, Default)]
pub(crate) struct LinkStats {
    pub(crate) connections: AtomicU64,
    pub(crate) chunks: AtomicU64,
    /// Chunk losses (each one a retransmission timeout waited).
    pub(crate) lost: AtomicU64,
}

impl LinkStats {
    pub(crate) fn line(&self) -> String {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        format!(
            "{} connections, {} chunks, {} lost and retransmitted",
            g(&self.connections),
            g(&self.chunks),
            g(&self.lost)
        )
    }
}

/// A proxy on a loopback port in front of `target`; stops (with every connection it
/// carries) when dropped.
pub(crate) struct Proxy {
    pub(crate) port: u16,
    pub(crate) stats: Arc<LinkStats>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub(crate) async fn start(target: SocketAddr, link: Link, seed: u64) -> Result<Proxy, String> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("proxy: {e}"))?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        let stats = Arc::new(LinkStats::default());
        let s = stats.clone();
        let task = tokio::spawn(async move {
            // Dropped (aborting every connection) when the proxy is.
            let mut conns = JoinSet::new();
            let mut rng = Rng::new(seed);
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((client, _)) = accepted else { continue };
                        s.connections.fetch_add(1, Ordering::Relaxed);
                        let (a, b) = (Rng::new(rng.next()), Rng::new(rng.next()));
                        conns.spawn(relay(client, target, link, (a, b), s.clone()));
                    }
                    Some(_) = conns.join_next(), if !conns.is_empty() => {}
                }
            }
        });
        Ok(Proxy { port, stats, task })
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn relay(
    client: TcpStream,
    target: SocketAddr,
    link: Link,
    (up, down): (Rng, Rng),
    stats: Arc<LinkStats>,
) {
    let Ok(server) = TcpStream::connect(target).await else {
        return;
    };
    let _ = (client.set_nodelay(true), server.set_nodelay(true));
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    tokio::join!(
        pipe(cr, sw, link, up, stats.clone()),
        pipe(sr, cw, link, down, stats)
    );
}

/// One direction: each chunk is due `link`'s delay after it was read (never before the
/// chunk ahead of it), plus a retransmission timeout per loss.
async fn pipe(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    link: Link,
    mut rng: Rng,
    stats: Arc<LinkStats>,
) {
    let (tx, mut rx) = mpsc::channel::<(Instant, Vec<u8>)>(256);
    let reader = async move {
        let span = u64::try_from((link.max - link.min).as_micros()).unwrap_or(0);
        let mut last = Instant::now();
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            stats.chunks.fetch_add(1, Ordering::Relaxed);
            let mut delay = link.min + Duration::from_micros(rng.below(span + 1));
            let mut rto = RTO;
            for _ in 0..6 {
                if rng.below(100) >= link.loss_percent {
                    break;
                }
                stats.lost.fetch_add(1, Ordering::Relaxed);
                delay += rto;
                rto *= 2;
            }
            last = last.max(Instant::now() + delay);
            if tx.send((last, buf[..n].to_vec())).await.is_err() {
                break;
            }
        }
    };
    let writer = async move {
        while let Some((due, bytes)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&bytes).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(reader, writer);
}

/// The loopback address `url` points at, and `url` with that address replaced by
/// `127.0.0.1:{port}` (`{port}` left in, for the proxy's). `None` for a URL with
/// several hosts (a Sentinel set) or none.
pub(crate) fn through(url: &str) -> Option<(SocketAddr, String)> {
    let (scheme, rest) = url.split_once("://")?;
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (user, hostport) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    if hostport.contains(',') || hostport.is_empty() {
        return None;
    }
    let (host, port) = match hostport.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => (h, p.parse().ok()?),
        _ => (
            hostport,
            match scheme {
                "redis" => 6379,
                "postgres" | "postgresql" => 5432,
                "mysql" | "mariadb" => 3306,
                _ => return None,
            },
        ),
    };
    let ip: std::net::IpAddr = match host {
        "localhost" => [127, 0, 0, 1].into(),
        h => h
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse()
            .ok()?,
    };
    let user = user.map(|u| format!("{u}@")).unwrap_or_default();
    Some((
        SocketAddr::new(ip, port),
        format!("{scheme}://{user}127.0.0.1:{{port}}{tail}"),
    ))
}

/// Starts a netem proxy in front of the store at `url`; the proxy and the URL through it.
pub(crate) async fn netem(url: &str, seed: u64) -> Result<(Proxy, String), String> {
    let (target, template) = through(url)
        .ok_or_else(|| format!("--faults netem: cannot put a proxy in front of {url}"))?;
    let proxy = Proxy::start(target, Link::NETEM, seed).await?;
    let url = template.replace("{port}", &proxy.port.to_string());
    Ok((proxy, url))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Mutex;

    use idem_runtime::{Error, Idem, Options, RedisStore, Store};

    use super::super::servers::Node;
    use super::*;

    #[test]
    fn urls_are_rewritten_to_the_proxy() {
        let (t, u) = through("redis://127.0.0.1:6379").unwrap();
        assert_eq!((t.port(), u.as_str()), (6379, "redis://127.0.0.1:{port}"));
        let (t, u) = through("postgres://postgres@localhost/test?sslmode=disable").unwrap();
        assert_eq!(t.port(), 5432);
        assert_eq!(
            u,
            "postgres://postgres@127.0.0.1:{port}/test?sslmode=disable"
        );
        assert!(through("redis+sentinel://127.0.0.1:1,127.0.0.1:2/svc").is_none());
    }

    /// One second leases over the slow, lossy link: heartbeats keep most of them alive;
    /// a lease that is lost anyway is counted (`lease_lost`) by the call whose completion
    /// it refused, and every key whose body ran more than once had such a loss. No
    /// silent double. A private Redis; bounded: 16 tasks x 25 calls.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn short_leases_over_a_slow_lossy_link_are_kept_or_lost_visibly() {
        static PAY: Options = Options::dedup("netem::pay")
            .lease(Duration::from_secs(1))
            .wait(Duration::from_secs(3));
        let node = Node::start_on(None, &["--save", "", "--appendonly", "no"], None).unwrap();
        let (proxy, url) = netem(&format!("redis://127.0.0.1:{}", node.port), 7)
            .await
            .unwrap();
        let store: Arc<dyn Store> = Arc::new(RedisStore::connect(&url).unwrap());
        let runs: Arc<Mutex<HashMap<u64, u64>>> = Arc::default();
        let lost: Arc<Mutex<HashMap<u64, u64>>> = Arc::default();
        let mut tasks = Vec::new();
        for t in 0..16u64 {
            let (store, runs, lost) = (store.clone(), runs.clone(), lost.clone());
            tasks.push(tokio::spawn(async move {
                // One runtime per task, so its lease-lost count is its own calls'.
                let idem = Idem::builder()
                    .shared_store(store)
                    .namespace("netem")
                    .build();
                let mut rng = Rng::new(t);
                let (mut ok, mut errors) = (0u64, 0u64);
                for _ in 0..25 {
                    let key = rng.below(40);
                    // Bodies up to 1.5 s: longer than the lease, so only renewals keep it.
                    let body_ms = rng.below(1500);
                    let before = idem.stats().lease_lost;
                    let runs = runs.clone();
                    let r: Result<u64, Error> = idem
                        .dedup(&PAY, key, async move {
                            *runs.lock().unwrap().entry(key).or_default() += 1;
                            tokio::time::sleep(Duration::from_millis(body_ms)).await;
                            Ok(key * 10)
                        })
                        .await;
                    if idem.stats().lease_lost > before {
                        *lost.lock().unwrap().entry(key).or_default() += 1;
                    }
                    match r {
                        Ok(v) => {
                            assert_eq!(v, key * 10);
                            ok += 1;
                        }
                        Err(Error::Store(_) | Error::InProgress { .. }) => errors += 1,
                        Err(e) => panic!("unexpected error: {e}"),
                    }
                }
                (ok, errors)
            }));
        }
        let (mut ok, mut errors) = (0, 0);
        for t in tasks {
            let (o, e) = t.await.unwrap();
            (ok, errors) = (ok + o, errors + e);
        }
        let runs = runs.lock().unwrap().clone();
        let lost = lost.lock().unwrap().clone();
        let doubled: Vec<_> = runs.iter().filter(|(_, n)| **n > 1).collect();
        let silent: Vec<_> = runs
            .iter()
            .filter(|(k, n)| **n > 1 + lost.get(k).copied().unwrap_or(0))
            .collect();
        println!(
            "netem: {} calls ({ok} answered, {errors} store errors or in progress), {} keys, \
             {} body runs, {} leases lost, {} keys doubled, {} silent; link: {}",
            16 * 25,
            runs.len(),
            runs.values().sum::<u64>(),
            lost.values().sum::<u64>(),
            doubled.len(),
            silent.len(),
            proxy.stats.line()
        );
        assert!(
            silent.is_empty(),
            "keys run twice with no lost lease: {silent:?}"
        );
        assert!(
            proxy.stats.lost.load(Ordering::Relaxed) > 0,
            "the link lost nothing"
        );
    }
}
