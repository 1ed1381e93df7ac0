//! Faults across processes and servers: `kill -9` of a holder, a holder paused past its
//! lease, two processes racing, a server killed and restarted mid-run, connections cut.
//!
//! Child processes are this test binary run again with `IDEM_REDIS_CHILD` set: the
//! `child` test below then plays the part named there and never returns normally.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/redis_harness.rs"]
mod harness;
#[path = "support/stopped.rs"]
mod stopped;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use harness::{Proxy, RedisServer};
use idem_runtime::store::redis::redis::AsyncCommands;
use idem_runtime::store::{ClaimKind, ClaimOutcome, ClaimRequest, Owner};
use idem_runtime::{Error, Idem, Options, RedisStore, Store};

static KILL9: Options = Options::dedup("redis_faults::kill9").lease(Duration::from_secs(3));
static PAUSE: Options = Options::lock("redis_faults::pause")
    .lease(Duration::from_millis(900))
    .wait(Duration::ZERO);
static RACE: Options = Options::dedup("redis_faults::race").wait(Duration::from_secs(30));
static CHURN: Options = Options::dedup("redis_faults::churn")
    .lease(Duration::from_secs(300))
    .wait(Duration::ZERO);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn idem(url: &str, ns: &str) -> Idem {
    Idem::builder()
        .store(RedisStore::connect(url).unwrap())
        .namespace(ns)
        .build()
}

/// Starts this binary as a child playing `role`.
fn spawn_child(role: &str, url: &str, ns: &str) -> (Child, BufReader<ChildStdout>) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["child", "--exact", "--nocapture", "--test-threads=1"])
        .env("IDEM_REDIS_CHILD", role)
        .env("IDEM_REDIS_URL", url)
        .env("IDEM_REDIS_NS", ns)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    (child, out)
}

/// The next line the child printed that starts with `tag`, without the tag.
fn expect_line(out: &mut BufReader<ChildStdout>, tag: &str) -> String {
    let mut line = String::new();
    let mut seen = String::new();
    loop {
        line.clear();
        let n = out.read_line(&mut line).unwrap();
        assert!(
            n > 0,
            "child exited before printing {tag}; it printed:\n{seen}"
        );
        seen.push_str(&line);
        // libtest prints "test child ... " before the child's first line.
        if let Some(at) = line.find(tag) {
            return line[at + tag.len()..].trim().to_owned();
        }
    }
}

/// The child side. Does nothing in a normal test run.
#[test]
fn child() {
    let Ok(role) = std::env::var("IDEM_REDIS_CHILD") else {
        return;
    };
    let url = std::env::var("IDEM_REDIS_URL").unwrap();
    let ns = std::env::var("IDEM_REDIS_NS").unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let idem = idem(&url, &ns);
        match role.as_str() {
            // Claims a key and hangs inside the body (heartbeat running) until killed.
            "hold" => {
                let r: Result<u8, Error> = idem
                    .dedup(&KILL9, "k", async {
                        println!("RUNNING");
                        std::future::pending::<()>().await;
                        Ok(1)
                    })
                    .await;
                println!("FAILED {r:?}");
            }
            // Holds a lock; the parent stops this process past the lease, then resumes it.
            "pause" => {
                let r: Result<(), Error> = idem
                    .lock(&PAUSE, "l", async {
                        println!("FENCE {}", idem_runtime::fence().unwrap_or(0));
                        tokio::time::sleep(Duration::from_secs(6)).await;
                        Ok(())
                    })
                    .await;
                println!("DONE lost={} result={r:?}", idem.stats().lease_lost);
            }
            // 50 tasks on 10 keys; the body counts its runs in Redis (the effect), and the
            // values every caller got are printed for the parent to compare.
            "race" => {
                let mut raw = harness::raw_connection(url.as_str()).await;
                println!("READY");
                let mut tasks = Vec::new();
                for i in 0..50u64 {
                    let idem = idem.clone();
                    let mut raw = raw.clone();
                    let ns = ns.clone();
                    tasks.push(tokio::spawn(async move {
                        let k = i % 10;
                        let v: u64 = idem
                            .dedup(&RACE, format!("k{k}"), async move {
                                let _: i64 = raw.incr(format!("{ns}:runs:{k}"), 1).await.unwrap();
                                tokio::time::sleep(ms(20)).await;
                                Ok::<_, Error>(std::process::id() as u64 * 1000 + i)
                            })
                            .await
                            .unwrap();
                        (k, v)
                    }));
                }
                for t in tasks {
                    let (k, v) = t.await.unwrap();
                    println!("VAL {k} {v}");
                }
                let _: () = raw
                    .set(format!("{ns}:done:{}", std::process::id()), 1)
                    .await
                    .unwrap();
                println!("END");
            }
            other => panic!("unknown child role {other}"),
        }
    });
    std::process::exit(0);
}

/// `kill -9` of a process inside its body: the key is not taken over before the lease
/// ends, and is taken over (the body runs once more, here) after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_holder_is_taken_over_after_the_lease() {
    let url = harness::shared_url();
    let ns = harness::unique("kill9");
    let (mut child, mut out) = spawn_child("hold", url, &ns);
    expect_line(&mut out, "RUNNING");
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();

    let idem = idem(url, &ns);
    static NOWAIT: Options = Options::dedup("redis_faults::kill9").wait(Duration::ZERO);
    let r: Result<u8, Error> = idem.dedup(&NOWAIT, "k", async { Ok(2) }).await;
    assert!(
        matches!(r, Err(Error::InProgress { .. })),
        "taken over before the lease ended: {r:?}"
    );
    static WAIT: Options = Options::dedup("redis_faults::kill9").wait(Duration::from_secs(20));
    let runs = AtomicUsize::new(0);
    let r: u8 = idem
        .dedup(&WAIT, "k", async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Error>(2)
        })
        .await
        .unwrap();
    assert_eq!((r, runs.load(Ordering::SeqCst)), (2, 1));
}

/// A lock holder stopped (SIGSTOP) past its lease: another owner takes the lock with a
/// greater fence, and when the old holder resumes, it notices the lost lease and its
/// release does not remove the new holder's lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_holder_cannot_release_the_new_holders_lock() {
    let url = harness::shared_url();
    let ns = harness::unique("pause");
    let (mut child, mut out) = spawn_child("pause", url, &ns);
    let f1: u64 = expect_line(&mut out, "FENCE").parse().unwrap();
    stopped::stop(child.id());

    let idem = idem(url, &ns);
    let store = idem.store().clone();
    let key = idem.key(&PAUSE, format_args!("l"));
    let me = ClaimRequest::new(ClaimKind::Lock, Owner::next(), Duration::from_secs(60));
    let f2 = loop {
        match store.claim(&key, &me).await.unwrap() {
            ClaimOutcome::Claimed { fence, .. } => break fence,
            ClaimOutcome::Busy { retry_in, .. } => tokio::time::sleep(retry_in + ms(5)).await,
            other => panic!("{other:?}"),
        }
    };
    assert!(f2 > f1, "fences must increase: {f1} then {f2}");
    stopped::signal(child.id(), "-CONT");
    let done = expect_line(&mut out, "DONE");
    child.wait().unwrap();
    assert!(
        done.starts_with("lost=1"),
        "the resumed holder did not notice: {done}"
    );

    let third = ClaimRequest::new(ClaimKind::Lock, Owner::next(), ms(1000));
    assert!(
        matches!(
            store.claim(&key, &third).await.unwrap(),
            ClaimOutcome::Busy { .. }
        ),
        "the stale holder's release removed the new holder's lock"
    );
    assert!(store.release(&key, me.owner).await.unwrap());
}

/// Two processes, 50 tasks each, on the same 10 keys: each body ran once (counted in
/// Redis by the bodies themselves) and every caller in both processes got its value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_run_each_key_once() {
    let url = harness::shared_url();
    let ns = harness::unique("procs");
    let mut children: Vec<_> = (0..2).map(|_| spawn_child("race", url, &ns)).collect();
    let mut seen: HashMap<String, Vec<String>> = HashMap::new();
    for (child, out) in &mut children {
        let mut line = String::new();
        loop {
            line.clear();
            assert!(out.read_line(&mut line).unwrap() > 0, "child died");
            let l = line.trim();
            if l.ends_with("END") {
                break;
            }
            if let Some(rest) = l.find("VAL ").map(|at| &l[at + 4..]) {
                let (k, v) = rest.split_once(' ').unwrap();
                seen.entry(k.to_owned()).or_default().push(v.to_owned());
            }
        }
        assert!(child.wait().unwrap().success());
    }
    assert_eq!(seen.len(), 10);
    for (k, vs) in &seen {
        assert_eq!(vs.len(), 10, "key {k}");
        assert!(
            vs.windows(2).all(|w| w[0] == w[1]),
            "key {k} got different values: {vs:?}"
        );
    }
    let mut raw = harness::raw_connection(url).await;
    for k in 0..10 {
        let runs: i64 = raw.get(format!("{ns}:runs:{k}")).await.unwrap();
        assert_eq!(runs, 1, "key {k} ran {runs} times across the two processes");
        let _: () = raw.del(format!("{ns}:runs:{k}")).await.unwrap();
    }
}

/// Workers hammer keys while the fault happens; afterwards every key's body ran at most
/// once, every error was a store error or "in progress", and the same store serves
/// calls again.
async fn churn_through(idem: &Idem, fault: impl AsyncFnOnce()) {
    let runs: Arc<Mutex<HashMap<u64, usize>>> = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut workers = Vec::new();
    for w in 0..8u64 {
        let (idem, runs, stop) = (idem.clone(), runs.clone(), stop.clone());
        workers.push(tokio::spawn(async move {
            let (mut ok, mut failed) = (0usize, 0usize);
            let mut i = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let k = (i * 8 + w) % 64;
                i += 1;
                let runs = runs.clone();
                let r: Result<u64, Error> = idem
                    .dedup(&CHURN, format!("k{k}"), async move {
                        *runs.lock().unwrap().entry(k).or_default() += 1;
                        Ok(k)
                    })
                    .await;
                match r {
                    Ok(v) => {
                        assert_eq!(v, k);
                        ok += 1;
                    }
                    Err(Error::Store(_) | Error::InProgress { .. }) => {
                        failed += 1;
                        tokio::time::sleep(ms(5)).await;
                    }
                    Err(e) => panic!("unexpected error: {e}"),
                }
            }
            (ok, failed)
        }));
    }
    tokio::time::sleep(ms(300)).await;
    fault().await;
    tokio::time::sleep(ms(800)).await;
    stop.store(true, Ordering::SeqCst);
    for w in workers {
        w.await.unwrap();
    }
    for (k, n) in runs.lock().unwrap().iter() {
        assert_eq!(*n, 1, "key {k} ran {n} times");
    }
    // Served again, without rebuilding anything.
    let mut fresh_ok = false;
    for attempt in 0..100 {
        match idem
            .dedup(&CHURN, format!("after{attempt}"), async {
                Ok::<_, Error>(1u8)
            })
            .await
        {
            Ok(_) => {
                fresh_ok = true;
                break;
            }
            Err(_) => tokio::time::sleep(ms(50)).await,
        }
    }
    assert!(fresh_ok, "the store did not recover");
}

/// The server is killed (`kill -9`) and restarted mid-run. It fsyncs every write, so no
/// acknowledged claim or completion is lost; keys whose completion failed stay claimed
/// for their (long) lease instead of running again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_killed_and_restarted_mid_run() {
    let mut server = RedisServer::start_durable();
    let store = RedisStore::builder()
        .timeout(ms(500))
        .connect(&server.url())
        .unwrap();
    let idem = Idem::builder().store(store).namespace("restart").build();
    churn_through(&idem, async || {
        tokio::task::block_in_place(|| {
            server.kill();
            std::thread::sleep(ms(300));
            server.restart();
        });
    })
    .await;
}

/// Every connection is cut by the proxy, twice, mid-run.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn connections_cut_mid_run() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port);
    let store = RedisStore::builder()
        .timeout(ms(500))
        .connect(&proxy.url())
        .unwrap();
    let idem = Idem::builder().store(store).namespace("cut").build();
    churn_through(&idem, async || {
        proxy.cut_all();
        tokio::time::sleep(ms(200)).await;
        proxy.cut_all();
    })
    .await;
}
