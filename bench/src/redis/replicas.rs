//! What `wait_for_replicas(1, …)` costs a new key: the dedup new-key case through a store
//! that pipelines `WAIT 1` with each claim and completion, beside the same case without
//! it (`new`) and the raw baselines, in turns. Needs a primary with at least one replica
//! at the case's URL (`WAIT` fails otherwise); run as
//! `idem-bench-redis --redis URL --case one --case new --case new-wait1`.

use std::time::Duration;

use idem_runtime::{Error, Idem, Options, RedisStore};

use super::ctx::Ctx;
use super::op::{Op, op};

static NEW_WAITED: Options = Options::dedup("bench::dedup_waited").ttl(Duration::from_secs(30));

pub(crate) const DEDUP_NEW_WAIT1: &str = "dedup new key, wait_for_replicas(1)";

/// The new-key case through a store that waits for one replica (up to a second).
pub(crate) fn dedup_new_wait1(ctx: &Ctx) -> Op {
    let idem = RedisStore::builder()
        .wait_for_replicas(1, Duration::from_secs(1))
        .connect(&ctx.url)
        .map(|store| {
            Idem::builder()
                .store(store)
                .namespace(ctx.run.to_string())
                .build()
        })
        .map_err(|e| e.to_string());
    op(move |t, i| {
        let idem = idem.clone();
        async move {
            let idem = idem?;
            let v: u64 = idem
                .dedup(
                    &NEW_WAITED,
                    format!("{t}:{i}"),
                    async move { Ok::<_, Error>(i) },
                )
                .await
                .map_err(|e| e.to_string())?;
            if v != i {
                return Err(format!("new key replayed {v}"));
            }
            Ok(())
        }
    })
}
