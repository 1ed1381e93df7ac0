//! idem's operations through `RedisStore`, as users call them (the direct API the
//! `#[idempotent]` expansion calls): envelope, owner ids and all.

use std::time::Duration;

use idem_runtime::codec::NoReplay;
use idem_runtime::{Error, Options};

use super::ctx::Ctx;
use super::op::{Op, op};

static NEW: Options = Options::dedup("bench::dedup").ttl(Duration::from_secs(30));
static REPLAY: Options = Options::dedup("bench::replay").ttl(Duration::from_secs(300));
static LOCK: Options = Options::lock("bench::lock");
// Consumed tokens are completed records: keep them briefly, like new keys, so runs do not
// fill the server (the default ttl is a day).
static TOKEN: Options = Options::token("bench::token").ttl(Duration::from_secs(30));

pub(crate) const DEDUP_NEW: &str = "dedup new key";
pub(crate) const DEDUP_REPLAY: &str = "dedup replay";
pub(crate) const LOCK_CYCLE: &str = "lock acquire+release";
pub(crate) const TOKEN_CYCLE: &str = "token issue+consume";

pub(crate) fn dedup_new(ctx: &Ctx) -> Op {
    let idem = ctx.idem.clone();
    op(move |t, i| {
        let idem = idem.clone();
        async move {
            let got = idem
                .dedup(&NEW, format!("{t}:{i}"), async move { Ok::<_, Error>(i) })
                .await;
            ran_new(got, i)
        }
    })
}

/// A new key's call, which must have run its body and returned `i`.
pub(crate) fn ran_new(got: Result<u64, Error>, i: u64) -> Result<(), String> {
    match got {
        Ok(v) if v == i => Ok(()),
        Ok(v) => Err(format!("new key replayed {v}")),
        Err(e) => Err(e.to_string()),
    }
}

/// Completes the keys the replay case reads, one per task.
pub(crate) async fn seed_replay(ctx: &Ctx, tasks: usize) {
    for t in 0..tasks {
        let _: u64 = ctx
            .idem
            .dedup(
                &REPLAY,
                format!("{t}"),
                async move { Ok::<_, Error>(t as u64) },
            )
            .await
            .expect("seeding replay keys");
    }
}

pub(crate) fn dedup_replay(ctx: &Ctx) -> Op {
    let idem = ctx.idem.clone();
    op(move |t, _| {
        let idem = idem.clone();
        async move {
            let v: u64 = idem
                .dedup(&REPLAY, format!("{t}"), async {
                    Err(Error::Config("ran".into()))
                })
                .await
                .map_err(|e| e.to_string())?;
            if v != t as u64 {
                return Err(format!("replayed {v}"));
            }
            Ok(())
        }
    })
}

pub(crate) fn lock_cycle(ctx: &Ctx) -> Op {
    let idem = ctx.idem.clone();
    op(move |t, _| {
        let idem = idem.clone();
        async move {
            idem.lock(&LOCK, format!("{t}"), async { Ok::<_, Error>(()) })
                .await
                .map_err(|e| e.to_string())
        }
    })
}

pub(crate) fn token_cycle(ctx: &Ctx) -> Op {
    let idem = ctx.idem.clone();
    op(move |_, _| {
        let idem = idem.clone();
        async move {
            let tok = idem
                .issue_token(Duration::from_secs(30))
                .await
                .map_err(|e| e.to_string())?;
            idem.consume_token::<NoReplay, (), Error, _>(&TOKEN, &tok, async { Ok(()) })
                .await
                .map_err(|e| e.to_string())
        }
    })
}
