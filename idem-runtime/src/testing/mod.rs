//! The conformance suite: one set of semantic tests that any [`Store`] must pass.
//!
//! Run it on your store with one macro call in an integration test; it expands to one
//! `#[test]` per case, each on its own multi-threaded tokio runtime:
//!
//! ```
//! use std::sync::Arc;
//! use idem_runtime::{MemoryStore, Store};
//!
//! idem_runtime::conformance_tests!(memory, || async { Arc::new(MemoryStore::new()) as Arc<dyn Store> });
//! # fn main() {}
//! ```
//!
//! The factory runs once per case. Every case uses a fresh random namespace, so a
//! shared server (one Redis, one database) may serve all cases at once. Cases use real
//! time with margins of several hundred milliseconds and assert behaviour only, never
//! how long something took.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{Barrier, Notify};

use crate::codec::{NoReplay, ReplayOk, ReplayResult};
use crate::store::{ClaimKind, ClaimOutcome, ClaimRequest, Owner};
use crate::{Error, Fingerprint, Idem, Key, Options, Store};

/// Runs one case: builds a multi-threaded runtime, makes the store, runs the case.
pub fn run_case<M, MF, C, CF>(make: M, case: C)
where
    M: FnOnce() -> MF,
    MF: Future<Output = Arc<dyn Store>>,
    C: FnOnce(Arc<dyn Store>) -> CF,
    CF: Future<Output = ()>,
{
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(async {
        let store = make().await;
        case(store).await;
    });
}

/// Expands to one `#[test]` per conformance case, in a module named `$name`.
/// `$make` is a closure returning a future of `Arc<dyn Store>`.
#[macro_export]
macro_rules! conformance_tests {
    ($name:ident, $make:expr) => {
        $crate::__conformance_cases!([$crate::__case_tests] $name, $make, []);
    };
}

/// Expands to one `#[test]` per conformance case of the toolbox primitives (versioned
/// values, state-machine moves, Bloom bitmaps), in a module named `$name`; see
/// [`conformance_tests!`]. Separate so that a store without these primitives still runs
/// the main suite.
///
/// ```
/// use std::sync::Arc;
/// use idem_runtime::{MemoryStore, Store};
///
/// idem_runtime::toolbox_conformance_tests!(memory_toolbox, || async { Arc::new(MemoryStore::new()) as Arc<dyn Store> });
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! toolbox_conformance_tests {
    ($name:ident, $make:expr) => {
        $crate::__toolbox_conformance_cases!([$crate::__case_tests] $name, $make, [toolbox]);
    };
}

// The two lists below are the only place a case is named. Each hands its list
// (`module::case`, the module being the case's private file under `cases/`) to the
// macro in brackets: `__case_tests` writes the tests in the user's crate, and
// `export_cases` makes each case public under `cases` (or `cases::toolbox`). A case
// function left out of its list is therefore never exported, and the build fails on it
// as dead code; a listed name without a function fails to resolve.

/// The main suite's cases. Not a public API.
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_cases {
    ([$($then:tt)*] $($args:tt)*) => {
        $($then)*! { $($args)*;
            dedup::dedup_concurrent_calls_run_once,
            dedup::dedup_replays_completed,
            dedup::dedup_err_releases_and_retry_runs,
            dedup::dedup_cache_err_replays_err,
            dedup::dedup_reject_mode,
            dedup::dedup_wait_zero_fails_fast,
            dedup::waiters_take_over_when_twin_fails,
            dedup::fingerprint_mismatch,
            dedup::distinct_keys_do_not_interfere,
            dedup::namespaces_are_isolated,
            dedup::ttl_expiry_runs_again,
            lease::cancellation_releases_claim,
            cancel::dropped_after_its_body_never_runs_again,
            cancel::timeout_sweep_never_runs_twice_nor_sticks,
            cancel::abort_storm_runs_each_key_once,
            cancel::dropped_during_its_claim_never_holds_the_key,
            cancel::dropped_during_its_completion_still_completes,
            lease::crashed_holder_taken_over_after_lease,
            lease::heartbeat_keeps_long_body_claimed,
            lease::stale_owner_cannot_complete_release_or_renew,
            lease::corrupt_record_is_an_error,
            lock::lock_excludes_and_fences_increase,
            lock::lock_wait_zero_is_locked,
            token::token_consumed_once,
            token::token_invalid_and_expiry,
            token::token_err_returns_token,
            token::issue_refuses_existing,
            inspect::inspect_reports_each_state,
            inspect::forget_removes_whatever_the_state,
            inspect::forget_in_progress_makes_the_old_completion_a_lost_lease,
            inspect::forget_wakes_waiters,
            inspect::count_records_by_function_and_state,
            steps::steps_resume_after_err,
            steps::steps_resume_after_a_dropped_future,
            steps::steps_survive_an_expired_lease,
            steps::steps_50_duplicates_run_each_step_once,
            steps::step_key_is_stable_across_attempts,
            steps::verified_step_with_intent_asks_verify,
            steps::step_misuse_is_an_error,
            steps::steps_resume_a_returned_token,
            steps::forget_drops_the_journal,
            step_edges::another_payload_never_resumes_a_journal,
            step_edges::dropped_while_a_step_is_journaled_never_reruns_it,
            step_edges::timeout_sweep_over_steps_never_reruns_one,
            step_edges::verified_retried_in_call_asks_verify,
            step_edges::stale_holder_runs_no_later_step,
            step_edges::in_call_retries_replay_or_run_once,
            step_edges::journal_outlives_a_slow_failure,
            recovery::recovery_finishes_a_dropped_call,
            recovery::recovery_takes_over_an_expired_lease,
            recovery::two_recoverers_never_run_one_call_twice,
            recovery::an_err_is_not_recovered,
            recovery::an_unknown_function_is_left_alone,
            recovery::the_last_attempt_parks_the_call,
        }
    };
}

/// The toolbox suite's cases. Not a public API.
#[doc(hidden)]
#[macro_export]
macro_rules! __toolbox_conformance_cases {
    ([$($then:tt)*] $($args:tt)*) => {
        $($then)*! { $($args)*;
            versioned::versioned_compare_and_set,
            versioned::versioned_ttl_expiry,
            versioned::optimistic_balance_50_tasks,
            state_machine::state_machine_moves,
            state_machine::state_machine_concurrent_movers,
            state_machine::state_machine_body_failure_and_cancel,
            state_machine::state_machine_crashed_hold_taken_over,
            bloom::bloom_insert_and_contains,
            bloom::bloom_ttl_is_not_refreshed,
            bloom::bloom_false_positive_rate,
            bloom::bloom_dedup_never_drops_new_ids,
            bloom::bloom_new_verdict_expires_with_the_records,
        }
    };
}

/// One `#[test]` per listed case, in a module `$name`, each running the case exported
/// under `cases` (or `cases::$group`). Not a public API.
#[doc(hidden)]
#[macro_export]
macro_rules! __case_tests {
    ($name:ident, $make:expr, [$($group:ident)?]; $($module:ident :: $case:ident),* $(,)?) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            use $crate::testing::cases $(::$group)? as __cases;
            $(
                #[test]
                fn $case() {
                    $crate::testing::run_case($make, __cases::$case);
                }
            )*
        }
    };
}

/// Makes each listed case public where this is invoked.
macro_rules! export_cases {
    (; $($module:ident :: $case:ident),* $(,)?) => {
        $(pub use $module::$case;)*
    };
}

fn idem(store: &Arc<dyn Store>) -> Idem {
    let mut b = [0u8; 6];
    getrandom::fill(&mut b).expect("os rng");
    let ns: String = b.iter().map(|x| format!("{x:02x}")).collect();
    Idem::builder()
        .shared_store(store.clone())
        .namespace(format!("conformance-{ns}"))
        .build()
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

// A case left out of its list is dead code: make that an error in every build.
#[deny(dead_code)]
pub mod cases;
