//! The physical minimum: raw `SET NX PX` (one round trip), `SET NX PX` + `DEL` (two), and
//! three native commands in a row for a token's three steps, through the very connections
//! `RedisStore` uses (`RedisStore::command`).

use idem_runtime::store::redis::redis;

use super::ctx::Ctx;
use super::op::{Op, op};

pub(crate) const ONE_RT: &str = "raw SET NX PX (1 RT)";
pub(crate) const TWO_RT: &str = "raw SET NX PX + DEL (2 RT)";
pub(crate) const THREE_RT: &str = "raw SET NX PX + SET XX GET + SET XX PX (3 RT)";
pub(crate) const TWO_RT_KEEP: &str = "raw SET NX PX + SET XX PX (2 RT, kept)";

/// An operation that sends `build`'s commands one after another (each awaited before the
/// next, as the steps of one idem call are), on the key of `(task, i)`.
fn commands<const N: usize>(ctx: &Ctx, build: fn(String) -> [redis::Cmd; N]) -> Op {
    let (store, run_id) = (ctx.store.clone(), ctx.run.clone());
    op(move |t, i| {
        let (store, run_id) = (store.clone(), run_id.clone());
        async move {
            for cmd in build(key(&run_id, t, i)) {
                let _: redis::Value = store.command(&cmd).await.map_err(|e| e.to_string())?;
            }
            Ok(())
        }
    })
}

pub(crate) fn set_nx_px(ctx: &Ctx) -> Op {
    commands(ctx, |k| [set_nx(k)])
}

pub(crate) fn set_nx_px_del(ctx: &Ctx) -> Op {
    commands(ctx, |k| {
        let mut del = redis::cmd("DEL");
        del.arg(&k);
        [set_nx(k), del]
    })
}

/// A token's three steps (issue, claim, complete) as the cheapest native commands that
/// could stand for them, none checking anything: `SET NX PX` writes the key, `SET XX GET`
/// reads and replaces it, `SET XX PX` overwrites it and keeps it 30 s, as a consumed
/// token's record is kept. No store can take a token through its three atomic steps for
/// less, so this is the floor the token case is also compared with.
pub(crate) fn three_steps(ctx: &Ctx) -> Op {
    commands(ctx, |k| {
        let mut claim = redis::cmd("SET");
        claim.arg(&k).arg("p-t").arg("XX").arg("GET").arg("KEEPTTL");
        let done = keep(&k);
        [set_nx(k), claim, done]
    })
}

/// Like [`set_nx_px_del`], but the second command overwrites the key and keeps it for
/// 30 s, as a dedup completion keeps its record: what keeping a record costs the server
/// (a growing keyspace, expiry) apart from any script (`idem-bench-redis` only).
pub(crate) fn set_nx_px_set_xx(ctx: &Ctx) -> Op {
    commands(ctx, |k| {
        let done = keep(&k);
        [set_nx(k), done]
    })
}

/// `SET k c-done XX PX 30000`: a completion that keeps the record.
fn keep(k: &str) -> redis::Cmd {
    let mut set = redis::cmd("SET");
    set.arg(k).arg("c-done").arg("XX").arg("PX").arg(30_000);
    set
}

pub(crate) fn key(run_id: &str, t: usize, i: u64) -> String {
    format!("{run_id}:raw:{t}:{i}")
}

/// `SET k 1 NX PX 30000`.
pub(crate) fn set_nx(k: String) -> redis::Cmd {
    let mut cmd = redis::cmd("SET");
    cmd.arg(k).arg("1").arg("NX").arg("PX").arg(30_000);
    cmd
}
