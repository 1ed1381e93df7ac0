//! What idem tells operators: one `tracing` span per call, events, and (with the
//! `metrics` feature) counters and histograms through the
//! [`metrics`](https://docs.rs/metrics) facade, so any exporter (Prometheus, StatsD,
//! OpenTelemetry, ...) picks them up.
//!
//! # The span
//!
//! Every call of an idempotent function (attribute or direct API, and the attribute's
//! SQL transactional mode, `transaction = ...`) runs inside one span named [`SPAN`]
//! (`idem`), at level `INFO`, with these fields:
//!
//! | field      | value                                                                |
//! |------------|----------------------------------------------------------------------|
//! | `function` | the function's path, as in `#[idempotent]` errors (`app::charge`)    |
//! | `key`      | the record as errors print it: `namespace/function#digest` (the rendered key itself is never logged) |
//! | `strategy` | `dedup`, `lock` or `token`                                           |
//! | `outcome`  | set when the call ends; one of [`OUTCOMES`]                          |
//!
//! Outcomes: `ran` (the body ran; its result was recorded, or released on `Err`),
//! `replayed` (a stored result was returned), `waited` (the call waited for an in-flight
//! twin and returned its result), `rejected` (a duplicate under `on_duplicate =
//! "reject"`, or an unknown or expired token), `in_progress` (another call held the key
//! past `wait`; for locks, the lock stayed taken), `mismatch` (same key, different
//! fingerprint), `lease_lost` (the body ran but its claim was taken over before the
//! result was recorded), `store_error` (the store failed, or a record is corrupt or no
//! longer decodes).
//!
//! Each durable step ([`step`](crate::step)) runs in a span [`STEP_SPAN`] (`idem_step`),
//! a child of its call's, with the fields `function`, `step` (the step's name) and
//! `outcome`: `ran` (the closure ran and its value was journaled), `replayed` (the
//! value came from the journal), `verified` (a verified step's `verify` found its
//! effect), or `failed` (the closure returned `Err`, or the step could not start).
//! `idem_steps_total` counts the first three.
//!
//! # Events
//!
//! At `WARN`: a lost lease, a store failure after the body ran (the effect happened but
//! its result is not recorded yet), a corrupt record, and every
//! [`Idem::forget`](crate::Idem::forget). At `DEBUG`: the outcome of every other call.
//!
//! # Metrics (feature `metrics`)
//!
//! | name                      | kind      | labels                          |
//! |---------------------------|-----------|---------------------------------|
//! | `idem_calls_total`        | counter   | `function`, `strategy`, `outcome` |
//! | `idem_lease_lost_total`   | counter   |                                 |
//! | `idem_store_errors_total` | counter   | `op`                            |
//! | `idem_store_seconds`      | histogram | `op`                            |
//! | `idem_wait_seconds`       | histogram |                                 |
//! | `idem_steps_total`        | counter   | `function`, `outcome`           |
//!
//! `op` is one of `claim`, `complete`, `release`, `renew`, `issue`. Store calls of an
//! in-process store ([`MemoryStore`](crate::MemoryStore)) are not timed: they take
//! nanoseconds, and reading the clock would cost more than the call. Labels are built
//! once per function and kept, so counting costs a few nanoseconds when no recorder is
//! installed. `describe_metrics` (feature `metrics`) registers each metric's help text
//! with the recorder.

use std::future::Future;

use tracing::Instrument as _;

use crate::options::Strategy;
use crate::{Error, Key, Options};

/// The name of the span every call runs in.
pub const SPAN: &str = "idem";

/// Every value of the span's `outcome` field (and the `outcome` label of `idem_calls_total`).
pub const OUTCOMES: [&str; 8] = [
    "ran",
    "replayed",
    "waited",
    "rejected",
    "in_progress",
    "mismatch",
    "lease_lost",
    "store_error",
];

/// Counter of calls: labels `function`, `strategy`, `outcome`.
pub const CALLS_TOTAL: &str = "idem_calls_total";
/// Counter of claims lost while the body ran.
pub const LEASE_LOST_TOTAL: &str = "idem_lease_lost_total";
/// Counter of failed store calls: label `op`.
pub const STORE_ERRORS_TOTAL: &str = "idem_store_errors_total";
/// Histogram of store call durations in seconds: label `op`.
pub const STORE_SECONDS: &str = "idem_store_seconds";
/// Histogram of the time duplicates spent waiting for a twin or a lock, in seconds.
pub const WAIT_SECONDS: &str = "idem_wait_seconds";
/// Counter of durable steps: labels `function`, `outcome` (`ran`, `replayed`, `verified`).
pub const STEPS_TOTAL: &str = "idem_steps_total";
/// Counter: abandoned calls a recoverer ran, by `function` and `outcome` (`recovered`,
/// `failed`, `parked`, `unknown`).
pub const RECOVERED_TOTAL: &str = "idem_recovered_total";
/// Gauge: calls found due for recovery by the last sweep, by `namespace`.
pub const RECOVERY_WAITING: &str = "idem_recovery_waiting";
/// The name of the span each durable step runs in.
pub const STEP_SPAN: &str = "idem_step";

/// How a durable step ended: its span's `outcome` field and `idem_steps_total`'s label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StepOutcome {
    Ran,
    Replayed,
    Verified,
    Failed,
    /// The step ran, and its journal write could not reach the store.
    Unjournaled,
}

/// Every step outcome, in order.
#[cfg(feature = "metrics")]
const STEP_OUTCOMES: [StepOutcome; 5] = [
    StepOutcome::Ran,
    StepOutcome::Replayed,
    StepOutcome::Verified,
    StepOutcome::Failed,
    StepOutcome::Unjournaled,
];

impl StepOutcome {
    fn as_str(self) -> &'static str {
        match self {
            StepOutcome::Ran => "ran",
            StepOutcome::Replayed => "replayed",
            StepOutcome::Verified => "verified",
            StepOutcome::Failed => "failed",
            StepOutcome::Unjournaled => "unjournaled",
        }
    }
}

/// The span of step `step` of `function`, its outcome still empty.
pub(crate) fn step_span(function: &'static str, step: &str) -> tracing::Span {
    tracing::info_span!(STEP_SPAN, function, step, outcome = tracing::field::Empty,)
}

/// Records how a step ended: the current span's field and `idem_steps_total`.
pub(crate) fn step_ended(_function: &'static str, outcome: StepOutcome) {
    ended_as(outcome.as_str());
    #[cfg(feature = "metrics")]
    if outcome != StepOutcome::Failed {
        metrics_impl::step(_function, outcome);
    }
}

/// How a call ended: the span's `outcome` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Ran = 0,
    Replayed,
    Waited,
    Rejected,
    InProgress,
    Mismatch,
    LeaseLost,
    StoreError,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        OUTCOMES[self as usize]
    }

    /// The outcome of a call that ends with `err` before its body ran.
    pub(crate) fn of(err: &Error) -> Outcome {
        match err {
            Error::InProgress { .. } | Error::Locked { .. } => Outcome::InProgress,
            Error::Duplicate { .. } | Error::TokenInvalid { .. } => Outcome::Rejected,
            Error::PayloadMismatch { .. } => Outcome::Mismatch,
            Error::LeaseLost { .. } => Outcome::LeaseLost,
            _ => Outcome::StoreError,
        }
    }
}

/// A store call, as the `op` label names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Claim = 0,
    Complete,
    Release,
    Renew,
    Issue,
}

pub(crate) fn strategy_name(s: Strategy) -> &'static str {
    match s {
        Strategy::Dedup => "dedup",
        Strategy::Lock => "lock",
        Strategy::Token => "token",
    }
}

/// Runs a call's future inside its `idem` span. With no subscriber interested the span
/// is a no-op and entering it on each poll is one branch.
pub(crate) fn instrument<F: Future>(
    opts: &Options,
    key: &Key,
    fut: F,
) -> tracing::instrument::Instrumented<F> {
    fut.instrument(span(opts, key))
}

/// The `idem` span of one call, its outcome still empty.
pub(crate) fn span(opts: &Options, key: &Key) -> tracing::Span {
    tracing::info_span!(
        SPAN,
        function = opts.name(),
        key = %key,
        strategy = strategy_name(opts.strategy()),
        outcome = tracing::field::Empty,
    )
}

/// Records how the call running in the current span ended: the span's field, a debug
/// event (a warning for a corrupt record), and `idem_calls_total`.
#[inline]
pub(crate) fn outcome(opts: &Options, key: &Key, outcome: Outcome) {
    ended(outcome);
    #[cfg(feature = "metrics")]
    metrics_impl::call(metrics_impl::keys_of(opts), outcome);
    #[cfg(not(feature = "metrics"))]
    let _ = opts;
    log(key, outcome, None);
}

/// [`outcome`] for a call that ends with `err`.
#[inline]
pub(crate) fn failed(opts: &Options, key: &Key, err: &Error) {
    let o = Outcome::of(err);
    ended(o);
    #[cfg(feature = "metrics")]
    metrics_impl::call(metrics_impl::keys_of(opts), o);
    #[cfg(not(feature = "metrics"))]
    let _ = opts;
    log(key, o, Some(err));
}

/// [`outcome`] for a dedup call known by its key alone: a transaction idem opened,
/// whose commit comes after the options' borrow has ended.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub(crate) fn outcome_of(key: &Key, outcome: Outcome) {
    ended(outcome);
    #[cfg(feature = "metrics")]
    metrics_impl::call(metrics_impl::keys_of_scope(key.scope()), outcome);
    log(key, outcome, None);
}

/// [`failed`] for a dedup call known by its key alone (see [`outcome_of`]).
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub(crate) fn failed_of(key: &Key, err: &Error) {
    let o = Outcome::of(err);
    ended(o);
    #[cfg(feature = "metrics")]
    metrics_impl::call(metrics_impl::keys_of_scope(key.scope()), o);
    log(key, o, Some(err));
}

/// A call answered on the spot, before any future (an in-process replay): its span is
/// opened and closed here, with the outcome already set.
#[inline]
pub(crate) fn answered_now(key: &Key, outcome: Outcome) {
    let span = tracing::info_span!(
        SPAN,
        function = key.scope(),
        key = %key,
        strategy = "dedup",
        outcome = outcome.as_str(),
    );
    let _entered = span.enter();
    #[cfg(feature = "metrics")]
    metrics_impl::call(metrics_impl::keys_of_scope(key.scope()), outcome);
    log(key, outcome, None);
}

fn ended(outcome: Outcome) {
    ended_as(outcome.as_str());
}

fn ended_as(outcome: &'static str) {
    let span = tracing::Span::current();
    if !span.is_disabled() {
        span.record("outcome", outcome);
    }
}

fn log(key: &Key, outcome: Outcome, err: Option<&Error>) {
    match err {
        Some(e @ Error::Corrupt { .. }) => {
            tracing::warn!(%key, outcome = outcome.as_str(), error = %e, "corrupt record; not replayed")
        }
        Some(e) => tracing::debug!(%key, outcome = outcome.as_str(), error = %e, "idem call ended"),
        None => tracing::debug!(%key, outcome = outcome.as_str(), "idem call ended"),
    }
}

/// Counts a lost lease.
pub(crate) fn lease_lost() {
    #[cfg(feature = "metrics")]
    metrics_impl::lease_lost();
}

/// Records the time a duplicate spent waiting.
pub(crate) fn waited(_for: std::time::Duration) {
    #[cfg(feature = "metrics")]
    metrics_impl::waited(_for);
}

/// Awaits one store call: timed (unless the store is in-process) and counted when it
/// fails. Without the `metrics` feature it is the call itself.
#[inline]
pub(crate) async fn store_call<T>(
    _local: bool,
    _op: Op,
    call: impl Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    #[cfg(feature = "metrics")]
    {
        let start = (!_local).then(std::time::Instant::now);
        let out = call.await;
        if let Some(start) = start {
            metrics_impl::store_seconds(_op, start.elapsed());
        }
        if out.is_err() {
            metrics_impl::store_error(_op);
        }
        out
    }
    #[cfg(not(feature = "metrics"))]
    call.await
}

/// Registers the help text of every idem metric with the installed recorder (exporters
/// such as Prometheus print it). Call once after installing the recorder.
///
/// ```
/// idem_runtime::observe::describe_metrics(); // a no-op without a recorder
/// ```
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub fn describe_metrics() {
    metrics::describe_counter!(
        CALLS_TOTAL,
        "Calls of idempotent functions, by function, strategy and outcome."
    );
    metrics::describe_counter!(
        LEASE_LOST_TOTAL,
        "Claims lost while the body ran (lease too short for the body's pauses)."
    );
    metrics::describe_counter!(STORE_ERRORS_TOTAL, "Store calls that failed, by operation.");
    metrics::describe_histogram!(
        STORE_SECONDS,
        metrics::Unit::Seconds,
        "Duration of store calls, by operation (shared stores only)."
    );
    metrics::describe_counter!(
        STEPS_TOTAL,
        "Durable steps, by function and outcome (ran, replayed, verified)."
    );
    metrics::describe_counter!(
        RECOVERED_TOTAL,
        "Abandoned calls run by a recoverer, by function and outcome."
    );
    metrics::describe_gauge!(
        RECOVERY_WAITING,
        "Calls found due for recovery by the last sweep, by namespace."
    );
    metrics::describe_histogram!(
        WAIT_SECONDS,
        metrics::Unit::Seconds,
        "Time duplicates waited for an in-flight twin or for a lock."
    );
}

/// Per-function metric keys, built once and kept for the life of the process.
#[cfg(feature = "metrics")]
pub(crate) mod metrics_impl {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    use std::time::Duration;

    use metrics::{Key, Label, Level, Metadata};

    use super::{CALLS_TOTAL, OUTCOMES, Op, Outcome, STEP_OUTCOMES, StepOutcome, strategy_name};
    use crate::Options;
    use crate::options::CallKeys;
    use crate::options::Strategy;

    static META: Metadata<'static> =
        Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

    // One label set per store operation, in `Op` order, shared by both metrics.
    static OP_LABELS: [[Label; 1]; 5] = [
        [Label::from_static_parts("op", "claim")],
        [Label::from_static_parts("op", "complete")],
        [Label::from_static_parts("op", "release")],
        [Label::from_static_parts("op", "renew")],
        [Label::from_static_parts("op", "issue")],
    ];
    macro_rules! op_keys {
        ($name:expr) => {
            [
                Key::from_static_parts($name, &OP_LABELS[0]),
                Key::from_static_parts($name, &OP_LABELS[1]),
                Key::from_static_parts($name, &OP_LABELS[2]),
                Key::from_static_parts($name, &OP_LABELS[3]),
                Key::from_static_parts($name, &OP_LABELS[4]),
            ]
        };
    }
    static STORE_SECONDS: [Key; 5] = op_keys!(super::STORE_SECONDS);
    static STORE_ERRORS: [Key; 5] = op_keys!(super::STORE_ERRORS_TOTAL);
    static LEASE_LOST: Key = Key::from_static_name(super::LEASE_LOST_TOTAL);
    static WAIT: Key = Key::from_static_name(super::WAIT_SECONDS);

    /// The keys of `function` under `strategy`: leaked once per distinct pair.
    fn intern(function: &'static str, strategy: Strategy) -> &'static CallKeys {
        type Map = HashMap<(&'static str, &'static str), &'static CallKeys>;
        static ALL: OnceLock<Mutex<Map>> = OnceLock::new();
        let strategy = strategy_name(strategy);
        leaked(&ALL, (function, strategy), || {
            let keys = OUTCOMES.map(|outcome| {
                let labels: &'static [Label] = Box::leak(Box::new([
                    Label::from_static_parts("function", function),
                    Label::from_static_parts("strategy", strategy),
                    Label::from_static_parts("outcome", outcome),
                ]));
                Key::from_static_parts(CALLS_TOTAL, labels)
            });
            CallKeys(keys)
        })
    }

    /// The value `make` builds for `key`, built and leaked once per distinct key in
    /// `all`, so a label set lives as long as the process and is never built again.
    fn leaked<K: Eq + std::hash::Hash, T: 'static>(
        all: &'static OnceLock<Mutex<HashMap<K, &'static T>>>,
        key: K,
        make: impl FnOnce() -> T,
    ) -> &'static T {
        let mut all = all
            .get_or_init(Mutex::default)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        all.entry(key)
            .or_insert_with(|| Box::leak(Box::new(make())))
    }

    /// The keys of a function, cached in its (usually `static`) options.
    #[inline]
    pub(crate) fn keys_of(opts: &Options) -> &'static CallKeys {
        opts.metric_keys
            .get_or_init(|| intern(opts.name(), opts.strategy()))
    }

    /// The keys of a dedup function known only by its key's scope (the in-process
    /// replay has no options at hand).
    #[inline]
    pub(crate) fn keys_of_scope(scope: &'static str) -> &'static CallKeys {
        type Slot = OnceLock<(&'static str, &'static CallKeys)>;
        static SLOTS: [Slot; 64] = [const { OnceLock::new() }; 64];
        slotted(&SLOTS, scope, |s| intern(s, Strategy::Dedup))
    }

    /// What `make` interned for `name`, found through a small table indexed by the
    /// string's address: function names and scopes are `'static` strings, one per
    /// function, so a lookup is one atomic load and one comparison; a slot taken by
    /// another function falls back to `make` (which looks in its map).
    #[inline]
    fn slotted<T: 'static, const N: usize>(
        slots: &'static [OnceLock<(&'static str, &'static T)>; N],
        name: &'static str,
        make: impl Fn(&'static str) -> &'static T,
    ) -> &'static T {
        let slot = &slots[(name.as_ptr() as usize >> 4) % N];
        match slot.get() {
            Some((s, keys)) if std::ptr::eq(*s, name) => keys,
            Some(_) => make(name),
            None => slot.get_or_init(|| (name, make(name))).1,
        }
    }

    /// `idem_steps_total`'s keys of one function, one per step outcome (in
    /// `StepOutcome` order; `failed` is never counted).
    pub(crate) struct StepKeys([Key; 5]);

    /// The step keys of `function`: leaked once per function, so counting a step
    /// allocates nothing (a label set built per step did, recorder or not).
    fn intern_steps(function: &'static str) -> &'static StepKeys {
        type Map = HashMap<&'static str, &'static StepKeys>;
        static ALL: OnceLock<Mutex<Map>> = OnceLock::new();
        leaked(&ALL, function, || {
            let keys = STEP_OUTCOMES.map(|outcome| {
                let labels: &'static [Label] = Box::leak(Box::new([
                    Label::from_static_parts("function", function),
                    Label::from_static_parts("outcome", outcome.as_str()),
                ]));
                Key::from_static_parts(super::STEPS_TOTAL, labels)
            });
            StepKeys(keys)
        })
    }

    /// Counts one step of `function` that ended as `outcome`.
    #[inline]
    pub(crate) fn step(function: &'static str, outcome: StepOutcome) {
        type Slot = OnceLock<(&'static str, &'static StepKeys)>;
        static SLOTS: [Slot; 64] = [const { OnceLock::new() }; 64];
        let keys = slotted(&SLOTS, function, intern_steps);
        metrics::with_recorder(|r| {
            r.register_counter(&keys.0[outcome as usize], &META)
                .increment(1)
        });
    }

    #[inline]
    pub(crate) fn call(keys: &'static CallKeys, outcome: Outcome) {
        metrics::with_recorder(|r| {
            r.register_counter(&keys.0[outcome as usize], &META)
                .increment(1)
        });
    }

    pub(crate) fn lease_lost() {
        metrics::with_recorder(|r| r.register_counter(&LEASE_LOST, &META).increment(1));
    }

    pub(crate) fn waited(d: Duration) {
        metrics::with_recorder(|r| r.register_histogram(&WAIT, &META).record(d.as_secs_f64()));
    }

    pub(crate) fn store_seconds(op: Op, d: Duration) {
        metrics::with_recorder(|r| {
            r.register_histogram(&STORE_SECONDS[op as usize], &META)
                .record(d.as_secs_f64())
        });
    }

    pub(crate) fn store_error(op: Op) {
        metrics::with_recorder(|r| {
            r.register_counter(&STORE_ERRORS[op as usize], &META)
                .increment(1)
        });
    }
}
