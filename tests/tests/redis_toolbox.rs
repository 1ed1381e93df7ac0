//! The toolbox primitives on Redis: the toolbox conformance suite on the machine's
//! server on 6379 (standalone) and on a private 3-master Cluster, the size of a Bloom
//! bitmap as Redis counts it, and garbage under toolbox record names.

#[path = "support/redis_harness.rs"]
mod harness;

use std::sync::{Arc, OnceLock};

use idem_runtime::store::redis::redis;
use idem_runtime::store::{Owner, Settle, StateStore, TransitionRequest};
use idem_runtime::toolbox::{BloomFilter, Optimistic, StateMachine};
use idem_runtime::{Error, Idem, RedisStore, Store};

idem_runtime::toolbox_conformance_tests!(standalone, || async {
    Arc::new(RedisStore::connect(harness::shared_url()).expect("store")) as Arc<dyn Store>
});

fn cluster() -> &'static harness::Cluster {
    static CLUSTER: OnceLock<harness::Cluster> = OnceLock::new();
    CLUSTER.get_or_init(harness::Cluster::start)
}

idem_runtime::toolbox_conformance_tests!(cluster, || async {
    let urls = cluster().urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    Arc::new(RedisStore::connect_cluster(&urls).expect("cluster store")) as Arc<dyn Store>
});

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

async fn raw() -> redis::aio::MultiplexedConnection {
    harness::raw_connection(harness::shared_url()).await
}

/// A filter for 10,000,000 ids at 1% is a bitmap of 95,850,584 bits (in 1 MiB shards plus
/// a meta key), allocated whole when the filter is created (so its size does not depend
/// on how many ids went in), and Redis counts it at most 12 MiB.
#[test]
fn bloom_bitmap_for_10m_ids_at_1pct_is_at_most_12_mib() {
    runtime().block_on(async {
        let store = RedisStore::connect(harness::shared_url()).expect("store");
        let idem = Idem::builder()
            .store(store.clone())
            .namespace(harness::unique("bloom-size"))
            .build();
        let filter = Arc::new(BloomFilter::new(&idem, "events", 10_000_000, 0.01).unwrap());
        assert_eq!((filter.size_bits(), filter.hashes()), (95_850_584, 7));
        let name = store.bloom_name(filter.key(), filter.size_bits());
        let mut conn = raw().await;
        let mut sizes = Vec::new();
        for round in 0..2u64 {
            let mut tasks = Vec::new();
            for t in 0..16u64 {
                let filter = filter.clone();
                tasks.push(tokio::spawn(async move {
                    for i in (t..10_000).step_by(16) {
                        let insert = filter.insert(format_args!("evt-{round}-{i}"));
                        insert.await.unwrap();
                    }
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
            let shards: Vec<String> = redis::cmd("KEYS")
                .arg(format!("{name}:*"))
                .query_async(&mut conn)
                .await
                .unwrap();
            let (mut usage, mut len) = (0u64, 0u64);
            for key in shards.iter().chain([&name]) {
                let u: u64 = redis::cmd("MEMORY").arg("USAGE").arg(key).query_async(&mut conn).await.unwrap();
                let l: u64 = redis::cmd("STRLEN").arg(key).query_async(&mut conn).await.unwrap();
                usage += u;
                len += l;
            }
            println!(
                "after {} inserts: {} shards, {len} bytes of strings, MEMORY USAGE {usage} bytes ({:.2} MiB)",
                (round + 1) * 10_000,
                shards.len(),
                usage as f64 / (1024.0 * 1024.0)
            );
            assert_eq!(shards.len(), 12);
            assert_eq!(len, 95_850_584u64.div_ceil(8) + "95850584".len() as u64);
            assert!(usage <= 12 * 1024 * 1024, "MEMORY USAGE {usage} > 12 MiB");
            sizes.push(usage);
        }
        assert_eq!(sizes[0], sizes[1], "the bitmap grew with inserts");
        let mut del = redis::cmd("DEL");
        del.arg(&name);
        for n in 0..12 {
            del.arg(format!("{name}:{n}"));
        }
        let _: () = del.query_async(&mut conn).await.unwrap();
    });
}

/// Something else under a toolbox record's name (a string where a hash belongs, a hash
/// where a bitmap belongs, a non-numeric version) is `Error::Corrupt`, never a value.
#[test]
fn garbage_toolbox_records_are_corrupt() {
    runtime().block_on(async {
        let store = RedisStore::connect(harness::shared_url()).expect("store");
        let idem = Idem::builder()
            .store(store.clone())
            .namespace(harness::unique("tb-garbage"))
            .build();
        let mut conn = raw().await;
        static VALUES: Optimistic = Optimistic::new("garbage::values");
        let key = idem.versioned_key(&VALUES, "a");
        let rec = store.record_name(&key);
        let _: () = redis::cmd("SET")
            .arg(format!("{rec}:v"))
            .arg("x")
            .query_async(&mut conn)
            .await
            .unwrap();
        let r = idem.load::<u32>(&VALUES, "a").await;
        assert!(matches!(r, Err(Error::Corrupt { .. })), "{r:?}");
        let r = idem.compare_and_set(&VALUES, "a", 0, 1u32).await;
        assert!(matches!(r, Err(Error::Corrupt { .. })), "{r:?}");
        let _: () = redis::cmd("DEL")
            .arg(format!("{rec}:v"))
            .query_async(&mut conn)
            .await
            .unwrap();
        let _: () = redis::cmd("HSET")
            .arg(format!("{rec}:v"))
            .arg("v")
            .arg("x")
            .arg("n")
            .arg("seven")
            .query_async(&mut conn)
            .await
            .unwrap();
        let r = idem.load::<u32>(&VALUES, "a").await;
        assert!(matches!(r, Err(Error::Corrupt { .. })), "{r:?}");
        let r = idem.compare_and_set(&VALUES, "a", 7, 1u32).await;
        assert!(matches!(r, Err(Error::Corrupt { .. })), "{r:?}");

        let m = StateMachine::builder("garbage::order")
            .states(["new", "done"])
            .initial("new")
            .allow("new", ["done"])
            .build()
            .unwrap();
        let key = idem.state_key(&m, "o");
        let srec = format!("{}:s", store.record_name(&key));
        let _: () = redis::cmd("SET")
            .arg(&srec)
            .arg("x")
            .query_async(&mut conn)
            .await
            .unwrap();
        let r = idem.transition(&m, "o", "new").await;
        assert!(matches!(r, Err(Error::Corrupt { .. })), "{r:?}");
        assert!(matches!(
            idem.state(&m, "o").await,
            Err(Error::Corrupt { .. })
        ));
        let from = ["new"];
        let req = TransitionRequest::new(&from, true, "done");
        assert!(matches!(
            store.transition(&key, &req).await,
            Err(Error::Corrupt { .. })
        ));
        assert!(matches!(
            store
                .settle_transition(&key, Owner::next(), Settle::Abort)
                .await,
            Err(Error::Corrupt { .. })
        ));

        let f = BloomFilter::new(&idem, "garbage::ids", 1000, 0.01).unwrap();
        let brec = store.bloom_name(f.key(), f.size_bits());
        let _: () = redis::cmd("HSET")
            .arg(&brec)
            .arg("a")
            .arg("b")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(matches!(f.insert("x").await, Err(Error::Corrupt { .. })));
        assert!(matches!(f.contains("x").await, Err(Error::Corrupt { .. })));
        // A shard gone (evicted) while the filter lives: no more "definitely new".
        let _: () = redis::cmd("DEL")
            .arg(&brec)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(!f.insert("x").await.unwrap());
        let _: () = redis::cmd("DEL")
            .arg(format!("{brec}:0"))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(matches!(f.insert("y").await, Err(Error::Corrupt { .. })));
        assert!(matches!(f.contains("x").await, Err(Error::Corrupt { .. })));
        let _: () = redis::cmd("DEL")
            .arg(format!("{rec}:v"))
            .arg(&srec)
            .arg(&brec)
            .arg(format!("{brec}:0"))
            .query_async(&mut conn)
            .await
            .unwrap();
    });
}
