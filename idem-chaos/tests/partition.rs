//! A silent partition between an application and its Redis: the server runs on a
//! virtual host (a network namespace of idem-chaos' `netns` module) and every packet
//! between it and this process is dropped inside its namespace (nftables `drop`: no
//! reset, no ICMP), then the cut heals.
//!
//! What the failure model says, checked here: every call made during the cut ends in
//! `Error::Store` (bounded by the store's timeout), no body runs without a claim, and
//! once healed no key stays stuck past its lease; a body in flight when the cut came
//! runs at most once more, after its lease.
//!
//! Needs root, `ip`, `nft` (Debian: iproute2, nftables) and `redis-server`; without the
//! first three it is skipped with a message saying why.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[allow(dead_code)]
#[path = "../src/netns.rs"]
mod netns;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_runtime::{Error, Idem, Options, RedisStore};
use netns::{Net, Peer};

static PAY: Options = Options::dedup("partition::pay")
    .lease(Duration::from_secs(1))
    .wait(Duration::from_millis(200));

/// Whether the Redis at `ip:port` answers PING.
fn pong(ip: Ipv4Addr, port: u16) -> bool {
    let addr = SocketAddr::from((ip, port));
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    let mut buf = [0u8; 7];
    s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
}

type Runs = Arc<Mutex<HashMap<String, usize>>>;

/// One call of `key`; its body counts its runs.
async fn pay(idem: &Idem, runs: &Runs, key: &str) -> Result<u32, Error> {
    let body = {
        let (runs, key) = (runs.clone(), key.to_owned());
        async move {
            *runs.lock().unwrap().entry(key).or_default() += 1;
            Ok::<u32, Error>(7)
        }
    };
    idem.dedup(&PAY, key.to_owned(), body).await
}

fn ran(runs: &Runs, key: &str) -> usize {
    runs.lock().unwrap().get(key).copied().unwrap_or(0)
}

/// A guard against a hang, far beyond the store's timeout: a call must end by itself.
const HANG: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_partition_fails_calls_runs_no_body_and_leaves_no_key_stuck() {
    if let Err(why) = netns::available() {
        eprintln!("skipped: {why}");
        return;
    }
    let mut net = Net::new().unwrap();
    let a = net.add_host("a").unwrap();
    let mut server = a
        .tokio_command("redis-server")
        .args(["--port", "6379", "--bind", &a.addr.to_string()])
        .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("redis-server (apt-get install -y redis-server)");
    let mut up = false;
    for _ in 0..200 {
        if pong(a.addr, 6379) {
            up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(up, "redis-server on the virtual host did not start");

    let store = RedisStore::builder()
        .timeout(Duration::from_millis(500))
        .connect(&format!("redis://{}:6379", a.addr))
        .unwrap();
    let idem = Idem::builder()
        .store(store)
        .namespace(format!("partition-{}", std::process::id()))
        .build();
    let runs: Runs = Arc::default();
    assert_eq!(pay(&idem, &runs, "warm").await.unwrap(), 7);

    // A body in flight when the cut comes: its completion cannot reach the store.
    let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let inflight = {
        let (idem, runs) = (idem.clone(), runs.clone());
        tokio::spawn(async move {
            let body = async move {
                *runs.lock().unwrap().entry("inflight".into()).or_default() += 1;
                let _ = started_tx.send(());
                let _ = go_rx.await;
                Ok::<u32, Error>(7)
            };
            idem.dedup(&PAY, "inflight".to_owned(), body).await
        })
    };
    started_rx.await.unwrap();
    let root = net.root_addr();
    net.cut(
        &[&a],
        &[Peer {
            addr: root,
            port: None,
        }],
    )
    .unwrap();
    go_tx.send(()).unwrap();
    let first = tokio::time::timeout(HANG, inflight)
        .await
        .expect("the call in flight hung through the partition")
        .unwrap();
    eprintln!("the call in flight at the cut returned {first:?}");

    // During the cut: every call ends in Error::Store, and no body runs.
    for i in 0..20 {
        let key = format!("cut-{i}");
        let r = tokio::time::timeout(HANG, pay(&idem, &runs, &key))
            .await
            .expect("a call hung through the partition");
        assert!(matches!(r, Err(Error::Store(_))), "{key}: {r:?}");
        assert_eq!(ran(&runs, &key), 0, "{key}: a body ran without a claim");
    }

    net.heal().unwrap();

    // Healed: each key answers again (the in-flight one once its lease is over), and
    // each body has run at most once, the in-flight one at most twice.
    let mut keys: Vec<String> = (0..20).map(|i| format!("cut-{i}")).collect();
    keys.push("inflight".into());
    for key in &keys {
        let mut answered = None;
        for _ in 0..100 {
            match tokio::time::timeout(HANG, pay(&idem, &runs, key))
                .await
                .expect("a call hung after the heal")
            {
                Ok(v) => {
                    answered = Some(v);
                    break;
                }
                Err(Error::Store(_) | Error::InProgress { .. }) => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("{key}: {e}"),
            }
        }
        assert_eq!(answered, Some(7), "{key} stayed stuck after the heal");
        assert_eq!(pay(&idem, &runs, key).await.unwrap(), 7, "{key}: no replay");
    }
    for key in &keys[..20] {
        assert_eq!(ran(&runs, key), 1, "{key}");
    }
    let inflight_runs = ran(&runs, "inflight");
    assert!(
        (1..=2).contains(&inflight_runs),
        "the in-flight key ran {inflight_runs} times"
    );
    eprintln!("the in-flight key ran {inflight_runs} times in all");
    let _ = server.start_kill();
    let _ = server.wait().await;
}
