//! Why a consumer refuses to start or stops.

use std::time::Duration;

/// A consumer that cannot run safely, or a broker that could not be reached.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConsumerError {
    /// The record ttl ends before the broker stops redelivering: a redelivery after the
    /// record expired would run the effect again.
    #[error(
        "record ttl {ttl:?} is shorter than the broker's redelivery horizon {horizon:?}: \
         raise the ttl (Options::ttl) or bound the redeliveries"
    )]
    RetentionTooShort {
        /// The record ttl.
        ttl: Duration,
        /// How long the broker may redeliver.
        horizon: Duration,
    },
    /// The broker redelivers without end (no delivery limit, no message age limit), so no
    /// record ttl covers it.
    #[error(
        "the broker may redeliver without end (no max_deliver and no max_age): \
         set a delivery limit or a message age limit on the consumer or stream"
    )]
    UnboundedRedelivery,
    /// The broker (connection, stream, consumer, queue) failed.
    #[error("broker: {0}")]
    Broker(#[source] idem_runtime::store::BoxError),
    /// idem failed.
    #[error(transparent)]
    Idem(#[from] idem_runtime::Error),
}

impl ConsumerError {
    /// Wraps a broker client's error.
    pub fn broker(err: impl Into<idem_runtime::store::BoxError>) -> Self {
        ConsumerError::Broker(err.into())
    }
}
