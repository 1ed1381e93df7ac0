//! How a message's effect runs under its claim: recorded in the store after the handler
//! ([`Handler`]), or committed with the claim in one SQL transaction (see `tx`).

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use idem_runtime::codec::ReplayOk;
use idem_runtime::inspect::RecordState;
use idem_runtime::store::BoxError;
use idem_runtime::{Error, Idem, Options};

use crate::Message;

/// A message handler: the effect of one message. An `Err` naks the message with
/// backoff (and after `max_attempts` terminates it); nothing is recorded.
///
/// Any `Fn(Message) -> impl Future<Output = Result<(), BoxError>>` is one.
pub trait Handler: Send + Sync + 'static {
    /// Runs the effect of `msg`.
    fn handle(&self, msg: Message) -> impl Future<Output = Result<(), BoxError>> + Send;
}

impl<F, Fut> Handler for F
where
    F: Fn(Message) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), BoxError>> + Send,
{
    fn handle(&self, msg: Message) -> impl Future<Output = Result<(), BoxError>> + Send {
        self(msg)
    }
}

/// What running a delivery's effect came to.
#[doc(hidden)]
pub enum Ran {
    /// The handler ran here and its result is recorded (or committed).
    Effect,
    /// The message completed before: nothing ran.
    Replayed,
    /// The handler failed; nothing is recorded.
    Failed(BoxError),
}

pub(crate) mod sealed {
    pub trait Sealed {}
}

/// How a [`Consumer`](crate::Consumer) runs its effects: [`Plain`] (recorded in the idem
/// store after the handler) or, with the `postgres` feature, in the claim's SQL
/// transaction. Sealed.
pub trait Effect: sealed::Sealed + Send + Sync + 'static {
    #[doc(hidden)]
    /// Claims the message's id with `opts` (waiting up to its `wait` for a twin) and runs
    /// the effect. [`Error::InProgress`]: a twin still holds it.
    fn run(
        &self,
        idem: &Idem,
        opts: &Options,
        msg: &Message,
    ) -> impl Future<Output = Result<Ran, Error>> + Send;

    /// How long the holder of the message's claim may still hold it (the nak delay of a
    /// duplicate that waited in vain).
    #[doc(hidden)]
    fn lease_left(
        &self,
        idem: &Idem,
        opts: &Options,
        msg: &Message,
    ) -> impl Future<Output = Duration> + Send;
}

impl<H: Handler> sealed::Sealed for Plain<H> {}

/// The internal error of a handler run under dedup.
pub(crate) enum Failure {
    Idem(Error),
    Handler(BoxError),
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Failure::Idem(e)
    }
}

/// Effects recorded in the idem store after the handler returns (see
/// [`ConsumerBuilder::handler`](crate::ConsumerBuilder::handler)).
#[derive(Debug)]
pub struct Plain<H>(pub(crate) H);

impl<H: Handler> Effect for Plain<H> {
    async fn run(&self, idem: &Idem, opts: &Options, msg: &Message) -> Result<Ran, Error> {
        let ran = AtomicBool::new(false);
        let body = async {
            ran.store(true, Ordering::Relaxed);
            self.0.handle(msg.clone()).await.map_err(Failure::Handler)
        };
        match idem
            .dedup_with::<ReplayOk, (), Failure, _>(opts, &msg.id, None, body)
            .await
        {
            Ok(()) if ran.load(Ordering::Relaxed) => Ok(Ran::Effect),
            Ok(()) => Ok(Ran::Replayed),
            Err(Failure::Handler(e)) => Ok(Ran::Failed(e)),
            Err(Failure::Idem(e)) => Err(e),
        }
    }

    /// Read without writing, by the store's clock: a free key has none left.
    async fn lease_left(&self, idem: &Idem, opts: &Options, msg: &Message) -> Duration {
        match idem.inspect(opts, &msg.id).await {
            Ok(Some(info)) if info.state == RecordState::InProgress => {
                info.lease_left.unwrap_or(opts.lease_for())
            }
            Ok(_) => Duration::ZERO,
            Err(_) => opts.lease_for(),
        }
    }
}
