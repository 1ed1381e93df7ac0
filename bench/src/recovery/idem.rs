//! idem's recoverable checkout: [`Idem::dedup_recoverable`] records the order number with
//! the claim, and a [`Recoverer`](idem_runtime::recover::Recoverer) that knows the same
//! options makes the same call again for every abandoned one. The takeover hands it the
//! journal, so charge and reserve replay and only mail runs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::FutureExt as _;
use idem_runtime::{Idem, Options, step};

use super::{LIMIT, Stall, Starter, Timed, poll_until};
use crate::durable::flow::{Shared, expected, step_value};
use crate::work::{BenchError, Receipt, STEP_NAMES};

/// The lease of a checkout. Short, so the parent does not wait long for a killed call's
/// lease to run out (that wait is not timed); long enough that the child's heartbeats,
/// one per call every third of it, stay a small load while N calls hang at step 2.
const LEASE: Duration = Duration::from_secs(5);

/// How many calls the recoverer runs at once: its default, stated so the table's claim
/// holds if the default moves.
const CONCURRENCY: usize = 16;

/// Static: a recoverer keeps the options of the functions it knows.
static CHECKOUT: Options = Options::dedup("idem_bench::recovery::checkout")
    .lease(LEASE)
    .ttl(Duration::from_secs(3600));

/// Checkout `n`: three durable steps, each inserting its effect. With a `stall`, the call
/// stops for good after step 2 (the child's killed calls).
async fn checkout(
    idem: Idem,
    sh: Shared,
    n: u64,
    stall: Option<Arc<Stall>>,
) -> Result<Receipt, BenchError> {
    idem.dedup_recoverable(&CHECKOUT, n, &n, async {
        let wf = sh.wf(n);
        let mut last = expected(n);
        for (i, name) in STEP_NAMES.iter().enumerate() {
            last = step(name, |_| async {
                sh.effects.insert(&sh.lib, &wf, i).await?;
                Ok::<_, BenchError>(step_value(n, i))
            })
            .await?;
            if let (1, Some(stall)) = (i, &stall) {
                stall.point().await;
            }
        }
        Ok(last)
    })
    .await
}

/// The child's calls: each hangs after step 2, its heartbeat renewing the lease until
/// the process is killed.
pub(crate) fn starter(idem: Idem, sh: Shared, stall: Arc<Stall>) -> Starter {
    Box::new(move |n| {
        checkout(idem.clone(), sh.clone(), n, Some(stall.clone()))
            .map(|r| r.map(drop))
            .boxed()
    })
}

/// Waits until the N killed calls are all listed as abandoned (their leases ran out by
/// the store's clock), then starts a recoverer and times it until none is left.
pub(crate) async fn recover(idem: &Idem, sh: &Shared, n: u64) -> Result<Timed, String> {
    let index = idem
        .store()
        .recovery()
        .ok_or("this store keeps no recovery index")?;
    let ns = idem.namespace();
    let waited = Instant::now();
    loop {
        let calls = index
            .list(Some(ns), n as usize + 1)
            .await
            .map_err(|e| e.to_string())?;
        if calls.len() as u64 == n && calls.iter().all(|c| c.abandoned && c.steps == 2) {
            break;
        }
        if waited.elapsed() > LEASE * 2 + LIMIT {
            return Err(format!(
                "{} of {n} calls listed, {} abandoned with 2 steps",
                calls.len(),
                calls.iter().filter(|c| c.abandoned && c.steps == 2).count()
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (to_run, sh) = (idem.clone(), sh.clone());
    let t0 = Instant::now();
    let recoverer = idem
        .recoverer()
        .concurrency(CONCURRENCY)
        .register(&CHECKOUT, move |n: u64, _ctx| {
            checkout(to_run.clone(), sh.clone(), n, None)
        })
        .spawn()
        .map_err(|e| format!("recoverer: {e}"))?;
    let secs = poll_until(t0, || async {
        index
            .list(Some(ns), 1)
            .await
            .map(|left| left.is_empty())
            .map_err(|e| e.to_string())
    })
    .await;
    let totals = recoverer.shutdown().await;
    let secs = secs?;
    if totals.recovered != n || totals.failed + totals.parked + totals.unknown > 0 {
        return Err(format!("the recoverer's totals: {totals:?}"));
    }
    Ok(Timed { secs, launch: None })
}
