//! What the layer counts, with the `metrics` feature, through the [`metrics`] facade
//! (so every exporter picks it up), beside the runtime's `idem_*` metrics:
//!
//! | name                       | kind    | labels    |
//! |----------------------------|---------|-----------|
//! | `idem_http_requests_total` | counter | `outcome` |
//!
//! `outcome` is one of [`OUTCOMES`]: `ran` (the handler ran and its response was
//! stored, or completed without a replayable body), `replayed` (a stored response was
//! returned), `not_stored` (the handler ran and its status is not stored, so the key was
//! released: 5xx, 408, 429 by default), `passed` (a method the layer does not cover, or
//! no key on a route where it is optional), `service_error` (the inner service failed),
//! or the [`code`](crate::Problem::code) of the problem answered instead of the handler
//! (`idempotency-key-in-flight`, `idempotency-store-unavailable`, ...).
//!
//! Keys are built once, so counting costs a few nanoseconds when no recorder is
//! installed. [`describe_metrics`] registers the help text.

use crate::Problem;

/// Counter of requests the layer saw: label `outcome`.
pub const REQUESTS_TOTAL: &str = "idem_http_requests_total";

/// Every value of the `outcome` label: `ran`, `replayed`, `not_stored`, `passed`,
/// `service_error`, then the problems' [`code`](Problem::code)s.
pub const OUTCOMES: [&str; 24] = [
    "ran",
    "replayed",
    "not_stored",
    "passed",
    "service_error",
    Problem::KeyMissing.code(),
    Problem::KeyMalformed.code(),
    Problem::KeyReused.code(),
    Problem::InFlight.code(),
    Problem::NotReplayable.code(),
    Problem::RequestTooLarge.code(),
    Problem::BodyUnreadable.code(),
    Problem::StoreUnavailable.code(),
    Problem::RecordCorrupt.code(),
    Problem::TokenInvalid.code(),
    Problem::TokenUsed.code(),
    Problem::Completed.code(),
    Problem::Internal.code(),
    Problem::Busy.code(),
    Problem::Unavailable.code(),
    Problem::StateConflict.code(),
    Problem::NoSuchRow.code(),
    Problem::TokenLimit.code(),
    Problem::SignatureInvalid.code(),
];

/// How the layer answered one request: the `outcome` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Ran,
    Replayed,
    NotStored,
    Passed,
    ServiceError,
    Problem(Problem),
}

impl Outcome {
    fn index(self) -> usize {
        match self {
            Outcome::Ran => 0,
            Outcome::Replayed => 1,
            Outcome::NotStored => 2,
            Outcome::Passed => 3,
            Outcome::ServiceError => 4,
            Outcome::Problem(p) => 5 + p as usize,
        }
    }
}

/// Counts one request.
#[inline]
pub(crate) fn count(outcome: Outcome) {
    #[cfg(feature = "metrics")]
    imp::count(outcome.index());
    #[cfg(not(feature = "metrics"))]
    let _ = outcome.index();
}

/// Registers the help text of the layer's metrics with the installed recorder. Call
/// once after installing it (and the runtime's
/// [`describe_metrics`](idem_runtime::observe::describe_metrics)).
///
/// ```
/// idem_http::observe::describe_metrics(); // a no-op without a recorder
/// ```
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub fn describe_metrics() {
    metrics::describe_counter!(
        REQUESTS_TOTAL,
        "Requests the Idempotency-Key layer answered, by outcome."
    );
}

#[cfg(feature = "metrics")]
mod imp {
    use metrics::{Key, Label, Level, Metadata};

    use super::{OUTCOMES, REQUESTS_TOTAL};

    static META: Metadata<'static> =
        Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

    macro_rules! keys {
        ($($i:literal)*) => {
            [$(Key::from_static_parts(REQUESTS_TOTAL, &LABELS[$i])),*]
        };
    }
    macro_rules! labels {
        ($($i:literal)*) => {
            [$([Label::from_static_parts("outcome", OUTCOMES[$i])]),*]
        };
    }
    static LABELS: [[Label; 1]; OUTCOMES.len()] =
        labels!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23);
    static KEYS: [Key; OUTCOMES.len()] =
        keys!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23);

    #[inline]
    pub(super) fn count(index: usize) {
        metrics::with_recorder(|r| r.register_counter(&KEYS[index], &META).increment(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_problem_is_counted_under_its_code() {
        use Problem::*;
        let all = [
            KeyMissing,
            KeyMalformed,
            KeyReused,
            InFlight,
            NotReplayable,
            RequestTooLarge,
            BodyUnreadable,
            StoreUnavailable,
            RecordCorrupt,
            TokenInvalid,
            TokenUsed,
            Completed,
            Internal,
            Busy,
            Unavailable,
            StateConflict,
            NoSuchRow,
            TokenLimit,
            SignatureInvalid,
        ];
        assert_eq!(5 + all.len(), OUTCOMES.len());
        for p in all {
            assert_eq!(OUTCOMES[Outcome::Problem(p).index()], p.code());
        }
    }
}
