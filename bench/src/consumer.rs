//! The `consumer` family: messages/s through idem's consumer rules against a bare
//! consumer that only acks, on the same broker, the same kind of stream or queue holding
//! the same messages, the same prefetch, the same concurrency and the same adapter (so the
//! same ack: JetStream's double ack, lapin's checked ack). The difference is what idem
//! adds per message: the claim, the record and the rules. Measured on MemoryStore and,
//! with a PostgreSQL `--sql` URL, on SqlStore.
//!
//! Brokers: NATS JetStream at `$IDEM_BENCH_NATS` (default `nats://127.0.0.1:4222`),
//! RabbitMQ at `$IDEM_BENCH_AMQP` (default `amqp://guest:guest@127.0.0.1:5672/%2f`),
//! Redis Streams at `$IDEM_BENCH_REDIS` (default `redis://127.0.0.1:6379`) and MQTT 5 at
//! `$IDEM_BENCH_MQTT` (default `127.0.0.1:1883`); a broker that does not answer is noted
//! and skipped. NATS, RabbitMQ and Redis get every message before the run; MQTT gets them
//! during it, at most `MQTT_AHEAD` (512) ahead of the consumer: Mosquitto queues at most
//! 1,000 per session by default (a limit kept) and drops the rest, so a backlog of the
//! whole run cannot wait for it. The figure is the steady state of publish and consume
//! together, as MQTT is used.

use std::future::IntoFuture as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::pull, message::PublishMessage, stream};
use futures_util::future::join_all;
use idem_consumer::mqtt::rumqttc::Outgoing;
use idem_consumer::mqtt::rumqttc::v5::mqttbytes::QoS;
use idem_consumer::mqtt::rumqttc::v5::mqttbytes::v5::{Packet, PublishProperties};
use idem_consumer::mqtt::rumqttc::v5::{AsyncClient, Event, EventLoop, MqttOptions};
use idem_consumer::mqtt::{MqttConfig, MqttSource};
use idem_consumer::nats::NatsSource;
use idem_consumer::rabbitmq::RabbitSource;
use idem_consumer::redis_streams::{RedisStreamConfig, RedisStreamSource, redis};
use idem_consumer::{Consumer, Delivery, Message, Source};
use idem_runtime::store::BoxError;
use idem_runtime::{Idem, MemoryStore, Options, SqlStore, Store};
use lapin::options::{BasicPublishOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::{FieldTable, ShortString};
use lapin::{BasicProperties, Connection};

use crate::args::Args;
use crate::report::{Report, Summary};

/// Deliveries in flight, and messages pulled ahead (NATS batch, AMQP prefetch).
const CONCURRENCY: usize = 64;
const PREFETCH: usize = 256;

/// Publishes awaiting their broker's ack at once. async-nats bounds its own publish acks
/// in flight, so a publisher that sends everything before reading an ack stalls for good
/// once that bound is reached: read the acks window by window.
const PUBLISH_WINDOW: usize = 512;

/// The bound on one broker round trip (a publish, its ack, a pull), and on a whole
/// measured run: a bench that cannot finish says why and exits.
const STEP_TIMEOUT: Duration = Duration::from_secs(30);
const RUN_TIMEOUT: Duration = Duration::from_secs(120);

/// `fut`, or an error naming `what` once [`STEP_TIMEOUT`] has passed.
async fn bounded<T, E: Into<BoxError>>(
    what: &str,
    fut: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, BoxError> {
    match tokio::time::timeout(STEP_TIMEOUT, fut).await {
        Ok(r) => r.map_err(Into::into),
        Err(_) => Err(format!("{what}: no answer from the broker within {STEP_TIMEOUT:?}").into()),
    }
}

static OPS: Options = Options::dedup("bench::consumer");

/// Runs the family: for each broker that answers, the bare consumer and idem's on each
/// store, then one `ratio consumer-BROKER-STORE` line each.
pub(crate) async fn run(args: &Args, report: &mut Report) {
    let n: usize = if args.quick { 5_000 } else { 20_000 };
    let pg = args.sql.iter().find(|u| u.starts_with("postgres")).cloned();
    let nats_url = std::env::var("IDEM_BENCH_NATS").unwrap_or("nats://127.0.0.1:4222".into());
    let amqp_url =
        std::env::var("IDEM_BENCH_AMQP").unwrap_or("amqp://guest:guest@127.0.0.1:5672/%2f".into());
    let redis_url = std::env::var("IDEM_BENCH_REDIS").unwrap_or("redis://127.0.0.1:6379".into());
    let mqtt_addr = std::env::var("IDEM_BENCH_MQTT").unwrap_or("127.0.0.1:1883".into());
    for broker in [
        Broker::Nats(nats_url),
        Broker::Amqp(amqp_url),
        Broker::Redis(redis_url),
        Broker::Mqtt(mqtt_addr),
    ] {
        if let Err(e) = broker_cases(args, report, &broker, n, pg.as_deref()).await {
            report.note(format!("consumer/{} skipped: {e}", broker.name()));
        }
    }
}

/// How far the MQTT publisher may run ahead of the consumer's acks: with the
/// [`CONCURRENCY`] messages in flight to the consumer, well under Mosquitto's default of
/// 1,000 queued per session beyond those in flight.
const MQTT_AHEAD: u64 = 512;

enum Broker {
    Nats(String),
    Amqp(String),
    Redis(String),
    /// `host:port`.
    Mqtt(String),
}

impl Broker {
    fn name(&self) -> &'static str {
        match self {
            Broker::Nats(_) => "nats",
            Broker::Amqp(_) => "rabbitmq",
            Broker::Redis(_) => "redis-streams",
            Broker::Mqtt(_) => "mqtt",
        }
    }
}

async fn broker_cases(
    args: &Args,
    report: &mut Report,
    broker: &Broker,
    n: usize,
    pg: Option<&str>,
) -> Result<(), BoxError> {
    let mut stores: Vec<(&str, Arc<dyn Store>)> = vec![("memory", Arc::new(MemoryStore::new()))];
    if let Some(url) = pg {
        stores.push(("postgres", Arc::new(SqlStore::connect(url).await?)));
    }
    let group = format!("consumer/{}", broker.name());
    // The median of the repeats of each case, the bare one and idem's interleaved so a
    // drift of the machine's load hits both alike.
    let mut bare = Vec::new();
    let mut idem: Vec<Vec<f64>> = vec![Vec::new(); stores.len()];
    for _ in 0..args.repeats() {
        bare.push(measure(broker, n, None).await?);
        for (i, (_, store)) in stores.iter().enumerate() {
            idem[i].push(measure(broker, n, Some(store.clone())).await?);
        }
    }
    let bare = report.add_summary(&group, "bare consumer (ack only)", summary(bare));
    for ((name, _), rates) in stores.iter().zip(idem) {
        let s = report.add_summary(&group, &format!("idem consumer on {name}"), summary(rates));
        report.ratio(
            format!("consumer-{}-{name}", broker.name()),
            &s,
            &bare,
            "idem consumer msgs/s ÷ bare ack-only consumer msgs/s, same broker, prefetch and adapter",
        );
    }
    Ok(())
}

fn summary(mut rates: Vec<f64>) -> Summary {
    rates.sort_by(f64::total_cmp);
    Summary {
        tasks: CONCURRENCY,
        ops_per_sec: rates.get(rates.len() / 2).copied().unwrap_or(0.0),
        p50: Duration::ZERO,
        p99: Duration::ZERO,
        errors: 0,
    }
}

/// Publishes `n` fresh messages and consumes them all: through idem on `store`, or bare
/// (`None`). Messages per second from the first pull to the last ack (MQTT: from the
/// first pull, with [`MQTT_AHEAD`] messages waiting, to the last ack).
async fn measure(
    broker: &Broker,
    n: usize,
    store: Option<Arc<dyn Store>>,
) -> Result<f64, BoxError> {
    let tag = format!("{}_{}", crate::load::run_tag(), crate::load::fresh_id());
    match broker {
        Broker::Nats(url) => {
            let js = jetstream::new(bounded("connect", async_nats::connect(url)).await?);
            let name = format!("BENCH_{tag}");
            let subject = format!("{name}.m");
            let st = bounded(
                "create stream",
                js.create_stream(stream::Config {
                    name: name.clone(),
                    subjects: vec![subject.clone()],
                    max_age: Duration::from_secs(600),
                    ..Default::default()
                }),
            )
            .await?;
            let mut acks = Vec::with_capacity(PUBLISH_WINDOW);
            for i in 0..n {
                let m = PublishMessage::build()
                    .payload("{}".into())
                    .message_id(format!("{tag}-{i}"));
                acks.push(bounded("publish", js.send_publish(subject.clone(), m)).await?);
                if acks.len() == PUBLISH_WINDOW || i + 1 == n {
                    for a in acks.drain(..) {
                        bounded("publish ack", a.into_future()).await?;
                    }
                }
            }
            let mut c = st
                .create_consumer(pull::Config {
                    durable_name: Some("D".into()),
                    ack_wait: Duration::from_secs(30),
                    max_deliver: 5,
                    max_ack_pending: 10_000,
                    ..Default::default()
                })
                .await?;
            let source = NatsSource::new(&mut c, Duration::from_secs(600), PREFETCH).await?;
            let rate = consume(source, n, store, Arc::default()).await;
            let _ = js.delete_stream(&name).await;
            rate
        }
        Broker::Amqp(url) => {
            let conn = bounded("connect", Connection::connect(url, Default::default())).await?;
            let ch = conn.create_channel().await?;
            let queue = format!("bench_{tag}");
            ch.queue_declare(
                queue.as_str().into(),
                QueueDeclareOptions::default(),
                FieldTable::default(),
            )
            .await?;
            let mut confirms = Vec::with_capacity(PUBLISH_WINDOW);
            for i in 0..n {
                let props = BasicProperties::default()
                    .with_message_id(ShortString::from(format!("{tag}-{i}")));
                confirms.push(
                    bounded(
                        "publish",
                        ch.basic_publish(
                            "".into(),
                            queue.as_str().into(),
                            BasicPublishOptions::default(),
                            b"{}",
                            props,
                        ),
                    )
                    .await?,
                );
                if confirms.len() == PUBLISH_WINDOW || i + 1 == n {
                    let window = std::mem::take(&mut confirms);
                    let all = async {
                        join_all(window)
                            .await
                            .into_iter()
                            .collect::<Result<Vec<_>, _>>()
                    };
                    bounded("publish confirms", all).await?;
                }
            }
            let source = RabbitSource::new(&ch, &queue, PREFETCH as u16).await?;
            let rate = consume(source, n, store, Arc::default()).await;
            let _ = ch
                .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                .await;
            let _ = conn.close(200, "".into()).await;
            rate
        }
        Broker::Redis(url) => {
            let client = redis::Client::open(url.as_str())?;
            let mut conn = bounded("connect", client.get_multiplexed_async_connection()).await?;
            let stream = format!("bench_{tag}");
            for start in (0..n).step_by(PUBLISH_WINDOW) {
                let mut pipe = redis::pipe();
                for i in start..(start + PUBLISH_WINDOW).min(n) {
                    pipe.cmd("XADD")
                        .arg(&stream)
                        .arg("*")
                        .arg("message_id")
                        .arg(format!("{tag}-{i}"))
                        .arg("payload")
                        .arg("{}")
                        .ignore();
                }
                bounded("XADD", pipe.query_async::<()>(&mut conn)).await?;
            }
            let cfg = RedisStreamConfig::new(&stream, "G", "bench")
                .id_field("message_id")
                .batch(PREFETCH)
                .max_deliveries(5);
            let source = RedisStreamSource::new(&client, cfg).await?;
            let rate = consume(source, n, store, Arc::default()).await;
            let _: Result<(), _> = redis::cmd("DEL").arg(&stream).query_async(&mut conn).await;
            rate
        }
        Broker::Mqtt(addr) => {
            let (host, port) = addr
                .rsplit_once(':')
                .and_then(|(h, p)| Some((h.to_owned(), p.parse::<u16>().ok()?)))
                .ok_or("IDEM_BENCH_MQTT: host:port")?;
            let options = |id: &str| {
                let mut o = MqttOptions::new(id, host.clone(), port);
                o.set_keep_alive(Duration::from_secs(10));
                o
            };
            let topic = format!("bench/{tag}");
            let client_id = format!("bench-{tag}");
            let cfg = MqttConfig::new(&topic).receive_maximum(CONCURRENCY as u16);
            // The session subscribes first, so every message published is queued for it.
            let source = MqttSource::new(options(&client_id), cfg).await?;
            let consumed = Arc::new(AtomicU64::new(0));
            let feed = MqttFeed::start(
                AsyncClient::new(options(&format!("pub-{tag}")), 64),
                topic,
                tag,
                n as u64,
                consumed.clone(),
            );
            // The run starts with a backlog of MQTT_AHEAD, as the other brokers start
            // with theirs, and the publisher keeps it topped up from then on.
            bounded(
                "the first publishes",
                feed.published(MQTT_AHEAD.min(n as u64)),
            )
            .await?;
            let rate = consume(source, n, store, consumed).await;
            let fed = bounded("the publisher", feed.finish()).await;
            // Ends the session (a clean start without expiry).
            let mut o = options(&client_id);
            o.set_clean_start(true);
            let (c, mut ev) = AsyncClient::new(o, 8);
            let _ = tokio::time::timeout(STEP_TIMEOUT, async {
                while let Ok(e) = ev.poll().await {
                    if matches!(e, Event::Incoming(Packet::ConnAck(_))) {
                        let _ = c.disconnect().await;
                    }
                }
            })
            .await;
            let rate = rate?;
            fed?;
            Ok(rate)
        }
    }
}

/// An MQTT publisher of `n` QoS 1 messages (the id in the `message-id` user property),
/// kept at most [`MQTT_AHEAD`] ahead of `consumed`.
struct MqttFeed {
    /// Publishes the broker has acked.
    acked: Arc<AtomicU64>,
    send: tokio::task::JoinHandle<Result<(), BoxError>>,
    poll: tokio::task::JoinHandle<Result<(), BoxError>>,
}

impl MqttFeed {
    fn start(
        (client, mut events): (AsyncClient, EventLoop),
        topic: String,
        tag: String,
        n: u64,
        consumed: Arc<AtomicU64>,
    ) -> MqttFeed {
        let acked = Arc::new(AtomicU64::new(0));
        let sender = client.clone();
        let send = tokio::spawn(async move {
            let deadline = Instant::now() + RUN_TIMEOUT;
            for i in 0..n {
                // Polled rather than woken, so neither consumer pays for waking it.
                while i >= consumed.load(Ordering::Relaxed) + MQTT_AHEAD {
                    if Instant::now() > deadline {
                        return Err("MQTT publisher: the consumer stopped taking messages".into());
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                let mut props = PublishProperties::default();
                props
                    .user_properties
                    .push(("message-id".into(), format!("{tag}-{i}")));
                sender
                    .publish_with_properties(topic.as_str(), QoS::AtLeastOnce, false, "{}", props)
                    .await?;
            }
            Ok::<_, BoxError>(())
        });
        let count = acked.clone();
        let poll = tokio::spawn(async move {
            while count.load(Ordering::Relaxed) < n {
                if let Event::Incoming(Packet::PubAck(_)) = events.poll().await? {
                    count.fetch_add(1, Ordering::Relaxed);
                }
            }
            // The DISCONNECT is written while the loop is polled.
            let _ = client.try_disconnect();
            let _ = tokio::time::timeout(STEP_TIMEOUT, async {
                while !matches!(
                    events.poll().await,
                    Ok(Event::Outgoing(Outgoing::Disconnect)) | Err(_)
                ) {}
            })
            .await;
            Ok::<_, BoxError>(())
        });
        MqttFeed { acked, send, poll }
    }

    /// Once the broker acked `k` publishes.
    async fn published(&self, k: u64) -> Result<(), BoxError> {
        while self.acked.load(Ordering::Relaxed) < k {
            if self.poll.is_finished() {
                return Err("MQTT publisher: it stopped early".into());
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        Ok(())
    }

    /// Every publish sent and acked by the broker, and the publisher gone.
    async fn finish(self) -> Result<(), BoxError> {
        self.send.await??;
        self.poll.await??;
        Ok(())
    }
}

/// Consumes `n` messages from `source`, counting them in `consumed` as they are acked
/// (the idem consumer's every millisecond, so neither path pays per message for it).
async fn consume<S: Source + 'static>(
    source: S,
    n: usize,
    store: Option<Arc<dyn Store>>,
    consumed: Arc<AtomicU64>,
) -> Result<f64, BoxError> {
    let started = Instant::now();
    let deadline = started + RUN_TIMEOUT;
    match store {
        None => bare(source, n as u64, deadline, consumed).await?,
        Some(store) => {
            let idem = Idem::builder()
                .shared_store(store)
                .namespace(format!("bench-consumer-{}", crate::load::run_tag()))
                .build();
            let consumer = Consumer::builder(idem, OPS.clone())
                .concurrency(CONCURRENCY)
                .handler(|_: Message| async { Ok::<_, BoxError>(()) });
            let watch = consumer.clone();
            let done = async move {
                loop {
                    let processed = watch.counters().processed;
                    consumed.store(processed, Ordering::Relaxed);
                    if processed >= n as u64 || Instant::now() >= deadline {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            };
            // `done` ends the run at the deadline; the bound on top catches a run that
            // does not stop when told to.
            let c = tokio::time::timeout(RUN_TIMEOUT + STEP_TIMEOUT, consumer.run(source, done))
                .await
                .map_err(|_| "idem consumer: did not stop after its deadline")??;
            if c.processed < n as u64 || c.ack_failures > 0 {
                return Err(format!("idem consumer: {c:?} of {n}").into());
            }
        }
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

/// The baseline: the same loop shape as [`Consumer::run`] ([`CONCURRENCY`] workers taking
/// turns at the source, each delivery processed in its worker), each delivery only
/// acked, and the source closed as the consumer's run closes it. `acked` counts the acks.
async fn bare<S: Source + 'static>(
    source: S,
    n: u64,
    deadline: Instant,
    acked: Arc<AtomicU64>,
) -> Result<(), BoxError> {
    // The source and how many deliveries it gave, under one lock: a worker that finds
    // `n` pulled stops rather than wait for a delivery that never comes.
    let source = Arc::new(tokio::sync::Mutex::new((source, 0u64)));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..CONCURRENCY {
        let (source, acked) = (source.clone(), acked.clone());
        workers.spawn(async move {
            loop {
                let d = {
                    let mut held = source.lock().await;
                    let (source, pulled) = &mut *held;
                    if *pulled >= n {
                        return Ok::<_, BoxError>(());
                    }
                    let d = match source.next().await {
                        Some(d) => d?,
                        None => return Err("the subscription ended".into()),
                    };
                    *pulled += 1;
                    d
                };
                if d.ack().await.is_ok() {
                    acked.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    }
    // Every wait is bounded by the run's deadline: a broker that stops delivering ends
    // the run with an error.
    let timed_out = || -> BoxError {
        "bare consumer: its deadline passed before every message was acked".into()
    };
    let drained = async {
        while let Some(done) = workers.join_next().await {
            done.map_err(|e| -> BoxError { e.into() })??;
        }
        Ok::<_, BoxError>(())
    };
    tokio::time::timeout_at(deadline.into(), drained)
        .await
        .map_err(|_| timed_out())??;
    let Some(source) = Arc::into_inner(source) else {
        return Err("bare consumer: a worker outlived the run".into());
    };
    source.into_inner().0.close().await;
    match acked.load(Ordering::Relaxed) {
        a if a == n => Ok(()),
        a => Err(format!("bare consumer: {a} of {n} acks went through").into()),
    }
}
