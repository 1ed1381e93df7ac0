//! The consumer rules on a real RabbitMQ (127.0.0.1:5672), one private queue (and
//! dead-letter queue) per test.
#![cfg(feature = "rabbitmq")]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Effects, eventually, settle, spawn, two_consumers_split_300_ids, unique};
use idem_consumer::rabbitmq::RabbitSource;
use idem_consumer::rabbitmq::lapin::options::{
    BasicPublishOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use idem_consumer::rabbitmq::lapin::types::{AMQPValue, FieldTable, ShortString};
use idem_consumer::rabbitmq::lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use idem_consumer::{Consumer, Handler, Message, Plain};
use idem_runtime::store::BoxError;
use idem_runtime::{Idem, MemoryStore, Options, Store};

const AMQP: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

struct Rabbit {
    conn: Connection,
    queue: String,
    dead: String,
}

async fn rabbit() -> Rabbit {
    let conn = Connection::connect(AMQP, ConnectionProperties::default())
        .await
        .unwrap_or_else(|e| panic!("RabbitMQ must run on {AMQP} (rabbitmq-server): {e}"));
    let queue = unique("q");
    let dead = format!("{queue}.dead");
    let ch = conn.create_channel().await.expect("channel");
    ch.queue_declare(
        dead.as_str().into(),
        QueueDeclareOptions::default(),
        FieldTable::default(),
    )
    .await
    .expect("declare the dead-letter queue");
    let mut args = FieldTable::default();
    args.insert(
        "x-dead-letter-exchange".into(),
        AMQPValue::LongString("".into()),
    );
    args.insert(
        "x-dead-letter-routing-key".into(),
        AMQPValue::LongString(dead.as_str().into()),
    );
    ch.queue_declare(queue.as_str().into(), QueueDeclareOptions::default(), args)
        .await
        .expect("declare the queue");
    Rabbit { conn, queue, dead }
}

/// One consumer's own connection, as a separate process would have. A consumer that
/// goes away closes it, which hands its unacked deliveries back to the queue and cannot
/// disturb the connection the next consumer uses.
struct Link {
    conn: Connection,
    ch: Channel,
}

impl Link {
    async fn close(&self) {
        let _ = self.conn.close(200, "".into()).await;
    }
}

impl Rabbit {
    async fn source(&self) -> (Link, RabbitSource) {
        let conn = Connection::connect(AMQP, ConnectionProperties::default())
            .await
            .expect("connect");
        let ch = conn.create_channel().await.expect("channel");
        let src = RabbitSource::new(&ch, &self.queue, 32)
            .await
            .expect("consume");
        (Link { conn, ch }, src)
    }

    async fn publish(&self, id: Option<&str>, body: &str) {
        let ch = self.conn.create_channel().await.expect("channel");
        let mut props = BasicProperties::default();
        if let Some(id) = id {
            props = props.with_message_id(ShortString::from(id));
        }
        ch.basic_publish(
            "".into(),
            self.queue.as_str().into(),
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

    async fn depth(&self, queue: &str) -> u32 {
        let ch = self.conn.create_channel().await.expect("channel");
        let q = ch
            .queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("passive declare");
        let _ = ch.close(200, "".into()).await;
        q.message_count()
    }

    async fn delete(self) {
        if let Ok(ch) = self.conn.create_channel().await {
            for q in [&self.queue, &self.dead] {
                let _ = ch
                    .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
                    .await;
            }
        }
        let _ = self.conn.close(200, "".into()).await;
    }
}

static CREDIT: Options = Options::dedup("test::credit")
    .lease(Duration::from_secs(2))
    .wait(Duration::from_secs(10));

fn idem_on(store: &Arc<dyn Store>, ns: &str) -> Idem {
    Idem::builder()
        .shared_store(store.clone())
        .namespace(ns)
        .build()
}

fn recording(idem: Idem, effects: &Effects) -> Consumer<Plain<impl Handler>> {
    let effects = effects.clone();
    Consumer::builder(idem, CREDIT.clone()).handler(move |msg: Message| {
        let effects = effects.clone();
        async move {
            effects.record(&msg.id);
            Ok::<_, BoxError>(())
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_message_id_published_twice_runs_once() {
    let r = rabbit().await;
    r.publish(Some("m-1"), "{}").await;
    r.publish(Some("m-1"), "{}").await; // a publisher's retry: `redelivered` is false
    r.publish(Some("m-2"), "{}").await;
    let effects = Effects::default();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let consumer = recording(idem_on(&store, &unique("ns")), &effects);
    let (_link, src) = r.source().await;
    let run = spawn(&consumer, src);
    eventually(20, "three deliveries settled", || {
        let c = consumer.counters();
        c.processed + c.duplicates == 3
    })
    .await;
    let c = run.stop().await;
    assert_eq!((effects.count("m-1"), effects.count("m-2")), (1, 1));
    assert_eq!((c.processed, c.duplicates, c.ack_failures), (2, 1, 0));
    assert_eq!(r.depth(&r.queue).await, 0);
    r.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_competing_consumers_on_one_queue_run_each_message_once() {
    let r = rabbit().await;
    for i in 0..300 {
        r.publish(Some(&format!("c-{i}")), "{}").await;
        if i % 3 == 0 {
            r.publish(Some(&format!("c-{i}")), "{}").await;
        }
    }
    let effects = Effects::default();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let ns = unique("ns");
    let a = recording(idem_on(&store, &ns), &effects);
    let b = recording(idem_on(&store, &ns), &effects);
    let (_a, sa) = r.source().await;
    let (_b, sb) = r.source().await;
    let (ra, rb) = (spawn(&a, sa), spawn(&b, sb));
    two_consumers_split_300_ids((&a, ra), (&b, rb), &effects).await;
    r.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_message_is_dead_lettered_after_max_attempts_counted_across_restarts() {
    let r = rabbit().await;
    r.publish(Some("poison"), "{}").await;
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let ns = unique("ns");
    let failing = |base: u64| {
        Consumer::builder(idem_on(&store, &ns), CREDIT.clone())
            .max_attempts(3)
            .backoff(Duration::from_millis(base), Duration::from_millis(2 * base))
            .handler(|_: Message| async { Err::<(), BoxError>("unreadable".into()) })
    };
    // Its second failure is nak'ed for 2 s: time enough to stop it before a third.
    let first = failing(1000);
    let (link, src) = r.source().await;
    let run = spawn(&first, src);
    eventually(20, "two failures", || first.counters().handler_errors >= 2).await;
    let c1 = run.stop().await;
    link.close().await; // its prefetched deliveries go back to the queue
    assert_eq!((c1.handler_errors, c1.poison), (2, 0), "{c1:?}");
    let second = failing(10);
    let (_link, src) = r.source().await;
    let run = spawn(&second, src);
    eventually(20, "dead-lettered", || second.counters().poison == 1).await;
    let c2 = run.stop().await;
    assert_eq!(
        (c2.handler_errors, c2.poison, c2.ack_failures),
        (1, 1, 0),
        "{c2:?}"
    );
    settle(200).await;
    assert_eq!((r.depth(&r.queue).await, r.depth(&r.dead).await), (0, 1));
    r.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_without_an_id_is_dead_lettered() {
    let r = rabbit().await;
    r.publish(None, "{}").await;
    let effects = Effects::default();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let consumer = recording(idem_on(&store, &unique("ns")), &effects);
    let (_link, src) = r.source().await;
    let run = spawn(&consumer, src);
    eventually(20, "dead-lettered", || consumer.counters().poison == 1).await;
    let c = run.stop().await;
    assert_eq!((c.missing_id, effects.total()), (1, 0));
    settle(200).await;
    assert_eq!(r.depth(&r.dead).await, 1);
    r.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_channel_closed_after_the_effect_the_redelivery_is_acked_without_running() {
    let r = rabbit().await;
    r.publish(Some("cut"), "{}").await;
    let effects = Effects::default();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let ns = unique("ns");
    let (link, src) = r.source().await;
    // The first consumer's handler does the effect, then its channel goes away before
    // the ack can be sent.
    let e = effects.clone();
    let cut = link.ch.clone();
    let first =
        Consumer::builder(idem_on(&store, &ns), CREDIT.clone()).handler(move |msg: Message| {
            let (e, cut) = (e.clone(), cut.clone());
            async move {
                e.record(&msg.id);
                cut.close(200, "cut before the ack".into()).await?;
                Ok::<_, BoxError>(())
            }
        });
    let run = spawn(&first, src);
    eventually(20, "the ack failed", || first.counters().ack_failures == 1).await;
    let c1 = run.stop().await; // the closed channel ended the subscription
    link.close().await;
    assert_eq!((c1.processed, c1.ack_failures), (0, 1), "{c1:?}");
    // The broker requeued it; the next consumer acks the replay.
    let second = recording(idem_on(&store, &ns), &effects);
    let (_link, src) = r.source().await;
    let run = spawn(&second, src);
    eventually(20, "the redelivery acked", || {
        second.counters().duplicates == 1
    })
    .await;
    let c2 = run.stop().await;
    assert_eq!((c2.processed, c2.redeliveries), (0, 1), "{c2:?}");
    assert_eq!(effects.count("cut"), 1);
    assert_eq!(r.depth(&r.queue).await, 0);
    r.delete().await;
}
