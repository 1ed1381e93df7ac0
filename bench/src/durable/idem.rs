//! idem's 3-step workflow: an `#[idempotent]` fn whose body runs three [`step`]s, and
//! the same with three [`step_tx`]s (each effect commits with its journal entry). The
//! fn runs under the store the flow scopes it to ([`Idem::scope`]): PostgreSQL or Redis.
//!
//! A duplicate is the same call again; a resume is the same call again after the first
//! one was dropped right after step 2 (a dropped call gives its claim back at once, and
//! its journal stays).

use futures_util::future::BoxFuture;
use idem_runtime::store::sql::sqlx;
use idem_runtime::{Idem, idempotent, step, step_tx};

use super::flow::{Flow, INSERT, Shared, check, expected, step_value};
use crate::work::{BenchError, Receipt, STEP_NAMES};

/// Which body the flow's calls run.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Body {
    /// Three `step`s, effects through the bench's pool.
    Steps,
    /// Three `step_tx`s, effects in the store's transaction.
    Tx,
}

pub(crate) struct IdemFlow {
    pub(crate) idem: Idem,
    pub(crate) sh: Shared,
    pub(crate) body: Body,
}

impl IdemFlow {
    fn call(&self, n: u64) -> BoxFuture<'static, Result<Receipt, BenchError>> {
        let idem = self.idem.clone();
        let sh = self.sh.clone();
        match self.body {
            Body::Steps => Box::pin(async move { idem.scope(checkout(n, &sh)).await }),
            Body::Tx => Box::pin(async move { idem.scope(checkout_tx(n, &sh)).await }),
        }
    }
}

impl Flow for IdemFlow {
    fn run(&self, n: u64) -> BoxFuture<'static, Result<Receipt, BenchError>> {
        let call = self.call(n);
        Box::pin(async move {
            let got = call.await?;
            check(&got, n)?;
            Ok(got)
        })
    }

    fn run_killed(&self, n: u64) -> BoxFuture<'static, Result<(), BenchError>> {
        let at_step_2 = self.sh.kills.arm(n);
        let call = self.call(n);
        Box::pin(async move {
            tokio::select! {
                // Dropping the call here is the kill.
                _ = at_step_2 => Ok(()),
                r = call => Err(BenchError(format!("workflow {n} was not killed: {r:?}"))),
            }
        })
    }

    fn resume(&self, n: u64) -> BoxFuture<'static, Result<Receipt, BenchError>> {
        self.run(n)
    }
}

/// The checkout: three durable steps, each inserting its effect.
#[idempotent(key = "checkout:{n}", ttl = "1h")]
async fn checkout(n: u64, sh: &Shared) -> Result<Receipt, BenchError> {
    let wf = sh.wf(n);
    let mut last = expected(n);
    for (i, name) in STEP_NAMES.iter().enumerate() {
        last = step(name, |_| async {
            sh.effects.insert(&sh.lib, &wf, i).await?;
            Ok::<_, BenchError>(step_value(n, i))
        })
        .await?;
        if i == 1 {
            sh.kills.point(n).await;
        }
    }
    Ok(last)
}

/// The same checkout with transactional steps: each effect commits together with its
/// journal entry.
#[idempotent(key = "checkout-tx:{n}", ttl = "1h")]
async fn checkout_tx(n: u64, sh: &Shared) -> Result<Receipt, BenchError> {
    let wf = sh.wf(n);
    let mut last = expected(n);
    for (i, name) in STEP_NAMES.iter().enumerate() {
        let (lib, wf) = (sh.lib.clone(), wf.clone());
        last = step_tx(
            name,
            move |_, tx: &mut sqlx::Transaction<'static, sqlx::Postgres>| {
                Box::pin(async move {
                    sqlx::query(INSERT)
                        .bind(&*lib)
                        .bind(&wf)
                        .bind(i as i32)
                        .execute(&mut **tx)
                        .await
                        .map_err(|e| BenchError::of("effect insert", e))?;
                    Ok::<_, BenchError>(step_value(n, i))
                })
            },
        )
        .await?;
        if i == 1 {
            sh.kills.point(n).await;
        }
    }
    Ok(last)
}
