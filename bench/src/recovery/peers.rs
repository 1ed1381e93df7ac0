//! DBOS Transact for Rust and durare: the checkout as each one's workflow of three steps
//! (as in the `durable` family), started in the child under an executor id of the
//! round's own, and recovered in the parent the way each documents it.
//!
//! - DBOS: a relaunch. `DBOS::launch` re-enqueues the `PENDING` workflows of its executor
//!   id and application version on its internal queue (one statement, inside `launch`),
//!   and the queue's worker runs them from their checkpoints. The parent launches a new
//!   instance under the dead process's executor id, as a restarted process would.
//! - durare: `DurableEngine::recover_pending_for(&[dead executor id])`, which claims each
//!   `PENDING` workflow of that executor (one compare-and-set each) and runs it on a task
//!   of its own. Its docs prefer it to `recover()` (every executor of the version), which
//!   is the same sweep unfiltered.
//!
//! Both are told by their caller that the executor is dead; neither waits for a lease.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dbos::{Config, DBOS, RunOptions, WorkflowRef};
use durare::{DurableContext, DurableEngine, PostgresProvider, WorkflowOptions};
use futures_util::FutureExt as _;

use super::{Stall, Starter, Timed, executor, poll_until};
use crate::durable::durare::SCHEMA;
use crate::durable::flow::{PeerError, Shared, expected, step_value};
use crate::work::{BenchError, Receipt, STEP_NAMES};

/// A DBOS instance of the round `rtag`'s executor (the durable family's settings, the
/// executor id added).
fn dbos_config(url: &str, rtag: &str) -> Config {
    Config {
        app_version: Some(env!("CARGO_PKG_VERSION").to_owned()),
        executor_id: Some(executor(rtag)),
        ..Config::new("idem_bench", url)
    }
}

/// Registers the checkout on `dbos`; with a `stall`, each workflow stops for good after
/// step 2.
fn dbos_register(
    dbos: &DBOS,
    sh: Shared,
    stall: Option<Arc<Stall>>,
) -> Result<WorkflowRef<u64, Receipt, PeerError>, String> {
    dbos.register_workflow("checkout", move |n: u64| {
        let (sh, stall) = (sh.clone(), stall.clone());
        async move {
            let wf = sh.wf(n);
            let mut last = expected(n);
            for (i, name) in STEP_NAMES.iter().enumerate() {
                last = dbos::step(name, || {
                    let (sh, wf) = (sh.clone(), wf.clone());
                    async move {
                        sh.effects
                            .insert(&sh.lib, &wf, i)
                            .await
                            .map_err(|e| dbos::Error::Application(PeerError::from(e)))?;
                        Ok(step_value(n, i))
                    }
                })
                .await?;
                if let (1, Some(stall)) = (i, &stall) {
                    stall.point().await;
                }
            }
            Ok::<_, dbos::Error<PeerError>>(last)
        }
    })
    .map_err(|e| format!("dbos register: {e}"))
}

/// The child's DBOS workflows, each stopping after step 2.
pub(crate) async fn dbos_starter(
    url: &str,
    sh: Shared,
    rtag: &str,
    stall: Arc<Stall>,
) -> Result<Starter, String> {
    let dbos = DBOS::new(dbos_config(url, rtag));
    let checkout = Arc::new(dbos_register(&dbos, sh.clone(), Some(stall))?);
    dbos.launch()
        .await
        .map_err(|e| format!("dbos launch: {e}"))?;
    // Kept for the child's life: the instance runs the workflows.
    let dbos = Arc::new(dbos);
    Ok(Box::new(move |n| {
        let (checkout, id, _dbos) = (checkout.clone(), sh.wf(n), dbos.clone());
        async move {
            let options = RunOptions {
                workflow_id: Some(&id),
                ..Default::default()
            };
            checkout
                .run_with(n, options)
                .await
                .map(drop)
                .map_err(|e| BenchError::of("dbos", e))
        }
        .boxed()
    }))
}

/// Relaunches DBOS under the killed executor's id and times it until all `n` workflows
/// of the round succeeded.
pub(crate) async fn dbos_recover(
    url: &str,
    sh: &Shared,
    rtag: &str,
    n: u64,
) -> Result<Timed, String> {
    let dbos = DBOS::new(dbos_config(url, rtag));
    let _checkout = dbos_register(&dbos, sh.clone(), None)?;
    let t0 = Instant::now();
    dbos.launch()
        .await
        .map_err(|e| format!("dbos launch: {e}"))?;
    let launch = t0.elapsed().as_secs_f64();
    let secs = poll_until(t0, || succeeded(sh, "dbos", n)).await;
    dbos.shutdown().await;
    Ok(Timed {
        secs: secs?,
        launch: Some(launch),
    })
}

/// Whether all `n` workflows of the round (ids `{rtag}-…`) are `SUCCESS` in `schema`.
async fn succeeded(sh: &Shared, schema: &str, n: u64) -> Result<bool, String> {
    let done: i64 = idem_runtime::store::sql::sqlx::query_scalar(
        idem_runtime::store::sql::sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM {schema}.workflow_status \
             WHERE workflow_uuid LIKE $1 AND status = 'SUCCESS'"
        )),
    )
    .bind(format!("{}-%", sh.tag))
    .fetch_one(&sh.effects.pool)
    .await
    .map_err(|e| format!("{schema} status: {e}"))?;
    Ok(done as u64 >= n)
}

/// A durare engine under `executor_id` with the checkout registered, launched (durare's
/// documented defaults otherwise, in the durable family's schema).
async fn durare_engine(
    url: &str,
    sh: Shared,
    executor_id: String,
    stall: Option<Arc<Stall>>,
) -> Result<Arc<DurableEngine>, String> {
    let bench = |e: durare::Error| format!("durare: {e}");
    let provider = PostgresProvider::connect_with_schema(url, SCHEMA)
        .await
        .map_err(bench)?;
    let mut builder = DurableEngine::builder(Arc::new(provider));
    builder.executor_id(executor_id);
    builder.register("checkout", move |ctx: DurableContext, n: u64| {
        let (sh, stall) = (sh.clone(), stall.clone());
        async move { durare_checkout(ctx, n, sh, stall).await }
    });
    let engine = builder.build().await.map_err(bench)?;
    engine.launch().await.map_err(bench)?;
    Ok(Arc::new(engine))
}

async fn durare_checkout(
    ctx: DurableContext,
    n: u64,
    sh: Shared,
    stall: Option<Arc<Stall>>,
) -> durare::Result<Receipt> {
    let wf = sh.wf(n);
    let mut last = expected(n);
    for (i, name) in STEP_NAMES.iter().enumerate() {
        last = ctx
            .step(name, || async {
                sh.effects
                    .insert(&sh.lib, &wf, i)
                    .await
                    .map_err(|e| durare::Error::app(e.0))?;
                Ok::<_, durare::Error>(step_value(n, i))
            })
            .await?;
        if let (1, Some(stall)) = (i, &stall) {
            stall.point().await;
        }
    }
    Ok(last)
}

/// The child's durare workflows, each stopping after step 2.
pub(crate) async fn durare_starter(
    url: &str,
    sh: Shared,
    rtag: &str,
    stall: Arc<Stall>,
) -> Result<Starter, String> {
    let engine = durare_engine(url, sh.clone(), executor(rtag), Some(stall)).await?;
    Ok(Box::new(move |n| {
        let (engine, id) = (engine.clone(), sh.wf(n));
        async move {
            let handle = engine
                .start::<u64, Receipt>("checkout", n, WorkflowOptions::with_id(id))
                .await
                .map_err(|e| BenchError::of("durare", e))?;
            handle
                .await
                .map(drop)
                .map_err(|e| BenchError::of("durare", e))
        }
        .boxed()
    }))
}

/// A new engine (a process of its own executor id) recovers the killed executor's
/// workflows; timed until all `n` of the round succeeded.
pub(crate) async fn durare_recover(
    url: &str,
    sh: &Shared,
    rtag: &str,
    n: u64,
) -> Result<Timed, String> {
    let engine = durare_engine(url, sh.clone(), format!("{}-next", executor(rtag)), None).await?;
    let t0 = Instant::now();
    let dispatched = engine
        .recover_pending_for(&[executor(rtag)])
        .await
        .map_err(|e| format!("durare recover: {e}"));
    let secs = match dispatched {
        Ok(ids) if ids.len() as u64 == n => poll_until(t0, || succeeded(sh, SCHEMA, n)).await,
        Ok(ids) => Err(format!("durare recovered {} of {n} workflows", ids.len())),
        Err(e) => Err(e),
    };
    let _ = engine.shutdown(Duration::from_secs(10)).await;
    Ok(Timed {
        secs: secs?,
        launch: None,
    })
}
