//! The process whose calls are abandoned: `idem-bench --recovery-child LIB PG_URL
//! STORE_URL RTAG N` starts N calls of LIB's checkout (a few dozen at a time, so the
//! setup does not swamp the pools), each of which stops for good after step 2's
//! checkpoint, prints `ready` once all N are there, and waits to be killed.

use std::io::Write as _;
use std::process::ExitCode;
use std::sync::Arc;

use idem_runtime::{Idem, RedisStore, SqlStore};

use super::{Lib, Stall, Starter, idem, namespace, peers};
use crate::durable::flow::{Effects, Shared};

/// Calls started but not yet at step 2, at most.
const SETUP: u64 = 32;

/// The child's entry point (from `main`).
pub fn child(args: Vec<String>) -> ExitCode {
    let [lib, url, store_url, rtag, n] = args.as_slice() else {
        eprintln!("recovery child: expected LIB PG_URL STORE_URL RTAG N, got {args:?}");
        return ExitCode::FAILURE;
    };
    let (Some(lib), Ok(n)) = (Lib::parse(lib), n.parse::<u64>()) else {
        eprintln!("recovery child: bad LIB or N: {args:?}");
        return ExitCode::FAILURE;
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("recovery child: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(stall_all(lib, url, store_url, rtag, n)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("recovery child: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn starter(
    lib: Lib,
    url: &str,
    store_url: &str,
    rtag: &str,
    sh: Shared,
    stall: Arc<Stall>,
) -> Result<Starter, String> {
    let idem = |b: idem_runtime::IdemBuilder| b.namespace(namespace(rtag)).build();
    Ok(match lib {
        Lib::IdemPg => {
            let store = SqlStore::connect(store_url)
                .await
                .map_err(|e| e.to_string())?;
            idem::starter(idem(Idem::builder().store(store)), sh, stall)
        }
        Lib::IdemRedis => {
            let store = RedisStore::connect(store_url).map_err(|e| e.to_string())?;
            idem::starter(idem(Idem::builder().store(store)), sh, stall)
        }
        Lib::Dbos => peers::dbos_starter(url, sh, rtag, stall).await?,
        Lib::Durare => peers::durare_starter(url, sh, rtag, stall).await?,
    })
}

/// Starts the N calls, says `ready` once all stopped after step 2, and never returns
/// unless something failed.
async fn stall_all(lib: Lib, url: &str, store_url: &str, rtag: &str, n: u64) -> Result<(), String> {
    let effects = Effects::connect(url).await.map_err(|e| e.0)?;
    let sh = Shared::new(lib.name(), &effects, rtag);
    let stall = Arc::new(Stall::new());
    let start = starter(lib, url, store_url, rtag, sh, stall.clone()).await?;
    let mut reached = stall.watch();
    for i in 0..n {
        let _ = reached.wait_for(|r| i < r + SETUP).await;
        let call = start(i);
        tokio::spawn(async move {
            // A stalled call never ends: any end means the setup failed.
            let r = call.await;
            eprintln!("recovery child: call {i} ended before the kill: {r:?}");
            std::process::exit(1);
        });
    }
    let _ = reached.wait_for(|r| *r == n).await;
    let mut out = std::io::stdout();
    writeln!(out, "ready").map_err(|e| e.to_string())?;
    out.flush().map_err(|e| e.to_string())?;
    std::future::pending::<()>().await;
    Ok(())
}
