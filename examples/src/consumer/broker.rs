//! The consumer on a real broker: credits from NATS JetStream or RabbitMQ into a
//! PostgreSQL ledger, each message's effect once.
//!
//! ```text
//! consumer --broker nats://127.0.0.1:4222 --stream S --subject S.credits --durable D \
//!          --store URL --ledger postgres://...
//! consumer --broker amqp://guest:guest@127.0.0.1:5672 --queue Q --store URL --ledger postgres://...
//! consumer --broker redis://127.0.0.1:6379 --stream S --group G --store URL --ledger postgres://...
//! consumer --broker mqtt://127.0.0.1:1883 --topic T --client-id C --store URL --ledger postgres://...
//! ```
//!
//! Messages are JSON `{"account": "...", "amount": i64}` with their id in `Nats-Msg-Id`,
//! the AMQP `message_id` property, or a Redis Streams entry's `message_id` field (the
//! JSON in its `payload` field, or the entry's other fields as they are:
//! `XADD S * message_id m1 account a amount 5`; the amount may be a decimal string), or
//! an MQTT 5 message's `message-id` user property. MQTT runs on a persistent session
//! (`--client-id`, which may already exist with messages queued for it), QoS 1, acks
//! after the record; `--topic` may be a shared subscription (`$share/G/T`). Each effect inserts one row into
//! `ledger_credits(message_id, account, amount)` (no unique constraint: the table shows
//! any double effect). When `--store` is the ledger's database, the insert commits in the
//! claim's transaction. `--stream`, `--durable`, `--queue` and `--group` bind to what
//! exists, with its own settings, and create it only if absent (a Redis group created here
//! reads the stream from its start).
//!
//! More options: `--idle-exit-ms N` (exit after N ms without deliveries, printing the
//! counters), `--namespace NS`, `--concurrency N`, `--lease-ms N`, `--wait-ms N`,
//! `--max-attempts N`, `--backoff-ms N` (the first nak delay after a failure),
//! `--record-ttl-s N`, `--ledger-table NAME`, for Redis Streams `--min-idle-ms N` (how long
//! an entry stays pending with a consumer that went silent before another reclaims it;
//! default 30000) and `--consumer NAME` (default `consumer-<pid>`), and for fault tests
//! `--pause-at claim|effect|ack` with `--pause-ms N`: print `PAUSE <where> <id>` at that
//! point of the first delivery and sleep (a test then kills or stops the process).

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use idem_consumer::mqtt::{MqttConfig, MqttSource};
use idem_consumer::nats::NatsSource;
use idem_consumer::rabbitmq::RabbitSource;
use idem_consumer::redis_streams::{RedisStreamConfig, RedisStreamSource};
use idem_consumer::{
    AckError, Consumer, Counters, Delivery, Effect, Horizon, Message, Source, TxHandler,
};
use idem_runtime::store::BoxError;
use idem_runtime::store::sql::sqlx::{self, PgPool, Postgres, Transaction};
use idem_runtime::{Idem, Options, SqlStore};

pub(crate) struct Args {
    broker: String,
    stream: Option<String>,
    subject: Option<String>,
    durable: Option<String>,
    queue: Option<String>,
    group: Option<String>,
    topic: Option<String>,
    client_id: Option<String>,
    consumer: Option<String>,
    min_idle: Duration,
    store: String,
    ledger: String,
    table: String,
    namespace: String,
    idle_exit: Option<Duration>,
    concurrency: usize,
    lease: Duration,
    wait: Duration,
    max_attempts: u32,
    backoff: Duration,
    ttl: Duration,
    pause_at: Option<String>,
    pause: Duration,
}

const USAGE: &str = "usage: consumer --broker nats://HOST:PORT --stream S --subject S.credits \
    --durable D | --broker amqp://USER:PASS@HOST:PORT --queue Q | --broker redis://HOST:PORT \
    --stream S --group G [--min-idle-ms N] [--consumer NAME] | --broker mqtt://HOST:PORT --topic T \
    --client-id C, then --ledger postgres://... \
    [--store URL] [--idle-exit-ms N] [--namespace NS] [--concurrency N] [--lease-ms N] \
    [--wait-ms N] [--max-attempts N] [--backoff-ms N] [--record-ttl-s N] [--ledger-table NAME] \
    [--pause-at claim|effect|ack --pause-ms N]";

pub(crate) fn parse(raw: Vec<String>) -> Result<Args, String> {
    let mut a = Args {
        broker: String::new(),
        stream: None,
        subject: None,
        durable: None,
        queue: None,
        group: None,
        topic: None,
        client_id: None,
        consumer: None,
        min_idle: Duration::from_secs(30),
        store: "memory".into(),
        ledger: String::new(),
        table: "ledger_credits".into(),
        namespace: "consumer".into(),
        idle_exit: None,
        concurrency: 32,
        lease: Duration::from_secs(10),
        wait: Duration::from_secs(10),
        max_attempts: 5,
        backoff: Duration::from_millis(100),
        ttl: Duration::from_secs(24 * 3600),
        pause_at: None,
        pause: Duration::from_secs(3600),
    };
    let mut it = raw.into_iter();
    while let Some(flag) = it.next() {
        let v = it
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        let num = |v: &str| v.parse::<u64>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--broker" => a.broker = v,
            "--stream" => a.stream = Some(v),
            "--subject" => a.subject = Some(v),
            "--durable" => a.durable = Some(v),
            "--queue" => a.queue = Some(v),
            "--group" => a.group = Some(v),
            "--topic" => a.topic = Some(v),
            "--client-id" => a.client_id = Some(v),
            "--consumer" => a.consumer = Some(v),
            "--min-idle-ms" => a.min_idle = Duration::from_millis(num(&v)?),
            "--store" => a.store = v,
            "--ledger" => a.ledger = v,
            "--ledger-table" => {
                if !v.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                    return Err("--ledger-table: letters, digits and _ only".into());
                }
                a.table = v;
            }
            "--namespace" => a.namespace = v,
            "--idle-exit-ms" => a.idle_exit = Some(Duration::from_millis(num(&v)?)),
            "--concurrency" => a.concurrency = num(&v)? as usize,
            "--lease-ms" => a.lease = Duration::from_millis(num(&v)?),
            "--wait-ms" => a.wait = Duration::from_millis(num(&v)?),
            "--max-attempts" => a.max_attempts = num(&v)? as u32,
            "--backoff-ms" => a.backoff = Duration::from_millis(num(&v)?),
            "--record-ttl-s" => a.ttl = Duration::from_secs(num(&v)?),
            "--pause-at" if ["claim", "effect", "ack"].contains(&v.as_str()) => {
                a.pause_at = Some(v)
            }
            "--pause-ms" => a.pause = Duration::from_millis(num(&v)?),
            _ => return Err(format!("unknown or bad option {flag} {v}\n{USAGE}")),
        }
    }
    if a.ledger.is_empty() {
        return Err(format!("--ledger postgres://... is required\n{USAGE}"));
    }
    Ok(a)
}

/// One credit, as published.
#[derive(serde::Deserialize)]
struct Credit {
    account: String,
    #[serde(deserialize_with = "amount")]
    amount: i64,
}

/// A JSON number, or a decimal string (a Redis Streams entry's fields are strings).
fn amount<'de, D: serde::Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    use serde::Deserialize;
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Amount {
        Number(i64),
        Text(String),
    }
    match Amount::deserialize(d)? {
        Amount::Number(n) => Ok(n),
        Amount::Text(t) => t.trim().parse().map_err(serde::de::Error::custom),
    }
}

fn credit(msg: &Message) -> Result<Credit, BoxError> {
    let c: Credit = serde_json::from_slice(&msg.payload)?;
    if c.account.is_empty() {
        return Err("a credit without an account".into());
    }
    Ok(c)
}

/// The fault hook of the tests: the first delivery that reaches `at` prints a marker and
/// sleeps.
#[derive(Clone)]
struct Pause {
    at: Option<String>,
    pause: Duration,
    used: Arc<AtomicBool>,
}

impl Pause {
    async fn point(&self, at: &str, id: &str) {
        if self.at.as_deref() == Some(at) && !self.used.swap(true, Ordering::SeqCst) {
            println!("PAUSE {at} {id}");
            use std::io::Write;
            let _ = std::io::stdout().flush();
            tokio::time::sleep(self.pause).await;
        }
    }
}

fn insert_sql(table: &str) -> String {
    format!("INSERT INTO {table} (message_id, account, amount) VALUES ($1, $2, $3)")
}

/// Transactional mode: the insert shares the claim's transaction.
struct InTx {
    sql: String,
    pause: Pause,
}

impl TxHandler for InTx {
    async fn handle(
        &self,
        msg: &Message,
        tx: &mut Transaction<'static, Postgres>,
    ) -> Result<(), BoxError> {
        let c = credit(msg)?;
        self.pause.point("claim", &msg.id).await;
        sqlx::query(sqlx::AssertSqlSafe(self.sql.clone()))
            .bind(&msg.id)
            .bind(&c.account)
            .bind(c.amount)
            .execute(&mut **tx)
            .await?;
        self.pause.point("effect", &msg.id).await;
        Ok(())
    }
}

/// A delivery whose ack can be held back (the "after the effect, before the ack" fault).
struct Held<D> {
    inner: D,
    pause: Pause,
}

impl<D: Delivery> Delivery for Held<D> {
    fn message_id(&self) -> Option<&str> {
        self.inner.message_id()
    }
    fn payload(&self) -> Bytes {
        self.inner.payload()
    }
    fn attempt(&self) -> u32 {
        self.inner.attempt()
    }
    fn progress_interval(&self) -> Option<Duration> {
        self.inner.progress_interval()
    }
    async fn ack(&self) -> Result<(), AckError> {
        self.pause
            .point("ack", self.message_id().unwrap_or(""))
            .await;
        self.inner.ack().await
    }
    async fn nak(&self, delay: Duration) -> Result<(), AckError> {
        self.inner.nak(delay).await
    }
    async fn in_progress(&self) -> Result<(), AckError> {
        self.inner.in_progress().await
    }
    async fn terminate(&self) -> Result<(), AckError> {
        self.inner.terminate().await
    }
}

struct HeldSource<S> {
    inner: S,
    pause: Pause,
}

impl<S> HeldSource<S> {
    fn new(inner: S, pause: Pause) -> Self {
        HeldSource { inner, pause }
    }
}

impl<S: Source> Source for HeldSource<S> {
    type Delivery = Held<S::Delivery>;
    async fn next(&mut self) -> Option<Result<Self::Delivery, BoxError>> {
        let d = self.inner.next().await?;
        Some(d.map(|inner| Held {
            inner,
            pause: self.pause.clone(),
        }))
    }
    fn redelivery_horizon(&self) -> Horizon {
        self.inner.redelivery_horizon()
    }
    async fn close(self) {
        self.inner.close().await;
    }
}

pub(crate) async fn main(args: Args) -> ExitCode {
    // Warnings (ack failures, poison, lease trouble) on stderr; RUST_LOG for more.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,sqlx=error"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    match run(args).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("consumer: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(a: Args) -> Result<ExitCode, BoxError> {
    let ledger = PgPool::connect(&a.ledger).await?;
    let create = format!(
        "CREATE TABLE IF NOT EXISTS {} (message_id TEXT, account TEXT, amount BIGINT)",
        a.table
    );
    if let Err(e) = sqlx::query(sqlx::AssertSqlSafe(create))
        .execute(&ledger)
        .await
    {
        // Another process created it at the same moment.
        tracing::debug!(error = %e, "creating the ledger table");
    }
    let opts = Options::dedup("ledger::credit")
        .ttl(a.ttl)
        .lease(a.lease)
        .wait(a.wait);
    let pause = Pause {
        at: a.pause_at.clone(),
        pause: a.pause,
        used: Arc::default(),
    };
    let transactional = a.store == a.ledger;
    let builder = |idem: Idem| {
        Consumer::builder(idem, opts.clone())
            .concurrency(a.concurrency)
            .max_attempts(a.max_attempts)
            .backoff(a.backoff, Duration::from_secs(30))
    };
    let counters = if transactional {
        let store = SqlStore::connect(&a.store).await?;
        let idem = Idem::builder()
            .store(store.clone())
            .namespace(a.namespace.clone())
            .build();
        let handler = InTx {
            sql: insert_sql(&a.table),
            pause: pause.clone(),
        };
        serve(builder(idem).transactional(store, handler), &a, pause).await?
    } else {
        let store = idem_runtime::store::connect(&a.store).await?;
        let idem = Idem::builder()
            .shared_store(store)
            .namespace(a.namespace.clone())
            .build();
        let (sql, p) = (insert_sql(&a.table), pause.clone());
        let handler = move |msg: Message| {
            let (ledger, sql, p) = (ledger.clone(), sql.clone(), p.clone());
            async move {
                let c = credit(&msg)?;
                p.point("claim", &msg.id).await;
                sqlx::query(sqlx::AssertSqlSafe(sql))
                    .bind(&msg.id)
                    .bind(&c.account)
                    .bind(c.amount)
                    .execute(&ledger)
                    .await?;
                p.point("effect", &msg.id).await;
                Ok::<_, BoxError>(())
            }
        };
        serve(builder(idem).handler(handler), &a, pause).await?
    };
    let c = counters;
    println!(
        "counters: processed={} duplicates={} in_flight_duplicates={} redeliveries={} \
         poison={} missing_id={} handler_errors={} store_errors={} ack_failures={}",
        c.processed,
        c.duplicates,
        c.in_flight_duplicates,
        c.redeliveries,
        c.poison,
        c.missing_id,
        c.handler_errors,
        c.store_errors,
        c.ack_failures
    );
    Ok(ExitCode::SUCCESS)
}

async fn serve<E: Effect>(
    consumer: Consumer<E>,
    a: &Args,
    pause: Pause,
) -> Result<Counters, BoxError> {
    let stop = shutdown(consumer.clone(), a.idle_exit);
    if a.broker.starts_with("nats://") {
        let (Some(stream), Some(subject), Some(durable)) = (&a.stream, &a.subject, &a.durable)
        else {
            return Err(format!("NATS needs --stream, --subject and --durable\n{USAGE}").into());
        };
        let source = nats(&a.broker, stream, subject, durable, a.concurrency).await?;
        Ok(consumer.run(HeldSource::new(source, pause), stop).await?)
    } else if a.broker.starts_with("amqp://") {
        let Some(queue) = &a.queue else {
            return Err(format!("AMQP needs --queue\n{USAGE}").into());
        };
        let conn =
            idem_consumer::rabbitmq::lapin::Connection::connect(&a.broker, Default::default())
                .await?;
        let channel = bind_queue(&conn, queue).await?;
        let prefetch = a.concurrency.min(u16::MAX as usize) as u16;
        let source = RabbitSource::new(&channel, queue, prefetch).await?;
        let counters = consumer.run(HeldSource::new(source, pause), stop).await?;
        let _ = conn.close(200, "bye".into()).await;
        Ok(counters)
    } else if a.broker.starts_with("redis://") || a.broker.starts_with("rediss://") {
        let (Some(stream), Some(group)) = (&a.stream, &a.group) else {
            return Err(format!("Redis Streams needs --stream and --group\n{USAGE}").into());
        };
        let name = a
            .consumer
            .clone()
            .unwrap_or_else(|| format!("consumer-{}", std::process::id()));
        let client = idem_consumer::redis_streams::redis::Client::open(a.broker.as_str())?;
        // As on NATS: at most 20 deliveries of an entry, which bounds its redeliveries.
        let cfg = RedisStreamConfig::new(stream, group, name)
            .id_field("message_id")
            .min_idle(a.min_idle)
            .batch(a.concurrency)
            .max_deliveries(20);
        let source = RedisStreamSource::new(&client, cfg).await?;
        Ok(consumer.run(HeldSource::new(source, pause), stop).await?)
    } else if let Some(addr) = a.broker.strip_prefix("mqtt://") {
        let (Some(topic), Some(client_id)) = (&a.topic, &a.client_id) else {
            return Err(format!("MQTT needs --topic and --client-id\n{USAGE}").into());
        };
        let addr = addr.trim_end_matches('/');
        let (host, port) = match addr.rsplit_once(':') {
            Some((h, p)) => (
                h,
                p.parse::<u16>()
                    .map_err(|e| format!("--broker port: {e}"))?,
            ),
            None => (addr, 1883),
        };
        let mut options = idem_consumer::mqtt::rumqttc::v5::MqttOptions::new(client_id, host, port);
        options.set_keep_alive(Duration::from_secs(10));
        let receive = a.concurrency.clamp(1, u16::MAX as usize) as u16;
        let cfg = MqttConfig::new(topic).receive_maximum(receive);
        let source = MqttSource::new(options, cfg).await?;
        Ok(consumer.run(HeldSource::new(source, pause), stop).await?)
    } else {
        Err(
            format!("--broker must be nats://..., amqp://..., redis://... or mqtt://...\n{USAGE}")
                .into(),
        )
    }
}

/// Binds to the stream and durable consumer, creating each only if absent.
async fn nats(
    url: &str,
    stream: &str,
    subject: &str,
    durable: &str,
    batch: usize,
) -> Result<NatsSource, BoxError> {
    use idem_consumer::nats::async_nats::jetstream::{self, consumer::pull, stream as st};
    let js = jetstream::new(idem_consumer::nats::async_nats::connect(url).await?);
    let stream = js
        .get_or_create_stream(st::Config {
            name: stream.to_owned(),
            subjects: vec![subject.to_owned()],
            ..Default::default()
        })
        .await?;
    let max_age = stream.cached_info().config.max_age;
    let mut consumer = stream
        .get_or_create_consumer(
            durable,
            pull::Config {
                durable_name: Some(durable.to_owned()),
                filter_subject: subject.to_owned(),
                ack_wait: Duration::from_secs(30),
                max_deliver: 20,
                ..Default::default()
            },
        )
        .await?;
    Ok(NatsSource::new(&mut consumer, max_age, batch).await?)
}

/// A channel on which `queue` exists: bound as it is, or declared (durable) if absent.
async fn bind_queue(
    conn: &idem_consumer::rabbitmq::lapin::Connection,
    queue: &str,
) -> Result<idem_consumer::rabbitmq::lapin::Channel, BoxError> {
    use idem_consumer::rabbitmq::lapin::options::QueueDeclareOptions;
    use idem_consumer::rabbitmq::lapin::types::FieldTable;
    let ch = conn.create_channel().await?;
    let passive = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    if ch
        .queue_declare(queue.into(), passive, FieldTable::default())
        .await
        .is_ok()
    {
        return Ok(ch);
    }
    // A passive declare of a missing queue closes its channel.
    let ch = conn.create_channel().await?;
    let durable = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    ch.queue_declare(queue.into(), durable, FieldTable::default())
        .await?;
    Ok(ch)
}

/// Resolves on Ctrl-C, or after `idle` without any delivery settled.
async fn shutdown<E: Effect>(consumer: Consumer<E>, idle: Option<Duration>) {
    let idle_exit = async {
        let Some(idle) = idle else {
            return std::future::pending().await;
        };
        let mut last = consumer.counters();
        let mut quiet_since = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(Duration::from_millis(25)).await;
            let now = consumer.counters();
            if now != last {
                (last, quiet_since) = (now, tokio::time::Instant::now());
            } else if quiet_since.elapsed() >= idle {
                return;
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = idle_exit => {}
    }
}
