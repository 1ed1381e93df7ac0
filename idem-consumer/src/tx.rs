//! SQL transactional mode on PostgreSQL: the claim, the handler's writes and the record
//! commit together, and the ack follows the commit.

use std::future::Future;
use std::time::Duration;

use idem_runtime::store::BoxError;
use idem_runtime::store::sql::sqlx::{self, Postgres, Transaction};
use idem_runtime::store::sql::{Begun, IdemTransaction};
use idem_runtime::{Error, Idem, Options, SqlStore};

use crate::Message;
use crate::effect::{Effect, Ran, sealed};

impl<H: TxHandler> sealed::Sealed for Transactional<H> {}

/// A handler that writes its effect through the claim's open transaction.
///
/// Do every write through `tx` and do not commit it: the consumer commits it together
/// with the message's record, then acks. An `Err` rolls everything back.
///
/// ```no_run
/// use idem_consumer::{Message, TxHandler};
/// use idem_runtime::store::BoxError;
/// use idem_runtime::store::sql::sqlx::{self, Postgres, Transaction};
///
/// struct Credit;
///
/// impl TxHandler for Credit {
///     async fn handle(&self, msg: &Message, tx: &mut Transaction<'static, Postgres>) -> Result<(), BoxError> {
///         sqlx::query("INSERT INTO ledger_credits (message_id, account, amount) VALUES ($1, 'a', 1)")
///             .bind(&msg.id)
///             .execute(&mut **tx)
///             .await?;
///         Ok(())
///     }
/// }
/// ```
pub trait TxHandler: Send + Sync + 'static {
    /// Runs the effect of `msg` inside `tx`.
    fn handle(
        &self,
        msg: &Message,
        tx: &mut Transaction<'static, Postgres>,
    ) -> impl Future<Output = Result<(), BoxError>> + Send;
}

/// Effects committed in the claim's transaction (see
/// [`ConsumerBuilder::transactional`](crate::ConsumerBuilder::transactional)).
pub struct Transactional<H> {
    pub(crate) store: SqlStore,
    pub(crate) handler: H,
}

impl<H: TxHandler> Effect for Transactional<H> {
    async fn run(&self, idem: &Idem, opts: &Options, msg: &Message) -> Result<Ran, Error> {
        let key = idem.key(opts, format_args!("{}", msg.id));
        let mut tx: IdemTransaction<Postgres> =
            match self.store.begin::<Postgres, ()>(opts, &key).await? {
                Begun::Replayed(()) => return Ok(Ran::Replayed),
                Begun::Claimed(tx) => tx,
            };
        // The uncommitted claim is invisible, so no lease ends it: a holder paused past its
        // lease would keep the row locked and then commit. Have the server end such a
        // transaction when it sits idle for the lease, so the next delivery takes over and
        // the paused holder's commit is refused.
        let ms = opts.lease_for().as_millis().clamp(1, i32::MAX as u128);
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "SET LOCAL idle_in_transaction_session_timeout = {ms}"
        )))
        .execute(&mut **tx.tx())
        .await
        .map_err(Error::store)?;
        match self.handler.handle(msg, tx.tx()).await {
            Ok(()) => {
                tx.commit(()).await?;
                Ok(Ran::Effect)
            }
            Err(e) => {
                let _ = tx.rollback().await;
                Ok(Ran::Failed(e))
            }
        }
    }

    /// The holder's claim is uncommitted, so invisible (a probe would only block on its
    /// row); the server ends it at most a lease after its last statement.
    async fn lease_left(&self, _: &Idem, opts: &Options, _: &Message) -> Duration {
        opts.lease_for()
    }
}
