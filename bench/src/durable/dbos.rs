//! DBOS Transact for Rust (`dbos`): the 3-step checkout as a registered workflow whose
//! body runs three `dbos::step`s, on DBOS's documented defaults (`Config::new`: a pool of
//! 10, LISTEN/NOTIFY, migrations at launch, the `dbos` schema). `app_version` is set
//! because DBOS computes none and refuses to launch without one.
//!
//! A duplicate is a run under the same workflow id (DBOS joins the finished workflow and
//! reads its recorded output). A kill after step 2 is the body ending with the error DBOS
//! reads as a lost database: it writes nothing terminal and leaves the row `PENDING` with
//! steps 1 and 2 recorded, the rows a process that died there leaves. The resume is
//! DBOS's documented one, `DBOS::resume`: the workflow goes back on the internal queue, a
//! dispatcher runs it from its checkpoints, and the handle's `result` waits for it.

use std::sync::Arc;

use dbos::sysdb::{BackendError, BackendErrorKind};
use dbos::{Config, DBOS, RunOptions, WorkflowRef};
use futures_util::future::BoxFuture;

use super::flow::{Flow, PeerError, Shared, check, expected, step_value};
use crate::work::{BenchError, Receipt, STEP_NAMES};

pub(crate) struct DbosFlow {
    dbos: Arc<DBOS>,
    checkout: Arc<WorkflowRef<u64, Receipt, PeerError>>,
    sh: Shared,
}

fn lost_database() -> dbos::Error<PeerError> {
    dbos::Error::SystemDatabase(dbos::sysdb::Error::Backend(BackendError {
        message: "idem-bench: killed after step 2".to_owned(),
        sqlstate: None,
        kind: BackendErrorKind::Connection,
    }))
}

fn bench(e: dbos::Error<PeerError>) -> BenchError {
    BenchError::of("dbos", e)
}

impl DbosFlow {
    /// Registers the checkout and launches DBOS on `url`.
    pub(crate) async fn start(url: &str, sh: Shared) -> Result<DbosFlow, BenchError> {
        let dbos = DBOS::new(Config {
            app_version: Some(env!("CARGO_PKG_VERSION").to_owned()),
            ..Config::new("idem_bench", url)
        });
        let body = sh.clone();
        let checkout = dbos
            .register_workflow("checkout", move |n: u64| {
                let sh = body.clone();
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
                        if i == 1 && sh.kills.due(n) {
                            return Err(lost_database());
                        }
                    }
                    Ok(last)
                }
            })
            .map_err(|e| BenchError::of("dbos register", e))?;
        dbos.launch()
            .await
            .map_err(|e| BenchError::of("dbos launch", e))?;
        Ok(DbosFlow {
            dbos: Arc::new(dbos),
            checkout: Arc::new(checkout),
            sh,
        })
    }

    pub(crate) async fn shutdown(&self) {
        self.dbos.shutdown().await;
    }
}

impl Flow for DbosFlow {
    fn run(&self, n: u64) -> BoxFuture<'static, Result<Receipt, BenchError>> {
        let (checkout, id) = (self.checkout.clone(), self.sh.wf(n));
        Box::pin(async move {
            let options = RunOptions {
                workflow_id: Some(&id),
                ..Default::default()
            };
            let got = checkout.run_with(n, options).await.map_err(bench)?;
            check(&got, n)?;
            Ok(got)
        })
    }

    fn run_killed(&self, n: u64) -> BoxFuture<'static, Result<(), BenchError>> {
        let mut at_step_2 = self.sh.kills.arm(n);
        let (checkout, id) = (self.checkout.clone(), self.sh.wf(n));
        Box::pin(async move {
            let options = RunOptions {
                workflow_id: Some(&id),
                ..Default::default()
            };
            match checkout.run_with(n, options).await {
                Err(dbos::Error::SystemDatabase(_)) if at_step_2.try_recv().is_ok() => Ok(()),
                other => Err(BenchError(format!(
                    "dbos workflow {n} was not killed: {other:?}"
                ))),
            }
        })
    }

    fn resume(&self, n: u64) -> BoxFuture<'static, Result<Receipt, BenchError>> {
        let (dbos, id) = (self.dbos.clone(), self.sh.wf(n));
        Box::pin(async move {
            let handle = dbos
                .resume::<Receipt, PeerError>(&id)
                .await
                .map_err(|e| BenchError::of("dbos resume", e))?;
            let got = handle.result().await.map_err(bench)?;
            check(&got, n)?;
            Ok(got)
        })
    }
}
