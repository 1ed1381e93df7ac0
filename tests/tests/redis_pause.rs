//! A process paused (SIGSTOP) inside its bodies for longer than their lease, its keys
//! taken over by another owner, then resumed (SIGCONT): what the woken bodies still do,
//! under the plain dedup strategy and under the lock strategy with a fenced effect.
//!
//! The paused process is this test binary run again with `IDEM_PAUSE_CHILD` set: the
//! `child` test below then plays its part. The pause is ordered by events, not by time:
//! the child's bodies wait for a `go` key that the parent sets only once the child is
//! stopped, and the parent resumes it only once every key was taken over.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/redis_harness.rs"]
mod harness;
#[path = "support/stopped.rs"]
mod stopped;

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use idem_runtime::store::redis::redis::{self, AsyncCommands, aio::MultiplexedConnection};
use idem_runtime::{Error, Idem, Options, RedisStore};

/// Keys each paused process holds when it is stopped.
const KEYS: u64 = 8;

/// A short lease: the paused process loses its claims within a second of its stop.
static DEDUP: Options = Options::dedup("redis_pause::dedup")
    .lease(Duration::from_secs(1))
    .wait(Duration::from_secs(30));
static LOCK: Options = Options::lock("redis_pause::lock")
    .lease(Duration::from_secs(1))
    .wait(Duration::from_secs(30));

/// The downstream write of the lock test: accepted only with a fence greater than the
/// last accepted one for the key (Kleppmann's fencing check, done by the resource).
const FENCED_WRITE: &str = r"
local last = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) > last then
  redis.call('SET', KEYS[1], ARGV[1])
  redis.call('RPUSH', KEYS[2], ARGV[2])
  return 1
end
return 0";

fn idem(url: &str, ns: &str) -> Idem {
    Idem::builder()
        .store(RedisStore::connect(url).unwrap())
        .namespace(ns)
        .build()
}

fn effects_key(ns: &str, k: u64) -> String {
    format!("{ns}:effects:{k}")
}

/// Waits (bounded) until the parent sets `{ns}:go`. Polls on a connection without a
/// response timeout, so a reply that waited out the stop is read, not timed out.
async fn wait_for_go(raw: &mut MultiplexedConnection, ns: &str) -> Result<(), Error> {
    for _ in 0..6000 {
        let go: Option<u8> = raw.get(format!("{ns}:go")).await.map_err(Error::store)?;
        if go.is_some() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Err(Error::Config("the parent never said go".into()))
}

/// Writes `who` to the key's effects if `fence` is the greatest seen; whether accepted.
async fn fenced_write(
    raw: &mut MultiplexedConnection,
    ns: &str,
    k: u64,
    fence: u64,
    who: &str,
) -> bool {
    let accepted: i64 = redis::Script::new(FENCED_WRITE)
        .key(format!("{ns}:fence:{k}"))
        .key(effects_key(ns, k))
        .arg(fence)
        .arg(who)
        .invoke_async(raw)
        .await
        .unwrap();
    accepted == 1
}

/// The paused side. Does nothing in a normal test run.
#[test]
fn child() {
    let Ok(role) = std::env::var("IDEM_PAUSE_CHILD") else {
        return;
    };
    let url = std::env::var("IDEM_PAUSE_URL").unwrap();
    let ns = std::env::var("IDEM_PAUSE_NS").unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let idem = idem(&url, &ns);
        let raw = harness::raw_connection(&url).await;
        let (accepted, rejected, returned) = (
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicU64::new(0)),
        );
        let mut tasks = Vec::new();
        for k in 0..KEYS {
            let (idem, mut raw, ns, role) = (idem.clone(), raw.clone(), ns.clone(), role.clone());
            let (accepted, rejected, returned) =
                (accepted.clone(), rejected.clone(), returned.clone());
            tasks.push(tokio::spawn(async move {
                let r: Result<u64, Error> = match role.as_str() {
                    // The plain effect: whatever the body does after waking lands.
                    "dedup" => {
                        idem.dedup(&DEDUP, format!("k{k}"), async {
                            println!("IN {k}");
                            wait_for_go(&mut raw, &ns).await?;
                            let _: i64 = raw.rpush(effects_key(&ns, k), "paused").await.unwrap();
                            Ok(1)
                        })
                        .await
                    }
                    // The fenced effect: the resource checks the fence.
                    "lock" => {
                        idem.lock(&LOCK, format!("k{k}"), async {
                            let fence = idem_runtime::fence().unwrap();
                            println!("IN {k} {fence}");
                            wait_for_go(&mut raw, &ns).await?;
                            if fenced_write(&mut raw, &ns, k, fence, "paused").await {
                                accepted.fetch_add(1, Ordering::SeqCst);
                            } else {
                                rejected.fetch_add(1, Ordering::SeqCst);
                            }
                            Ok(1)
                        })
                        .await
                    }
                    other => panic!("unknown child role {other}"),
                };
                if r.is_ok() {
                    returned.fetch_add(1, Ordering::SeqCst);
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        println!(
            "DONE lost={} returned={} accepted={} rejected={}",
            idem.stats().lease_lost,
            returned.load(Ordering::SeqCst),
            accepted.load(Ordering::SeqCst),
            rejected.load(Ordering::SeqCst),
        );
    });
    std::process::exit(0);
}

/// The child process, stopped and resumed by the parent; killed if still there on drop.
struct Paused {
    child: Child,
    out: BufReader<ChildStdout>,
}

impl Paused {
    fn start(role: &str, url: &str, ns: &str) -> Paused {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["child", "--exact", "--nocapture", "--test-threads=1"])
            .env("IDEM_PAUSE_CHILD", role)
            .env("IDEM_PAUSE_URL", url)
            .env("IDEM_PAUSE_NS", ns)
            .env("RUST_LOG", "off")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        Paused { child, out }
    }

    /// The rest of the next line that contains `tag`.
    fn line(&mut self, tag: &str) -> String {
        let mut line = String::new();
        loop {
            line.clear();
            let n = self.out.read_line(&mut line).unwrap();
            assert!(n > 0, "the child exited before printing {tag}");
            // libtest may print "test child ... " before the child's first line.
            if let Some(at) = line.find(tag) {
                return line[at + tag.len()..].trim().to_owned();
            }
        }
    }

    fn signal(&self, sig: &str) {
        if sig == "-STOP" {
            stopped::stop(self.child.id());
        } else {
            stopped::signal(self.child.id(), sig);
        }
    }

    /// The numbers of the child's `DONE` line, by name, once it has exited.
    fn done(mut self) -> impl Fn(&str) -> u64 {
        let done = self.line("DONE");
        assert!(self.child.wait().unwrap().success());
        move |name: &str| {
            done.split(' ')
                .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
                .unwrap_or_else(|| panic!("no {name} in {done}"))
                .parse()
                .unwrap()
        }
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn effects(raw: &mut MultiplexedConnection, ns: &str, k: u64) -> Vec<String> {
    raw.lrange(effects_key(ns, k), 0, -1).await.unwrap()
}

async fn clean(raw: &mut MultiplexedConnection, ns: &str) {
    let keys: Vec<String> = raw.keys(format!("{ns}:*")).await.unwrap();
    for k in keys {
        let _: () = raw.del(k).await.unwrap();
    }
}

/// Plain dedup: the paused process's bodies, woken after another owner took their keys
/// over and completed them, still make their effects; only their completions are
/// refused (counted as lost leases), so the records keep the taker's values. This
/// counts those late effects: with nothing downstream to refuse them, every one of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_dedup_body_still_makes_its_effect_and_its_completion_is_refused() {
    let url = harness::shared_url();
    let ns = harness::unique("pause-dedup");
    let mut raw = harness::raw_connection(url).await;
    let mut paused = Paused::start("dedup", url, &ns);
    for _ in 0..KEYS {
        paused.line("IN");
    }
    paused.signal("-STOP");
    let _: () = raw.set(format!("{ns}:go"), 1).await.unwrap();

    // The taker: each key's claim is taken over once the stopped process's lease ends.
    let taker = idem(url, &ns);
    let takeovers = (0..KEYS).map(|k| {
        let (taker, mut raw, ns) = (taker.clone(), raw.clone(), ns.clone());
        tokio::spawn(async move {
            taker
                .dedup(&DEDUP, format!("k{k}"), async {
                    let _: i64 = raw.rpush(effects_key(&ns, k), "taker").await.unwrap();
                    Ok::<u64, Error>(2)
                })
                .await
                .unwrap()
        })
    });
    for t in takeovers {
        assert_eq!(t.await.unwrap(), 2, "the taker ran the body itself");
    }
    paused.signal("-CONT");
    let done = paused.done();

    assert_eq!(
        done("lost"),
        KEYS,
        "every woken completion is refused and counted"
    );
    assert_eq!(
        done("returned"),
        KEYS,
        "the woken caller still gets its body's result"
    );
    let mut late = 0;
    for k in 0..KEYS {
        let fx = effects(&mut raw, &ns, k).await;
        assert_eq!(
            fx.iter().filter(|w| *w == "taker").count(),
            1,
            "key {k}: {fx:?}"
        );
        late += fx.iter().filter(|w| *w == "paused").count() as u64;
        // The record is the taker's: a later call replays 2, never the woken body's 1.
        let again: u64 = taker
            .dedup(&DEDUP, format!("k{k}"), async { Ok::<u64, Error>(3) })
            .await
            .unwrap();
        assert_eq!(again, 2, "key {k}");
    }
    // The failure model's figure: under plain dedup, a paused body makes its effect
    // when it wakes, beside the taker's. Here: every one of them.
    println!("paused dedup: {KEYS} keys taken over, {late} late effects of the paused process");
    assert_eq!(late, KEYS);
    clean(&mut raw, &ns).await;
}

/// Lock strategy with a fenced downstream write: the taker's fence is greater, so the
/// woken process's writes are refused by the resource, and its unlocks by the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_lock_holder_is_fenced_off_downstream() {
    let url = harness::shared_url();
    let ns = harness::unique("pause-lock");
    let mut raw = harness::raw_connection(url).await;
    let mut paused = Paused::start("lock", url, &ns);
    let mut first = vec![0u64; KEYS as usize];
    for _ in 0..KEYS {
        let line = paused.line("IN");
        let (k, fence) = line.split_once(' ').unwrap();
        first[k.parse::<usize>().unwrap()] = fence.parse().unwrap();
    }
    paused.signal("-STOP");
    let _: () = raw.set(format!("{ns}:go"), 1).await.unwrap();

    let taker = idem(url, &ns);
    let takeovers = (0..KEYS).map(|k| {
        let (taker, mut raw, ns) = (taker.clone(), raw.clone(), ns.clone());
        tokio::spawn(async move {
            taker
                .lock(&LOCK, format!("k{k}"), async {
                    let fence = idem_runtime::fence().unwrap();
                    let accepted = fenced_write(&mut raw, &ns, k, fence, "taker").await;
                    Ok::<_, Error>((fence, accepted))
                })
                .await
                .unwrap()
        })
    });
    for (k, t) in takeovers.enumerate() {
        let (fence, accepted) = t.await.unwrap();
        assert!(
            fence > first[k],
            "key {k}: fence {fence} after {}",
            first[k]
        );
        assert!(accepted, "key {k}: the taker's write was refused");
    }
    paused.signal("-CONT");
    let done = paused.done();

    assert_eq!(
        done("lost"),
        KEYS,
        "every woken unlock is refused and counted"
    );
    assert_eq!(
        (done("accepted"), done("rejected")),
        (0, KEYS),
        "the stale fences are refused downstream"
    );
    for k in 0..KEYS {
        assert_eq!(effects(&mut raw, &ns, k).await, ["taker"], "key {k}");
    }
    println!(
        "paused lock: {KEYS} keys taken over, 0 late effects accepted, {KEYS} refused by the fence"
    );
    clean(&mut raw, &ns).await;
}
