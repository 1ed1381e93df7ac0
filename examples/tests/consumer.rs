//! The consumer example as separate OS processes on the real brokers, with faults: a
//! consumer SIGKILLed after its claim or after its effect but before its ack, one stopped
//! with SIGSTOP past its lease, and a randomized run with consumers killed at random.
//! The ledger table (no unique constraint) must hold each message id exactly once.

use std::process::Stdio;
use std::time::Duration;

use idem_consumer::Source as _;
use idem_consumer::mqtt::{MqttConfig, MqttSource};
use idem_consumer::nats::async_nats::{self, jetstream};
use idem_consumer::rabbitmq::lapin::options::{BasicPublishOptions, QueueDeclareOptions};
use idem_consumer::rabbitmq::lapin::types::{FieldTable, ShortString};
use idem_consumer::rabbitmq::lapin::{BasicProperties, Connection};
use idem_consumer::redis_streams::redis;
use idem_runtime::SqlStore;
use idem_runtime::store::sql::sqlx::{self, PgPool};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const PG: &str = "postgres://postgres@127.0.0.1:5432/test";
const NATS: &str = "nats://127.0.0.1:4222";
const AMQP: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
const REDIS: &str = "redis://127.0.0.1:6379";
const MQTT: &str = "mqtt://127.0.0.1:1883";

// The broker tests' helpers: unique names, and MQTT's options, publisher and session end.
#[path = "../../idem-consumer/tests/common/mod.rs"]
mod common;
#[path = "../../idem-consumer/tests/common/mqtt.rs"]
mod mqtt_support;

use common::unique;
use mqtt_support::{end_session, options as mqtt_options};

/// Where the messages come from, and the ledger they go to.
struct Setup {
    broker: Vec<String>,
    ledger: PgPool,
    table: String,
    namespace: String,
    publish: Publisher,
}

enum Publisher {
    Nats(jetstream::Context, String, String),
    Rabbit(Connection, String),
    Redis(redis::aio::MultiplexedConnection, String),
    /// The topic, and the consumer's client id (its persistent session).
    Mqtt(String, String),
}

async fn ledger() -> (PgPool, String) {
    let pool = PgPool::connect(PG)
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL must run on {PG}: {e}"));
    // The idem table exists before the children start, so they never race to create it.
    SqlStore::connect(PG).await.expect("idem's table");
    let table = unique("ledger");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {table} (message_id TEXT, account TEXT, amount BIGINT)"
    )))
    .execute(&pool)
    .await
    .expect("ledger table");
    (pool, table)
}

/// A stream with a short duplicate window and a durable consumer with `ack_wait` 1 s, which
/// the example binds to with these settings.
async fn nats_setup() -> Setup {
    let js = jetstream::new(async_nats::connect(NATS).await.expect("NATS on 4222"));
    let name = unique("E");
    let subject = format!("{name}.credits");
    let stream = js
        .create_stream(jetstream::stream::Config {
            name: name.clone(),
            subjects: vec![subject.clone()],
            duplicate_window: Duration::from_millis(100),
            max_age: Duration::from_secs(600),
            ..Default::default()
        })
        .await
        .expect("stream");
    let durable = format!("{name}_D");
    stream
        .create_consumer(jetstream::consumer::pull::Config {
            durable_name: Some(durable.clone()),
            filter_subject: subject.clone(),
            ack_wait: Duration::from_secs(1),
            max_deliver: 100,
            ..Default::default()
        })
        .await
        .expect("durable");
    let (ledger, table) = ledger().await;
    let broker = [
        "--broker",
        NATS,
        "--stream",
        &name,
        "--subject",
        &subject,
        "--durable",
        &durable,
    ]
    .map(String::from)
    .to_vec();
    Setup {
        broker,
        ledger,
        table,
        namespace: unique("ns"),
        publish: Publisher::Nats(js, subject, name),
    }
}

async fn rabbit_setup() -> Setup {
    let conn = Connection::connect(AMQP, Default::default())
        .await
        .expect("RabbitMQ on 5672");
    let queue = unique("eq");
    let ch = conn.create_channel().await.expect("channel");
    ch.queue_declare(
        queue.as_str().into(),
        QueueDeclareOptions::default(),
        FieldTable::default(),
    )
    .await
    .expect("queue");
    let (ledger, table) = ledger().await;
    let broker = ["--broker", AMQP, "--queue", &queue]
        .map(String::from)
        .to_vec();
    Setup {
        broker,
        ledger,
        table,
        namespace: unique("ns"),
        publish: Publisher::Rabbit(conn, queue),
    }
}

/// A stream whose group already exists (created here, as an operator would), read by the
/// example with entries reclaimed after 1 s of silence.
async fn redis_setup() -> Setup {
    let client = redis::Client::open(REDIS).expect("a redis URL");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("Redis on 6379");
    let stream = unique("es");
    let _: () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(&stream)
        .arg("G")
        .arg("0")
        .arg("MKSTREAM")
        .query_async(&mut conn)
        .await
        .expect("the group");
    let (ledger, table) = ledger().await;
    let broker = [
        "--broker",
        REDIS,
        "--stream",
        &stream,
        "--group",
        "G",
        "--min-idle-ms",
        "1000",
    ]
    .map(String::from)
    .to_vec();
    Setup {
        broker,
        ledger,
        table,
        namespace: unique("ns"),
        publish: Publisher::Redis(conn, stream),
    }
}

/// A topic and a persistent session subscribed to it, created here and left offline (as
/// a consumer that was stopped): messages published now are queued for it.
async fn mqtt_setup() -> Setup {
    let topic = unique("et");
    let client_id = unique("ec");
    MqttSource::new(mqtt_options(&client_id), MqttConfig::new(&topic))
        .await
        .expect("Mosquitto on 1883")
        .close()
        .await;
    let (ledger, table) = ledger().await;
    let broker = [
        "--broker",
        MQTT,
        "--topic",
        &topic,
        "--client-id",
        &client_id,
    ]
    .map(String::from)
    .to_vec();
    Setup {
        broker,
        ledger,
        table,
        namespace: unique("ns"),
        publish: Publisher::Mqtt(topic, client_id),
    }
}

fn shared_topic(topic: &str) -> String {
    format!("$share/idem/{topic}")
}

/// `XADD <stream> * message_id <id> payload <body>`.
async fn xadd(conn: &redis::aio::MultiplexedConnection, stream: &str, id: &str, body: &str) {
    let _: String = redis::cmd("XADD")
        .arg(stream)
        .arg("*")
        .arg("message_id")
        .arg(id)
        .arg("payload")
        .arg(body)
        .query_async(&mut conn.clone())
        .await
        .expect("XADD");
}

impl Setup {
    /// Publishes credits `from..to` (ids `m-N`); `again` publishes them a second time,
    /// past the NATS duplicate window (a producer's retry).
    async fn publish(&self, ids: impl Iterator<Item = u32>) {
        match &self.publish {
            Publisher::Nats(js, subject, _) => {
                let mut acks = Vec::new();
                for i in ids {
                    let body = format!(r#"{{"account":"acct-{}","amount":{}}}"#, i % 7, i + 1);
                    let m = jetstream::message::PublishMessage::build()
                        .payload(body.into())
                        .message_id(format!("m-{i}"));
                    acks.push(js.send_publish(subject.clone(), m).await.expect("publish"));
                }
                for a in acks {
                    a.await.expect("publish ack");
                }
            }
            Publisher::Rabbit(conn, queue) => {
                let ch = conn.create_channel().await.expect("channel");
                for i in ids {
                    let body = format!(r#"{{"account":"acct-{}","amount":{}}}"#, i % 7, i + 1);
                    let props = BasicProperties::default()
                        .with_message_id(ShortString::from(format!("m-{i}")));
                    ch.basic_publish(
                        "".into(),
                        queue.as_str().into(),
                        BasicPublishOptions::default(),
                        body.as_bytes(),
                        props,
                    )
                    .await
                    .expect("publish");
                }
                let _ = ch.close(200, "".into()).await;
            }
            Publisher::Redis(conn, stream) => {
                for i in ids {
                    let body = format!(r#"{{"account":"acct-{}","amount":{}}}"#, i % 7, i + 1);
                    xadd(conn, stream, &format!("m-{i}"), &body).await;
                }
            }
            Publisher::Mqtt(topic, _) => {
                let msgs: Vec<(String, String)> = ids
                    .map(|i| {
                        let body = format!(r#"{{"account":"acct-{}","amount":{}}}"#, i % 7, i + 1);
                        (format!("m-{i}"), body)
                    })
                    .collect();
                let msgs: Vec<_> = msgs
                    .iter()
                    .map(|(id, body)| (Some(id.as_str()), body.as_str()))
                    .collect();
                mqtt_support::publish(topic, &msgs).await;
            }
        }
    }

    /// Publishes one message with this id and body.
    async fn publish_raw(&self, id: &str, body: &str) {
        match &self.publish {
            Publisher::Nats(js, subject, _) => {
                let m = jetstream::message::PublishMessage::build()
                    .payload(body.to_owned().into())
                    .message_id(id);
                js.send_publish(subject.clone(), m)
                    .await
                    .expect("publish")
                    .await
                    .expect("publish ack");
            }
            Publisher::Rabbit(conn, queue) => {
                let ch = conn.create_channel().await.expect("channel");
                let props = BasicProperties::default().with_message_id(ShortString::from(id));
                ch.basic_publish(
                    "".into(),
                    queue.as_str().into(),
                    BasicPublishOptions::default(),
                    body.as_bytes(),
                    props,
                )
                .await
                .expect("publish")
                .await
                .expect("publish confirm");
                let _ = ch.close(200, "".into()).await;
            }
            Publisher::Redis(conn, stream) => xadd(conn, stream, id, body).await,
            Publisher::Mqtt(topic, _) => mqtt_support::publish(topic, &[(Some(id), body)]).await,
        }
    }

    fn args(&self, store: &str, extra: &[&str]) -> Vec<String> {
        let mut a = self.broker.clone();
        for s in [
            "--store",
            store,
            "--ledger",
            PG,
            "--ledger-table",
            &self.table,
            "--namespace",
            &self.namespace,
            "--lease-ms",
            "1500",
        ] {
            a.push(s.to_owned());
        }
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    }

    fn spawn(&self, store: &str, extra: &[&str]) -> Consumer {
        self.spawn_slot(store, extra, None)
    }

    /// One of several consumers running at once. On MQTT each `slot` has its own
    /// persistent session (client id `<C>-<slot>`, reused when a killed consumer is
    /// replaced), subscribed to the topic through one shared subscription.
    fn spawn_slot(&self, store: &str, extra: &[&str], slot: Option<usize>) -> Consumer {
        let mut args = self.args(store, extra);
        if let (Some(slot), Publisher::Mqtt(topic, client_id)) = (slot, &self.publish) {
            for a in args.iter_mut() {
                if a == topic {
                    *a = shared_topic(topic);
                } else if a == client_id {
                    *a = format!("{client_id}-{slot}");
                }
            }
        }
        let mut child = Command::new(env!("CARGO_BIN_EXE_consumer"))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start the consumer example");
        let stdout = child.stdout.take().expect("stdout");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let tx2 = tx.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let _ = tx.send(line);
            }
        });
        // Log lines (warnings: failures, poison) as `log: ...`, echoed for the test's output.
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                eprintln!("{line}");
                let _ = tx2.send(format!("log: {line}"));
            }
        });
        Consumer {
            child,
            lines: rx,
            slot,
        }
    }

    /// (rows, distinct ids) in the ledger.
    async fn ledger_counts(&self) -> (i64, i64) {
        sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT count(*), count(DISTINCT message_id) FROM {}",
            self.table
        )))
        .fetch_one(&self.ledger)
        .await
        .expect("count the ledger")
    }

    async fn rows_of(&self, id: &str) -> i64 {
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM {} WHERE message_id = $1",
            self.table
        )))
        .bind(id)
        .fetch_one(&self.ledger)
        .await
        .expect("count one id")
    }

    async fn doubled(&self) -> Vec<(String, i64)> {
        sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT message_id, count(*) FROM {} GROUP BY message_id HAVING count(*) > 1 LIMIT 10",
            self.table
        )))
        .fetch_all(&self.ledger)
        .await
        .expect("doubled ids")
    }

    async fn cleanup(self) {
        let _ = sqlx::query(sqlx::AssertSqlSafe(format!("DROP TABLE {}", self.table)))
            .execute(&self.ledger)
            .await;
        match self.publish {
            Publisher::Nats(js, _, stream) => {
                let _ = js.delete_stream(&stream).await;
            }
            Publisher::Rabbit(conn, queue) => {
                if let Ok(ch) = conn.create_channel().await {
                    let _ = ch
                        .queue_delete(queue.as_str().into(), Default::default())
                        .await;
                }
            }
            Publisher::Redis(mut conn, stream) => {
                let dead = format!("{stream}:dlq");
                let _: Result<(), _> = redis::cmd("DEL")
                    .arg(&stream)
                    .arg(&dead)
                    .query_async(&mut conn)
                    .await;
            }
            Publisher::Mqtt(_, client_id) => {
                // A clean start with no session expiry ends a session.
                let ids = [0, 1, 2].map(|slot| format!("{client_id}-{slot}"));
                for id in std::iter::once(&client_id).chain(&ids) {
                    end_session(id).await;
                }
            }
        }
    }
}

struct Consumer {
    child: Child,
    lines: tokio::sync::mpsc::UnboundedReceiver<String>,
    slot: Option<usize>,
}

impl Consumer {
    /// Waits for a line starting with `prefix` (log lines start with `log: `) and
    /// containing every one of `parts`.
    async fn line_with(&mut self, prefix: &str, parts: &[&str], secs: u64) -> String {
        let wait = async {
            while let Some(l) = self.lines.recv().await {
                if l.starts_with(prefix) && parts.iter().all(|p| l.contains(p)) {
                    return l;
                }
            }
            panic!("the consumer exited before printing {prefix:?}");
        };
        tokio::time::timeout(Duration::from_secs(secs), wait)
            .await
            .unwrap_or_else(|_| panic!("no {prefix:?} line within {secs} s"))
    }

    /// Waits for a stdout line starting with `prefix`.
    async fn line(&mut self, prefix: &str, secs: u64) -> String {
        self.line_with(prefix, &[], secs).await
    }

    fn pid(&self) -> String {
        self.child.id().expect("running").to_string()
    }

    fn signal(&self, sig: &str) {
        let ok = std::process::Command::new("kill")
            .args([sig, &self.pid()])
            .status()
            .expect("kill(1)")
            .success();
        assert!(ok, "kill {sig}");
    }

    async fn sigkill(mut self) {
        self.child.start_kill().expect("SIGKILL");
        let _ = self.child.wait().await;
    }

    /// Waits for a clean exit (after `--idle-exit-ms`); the counters line.
    async fn finish(mut self, secs: u64) -> String {
        let counters = self.line("counters:", secs).await;
        let status = tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .expect("exits")
            .expect("status");
        assert!(status.success(), "{status}");
        counters
    }
}

fn counter(line: &str, name: &str) -> u64 {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {line:?}"))
}

/// A consumer killed at `at` on the first message; a second one finishes the work.
///
/// Outside transactional mode the effect and its record are two writes, so a kill between
/// them doubles the effect: the killed consumer then runs one delivery at a time, the one
/// held at `at`.
async fn killed_then_finished(setup: Setup, store: &str, at: &str) {
    setup.publish(0..20).await;
    let one = if store == PG { "32" } else { "1" };
    let mut a = setup.spawn(store, &["--pause-at", at, "--concurrency", one]);
    let marker = a.line(&format!("PAUSE {at}"), 30).await;
    a.sigkill().await;
    let b = setup.spawn(store, &["--idle-exit-ms", "4000"]);
    let counters = b.finish(60).await;
    assert_eq!(
        setup.ledger_counts().await,
        (20, 20),
        "{marker}; {counters}"
    );
    if at == "ack" {
        // The killed consumer's effect was recorded: its redelivery was a replay.
        assert!(counter(&counters, "duplicates") >= 1, "{counters}");
    }
    setup.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_transactional_killed_after_the_claim() {
    killed_then_finished(nats_setup().await, PG, "claim").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_transactional_killed_after_the_effect_before_the_ack() {
    killed_then_finished(nats_setup().await, PG, "ack").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_on_redis_killed_after_the_claim() {
    killed_then_finished(nats_setup().await, "redis://127.0.0.1:6379", "claim").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_on_redis_killed_after_the_effect_before_the_ack() {
    killed_then_finished(nats_setup().await, "redis://127.0.0.1:6379", "ack").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_streams_transactional_killed_after_the_claim() {
    killed_then_finished(redis_setup().await, PG, "claim").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_streams_transactional_killed_after_the_effect_before_the_ack() {
    killed_then_finished(redis_setup().await, PG, "ack").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_streams_on_redis_killed_after_the_effect_before_the_ack() {
    killed_then_finished(redis_setup().await, REDIS, "ack").await;
}

/// An entry written as plain fields (`XADD S * message_id m1 account a amount 5`), twice:
/// credited once, the amount read from its decimal string.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_streams_entries_of_plain_fields_are_credited_once() {
    let setup = redis_setup().await;
    let Publisher::Redis(conn, stream) = &setup.publish else {
        unreachable!("a Redis setup")
    };
    for _ in 0..2 {
        let _: String = redis::cmd("XADD")
            .arg(stream)
            .arg("*")
            .arg("message_id")
            .arg("flat-1")
            .arg("account")
            .arg("acct-9")
            .arg("amount")
            .arg("5")
            .query_async(&mut conn.clone())
            .await
            .expect("XADD");
    }
    let c = setup.spawn(REDIS, &["--idle-exit-ms", "1500"]);
    let counters = c.finish(60).await;
    assert_eq!(setup.ledger_counts().await, (1, 1), "{counters}");
    assert_eq!(
        (
            counter(&counters, "processed"),
            counter(&counters, "duplicates")
        ),
        (1, 1),
        "{counters}"
    );
    let amount: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT amount FROM {} WHERE message_id = 'flat-1'",
        setup.table
    )))
    .fetch_one(&setup.ledger)
    .await
    .expect("the row");
    assert_eq!(amount, 5);
    setup.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_transactional_killed_after_the_claim() {
    killed_then_finished(mqtt_setup().await, PG, "claim").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_transactional_killed_after_the_effect_before_the_ack() {
    killed_then_finished(mqtt_setup().await, PG, "ack").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_on_redis_killed_after_the_effect_before_the_ack() {
    killed_then_finished(mqtt_setup().await, REDIS, "ack").await;
}

/// A message without the `message-id` property is acked and counted, not run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_a_message_without_an_id_is_acked_and_counted() {
    let setup = mqtt_setup().await;
    let Publisher::Mqtt(topic, _) = &setup.publish else {
        unreachable!("an MQTT setup")
    };
    mqtt_support::publish(topic, &[(None, r#"{"account":"a","amount":1}"#)]).await;
    setup.publish(0..3).await;
    let c = setup.spawn(REDIS, &["--idle-exit-ms", "1500"]);
    let counters = c.finish(60).await;
    assert_eq!(counter(&counters, "missing_id"), 1, "{counters}");
    assert_eq!(counter(&counters, "processed"), 3, "{counters}");
    assert_eq!(setup.ledger_counts().await, (3, 3));
    // Everything was acked: the session has nothing left for the next run.
    let c = setup.spawn(REDIS, &["--idle-exit-ms", "1000"]);
    let counters = c.finish(60).await;
    assert_eq!(
        (
            counter(&counters, "processed"),
            counter(&counters, "missing_id")
        ),
        (0, 0),
        "{counters}"
    );
    setup.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_transactional_killed_after_the_claim() {
    killed_then_finished(rabbit_setup().await, PG, "claim").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_transactional_killed_after_the_effect_before_the_ack() {
    killed_then_finished(rabbit_setup().await, PG, "ack").await;
}

/// A consumer stopped inside its transaction past its lease: the server ends the idle
/// transaction, another consumer takes the message over, and the resumed one's commit is
/// refused. One row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_transactional_stopped_past_its_lease_then_resumed() {
    let setup = nats_setup().await;
    setup.publish(0..5).await;
    // The pause (2 s) is long enough for the stop to land inside it, before the commit.
    let pause = [
        "--pause-at",
        "effect",
        "--pause-ms",
        "2000",
        "--idle-exit-ms",
        "3000",
    ];
    let mut a = setup.spawn(PG, &pause);
    let marker = a.line("PAUSE effect", 30).await;
    a.signal("-STOP");
    // Past ack_wait (1 s) the broker redelivers to b; past the lease (1.5 s) the server
    // ends a's idle transaction and b's claim goes through.
    let b = setup.spawn(PG, &["--idle-exit-ms", "8000"]);
    let b_counters = b.finish(60).await;
    // b took over the message a was stopped in (others may have gone to a's pending pull
    // requests: a's connection stays open while it is stopped).
    let held = marker.rsplit(' ').next().expect("an id");
    assert_eq!(setup.rows_of(held).await, 1, "{marker}; {b_counters}");
    a.signal("-CONT");
    let a_counters = a.finish(60).await;
    assert!(
        counter(&a_counters, "store_errors") >= 1,
        "a's commit was refused: {a_counters}"
    );
    assert_eq!(setup.rows_of(held).await, 1, "{a_counters}; {b_counters}");
    assert_eq!(
        setup.ledger_counts().await,
        (5, 5),
        "{a_counters}; {b_counters}"
    );
    setup.cleanup().await;
}

/// A poison message (a credit without an account) fails twice in one consumer, which is
/// then SIGKILLed; the next one sees the two failures in the store and dead-letters the
/// message at the third.
async fn poison_across_a_kill(setup: Setup) {
    setup
        .publish_raw("poison-1", r#"{"account":"","amount":5}"#)
        .await;
    // The second failure's nak is 4 s: the kill lands well before a third attempt.
    let slow = ["--max-attempts", "3", "--backoff-ms", "2000"];
    let mut a = setup.spawn(PG, &slow);
    a.line_with("log: ", &["handler failed", "failures=2"], 30)
        .await;
    a.sigkill().await;
    let b = setup.spawn(PG, &["--max-attempts", "3", "--idle-exit-ms", "6000"]);
    let counters = b.finish(60).await;
    assert_eq!(counter(&counters, "handler_errors"), 1, "{counters}");
    assert_eq!(counter(&counters, "poison"), 1, "{counters}");
    assert_eq!(setup.ledger_counts().await, (0, 0));
    setup.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_poison_is_terminated_with_the_count_kept_across_a_kill() {
    poison_across_a_kill(nats_setup().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_streams_poison_is_dead_lettered_with_the_count_kept_across_a_kill() {
    poison_across_a_kill(redis_setup().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_poison_is_acked_with_the_count_kept_across_a_kill() {
    poison_across_a_kill(mqtt_setup().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_poison_is_rejected_with_the_count_kept_across_a_kill() {
    poison_across_a_kill(rabbit_setup().await).await;
}

/// Several thousand messages, a tenth of them published twice, three consumers of which
/// one is killed at random every fraction of a second and restarted.
async fn random_kills(setup: Setup) {
    const N: u32 = 2000;
    if let Publisher::Mqtt(topic, client_id) = &setup.publish {
        // The three sessions exist (offline) before the messages are published, so the
        // shared subscription queues them a third each: under Mosquitto's default limit
        // of 1,000 queued messages per session.
        for slot in 0..3 {
            let id = format!("{client_id}-{slot}");
            let cfg = MqttConfig::new(shared_topic(topic));
            MqttSource::new(mqtt_options(&id), cfg)
                .await
                .expect("Mosquitto on 1883")
                .close()
                .await;
        }
    }
    setup.publish(0..N).await;
    tokio::time::sleep(Duration::from_millis(200)).await; // past the duplicate window
    setup.publish((0..N).filter(|i| i % 10 == 3)).await;
    let args: &[&str] = &["--idle-exit-ms", "5000", "--concurrency", "16"];
    let mut consumers: Vec<Consumer> = (0..3)
        .map(|i| setup.spawn_slot(PG, args, Some(i)))
        .collect();
    let mut seed = std::process::id() as u64 ^ 0x9e37_79b9_7f4a_7c15;
    let mut rand = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let mut kills = 0;
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_millis(300 + rand(400))).await;
        let victim = consumers.swap_remove(rand(consumers.len() as u64) as usize);
        let slot = victim.slot;
        victim.sigkill().await;
        kills += 1;
        consumers.push(setup.spawn_slot(PG, args, slot));
    }
    let mut lines = Vec::new();
    for c in consumers {
        lines.push(c.finish(120).await);
    }
    let (rows, distinct) = setup.ledger_counts().await;
    assert!(
        setup.doubled().await.is_empty(),
        "doubled: {:?}",
        setup.doubled().await
    );
    assert_eq!(
        (rows, distinct),
        (N as i64, N as i64),
        "after {kills} kills: {lines:?}"
    );
    setup.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_random_kills_leave_each_id_once() {
    random_kills(nats_setup().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_streams_random_kills_leave_each_id_once() {
    random_kills(redis_setup().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_random_kills_leave_each_id_once() {
    random_kills(mqtt_setup().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_random_kills_leave_each_id_once() {
    random_kills(rabbit_setup().await).await;
}
