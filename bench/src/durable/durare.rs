//! durare: the 3-step checkout as a registered workflow whose body runs three
//! `ctx.step`s, and the same with three `ctx.transaction`s (durare's transactional step:
//! the insert and the step's checkpoint commit in one transaction). On its documented
//! defaults: `PostgresProvider` (a pool of 8, one of them held by its LISTEN/NOTIFY
//! listener), `EngineConfig::default()`, the engine launched. Its system tables go in a
//! schema of their own (`connect_with_schema`, durare's documented way to share a
//! database), so they never meet DBOS's tables in the default `dbos` schema.
//!
//! The crate is built without its default `sqlite` feature: its sqlx 0.8 would link a
//! second `libsqlite3-sys` beside the one idem's sqlx 0.9 links, which Cargo refuses.
//!
//! A duplicate is a start under the same workflow id (durare hands back a handle over the
//! recorded result). A kill after step 2 is the body stopping there for good (its task
//! waits forever; nothing of it runs again); the resume is durare's documented
//! `resume_workflow`: the workflow goes back on the internal queue, a dispatcher runs it
//! from its checkpoints, and the handle polls for the result.

use std::sync::Arc;
use std::time::Duration;

use durare::{DurableContext, DurableEngine, PostgresProvider, WorkflowOptions, params};
use futures_util::future::BoxFuture;

use super::flow::{Flow, Shared, check, expected, step_value};
use crate::work::{BenchError, Receipt, STEP_NAMES};

/// Which body a flow's workflows run.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Body {
    Steps,
    Tx,
}

impl Body {
    fn workflow(self) -> &'static str {
        match self {
            Body::Steps => "checkout",
            Body::Tx => "checkout_tx",
        }
    }
}

/// The schema durare's tables live in here.
pub(crate) const SCHEMA: &str = "durare_bench";

pub(crate) struct DurareFlow {
    engine: Arc<DurableEngine>,
    sh: Shared,
    body: Body,
}

fn bench(e: durare::Error) -> BenchError {
    BenchError::of("durare", e)
}

/// The engine, with both workflows registered, launched on `url`. `steps` and `tx` are
/// the two bodies' shared parts (their own labels and kills).
pub(crate) async fn start(
    url: &str,
    steps: Shared,
    tx: Shared,
) -> Result<(DurareFlow, DurareFlow), BenchError> {
    let provider = PostgresProvider::connect_with_schema(url, SCHEMA)
        .await
        .map_err(bench)?;
    let mut builder = DurableEngine::builder(Arc::new(provider));
    let sh = steps.clone();
    builder.register("checkout", move |ctx: DurableContext, n: u64| {
        let sh = sh.clone();
        async move { checkout(ctx, n, sh).await }
    });
    let sh = tx.clone();
    builder.register("checkout_tx", move |ctx: DurableContext, n: u64| {
        let sh = sh.clone();
        async move { checkout_tx(ctx, n, sh).await }
    });
    let engine = Arc::new(builder.build().await.map_err(bench)?);
    engine.launch().await.map_err(bench)?;
    Ok((
        DurareFlow {
            engine: engine.clone(),
            sh: steps,
            body: Body::Steps,
        },
        DurareFlow {
            engine,
            sh: tx,
            body: Body::Tx,
        },
    ))
}

async fn checkout(ctx: DurableContext, n: u64, sh: Shared) -> durare::Result<Receipt> {
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
        if i == 1 {
            sh.kills.point(n).await;
        }
    }
    Ok(last)
}

async fn checkout_tx(ctx: DurableContext, n: u64, sh: Shared) -> durare::Result<Receipt> {
    let wf = sh.wf(n);
    let mut last = expected(n);
    for (i, name) in STEP_NAMES.iter().enumerate() {
        let (lib, wf) = (sh.lib.to_string(), wf.clone());
        last = ctx
            .transaction(name, move |tx| {
                let (lib, wf) = (lib.clone(), wf.clone());
                Box::pin(async move {
                    tx.execute(
                        "INSERT INTO public.idem_bench_durable_effects (lib, wf, step) \
                         VALUES (?, ?, ?)",
                        &params![lib, wf, i as i64],
                    )
                    .await?;
                    Ok(step_value(n, i))
                })
            })
            .await?;
        if i == 1 {
            sh.kills.point(n).await;
        }
    }
    Ok(last)
}

impl DurareFlow {
    fn start_call(&self, n: u64) -> BoxFuture<'static, Result<Receipt, BenchError>> {
        let (engine, id, name) = (self.engine.clone(), self.sh.wf(n), self.body.workflow());
        Box::pin(async move {
            let handle = engine
                .start::<u64, Receipt>(name, n, WorkflowOptions::with_id(id))
                .await
                .map_err(bench)?;
            handle.await.map_err(bench)
        })
    }

    pub(crate) async fn shutdown(&self) {
        // Killed bodies wait forever; do not wait long for them.
        let _ = self.engine.shutdown(Duration::from_millis(100)).await;
    }
}

impl Flow for DurareFlow {
    fn run(&self, n: u64) -> BoxFuture<'static, Result<Receipt, BenchError>> {
        let call = self.start_call(n);
        Box::pin(async move {
            let got = call.await?;
            check(&got, n)?;
            Ok(got)
        })
    }

    fn run_killed(&self, n: u64) -> BoxFuture<'static, Result<(), BenchError>> {
        let at_step_2 = self.sh.kills.arm(n);
        let call = self.start_call(n);
        Box::pin(async move {
            tokio::select! {
                _ = at_step_2 => Ok(()),
                r = call => Err(BenchError(format!("durare workflow {n} was not killed: {r:?}"))),
            }
        })
    }

    fn resume(&self, n: u64) -> BoxFuture<'static, Result<Receipt, BenchError>> {
        let (engine, id) = (self.engine.clone(), self.sh.wf(n));
        Box::pin(async move {
            let handle = engine
                .resume_workflow::<Receipt>(&id)
                .await
                .map_err(bench)?;
            let got = handle.await.map_err(bench)?;
            check(&got, n)?;
            Ok(got)
        })
    }
}
