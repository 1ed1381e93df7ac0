//! durable-rust (`durable`): the 3-step checkout as a workflow of three `ctx.step`s and a
//! `ctx.complete`, started with `Ctx::start`, after `durable::init` (its documented
//! set-up: migrations, an executor id, heartbeat and recovery loops; sea-orm's default
//! pool).
//!
//! A workflow here is named, not keyed: `Ctx::start` attaches to a `RUNNING` workflow of
//! the same name, and starts a new one (all steps again) if the earlier one finished. So a
//! duplicate of a finished workflow is measured the way durable-rust documents a replay:
//! `Ctx::from_id` on the finished task (one bulk read of its steps' outputs) and the same
//! body, whose steps then come from that cache. A kill after step 2 is the call dropped
//! there (the task stays `RUNNING`); the resume is `Ctx::start` under the same name, which
//! attaches to it, and the same body.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use durable::{Ctx, DurableError};
use futures_util::future::BoxFuture;
use sea_orm::DatabaseConnection;
use uuid::Uuid;

use super::flow::{Flow, Shared, check, expected, step_value};
use crate::work::{BenchError, Receipt, STEP_NAMES};

pub(crate) struct DurableRustFlow {
    db: DatabaseConnection,
    sh: Shared,
    /// Finished workflows' task ids, for their replay.
    tasks: Arc<Mutex<HashMap<u64, Uuid>>>,
}

fn bench(e: DurableError) -> BenchError {
    BenchError::of("durable-rust", e)
}

impl DurableRustFlow {
    pub(crate) async fn start(url: &str, sh: Shared) -> Result<DurableRustFlow, BenchError> {
        let (db, _recovered) = durable::init(url).await.map_err(bench)?;
        Ok(DurableRustFlow {
            db,
            sh,
            tasks: Arc::default(),
        })
    }
}

async fn checkout(ctx: &Ctx, n: u64, sh: &Shared) -> Result<Receipt, DurableError> {
    let wf = sh.wf(n);
    let mut last = expected(n);
    for (i, name) in STEP_NAMES.iter().enumerate() {
        last = ctx
            .step(name, || async {
                sh.effects
                    .insert(&sh.lib, &wf, i)
                    .await
                    .map_err(|e| DurableError::custom(e.0))?;
                Ok(step_value(n, i))
            })
            .await?;
        if i == 1 {
            sh.kills.point(n).await;
        }
    }
    ctx.complete(&last).await?;
    Ok(last)
}

impl DurableRustFlow {
    /// `Ctx::start` under workflow `n`'s name (new, or attached to a running one), then
    /// the body; remembers the task.
    fn start_and_run(&self, n: u64) -> BoxFuture<'static, Result<Receipt, BenchError>> {
        let (db, sh, tasks) = (self.db.clone(), self.sh.clone(), self.tasks.clone());
        Box::pin(async move {
            let ctx = Ctx::start(&db, &sh.wf(n), None)
                .await
                .map_err(bench)?
                .into_ctx();
            let got = checkout(&ctx, n, &sh).await.map_err(bench)?;
            tasks
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(n, ctx.task_id());
            check(&got, n)?;
            Ok(got)
        })
    }
}

impl Flow for DurableRustFlow {
    fn run(&self, n: u64) -> BoxFuture<'static, Result<Receipt, BenchError>> {
        let task = self
            .tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&n)
            .copied();
        let Some(task) = task else {
            return self.start_and_run(n);
        };
        // A duplicate of a finished workflow: reattach by id and replay.
        let (db, sh) = (self.db.clone(), self.sh.clone());
        Box::pin(async move {
            let ctx = Ctx::from_id(&db, task).await.map_err(bench)?;
            let got = checkout(&ctx, n, &sh).await.map_err(bench)?;
            check(&got, n)?;
            Ok(got)
        })
    }

    fn run_killed(&self, n: u64) -> BoxFuture<'static, Result<(), BenchError>> {
        let at_step_2 = self.sh.kills.arm(n);
        let call = self.start_and_run(n);
        Box::pin(async move {
            tokio::select! {
                _ = at_step_2 => Ok(()),
                r = call => Err(BenchError(format!("durable-rust workflow {n} was not killed: {r:?}"))),
            }
        })
    }

    fn resume(&self, n: u64) -> BoxFuture<'static, Result<Receipt, BenchError>> {
        self.start_and_run(n)
    }
}
