//! What the consumer counts, in one place: the [`Counters`] snapshot and, with the
//! `metrics` feature, the same events published through the `metrics` facade.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::observe::Fate;

/// Counters of one consumer (all deliveries it processed, across its tasks).
///
/// Read them with [`Consumer::counters`](crate::Consumer::counters).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Counters {
    /// Messages whose effect ran here and was recorded, then acked.
    pub processed: u64,
    /// Deliveries of an already completed message: acked without running the handler.
    pub duplicates: u64,
    /// Deliveries that found the message running in another consumer (waited for it,
    /// then acked its result or, past `wait`, nak'ed it).
    pub in_flight_duplicates: u64,
    /// Deliveries the broker marked as redeliveries (attempt above 1).
    pub redeliveries: u64,
    /// Messages terminated or dead-lettered: `max_attempts` failures, or no message id.
    pub poison: u64,
    /// Of those, messages without an id.
    pub missing_id: u64,
    /// Handler errors (each followed by a nak with backoff, or by termination).
    pub handler_errors: u64,
    /// Deliveries nak'ed because the store failed (or a commit's outcome was unknown).
    pub store_errors: u64,
    /// Settlements (ack, nak, terminate) the broker refused or that failed.
    pub ack_failures: u64,
}

pub(crate) struct Live {
    #[cfg(feature = "metrics")]
    keys: crate::observe::Keys,
    processed: AtomicU64,
    duplicates: AtomicU64,
    in_flight_duplicates: AtomicU64,
    redeliveries: AtomicU64,
    poison: AtomicU64,
    missing_id: AtomicU64,
    handler_errors: AtomicU64,
    store_errors: AtomicU64,
    ack_failures: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

impl Live {
    /// The counters of a consumer of `operation`, all zero.
    pub(crate) fn new(operation: &'static str) -> Live {
        #[cfg(not(feature = "metrics"))]
        let _ = operation;
        Live {
            #[cfg(feature = "metrics")]
            keys: crate::observe::Keys::new(operation),
            processed: AtomicU64::new(0),
            duplicates: AtomicU64::new(0),
            in_flight_duplicates: AtomicU64::new(0),
            redeliveries: AtomicU64::new(0),
            poison: AtomicU64::new(0),
            missing_id: AtomicU64::new(0),
            handler_errors: AtomicU64::new(0),
            store_errors: AtomicU64::new(0),
            ack_failures: AtomicU64::new(0),
        }
    }

    /// A delivery the broker marked as a redelivery.
    pub(crate) fn redelivery(&self) {
        bump(&self.redeliveries);
        #[cfg(feature = "metrics")]
        self.keys.redelivery();
    }

    /// A delivery that found its message running in another consumer.
    pub(crate) fn in_flight_duplicate(&self) {
        bump(&self.in_flight_duplicates);
        #[cfg(feature = "metrics")]
        self.keys.in_flight_duplicate();
    }

    /// A handler failure.
    pub(crate) fn handler_error(&self) {
        bump(&self.handler_errors);
        #[cfg(feature = "metrics")]
        self.keys.handler_error();
    }

    /// A store failure (the delivery is nak'ed with backoff).
    pub(crate) fn store_error(&self) {
        bump(&self.store_errors);
    }

    /// A delivery settled as `fate` chose (`AckFailed`: the broker did not take it).
    pub(crate) fn settled(&self, fate: Fate) {
        match fate {
            Fate::Processed => bump(&self.processed),
            Fate::Duplicate => bump(&self.duplicates),
            Fate::AckFailed => bump(&self.ack_failures),
            _ => {}
        }
        #[cfg(feature = "metrics")]
        self.keys.settled(fate);
    }

    /// A message terminated (dead-lettered); `missing_id` if it had no id. Counted when
    /// the rules decide it, like the handler and store failures.
    pub(crate) fn poison(&self, missing_id: bool) {
        bump(&self.poison);
        if missing_id {
            bump(&self.missing_id);
        }
    }

    pub(crate) fn snapshot(&self) -> Counters {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Counters {
            processed: get(&self.processed),
            duplicates: get(&self.duplicates),
            in_flight_duplicates: get(&self.in_flight_duplicates),
            redeliveries: get(&self.redeliveries),
            poison: get(&self.poison),
            missing_id: get(&self.missing_id),
            handler_errors: get(&self.handler_errors),
            store_errors: get(&self.store_errors),
            ack_failures: get(&self.ack_failures),
        }
    }
}
