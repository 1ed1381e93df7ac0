//! The physical minimum: raw `SET NX PX` (one round trip), `SET NX PX` + `DEL` (two), and
//! three native commands in a row for a token's three steps, through the very connections
//! `RedisStore` uses (`RedisStore::command`).

use idem_runtime::store::redis::redis;

use super::Ctx;
use super::turns::{Op, op};

pub(crate) const ONE_RT: &str = "raw SET NX PX (1 RT)";
pub(crate) const TWO_RT: &str = "raw SET NX PX + DEL (2 RT)";
pub(crate) const THREE_RT: &str = "raw SET NX PX + SET XX GET + SET XX PX (3 RT)";
#[allow(dead_code)] // idem-bench-redis only.
pub(crate) const TWO_RT_KEEP: &str = "raw SET NX PX + SET XX PX (2 RT, kept)";

pub(crate) fn set_nx_px(ctx: &Ctx) -> Op {
    let (store, run_id) = (ctx.store.clone(), ctx.run.clone());
    op(move |t, i| {
        let (store, run_id) = (store.clone(), run_id.clone());
        async move {
            let cmd = set_cmd(&run_id, t, i);
            let _: Option<String> = store.command(&cmd).await.map_err(|e| e.to_string())?;
            Ok(())
        }
    })
}

pub(crate) fn set_nx_px_del(ctx: &Ctx) -> Op {
    let (store, run_id) = (ctx.store.clone(), ctx.run.clone());
    op(move |t, i| {
        let (store, run_id) = (store.clone(), run_id.clone());
        async move {
            let cmd = set_cmd(&run_id, t, i);
            let _: Option<String> = store.command(&cmd).await.map_err(|e| e.to_string())?;
            let mut del = redis::cmd("DEL");
            del.arg(key(&run_id, t, i));
            let _: i64 = store.command(&del).await.map_err(|e| e.to_string())?;
            Ok(())
        }
    })
}

/// A token's three steps (issue, claim, complete) as the cheapest native commands that
/// could stand for them, none checking anything: `SET NX PX` writes the key, `SET XX GET`
/// reads and replaces it, `SET XX PX` overwrites it and keeps it 30 s, as a consumed
/// token's record is kept. No store can take a token through its three atomic steps for
/// less, so this is the floor the token case is also compared with.
pub(crate) fn three_steps(ctx: &Ctx) -> Op {
    let (store, run_id) = (ctx.store.clone(), ctx.run.clone());
    op(move |t, i| {
        let (store, run_id) = (store.clone(), run_id.clone());
        async move {
            let k = key(&run_id, t, i);
            let cmd = set_cmd(&run_id, t, i);
            let _: Option<String> = store.command(&cmd).await.map_err(|e| e.to_string())?;
            let mut claim = redis::cmd("SET");
            claim.arg(&k).arg("p-t").arg("XX").arg("GET").arg("KEEPTTL");
            let _: Option<String> = store.command(&claim).await.map_err(|e| e.to_string())?;
            let mut done = redis::cmd("SET");
            done.arg(&k).arg("c-done").arg("XX").arg("PX").arg(30_000);
            let _: Option<String> = store.command(&done).await.map_err(|e| e.to_string())?;
            Ok(())
        }
    })
}

/// Like [`set_nx_px_del`], but the second command overwrites the key and keeps it for
/// 30 s, as a dedup completion keeps its record: what keeping a record costs the server
/// (a growing keyspace, expiry) apart from any script (`idem-bench-redis` only).
#[allow(dead_code)]
pub(crate) fn set_nx_px_set_xx(ctx: &Ctx) -> Op {
    let (store, run_id) = (ctx.store.clone(), ctx.run.clone());
    op(move |t, i| {
        let (store, run_id) = (store.clone(), run_id.clone());
        async move {
            let cmd = set_cmd(&run_id, t, i);
            let _: Option<String> = store.command(&cmd).await.map_err(|e| e.to_string())?;
            let mut set = redis::cmd("SET");
            set.arg(key(&run_id, t, i))
                .arg("c-done")
                .arg("XX")
                .arg("PX")
                .arg(30_000);
            let _: Option<String> = store.command(&set).await.map_err(|e| e.to_string())?;
            Ok(())
        }
    })
}

pub(crate) fn key(run_id: &str, t: usize, i: u64) -> String {
    format!("{run_id}:raw:{t}:{i}")
}

pub(crate) fn set_cmd(run_id: &str, t: usize, i: u64) -> redis::Cmd {
    let mut cmd = redis::cmd("SET");
    cmd.arg(key(run_id, t, i))
        .arg("1")
        .arg("NX")
        .arg("PX")
        .arg(30_000);
    cmd
}
