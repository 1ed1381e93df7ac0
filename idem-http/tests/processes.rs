//! Several server processes on one Redis: a client alternating between two servers,
//! and a server killed with SIGKILL mid-handler whose key the other takes over after
//! the lease, not before.
//!
//! The servers are this test binary run again (`child_server`, selected by an
//! environment variable), each serving the test app on its own loopback port.

#![allow(clippy::unwrap_used)]

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use idem_http::IdempotencyLayer;
use idem_runtime::{Idem, RedisStore};
use support::{Answer, REDIS, client, post_key};

const CHILD: &str = "IDEM_HTTP_TEST_CHILD";

/// The server process: serves the test app on Redis in the namespace, lease and
/// handler delay given by the parent, prints its address, and serves until killed.
/// Run by the parent only; as a plain test it has nothing to do.
#[test]
fn child_server() {
    let Ok(spec) = std::env::var(CHILD) else {
        return;
    };
    let mut it = spec.split(',');
    let (ns, lease_ms, sleep_ms) = (
        it.next().unwrap().to_owned(),
        it.next().unwrap().parse::<u64>().unwrap(),
        it.next().unwrap().parse::<u64>().unwrap(),
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async move {
        let idem = Idem::builder()
            .store(RedisStore::connect(REDIS).unwrap())
            .namespace(ns)
            .build();
        let layer = IdempotencyLayer::new(idem).lease(Duration::from_millis(lease_ms));
        let (router, shop) = support::app(layer);
        shop.sleep_ms.store(sleep_ms, Ordering::SeqCst);
        let base = support::serve(router).await;
        println!("LISTEN {base}");
        std::future::pending::<()>().await;
    });
}

/// A server process, killed when dropped.
struct Server {
    child: Child,
    base: String,
}

impl Server {
    fn start(ns: &str, lease: Duration, sleep: Duration) -> Server {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "child_server",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env(
                CHILD,
                format!("{ns},{},{}", lease.as_millis(), sleep.as_millis()),
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let base = loop {
            let line = lines
                .next()
                .expect("the server exited before listening")
                .unwrap();
            // The harness may print the test's name on the same line first.
            if let Some((_, base)) = line.split_once("LISTEN ") {
                break base.trim().to_owned();
            }
        };
        // Keep reading its output so it never blocks on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        Server { child, base }
    }

    async fn stats(&self) -> serde_json::Value {
        let res = client()
            .get(format!("{}/stats", self.base))
            .send()
            .await
            .unwrap();
        Answer::of(res).await.json()
    }

    fn kill(&mut self) {
        // SIGKILL: no destructor, no release; only the lease ends the claim.
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn runs(servers: &[&Server]) -> u64 {
    let mut n = 0;
    for s in servers {
        n += s.stats().await["runs"].as_u64().unwrap();
    }
    n
}

/// Two servers on one Redis, the client alternating between them: every key runs
/// once, and every retry, wherever it lands, replays the first response. Then 100
/// concurrent duplicates split between the two run once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_alternating_share_keys() {
    let ns = support::namespace("two");
    let a = Server::start(&ns, Duration::from_secs(30), Duration::ZERO);
    let b = Server::start(&ns, Duration::from_secs(30), Duration::ZERO);
    let c = client();
    for k in 0..30 {
        let key = format!("alt-{k}");
        let body = format!(r#"{{"order":{k}}}"#);
        let first = post_key(&c, &a.base, "/payments", &key, &body).await;
        assert_eq!((first.status, first.replayed()), (201, false));
        for (i, server) in [&b, &a, &b].into_iter().enumerate() {
            let again = post_key(&c, &server.base, "/payments", &key, &body).await;
            assert_eq!(again.status, 201, "retry {i} of {key}");
            assert!(again.replayed());
            assert_eq!(again.body, first.body);
        }
    }
    assert_eq!(runs(&[&a, &b]).await, 30);

    let calls = (0..100).map(|i| {
        let base = if i % 2 == 0 {
            a.base.clone()
        } else {
            b.base.clone()
        };
        let c = c.clone();
        tokio::spawn(
            async move { post_key(&c, &base, "/payments?sleep_ms=300", "both", "{}").await },
        )
    });
    let answers: Vec<Answer> = futures_util::future::join_all(calls)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        runs(&[&a, &b]).await,
        31,
        "the duplicates ran once across both servers"
    );
    let original = answers.iter().find(|x| x.status == 201).unwrap();
    for x in &answers {
        match x.status {
            201 => assert_eq!(x.body, original.body),
            _ => x.assert_problem(409, "idempotency-key-in-flight"),
        }
    }
}

/// A server killed with SIGKILL mid-handler: until its lease ends the key stays in
/// flight (the other server answers 409, and does not run it); after the lease the
/// other server takes it over and runs it once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_server_key_is_taken_over_after_the_lease() {
    let ns = support::namespace("kill");
    let lease = Duration::from_secs(3);
    let mut slow = Server::start(&ns, lease, Duration::from_secs(120));
    let other = Server::start(&ns, lease, Duration::ZERO);
    let c = client();
    let doomed = tokio::spawn({
        let (c, base) = (c.clone(), slow.base.clone());
        async move {
            c.post(format!("{base}/payments"))
                .header("idempotency-key", "killed")
                .header("content-type", "application/json")
                .body("{}")
                .send()
                .await
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    while slow.stats().await["started"] != 1 {
        assert!(Instant::now() < deadline, "the slow handler never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    slow.kill();
    let killed_at = Instant::now();
    assert!(doomed.await.unwrap().is_err(), "the killed server answered");

    let mut in_flight = 0;
    let taken_over = loop {
        let a = post_key(&c, &other.base, "/payments", "killed", "{}").await;
        if a.status == 201 {
            break a;
        }
        a.assert_problem(409, "idempotency-key-in-flight");
        assert_eq!(
            other.stats().await["started"],
            0,
            "ran before the lease ended"
        );
        in_flight += 1;
        assert!(
            killed_at.elapsed() < Duration::from_secs(30),
            "never taken over"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let waited = killed_at.elapsed();
    assert!(in_flight > 0, "the key was free right after the kill");
    // The lease was last renewed at most a third of it before the kill.
    assert!(
        waited >= lease * 2 / 3 - Duration::from_millis(100),
        "taken over after {waited:?}"
    );
    assert!(!taken_over.replayed());
    assert_eq!(other.stats().await["runs"], 1);
    let again = post_key(&c, &other.base, "/payments", "killed", "{}").await;
    assert!(again.replayed());
    assert_eq!(again.body, taken_over.body);
}
