//! Wake-up latency: how long after its twin's body returns does a waiting duplicate
//! return with the twin's value. With pub/sub (`RedisStore::connect`) and with the
//! polling fallback (a store from a pool, without a pub/sub address).

use std::time::{Duration, Instant};

use idem_runtime::store::redis::deadpool_redis;
use idem_runtime::{Error, Idem, Options, RedisStore};

use super::ctx::Ctx;
use crate::stats::{Row, row};

static WAKE: Options = Options::dedup("bench::wake")
    .lease(Duration::from_secs(30))
    .wait(Duration::from_secs(10));

const SAMPLES: usize = 200;

pub(crate) async fn all(ctx: &Ctx) -> Vec<Row> {
    let pool = deadpool_redis::Config::from_url(ctx.url.clone())
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
        .expect("deadpool");
    let polling = Idem::builder()
        .store(RedisStore::from_pool(pool))
        .namespace(format!("{}-poll", ctx.run))
        .build();
    vec![
        measure("wake-up", "waiter woken by pub/sub", &ctx.idem).await,
        measure("wake-up", "waiter polling (no pub/sub)", &polling).await,
    ]
}

async fn measure(group: &'static str, case: &str, idem: &Idem) -> Row {
    let mut lat = Vec::with_capacity(SAMPLES);
    let began = Instant::now();
    for n in 0..SAMPLES {
        let (go, gate) = tokio::sync::oneshot::channel::<Instant>();
        let (started, is_running) = tokio::sync::oneshot::channel::<()>();
        let twin = {
            let idem = idem.clone();
            tokio::spawn(async move {
                idem.dedup(&WAKE, format!("w{n}"), async move {
                    let _ = started.send(());
                    let _ = gate.await;
                    Ok::<_, Error>(n)
                })
                .await
            })
        };
        is_running.await.expect("twin runs");
        let waiter = {
            let idem = idem.clone();
            tokio::spawn(async move {
                let r = idem
                    .dedup(&WAKE, format!("w{n}"), async { Ok::<_, Error>(usize::MAX) })
                    .await;
                (r, Instant::now())
            })
        };
        // Let the waiter find the key busy and go to sleep on it.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let t0 = Instant::now();
        let _ = go.send(t0);
        let (r, woke) = waiter.await.expect("waiter");
        assert_eq!(
            r.expect("waiter result"),
            n,
            "the waiter got its twin's value"
        );
        twin.await.expect("twin").expect("twin result");
        lat.push(woke.duration_since(t0).as_nanos() as u64);
    }
    let r = row(group, case, 1, began.elapsed(), lat);
    eprintln!("  {group:<12} {case:<34}  p50 {:?}", r.p50);
    r
}
