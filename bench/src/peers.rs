//! The peer families: idem beside the crates a user would otherwise pick, on the same
//! function and workload, at 1 and 50 tasks.
//!
//! In memory: `#[idempotent]` on `MemoryStore` against `cached`'s `#[cached]` (its
//! default unbounded store behind one lock) and `#[concurrent_cached]` (its sharded
//! store). On Redis: idem's dedup against `cached`'s `AsyncRedisCache`, against a
//! hand-written `SET NX PX` + `GET` dedup (through idem's own connections, so only the
//! technique differs), and idem's lock against `rslock`.
//!
//! What is compared is not the same guarantee: the caches run the body for every caller
//! that misses at once, and a lock orders bodies without remembering results. The
//! `guarantees` module counts that; this one measures cost.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use cached::proc_macro::{cached, concurrent_cached};
use idem_runtime::store::redis::redis;
use idem_runtime::{Idem, MemoryStore, Options, RedisStore, idempotent};

use crate::args::Args;
use crate::load::{self, Ctx};
use crate::report::Report;
use crate::work::{BenchError, Receipt, receipt};

/// Keys the replay cases complete once (in warm-up) and then replay; far from the fresh
/// ids the new-key cases use.
pub(crate) const REPLAY_BASE: u64 = 1 << 40;

/// Sets idem's process-wide runtime (a `MemoryStore`) for the `#[idempotent]` functions
/// below; once, whoever asks first.
pub(crate) fn init_memory() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        let idem = Idem::builder()
            .store(MemoryStore::new())
            .namespace("bench")
            .build();
        if idem_runtime::init(idem).is_err() {
            eprintln!("idem-bench: idem runtime was already initialised");
        }
    });
}

pub(crate) async fn bare_charge(order_id: u64) -> Result<Receipt, BenchError> {
    Ok(receipt(order_id))
}

#[idempotent(key = "order:{order_id}", ttl = "1h")]
pub(crate) async fn idem_charge(order_id: u64) -> Result<Receipt, BenchError> {
    Ok(receipt(order_id))
}

#[cached]
pub(crate) async fn cached_charge(order_id: u64) -> Result<Receipt, BenchError> {
    Ok(receipt(order_id))
}

#[concurrent_cached]
pub(crate) async fn ccached_charge(order_id: u64) -> Result<Receipt, BenchError> {
    Ok(receipt(order_id))
}

pub(crate) async fn memory(args: &Args, report: &mut Report) {
    init_memory();
    let g = "peers/memory";
    for tasks in [1usize, 50] {
        let plan = args.plan(tasks);
        report.add(
            g,
            "bare call (no attribute)",
            load::run(
                plan,
                |c: Ctx| async move { bare_charge(c.id).await.map(drop) },
            )
            .await,
        );
        let idem_replay = report.add(
            g,
            "idem #[idempotent], replay",
            load::run_median(plan, args.repeats(), |c: Ctx| async move {
                idem_charge(REPLAY_BASE + c.task as u64).await.map(drop)
            })
            .await,
        );
        let cached_hit = report.add(
            g,
            "cached #[cached], hit",
            load::run_median(plan, args.repeats(), |c: Ctx| async move {
                cached_charge(REPLAY_BASE + c.task as u64).await.map(drop)
            })
            .await,
        );
        let cc_hit = report.add(
            g,
            "cached #[concurrent_cached], hit",
            load::run_median(plan, args.repeats(), |c: Ctx| async move {
                ccached_charge(REPLAY_BASE + c.task as u64).await.map(drop)
            })
            .await,
        );
        let idem_new = report.add(
            g,
            "idem #[idempotent], new key",
            load::run(
                plan,
                |c: Ctx| async move { idem_charge(c.id).await.map(drop) },
            )
            .await,
        );
        let cached_miss = report.add(
            g,
            "cached #[cached], miss",
            load::run(
                plan,
                |c: Ctx| async move { cached_charge(c.id).await.map(drop) },
            )
            .await,
        );
        let cc_miss = report.add(
            g,
            "cached #[concurrent_cached], miss",
            load::run_median(plan, args.repeats(), |c: Ctx| async move {
                ccached_charge(c.id).await.map(drop)
            })
            .await,
        );
        let t =
            format!("{tasks} tasks, same function and keys, MemoryStore vs cached's default store");
        report.ratio(
            format!("vs-cached-memory-replay@{tasks}"),
            &idem_replay,
            &cached_hit,
            &format!("#[idempotent] replay / #[cached] hit, {t}"),
        );
        report.ratio(
            format!("vs-cached-memory-new@{tasks}"),
            &idem_new,
            &cached_miss,
            &format!("#[idempotent] new key / #[cached] miss, {t}"),
        );
        report.ratio(
            format!("vs-concurrent-cached-memory-replay@{tasks}"),
            &idem_replay,
            &cc_hit,
            &format!("#[idempotent] replay / #[concurrent_cached] hit, {tasks} tasks"),
        );
        report.ratio(
            format!("vs-concurrent-cached-memory-new@{tasks}"),
            &idem_new,
            &cc_miss,
            &format!("#[idempotent] new key / #[concurrent_cached] miss, {tasks} tasks"),
        );
    }
}

// ---- Redis -------------------------------------------------------------------------

static REDIS_URL: OnceLock<String> = OnceLock::new();

fn redis_url() -> &'static str {
    REDIS_URL
        .get()
        .map_or("redis://127.0.0.1:6379", String::as_str)
}

pub(crate) fn set_redis_url(url: &str) {
    let _ = REDIS_URL.set(url.to_owned());
}

/// The Redis peer of `#[idempotent]`: cached 4's async Redis cache, keys under this
/// run's prefix, the same ttl as idem's records.
#[concurrent_cached(
    map_error = r##"|e| BenchError::of("cached redis", e)"##,
    ty = "cached::AsyncRedisCache<u64, Receipt>",
    create = r##"{
        cached::AsyncRedisCache::builder(format!("{}cached", crate::peers::redis_prefix()))
            .ttl(Duration::from_secs(120))
            .connection_string(redis_url())
            .build()
            .await
            .expect("cached's AsyncRedisCache (is Redis up?)")
    }"##
)]
pub(crate) async fn cached_redis_charge(order_id: u64) -> Result<Receipt, BenchError> {
    Ok(receipt(order_id))
}

/// Every key the peer cases write lives under this prefix (expiring within minutes).
pub(crate) fn redis_prefix() -> String {
    format!("idem-bench:{}:", load::run_tag())
}

pub(crate) static DEDUP: Options = Options::dedup("bench::peer").ttl(Duration::from_secs(120));
pub(crate) static LOCK: Options = Options::lock("bench::peer_lock");

/// A store and runtime for the peer cases, under this run's prefix.
pub(crate) fn redis_store(url: &str) -> Result<(RedisStore, Idem), BenchError> {
    let store = RedisStore::builder()
        .prefix(redis_prefix())
        .connect(url)
        .map_err(|e| BenchError::of("redis", e))?;
    let idem = Idem::builder()
        .store(store.clone())
        .namespace("peers")
        .build();
    Ok((store, idem))
}

/// Dedup the way services write it by hand: `SET key pending NX PX lease`; the winner
/// runs the body and overwrites the marker with the JSON result; a loser `GET`s and, while
/// it reads the marker, sleeps and reads again. Two round trips for a new key and for a
/// replay, no lease renewal, no owner check on the final write.
pub(crate) async fn handwritten<F>(
    store: &RedisStore,
    key: &str,
    lease: Duration,
    body: F,
) -> Result<Receipt, BenchError>
where
    F: std::future::Future<Output = Result<Receipt, BenchError>>,
{
    const PENDING: &[u8] = b"pending";
    let err = |e: idem_runtime::Error| BenchError::of("redis", e);
    let mut set = redis::cmd("SET");
    set.arg(key)
        .arg(PENDING)
        .arg("NX")
        .arg("PX")
        .arg(lease.as_millis() as u64);
    let claimed: Option<String> = store.command(&set).await.map_err(err)?;
    if claimed.is_some() {
        let value = body.await?;
        let json = serde_json::to_vec(&value).map_err(|e| BenchError::of("json", e))?;
        let mut put = redis::cmd("SET");
        put.arg(key).arg(json).arg("PX").arg(120_000);
        store.command::<redis::Value>(&put).await.map_err(err)?;
        return Ok(value);
    }
    // Bounded: 2,000 polls of 5 ms, then give up like a request timeout would.
    for _ in 0..2_000 {
        let mut get = redis::cmd("GET");
        get.arg(key);
        let v: Option<Vec<u8>> = store.command(&get).await.map_err(err)?;
        match v {
            Some(b) if b != PENDING => {
                return serde_json::from_slice(&b).map_err(|e| BenchError::of("json", e));
            }
            Some(_) => tokio::time::sleep(Duration::from_millis(5)).await,
            None => {
                return Err(BenchError(
                    "hand-written: marker expired, result lost".into(),
                ));
            }
        }
    }
    Err(BenchError("hand-written: gave up waiting".into()))
}

/// The `peers` family: the memory peers (unless the `memory` family runs them), then the
/// Redis peers when there is a `--redis`.
pub(crate) async fn run(args: &Args, report: &mut Report) {
    if !args.wants("memory") {
        memory(args, report).await;
    }
    if let Some(url) = &args.redis {
        redis(args, url, report).await;
    }
}

pub(crate) async fn redis(args: &Args, url: &str, report: &mut Report) {
    set_redis_url(url);
    let (store, idem) = match redis_store(url) {
        Ok(s) => s,
        Err(e) => {
            report.note(format!("redis peers skipped: {e}"));
            return;
        }
    };
    let rl = Arc::new(rslock::LockManager::new(vec![url.to_owned()]));
    let pfx: Arc<str> = Arc::from(redis_prefix());
    let g = "peers/redis";
    for tasks in [1usize, 50] {
        let plan = args.plan(tasks);
        let i = idem.clone();
        let idem_replay = report.add(
            g,
            "idem dedup on RedisStore, replay",
            load::run_median(plan, args.repeats(), move |c: Ctx| {
                let i = i.clone();
                async move {
                    let k = REPLAY_BASE + c.task as u64;
                    i.dedup(&DEDUP, k, async move { Ok::<_, BenchError>(receipt(k)) })
                        .await
                        .map(drop)
                }
            })
            .await,
        );
        let cached_hit = report.add(
            g,
            "cached AsyncRedisCache, hit",
            load::run_median(plan, args.repeats(), |c: Ctx| async move {
                cached_redis_charge(REPLAY_BASE + c.task as u64)
                    .await
                    .map(drop)
            })
            .await,
        );
        let (s, p) = (store.clone(), Arc::clone(&pfx));
        let hand_replay = report.add(
            g,
            "hand-written SET NX PX + GET, replay",
            load::run_median(plan, args.repeats(), move |c: Ctx| {
                let (s, key) = (
                    s.clone(),
                    format!("{p}hand:{}", REPLAY_BASE + c.task as u64),
                );
                async move {
                    let k = REPLAY_BASE + c.task as u64;
                    handwritten(
                        &s,
                        &key,
                        Duration::from_secs(30),
                        async move { Ok(receipt(k)) },
                    )
                    .await
                    .map(drop)
                }
            })
            .await,
        );
        let i = idem.clone();
        let idem_new = report.add(
            g,
            "idem dedup on RedisStore, new key",
            load::run_median(plan, args.repeats(), move |c: Ctx| {
                let i = i.clone();
                async move {
                    i.dedup(
                        &DEDUP,
                        c.id,
                        async move { Ok::<_, BenchError>(receipt(c.id)) },
                    )
                    .await
                    .map(drop)
                }
            })
            .await,
        );
        let cached_miss = report.add(
            g,
            "cached AsyncRedisCache, miss",
            load::run_median(plan, args.repeats(), |c: Ctx| async move {
                cached_redis_charge(c.id).await.map(drop)
            })
            .await,
        );
        let (s, p) = (store.clone(), Arc::clone(&pfx));
        let hand_new = report.add(
            g,
            "hand-written SET NX PX + GET, new key",
            load::run_median(plan, args.repeats(), move |c: Ctx| {
                let (s, key) = (s.clone(), format!("{p}hand:{}", c.id));
                async move {
                    handwritten(&s, &key, Duration::from_secs(30), async move {
                        Ok(receipt(c.id))
                    })
                    .await
                    .map(drop)
                }
            })
            .await,
        );
        let i = idem.clone();
        let idem_lock = report.add(
            g,
            "idem lock on RedisStore, acquire+release",
            load::run_median(plan, args.repeats(), move |c: Ctx| {
                let i = i.clone();
                async move {
                    i.lock(&LOCK, c.task, async { Ok::<_, BenchError>(()) })
                        .await
                }
            })
            .await,
        );
        let (r, p) = (Arc::clone(&rl), Arc::clone(&pfx));
        let rslock = report.add(
            g,
            "rslock, lock+unlock",
            load::run_median(plan, args.repeats(), move |c: Ctx| {
                let (r, key) = (Arc::clone(&r), format!("{p}rslock:{}", c.task));
                async move {
                    let l = r
                        .lock(key.as_str(), Duration::from_secs(30))
                        .await
                        .map_err(|e| BenchError::of("rslock", e))?;
                    r.unlock(&l).await;
                    Ok::<_, BenchError>(())
                }
            })
            .await,
        );
        let t = format!("{tasks} tasks, same Redis");
        report.ratio(
            format!("vs-cached-redis-replay@{tasks}"),
            &idem_replay,
            &cached_hit,
            &format!("idem replay / cached AsyncRedisCache hit, {t}"),
        );
        report.ratio(
            format!("vs-cached-redis-new@{tasks}"),
            &idem_new,
            &cached_miss,
            &format!("idem new key / cached AsyncRedisCache miss, {t}"),
        );
        report.ratio(
            format!("vs-handwritten-replay@{tasks}"),
            &idem_replay,
            &hand_replay,
            &format!(
                "idem replay / hand-written SET NX PX + GET replay through idem's connections, {t}"
            ),
        );
        report.ratio(format!("vs-handwritten-new@{tasks}"), &idem_new, &hand_new, &format!("idem new key / hand-written SET NX PX + GET new key through idem's connections, {t}"));
        report.ratio(
            format!("vs-rslock-lock@{tasks}"),
            &idem_lock,
            &rslock,
            &format!("idem lock acquire+release / rslock lock+unlock, {t}"),
        );
    }
    crate::work::redis_cleanup(&store, &pfx).await;
}
