//! The Redis family's compared cases on their own, for profiling one at a time:
//! `idem-bench-redis [--redis URL] [--secs N] [--tasks N] [--case NAME]...`
//!
//! Cases (default all, in turns as in the main load program): `one` (raw `SET NX PX`),
//! `two` (raw `SET NX PX` + `DEL`), `three` (raw `SET NX PX`, `SET XX GET`, `SET XX PX`:
//! the floor for a token's three steps), `new` (dedup new key), `replay`, `lock`, `token`; and,
//! only when named, `new-wait1` (the new-key case with `wait_for_replicas(1, 1s)`; the URL
//! must be a primary with a replica), `two-keep` (raw `SET NX PX` + `SET XX PX`: the key is kept 30 s, as a
//! dedup record is, which shows what keeping records costs the server apart from scripts),
//! and `steps` and `raw-writes` (a new key whose body makes three durable steps, or three
//! owner-less `SET … PX`: a step's cost split between this process and the server).
//! Each line gives ops/s and the CPU time per operation of this process and of the
//! server (when it runs on this machine). The same cases run from `idem-bench --cases redis`.

use idem_bench::redis::{self, COMPARED, DIAGNOSTIC, ctx::Ctx};

#[tokio::main]
async fn main() -> Result<(), String> {
    let mut url = "redis://127.0.0.1:6379".to_owned();
    let (mut secs, mut tasks) = (2.0f64, 50usize);
    let mut names: Vec<String> = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |what: &str| args.next().ok_or(format!("{what} takes a value"));
        match a.as_str() {
            "--redis" => url = value("--redis")?,
            "--secs" => {
                secs = value("--secs")?
                    .parse()
                    .map_err(|e| format!("--secs: {e}"))?
            }
            "--tasks" => {
                tasks = value("--tasks")?
                    .parse()
                    .map_err(|e| format!("--tasks: {e}"))?
            }
            "--case" => names.push(value("--case")?),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    let mut ctx = Ctx::new(&url, secs, idem_runtime::store::redis::DEFAULT_CONNECTIONS)?;
    ctx.find_server().await;
    let named = |short: &str| names.iter().any(|n| n == short);
    let chosen = COMPARED
        .iter()
        .filter(|(short, ..)| names.is_empty() || named(short))
        .chain(DIAGNOSTIC.iter().filter(|(short, ..)| named(short)));
    let cases = redis::prepare(&ctx, chosen, tasks).await;
    if cases.is_empty() {
        return Err(
            "no such case; pick from one, two, three, new, replay, lock, token, two-keep".into(),
        );
    }
    redis::turns::run(cases, tasks, secs, ctx.server_pid).await;
    Ok(())
}
