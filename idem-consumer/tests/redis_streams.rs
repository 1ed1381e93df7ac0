//! The consumer rules on a real Redis (127.0.0.1:6379) Streams consumer group, one private
//! stream per test (deleted at the end). A consumer killed with SIGKILL runs as a child
//! process: this test binary run again with `IDEM_STREAMS_CHILD` set.
#![cfg(feature = "redis-streams")]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::{Effects, HeldSource, eventually, idem, settle, spawn, unique, with_deadline};
use idem_consumer::redis_streams::redis::{self, AsyncCommands, Value};
use idem_consumer::redis_streams::{RedisStreamConfig, RedisStreamSource};
use idem_consumer::{Consumer, ConsumerError, Horizon, Message, Source};
use idem_runtime::store::BoxError;
use idem_runtime::{Idem, Options};
use tokio::io::{AsyncBufReadExt, BufReader};

const REDIS: &str = "redis://127.0.0.1:6379";

static CREDIT: Options = Options::dedup("test::credit")
    .ttl(Duration::from_secs(120))
    .lease(Duration::from_secs(10))
    .wait(Duration::from_secs(15));

fn client() -> redis::Client {
    redis::Client::open(REDIS).expect("a redis URL")
}

async fn conn() -> redis::aio::MultiplexedConnection {
    client()
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|e| panic!("Redis must run on {REDIS} (redis-server): {e}"))
}

/// A private stream, its group and dead-letter stream.
struct Stream {
    name: String,
    group: String,
}

impl Stream {
    fn new() -> Stream {
        Stream {
            name: unique("S"),
            group: "G".into(),
        }
    }

    fn config(&self, consumer: &str) -> RedisStreamConfig {
        RedisStreamConfig::new(&self.name, &self.group, consumer)
            .min_idle(Duration::from_millis(1000))
            .claim_every(Duration::from_millis(50))
            .block(Duration::from_millis(200))
            .max_deliveries(20)
    }

    async fn source(&self, cfg: RedisStreamConfig) -> RedisStreamSource {
        RedisStreamSource::new(&client(), cfg)
            .await
            .expect("read the stream")
    }

    async fn add(&self, fields: &[(&str, &str)]) -> String {
        let mut cmd = redis::cmd("XADD");
        cmd.arg(&self.name).arg("*");
        for (k, v) in fields {
            cmd.arg(k).arg(v);
        }
        cmd.query_async(&mut conn().await).await.expect("XADD")
    }

    /// Entries pending in the group.
    async fn pending(&self) -> i64 {
        let v: Value = redis::cmd("XPENDING")
            .arg(&self.name)
            .arg(&self.group)
            .query_async(&mut conn().await)
            .await
            .expect("XPENDING");
        match v {
            Value::Array(parts) => match parts.first() {
                Some(Value::Int(n)) => *n,
                other => panic!("XPENDING summary: {other:?}"),
            },
            other => panic!("XPENDING summary: {other:?}"),
        }
    }

    async fn dead_letters(&self) -> Vec<Vec<(String, String)>> {
        let v: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
            .arg(format!("{}:dlq", self.name))
            .arg("-")
            .arg("+")
            .query_async(&mut conn().await)
            .await
            .expect("XRANGE");
        v.into_iter().map(|(_, f)| f).collect()
    }

    /// Effects recorded across processes: a hash of id → times run.
    async fn effect(&self, id: &str) -> i64 {
        let n: Option<i64> = conn()
            .await
            .hget(format!("{}:effects", self.name), id)
            .await
            .expect("HGET");
        n.unwrap_or(0)
    }

    async fn drop(self) {
        let mut c = conn().await;
        let _: Result<(), _> = c
            .del(&[
                self.name.clone(),
                format!("{}:dlq", self.name),
                format!("{}:effects", self.name),
            ])
            .await;
    }
}

/// A consumer whose effect is one entry in `effects`, after `pause`; `started` is set as
/// the first handler starts.
fn recording(
    idem: Idem,
    effects: &Effects,
    pause: Duration,
    started: Arc<AtomicBool>,
) -> Consumer<idem_consumer::Plain<impl idem_consumer::Handler>> {
    common::recording(idem, &CREDIT, effects, pause, started)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unbounded_redeliveries_refuse_to_start_and_max_deliveries_bound_them() {
    let s = Stream::new();
    let consumer = recording(idem(), &Effects::default(), Duration::ZERO, Arc::default());
    let cfg = RedisStreamConfig::new(&s.name, &s.group, "c1");
    let unbounded = s.source(cfg.clone()).await;
    assert_eq!(unbounded.redelivery_horizon(), Horizon::Unbounded);
    let refused = consumer.run(unbounded, std::future::pending()).await;
    assert!(
        matches!(refused, Err(ConsumerError::UnboundedRedelivery)),
        "{refused:?}"
    );
    // The group exists now: binding to it again is fine.
    let bounded = s.source(cfg.max_deliveries(3)).await;
    assert_eq!(
        bounded.redelivery_horizon(),
        Horizon::Bounded(Duration::from_secs(31 * 4))
    );
    s.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_entry_runs_once_and_is_acked() {
    let s = Stream::new();
    for i in 0..20 {
        s.add(&[("payload", &format!("{{\"n\":{i}}}"))]).await;
    }
    let effects = Effects::default();
    let consumer = recording(idem(), &effects, Duration::ZERO, Arc::default());
    let run = spawn(&consumer, s.source(s.config("c1")).await);
    eventually(20, "20 processed", || consumer.counters().processed == 20).await;
    let c = run.stop().await;
    assert_eq!((effects.distinct(), effects.total()), (20, 20));
    assert_eq!((c.redeliveries, c.ack_failures), (0, 0), "{c:?}");
    assert_eq!(s.pending().await, 0, "all acked");
    s.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_from_a_field_the_fields_as_json_and_an_entry_without_an_id() {
    let s = Stream::new();
    s.add(&[("message_id", "m1"), ("account", "a"), ("amount", "5")])
        .await;
    s.add(&[("message_id", "m1"), ("account", "a"), ("amount", "5")])
        .await;
    let no_id = s.add(&[("payload", "{\"account\":\"b\"}")]).await;
    let seen: Arc<Mutex<Vec<(String, Bytes)>>> = Arc::default();
    let log = seen.clone();
    let consumer = Consumer::builder(idem(), CREDIT.clone()).handler(move |msg: Message| {
        let log = log.clone();
        async move {
            log.lock().expect("log").push((msg.id, msg.payload));
            Ok::<_, BoxError>(())
        }
    });
    let run = spawn(
        &consumer,
        s.source(s.config("c1").id_field("message_id")).await,
    );
    eventually(20, "three settled", || {
        let c = consumer.counters();
        c.processed + c.duplicates + c.poison == 3
    })
    .await;
    let c = run.stop().await;
    assert_eq!(
        (c.processed, c.duplicates, c.poison, c.missing_id),
        (1, 1, 1, 1)
    );
    let seen = seen.lock().expect("log").clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].0, "m1");
    let json: serde_json::Value = serde_json::from_slice(&seen[0].1).expect("JSON");
    assert_eq!(json, serde_json::json!({"account": "a", "amount": "5"}));
    let dead = s.dead_letters().await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert!(dead[0].contains(&("source_id".into(), no_id)), "{dead:?}");
    assert!(
        dead[0].contains(&("payload".into(), "{\"account\":\"b\"}".into())),
        "{dead:?}"
    );
    assert_eq!(s.pending().await, 0);
    s.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_entry_goes_to_the_dead_letter_stream_after_max_attempts() {
    let s = Stream::new();
    let id = s.add(&[("payload", "not json")]).await;
    let attempts: Arc<Mutex<Vec<u32>>> = Arc::default();
    let log = attempts.clone();
    let consumer = Consumer::builder(idem(), CREDIT.clone())
        .max_attempts(3)
        .backoff(Duration::from_millis(50), Duration::from_millis(100))
        .handler(move |msg: Message| {
            let log = log.clone();
            async move {
                log.lock().expect("log").push(msg.attempt);
                Err::<(), BoxError>("unreadable".into())
            }
        });
    let cfg = s.config("c1").min_idle(Duration::from_millis(300));
    let run = spawn(&consumer, s.source(cfg).await);
    eventually(30, "dead-lettered", || consumer.counters().poison == 1).await;
    settle(500).await;
    let c = run.stop().await;
    assert_eq!((c.handler_errors, c.poison, c.ack_failures), (3, 1, 0));
    assert_eq!(
        *attempts.lock().expect("log"),
        vec![1, 2, 3],
        "the delivery count"
    );
    assert_eq!(c.redeliveries, 2);
    let dead = s.dead_letters().await;
    assert_eq!(dead.len(), 1);
    assert!(dead[0].contains(&("source_id".into(), id)), "{dead:?}");
    assert_eq!(s.pending().await, 0, "acked once dead-lettered");
    s.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_consumer_keeps_its_entry_while_another_runs_xautoclaim() {
    let s = Stream::new();
    let id = s.add(&[("payload", "{}")]).await;
    let effects = Effects::default();
    let started = Arc::new(AtomicBool::new(false));
    let idem = idem();
    // The handler takes 4 s; min_idle is 1.5 s and the entry is refreshed every 0.5 s.
    let slow = recording(
        idem.clone(),
        &effects,
        Duration::from_secs(4),
        started.clone(),
    );
    let min_idle = Duration::from_millis(1500);
    let ra = spawn(&slow, s.source(s.config("a").min_idle(min_idle)).await);
    eventually(20, "the slow handler started", || {
        started.load(Ordering::SeqCst)
    })
    .await;
    let other = recording(idem, &effects, Duration::ZERO, Arc::default());
    let rb = spawn(&other, s.source(s.config("b").min_idle(min_idle)).await);
    eventually(20, "processed", || slow.counters().processed == 1).await;
    settle(2000).await; // past min_idle again: an unacked entry would be reclaimed now
    let (a, b) = (ra.stop().await, rb.stop().await);
    assert_eq!((effects.count(&id), effects.total()), (1, 1));
    assert_eq!(a.processed, 1, "{a:?}");
    assert_eq!(
        (
            b.redeliveries,
            b.processed,
            b.duplicates,
            b.in_flight_duplicates
        ),
        (0, 0, 0, 0),
        "the other consumer never got the entry: {b:?}"
    );
    assert_eq!(s.pending().await, 0);
    s.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_refreshes_a_reclaimed_entry_waits_for_its_running_twin() {
    let s = Stream::new();
    let id = s.add(&[("payload", "{}")]).await;
    let effects = Effects::default();
    let started = Arc::new(AtomicBool::new(false));
    let idem = idem();
    // The test needs the second consumer to reclaim the entry while the first handler
    // still runs: it starts after that handler, and reclaims on its first pass (every
    // 1 s, once the entry is 500 ms idle). Six seconds leave that room on a loaded CI
    // machine; with three, a late start once found the entry already acked.
    let slow = recording(
        idem.clone(),
        &effects,
        Duration::from_secs(6),
        started.clone(),
    );
    let min_idle = Duration::from_millis(500);
    let a_cfg = s.config("a").min_idle(min_idle).progress(None);
    let ra = spawn(&slow, s.source(a_cfg).await);
    eventually(20, "the slow handler started", || {
        started.load(Ordering::SeqCst)
    })
    .await;
    let other = recording(idem, &effects, Duration::ZERO, Arc::default());
    let rb = spawn(&other, s.source(s.config("b").min_idle(min_idle)).await);
    eventually(30, "both settled", || {
        slow.counters().processed == 1 && other.counters().duplicates == 1
    })
    .await;
    let (a, b) = (ra.stop().await, rb.stop().await);
    assert_eq!(effects.count(&id), 1, "the effect ran once");
    assert_eq!(a.processed, 1, "{a:?}");
    assert_eq!(
        (b.redeliveries, b.in_flight_duplicates, b.processed),
        (1, 1, 0),
        "reclaimed, waited for the twin, acked its result: {b:?}"
    );
    assert_eq!(s.pending().await, 0);
    s.drop().await;
}

// ---- A consumer killed with SIGKILL, in a child process ----

/// Where the child pauses: `claim` (in the handler, before the effect) or `ack` (after
/// the effect is recorded, before the XACK).
const CHILD: &str = "IDEM_STREAMS_CHILD";

/// The effect both processes run: one count per id in a Redis hash.
async fn count_effect(stream: &str, id: &str) -> Result<(), BoxError> {
    let mut c = conn().await;
    let _: i64 = c.hincr(format!("{stream}:effects"), id, 1).await?;
    Ok(())
}

fn redis_consumer(
    store: Arc<dyn idem_runtime::Store>,
    ns: &str,
    stream: &str,
    pause_in_handler: bool,
) -> Consumer<idem_consumer::Plain<impl idem_consumer::Handler>> {
    static KILLED: Options = Options::dedup("test::killed")
        .ttl(Duration::from_secs(120))
        .lease(Duration::from_millis(1500))
        .wait(Duration::from_secs(15));
    let idem = Idem::builder()
        .shared_store(store)
        .namespace(ns.to_owned())
        .build();
    let stream = stream.to_owned();
    let paused = Arc::new(AtomicBool::new(false));
    Consumer::builder(idem, KILLED.clone())
        .concurrency(1)
        .handler(move |msg: Message| {
            let (stream, paused) = (stream.clone(), paused.clone());
            async move {
                if pause_in_handler && !paused.swap(true, Ordering::SeqCst) {
                    println!("PAUSE {}", msg.id);
                    tokio::time::sleep(Duration::from_secs(600)).await;
                }
                count_effect(&stream, &msg.id).await
            }
        })
}

/// The child's side: runs only when the parent test started this binary for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_consumer_process() {
    let Ok(spec) = std::env::var(CHILD) else {
        return;
    };
    let [at, stream, ns]: [&str; 3] = spec
        .splitn(3, ' ')
        .collect::<Vec<_>>()
        .try_into()
        .expect("the child's spec");
    let s = Stream {
        name: stream.to_owned(),
        group: "G".into(),
    };
    let store = idem_runtime::store::connect(REDIS).await.expect("store");
    let consumer = redis_consumer(store, ns, stream, at == "claim");
    let source = s.source(s.config("child")).await;
    // At `ack`: the first ack prints `PAUSE` and never returns.
    let acked = AtomicBool::new(at != "ack");
    let hold = move |id: &str| {
        let first = !acked.swap(true, Ordering::SeqCst);
        if first {
            println!("PAUSE {id}");
        }
        first
    };
    let held = HeldSource::new(source, Arc::new(hold));
    let _ = consumer.run(held, std::future::pending()).await;
}

async fn killed_then_reclaimed(at: &str) {
    let s = Stream::new();
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(s.add(&[("payload", "{}")]).await);
    }
    let ns = unique("ns");
    let exe = std::env::current_exe().expect("the test binary");
    let mut child = tokio::process::Command::new(exe)
        .args(["child_consumer_process", "--exact", "--nocapture"])
        .env(CHILD, format!("{at} {} {ns}", s.name))
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the child consumer");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let marker = with_deadline(60, "the child pauses", async {
        loop {
            match lines.next_line().await {
                Ok(Some(l)) if l.starts_with("PAUSE ") => return l,
                Ok(Some(_)) => {}
                other => panic!("the child ended before pausing: {other:?}"),
            }
        }
    })
    .await;
    child.start_kill().expect("SIGKILL");
    let _ = child.wait().await;
    let held = marker.trim_start_matches("PAUSE ").to_owned();

    let store = idem_runtime::store::connect(REDIS).await.expect("store");
    let consumer = redis_consumer(store, &ns, &s.name, false);
    let run = spawn(&consumer, s.source(s.config("heir")).await);
    let done = async {
        loop {
            let mut all = true;
            for id in &ids {
                all &= s.effect(id).await >= 1;
            }
            if all && s.pending().await == 0 {
                return;
            }
            settle(50).await;
        }
    };
    with_deadline(60, "every entry's effect, all acked", done).await;
    let c = run.stop().await;
    for id in &ids {
        assert_eq!(s.effect(id).await, 1, "{id} ({marker}); {c:?}");
    }
    assert!(c.redeliveries >= 1, "the held entry was reclaimed: {c:?}");
    if at == "ack" {
        assert!(c.duplicates >= 1, "{held}'s effect was recorded: {c:?}");
    }
    s.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_killed_before_its_effect_leaves_the_entry_to_xautoclaim() {
    killed_then_reclaimed("claim").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_killed_after_its_effect_before_the_ack_is_replayed_not_rerun() {
    killed_then_reclaimed("ack").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_delivered_more_than_max_deliveries_is_dead_lettered_unrun() {
    let s = Stream::new();
    let id = s.add(&[("payload", "{}")]).await;
    let attempts: Arc<Mutex<Vec<u32>>> = Arc::default();
    let log = attempts.clone();
    // The store would allow 10 failures; the stream's bound of 2 deliveries ends it first.
    let consumer = Consumer::builder(idem(), CREDIT.clone())
        .max_attempts(10)
        .backoff(Duration::from_millis(20), Duration::from_millis(50))
        .handler(move |msg: Message| {
            let log = log.clone();
            async move {
                log.lock().expect("log").push(msg.attempt);
                Err::<(), BoxError>("failing".into())
            }
        });
    let cfg = s
        .config("c1")
        .min_idle(Duration::from_millis(300))
        .max_deliveries(2);
    let run = spawn(&consumer, s.source(cfg).await);
    let dead = async {
        while s.dead_letters().await.is_empty() {
            settle(50).await;
        }
    };
    with_deadline(30, "dead-lettered by the source", dead).await;
    settle(500).await;
    let c = run.stop().await;
    assert_eq!(*attempts.lock().expect("log"), vec![1, 2], "{c:?}");
    assert_eq!((c.handler_errors, c.poison), (2, 0), "{c:?}");
    let dead = s.dead_letters().await;
    assert_eq!(dead.len(), 1);
    assert!(dead[0].contains(&("source_id".into(), id)), "{dead:?}");
    assert_eq!(s.pending().await, 0);
    s.drop().await;
}
