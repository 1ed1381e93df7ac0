//! A fixed workload for instruction-count profiling (deterministic, unlike wall time on a
//! shared machine):
//!
//! `valgrind --tool=callgrind target/release/examples/profile_replay 100000 [new|cached|steps|raw]`
//!
//! `new` uses a fresh key per call; `cached` runs the `cached` crate's `#[cached]` hit
//! path on the same function, for comparison; `steps` runs a fresh key whose body makes
//! three durable steps of the same receipt (its cost over `new`, divided by three, is a
//! step's), and `raw` a fresh key whose body makes three owner-less writes of the same
//! receipt through the store's connections (Redis only: a `SET … PX` each).
//!
//! With `IDEM_PROFILE_REDIS=redis://…` the calls go to that Redis instead of a
//! MemoryStore (the client's instructions only: the server is another process).

use std::hint::black_box;

use idem_runtime::store::redis::redis;
use idem_runtime::{Error, Idem, MemoryStore, RedisStore, idempotent, step};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    order_id: u64,
    cents: u64,
    status: String,
}

/// The names of the three writes of `steps` and of `raw`.
const NAMES: [&str; 3] = ["charge", "reserve", "mail"];

/// The receipt every mode returns for `order_id`.
fn receipt(order_id: u64) -> Receipt {
    Receipt {
        order_id,
        cents: order_id % 10_000,
        status: "paid".to_owned(),
    }
}

#[idempotent(key = "order:{order_id}", ttl = "1h")]
async fn charge(order_id: u64) -> Result<Receipt, Error> {
    Ok(receipt(order_id))
}

#[idempotent(key = "order:{order_id}", ttl = "1h")]
async fn charge_in_steps(order_id: u64) -> Result<Receipt, Error> {
    let mut last = None;
    for (i, name) in NAMES.into_iter().enumerate() {
        let order_id = order_id + i as u64;
        last = Some(step(name, |_| async move { Ok::<_, Error>(receipt(order_id)) }).await?);
    }
    last.ok_or(Error::Config("no step ran".into()))
}

#[cached::proc_macro::cached]
async fn charge_cached(order_id: u64) -> Result<Receipt, String> {
    Ok(receipt(order_id))
}

/// The Redis store, when profiling on one.
static REDIS: std::sync::OnceLock<RedisStore> = std::sync::OnceLock::new();

#[idempotent(key = "order:{order_id}", ttl = "1h")]
async fn charge_raw(order_id: u64) -> Result<Receipt, Error> {
    let store = REDIS
        .get()
        .ok_or(Error::Config("raw needs IDEM_PROFILE_REDIS".into()))?;
    let mut last = None;
    for (i, name) in NAMES.into_iter().enumerate() {
        let order_id = order_id + i as u64;
        let r = receipt(order_id);
        let json = serde_json::to_vec(&r).map_err(|e| Error::Config(e.to_string()))?;
        // One command and one round trip, as a step's write; expiring, so nothing stays.
        let mut set = redis::cmd("SET");
        set.arg(format!("profile:raw:{order_id}:{name}"))
            .arg(json)
            .arg("PX")
            .arg(60_000);
        store.command::<redis::Value>(&set).await?;
        last = Some(r);
    }
    last.ok_or(Error::Config("no write".into()))
}

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(100_000);
    let mode = std::env::args().nth(2).unwrap_or_default();
    let new_keys = matches!(mode.as_str(), "new" | "steps" | "raw");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let builder = match std::env::var("IDEM_PROFILE_REDIS") {
        Ok(url) => {
            let store = RedisStore::connect(&url).expect("redis");
            REDIS.get_or_init(|| store.clone());
            // A namespace of its own per run, so every run's keys are new.
            let ns = format!("profile-{}", std::process::id());
            Idem::builder().store(store).namespace(ns)
        }
        Err(_) => Idem::builder().store(MemoryStore::new()),
    };
    idem_runtime::init(builder.build()).expect("init");
    rt.block_on(async {
        for i in 0..n {
            let id = if new_keys { i } else { 42 };
            if mode == "cached" {
                black_box(charge_cached(black_box(42)).await.expect("charge"));
            } else if mode == "steps" {
                black_box(charge_in_steps(black_box(id)).await.expect("charge"));
            } else if mode == "raw" {
                black_box(charge_raw(black_box(id)).await.expect("charge"));
            } else {
                black_box(charge(black_box(id)).await.expect("charge"));
            }
        }
    });
}
