//! What the consumer tells operators through the [`metrics`](https://docs.rs/metrics)
//! facade (feature `metrics`), beside the counters of
//! [`Consumer::counters`](crate::Consumer::counters). Each call through the consumer's
//! idem runtime is also counted in `idem_calls_total` (see `idem_runtime::observe`).
//!
//! | name                                      | kind    | labels                 |
//! |-------------------------------------------|---------|------------------------|
//! | `idem_consumer_messages_total`            | counter | `operation`, `outcome` |
//! | `idem_consumer_redeliveries_total`        | counter | `operation`            |
//! | `idem_consumer_in_flight_duplicates_total`| counter | `operation`            |
//! | `idem_consumer_handler_errors_total`      | counter | `operation`            |
//!
//! `operation` is the name of the consumer's options (`ledger::credit`).
//! `idem_consumer_messages_total` counts every delivery once, by what was done with it
//! (one of [`OUTCOMES`]):
//!
//! | outcome         | the delivery was                                                 |
//! |-----------------|------------------------------------------------------------------|
//! | `processed`     | acked after its effect ran here and was recorded                 |
//! | `duplicate`     | acked without running: the message had completed before          |
//! | `in_flight`     | nak'ed: another consumer still ran it after `wait`               |
//! | `retry`         | nak'ed with backoff: the handler failed                          |
//! | `dead_lettered` | terminated (dead-lettered): `max_attempts` handler failures      |
//! | `no_id`         | terminated (dead-lettered): the message has no id                |
//! | `store_error`   | nak'ed with backoff: the store failed, or a commit's outcome is unknown |
//! | `ack_failed`    | meant to be settled as above, but the broker did not take it: it delivers the message again |
//!
//! Keys are built once per consumer, so counting costs a few nanoseconds when no
//! recorder is installed. [`describe_metrics`] registers their help text.

/// Counter of deliveries: labels `operation`, `outcome`.
pub const MESSAGES_TOTAL: &str = "idem_consumer_messages_total";
/// Counter of deliveries the broker marked as redeliveries: label `operation`.
pub const REDELIVERIES_TOTAL: &str = "idem_consumer_redeliveries_total";
/// Counter of deliveries that found their message running in another consumer (and
/// waited for it): label `operation`.
pub const IN_FLIGHT_DUPLICATES_TOTAL: &str = "idem_consumer_in_flight_duplicates_total";
/// Counter of handler failures: label `operation`.
pub const HANDLER_ERRORS_TOTAL: &str = "idem_consumer_handler_errors_total";

/// Every value of the `outcome` label of [`MESSAGES_TOTAL`].
pub const OUTCOMES: [&str; 8] = [
    "processed",
    "duplicate",
    "in_flight",
    "retry",
    "dead_lettered",
    "no_id",
    "store_error",
    "ack_failed",
];

/// What was done with one delivery, as [`OUTCOMES`] names it (in the same order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fate {
    Processed = 0,
    Duplicate,
    InFlight,
    Retry,
    DeadLettered,
    NoId,
    StoreError,
    AckFailed,
}

/// Registers the help text of the consumer's metrics with the installed recorder. Call
/// once after installing it (and `idem_runtime::observe::describe_metrics` for the
/// runtime's own).
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub fn describe_metrics() {
    metrics::describe_counter!(
        MESSAGES_TOTAL,
        "Deliveries handled by a consumer, by operation and by what was done with them."
    );
    metrics::describe_counter!(
        REDELIVERIES_TOTAL,
        "Deliveries the broker marked as redeliveries, by operation."
    );
    metrics::describe_counter!(
        IN_FLIGHT_DUPLICATES_TOTAL,
        "Deliveries that found their message running in another consumer, by operation."
    );
    metrics::describe_counter!(
        HANDLER_ERRORS_TOTAL,
        "Handler failures (each nak'ed with backoff or dead-lettered), by operation."
    );
}

/// The metric keys of one consumer, built when it is built.
#[cfg(feature = "metrics")]
pub(crate) struct Keys {
    messages: [metrics::Key; 8],
    redeliveries: metrics::Key,
    in_flight_duplicates: metrics::Key,
    handler_errors: metrics::Key,
}

#[cfg(feature = "metrics")]
static META: metrics::Metadata<'static> =
    metrics::Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));

#[cfg(feature = "metrics")]
impl Keys {
    pub(crate) fn new(operation: &'static str) -> Keys {
        use metrics::{Key, Label};
        let op = || Label::from_static_parts("operation", operation);
        let key = |name: &'static str| Key::from_parts(name, vec![op()]);
        Keys {
            messages: OUTCOMES.map(|outcome| {
                Key::from_parts(
                    MESSAGES_TOTAL,
                    vec![op(), Label::from_static_parts("outcome", outcome)],
                )
            }),
            redeliveries: key(REDELIVERIES_TOTAL),
            in_flight_duplicates: key(IN_FLIGHT_DUPLICATES_TOTAL),
            handler_errors: key(HANDLER_ERRORS_TOTAL),
        }
    }

    pub(crate) fn settled(&self, fate: Fate) {
        count(&self.messages[fate as usize]);
    }
    pub(crate) fn redelivery(&self) {
        count(&self.redeliveries);
    }
    pub(crate) fn in_flight_duplicate(&self) {
        count(&self.in_flight_duplicates);
    }
    pub(crate) fn handler_error(&self) {
        count(&self.handler_errors);
    }
}

#[cfg(feature = "metrics")]
#[inline]
fn count(key: &metrics::Key) {
    metrics::with_recorder(|r| r.register_counter(key, &META).increment(1));
}
