//! What the consumer counts, in one place.

use std::sync::atomic::{AtomicU64, Ordering};

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

#[derive(Default)]
pub(crate) struct Live {
    pub(crate) processed: AtomicU64,
    pub(crate) duplicates: AtomicU64,
    pub(crate) in_flight_duplicates: AtomicU64,
    pub(crate) redeliveries: AtomicU64,
    pub(crate) poison: AtomicU64,
    pub(crate) missing_id: AtomicU64,
    pub(crate) handler_errors: AtomicU64,
    pub(crate) store_errors: AtomicU64,
    pub(crate) ack_failures: AtomicU64,
}

pub(crate) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

impl Live {
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
