//! A new key whose body makes three durable steps, and the same call whose body makes
//! three owner-less writes instead (`SET … PX`, through the store's connections): the
//! two `idem-bench-redis` diagnostic cases that split a step's cost between this process
//! and the server at any number of tasks, which the `steps` family's latencies cannot.

use std::time::Duration;

use idem_runtime::store::redis::redis;
use idem_runtime::{Error, Options, step};

use super::ctx::Ctx;
use super::idem_ops::ran_new;
use super::op::{Op, op};
use crate::work::STEP_NAMES;

static STEPPED: Options = Options::dedup("bench::stepped").ttl(Duration::from_secs(30));

pub(crate) const DEDUP_STEPS: &str = "dedup new key, 3 steps";
pub(crate) const DEDUP_RAW_WRITES: &str = "dedup new key, 3 raw SET PX from the body";

pub(crate) fn dedup_steps(ctx: &Ctx) -> Op {
    let idem = ctx.idem.clone();
    op(move |t, i| {
        let idem = idem.clone();
        async move {
            let body = async move {
                for (n, name) in STEP_NAMES.into_iter().enumerate() {
                    let v = i + n as u64;
                    if step(name, |_| async move { Ok::<_, Error>(v) }).await? != v {
                        return Err(Error::Config(format!("step {name} replayed")));
                    }
                }
                Ok::<_, Error>(i)
            };
            ran_new(idem.dedup(&STEPPED, format!("s:{t}:{i}"), body).await, i)
        }
    })
}

pub(crate) fn dedup_raw_writes(ctx: &Ctx) -> Op {
    let (idem, store, run) = (ctx.idem.clone(), ctx.store.clone(), ctx.run.clone());
    op(move |t, i| {
        let (idem, store, run) = (idem.clone(), store.clone(), run.clone());
        async move {
            let body = async move {
                for (n, name) in STEP_NAMES.into_iter().enumerate() {
                    let mut set = redis::cmd("SET");
                    set.arg(format!("{run}:raw-write:{t}:{i}:{name}"))
                        .arg(i + n as u64)
                        .arg("PX")
                        .arg(30_000);
                    store.command::<redis::Value>(&set).await?;
                }
                Ok::<_, Error>(i)
            };
            ran_new(idem.dedup(&STEPPED, format!("r:{t}:{i}"), body).await, i)
        }
    })
}
