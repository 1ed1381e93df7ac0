//! A consumer silently partitioned from NATS (127.0.0.1:4222) for longer than the
//! consumer's `ack_wait`, mid-handler: JetStream redelivers its messages to another
//! consumer, and the first one's ack arrives after the window (nats-server #4786). The
//! effect must not double.
//!
//! The partition is a proxy between the first consumer and NATS that stops forwarding
//! without closing anything, as a dropped link does: the client's progress signals
//! (`+WPI`) and acks wait in the pipe and arrive when it heals.
#![cfg(feature = "nats")]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::{Effects, eventually, spawn, unique};
use idem_consumer::nats::NatsSource;
use idem_consumer::nats::async_nats::{
    self,
    jetstream::{self, message::PublishMessage, stream},
};
use idem_consumer::{Consumer, Message};
use idem_runtime::store::BoxError;
use idem_runtime::{Idem, MemoryStore, Options, Store};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

const NATS_PORT: u16 = 4222;
const MESSAGES: u64 = 10;

static CREDIT: Options = Options::dedup("test::credit")
    .lease(Duration::from_secs(2))
    .wait(Duration::from_secs(10));

/// A loopback proxy to NATS that can hold traffic: while held, nothing is read from
/// either side and nothing read is written, and no connection is closed.
struct HoldProxy {
    port: u16,
    held: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl HoldProxy {
    async fn start(target: u16) -> HoldProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let (held, rx) = watch::channel(false);
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((client, _)) = accepted else { continue };
                        let rx = rx.clone();
                        conns.spawn(async move {
                            let Ok(server) = TcpStream::connect(("127.0.0.1", target)).await else {
                                return;
                            };
                            let (cr, cw) = client.into_split();
                            let (sr, sw) = server.into_split();
                            tokio::join!(pipe(cr, sw, rx.clone()), pipe(sr, cw, rx));
                        });
                    }
                    Some(_) = conns.join_next(), if !conns.is_empty() => {}
                }
            }
        });
        HoldProxy { port, held, task }
    }

    fn hold(&self) {
        self.held.send_replace(true);
    }

    fn heal(&self) {
        self.held.send_replace(false);
    }
}

impl Drop for HoldProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn open(held: &mut watch::Receiver<bool>) {
    while *held.borrow_and_update() {
        if held.changed().await.is_err() {
            return;
        }
    }
}

async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut held: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        open(&mut held).await;
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        open(&mut held).await;
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_ack_from_a_partitioned_consumer_does_not_double_the_effect() {
    let url = format!("nats://127.0.0.1:{NATS_PORT}");
    let direct = async_nats::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("NATS with JetStream must run on {url} (nats-server -js): {e}"));
    let js = jetstream::new(direct);
    let name = unique("P");
    let subject = format!("{name}.credits");
    let ack_wait = Duration::from_secs(1);
    let stream = js
        .create_stream(stream::Config {
            name: name.clone(),
            subjects: vec![format!("{name}.>")],
            max_age: Duration::from_secs(600),
            ..Default::default()
        })
        .await
        .expect("create the test stream");
    let durable = format!("{name}_D");
    stream
        .get_or_create_consumer(
            &durable,
            jetstream::consumer::pull::Config {
                durable_name: Some(durable.clone()),
                ack_wait,
                max_deliver: 50,
                ..Default::default()
            },
        )
        .await
        .expect("create the durable consumer");
    for i in 0..MESSAGES {
        js.send_publish(
            subject.clone(),
            PublishMessage::build()
                .payload("{}".into())
                .message_id(format!("late-{i}")),
        )
        .await
        .expect("publish")
        .await
        .expect("publish ack");
    }

    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let ns = unique("ns");
    let idem = || {
        Idem::builder()
            .shared_store(store.clone())
            .namespace(ns.clone())
            .build()
    };
    let effects = Effects::default();

    // Consumer A, through the proxy: its handlers start, then wait for the gate.
    let proxy = HoldProxy::start(NATS_PORT).await;
    let via_proxy = async_nats::connect(format!("nats://127.0.0.1:{}", proxy.port))
        .await
        .expect("connect through the proxy");
    let mut a_durable = jetstream::new(via_proxy)
        .get_stream(&name)
        .await
        .expect("stream through the proxy")
        .get_consumer(&durable)
        .await
        .expect("durable through the proxy");
    let started = Arc::new(AtomicU64::new(0));
    let (gate, gate_rx) = watch::channel(false);
    let a = {
        let (effects, started) = (effects.clone(), started.clone());
        Consumer::builder(idem(), CREDIT.clone())
            .backoff(Duration::from_millis(20), Duration::from_millis(200))
            .handler(move |msg: Message| {
                let (effects, started, mut gate) =
                    (effects.clone(), started.clone(), gate_rx.clone());
                async move {
                    started.fetch_add(1, Ordering::SeqCst);
                    let _ = gate.wait_for(|open| *open).await;
                    effects.record(&msg.id);
                    Ok::<_, BoxError>(())
                }
            })
    };
    let ra = spawn(
        &a,
        NatsSource::new(&mut a_durable, Duration::from_secs(600), 64)
            .await
            .expect("subscribe A"),
    );
    eventually(30, "A's handlers all started", || {
        started.load(Ordering::SeqCst) == MESSAGES
    })
    .await;

    // The silent partition: A's progress signals stop reaching NATS; after ack_wait the
    // messages go to B, which finds each one held by A and waits.
    proxy.hold();
    let mut b_durable = stream.get_consumer(&durable).await.expect("durable for B");
    let b = {
        let effects = effects.clone();
        Consumer::builder(idem(), CREDIT.clone())
            .backoff(Duration::from_millis(20), Duration::from_millis(200))
            .handler(move |msg: Message| {
                let effects = effects.clone();
                async move {
                    effects.record(&msg.id);
                    Ok::<_, BoxError>(())
                }
            })
    };
    let rb = spawn(
        &b,
        NatsSource::new(&mut b_durable, Duration::from_secs(600), 64)
            .await
            .expect("subscribe B"),
    );
    eventually(
        30,
        "every message redelivered to B while A holds it",
        || b.counters().in_flight_duplicates >= MESSAGES,
    )
    .await;

    // A's handlers finish while it is still cut off: effects made, records written,
    // acks sent into the partition. Then it heals and the acks arrive, late.
    gate.send_replace(true);
    eventually(30, "A's effects", || effects.total() == MESSAGES as u32).await;
    proxy.heal();
    eventually(60, "every message settled", || {
        let (x, y) = (a.counters(), b.counters());
        x.processed + x.ack_failures >= MESSAGES && y.duplicates >= MESSAGES
    })
    .await;
    let info = stream
        .get_consumer::<jetstream::consumer::pull::Config>(&durable)
        .await
        .expect("durable")
        .info()
        .await
        .expect("consumer info")
        .clone();
    let (ca, cb) = (ra.stop().await, rb.stop().await);
    println!(
        "late acks: A {ca:?}\nB {cb:?}\nbroker: {} pending, {} ack pending, {} redelivered",
        info.num_pending, info.num_ack_pending, info.num_redelivered
    );
    assert_eq!(effects.distinct(), MESSAGES as usize);
    assert!(effects.doubled().is_empty(), "{:?}", effects.doubled());
    assert_eq!(cb.processed, 0, "B never ran a handler: {cb:?}");
    assert!(cb.redeliveries >= MESSAGES, "B got redeliveries: {cb:?}");
    let _ = js.delete_stream(&name).await;
}
