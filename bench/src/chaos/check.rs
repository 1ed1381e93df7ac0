//! Reading the ledger against the failure model.
//!
//! Per key, with its body runs in order of their start and the times callers were told
//! it is completed:
//!
//! 1. A run that starts after a caller was told the key is completed means a completed
//!    record was lost: a violation on every store and setting the chaos program runs,
//!    except a failover without `wait_for_replicas`, where the README says the
//!    completions not yet replicated may be lost; those are counted with their age at
//!    the moment the primary died (the window).
//! 2. Two runs of a key with no completion between them are what the failure model
//!    allows after a crash or a store fault in flight: the first run's worker was killed
//!    between the two starts, or a store fault happened between a second before the
//!    first start and the second start. Otherwise it is a violation (two runs with
//!    nothing to explain them).
//!
//! Keys left in progress past their lease and errors of an unexpected kind are counted
//! by the caller and added to the violations.

use std::collections::BTreeMap;

use super::ledger::{Contents, Event, Run};

/// What the ledger shows.
#[derive(Debug, Default)]
pub(crate) struct Verdict {
    pub(crate) effects: usize,
    pub(crate) keys: usize,
    /// Keys that ran more than once, each time explained by a kill or a store fault.
    pub(crate) explained: usize,
    /// Completions lost in a failover where the failure model allows it, with their age
    /// (µs) when the primary died.
    pub(crate) lost_in_failover: Vec<i64>,
    pub(crate) violations: Vec<String>,
}

/// Checks `c`; `lossy_failover`: failovers may lose unreplicated completions.
pub(crate) fn check(c: &Contents, lossy_failover: bool) -> Verdict {
    let mut by_key: BTreeMap<i64, (Vec<Run>, Vec<i64>)> = BTreeMap::new();
    for r in &c.runs {
        by_key.entry(r.key).or_default().0.push(*r);
    }
    for (k, at) in &c.seen {
        by_key.entry(*k).or_default().1.push(*at);
    }
    let mut v = Verdict {
        effects: c.runs.len(),
        ..Verdict::default()
    };
    for (key, (runs, mut seen)) in by_key {
        if runs.is_empty() {
            v.violations.push(format!(
                "key {key}: reported completed but its body never ran"
            ));
            continue;
        }
        v.keys += 1;
        seen.sort_unstable();
        let mut repeated = false;
        for (i, r) in runs.iter().enumerate() {
            // Rule 1: the earliest completion reported before this run started.
            if let Some(&done) = seen.iter().find(|&&s| s < r.at) {
                // A paused worker's body that woke after its key was taken over.
                if super::pause::late(&c.events, r) {
                    repeated = true;
                    continue;
                }
                match failover_between(&c.events, done, r.at) {
                    Some(kill) if lossy_failover => {
                        v.lost_in_failover.push((kill - done).max(0));
                        repeated = true;
                    }
                    _ => v.violations.push(format!(
                        "key {key}: ran again {} ms after a caller was told it completed",
                        (r.at - done) / 1000
                    )),
                }
                continue;
            }
            if i == 0 {
                continue;
            }
            // Rule 2.
            let prev = &runs[i - 1];
            if explained(&c.events, prev, r)
                || super::pause::explains(&c.events, prev, r)
                || super::pause::lost_lease_explains(&c.events, prev, r)
            {
                repeated = true;
            } else {
                v.violations.push(format!(
                    "key {key}: ran twice ({} ms apart) with no kill or store fault to explain it",
                    (r.at - prev.at) / 1000
                ));
            }
        }
        if repeated {
            v.explained += 1;
        }
    }
    v
}

/// The kill of a failover that happened after `done` and whose promotion was over
/// before `rerun`: the time of the kill.
fn failover_between(events: &[Event], done: i64, rerun: i64) -> Option<i64> {
    events.iter().enumerate().find_map(|(i, e)| {
        if e.kind != "failover" || e.at > rerun {
            return None;
        }
        let promoted = events[i + 1..]
            .iter()
            .find(|p| p.kind == "promoted")
            .map_or(i64::MAX, |p| p.at);
        (done <= promoted).then_some(e.at)
    })
}

fn explained(events: &[Event], prev: &Run, next: &Run) -> bool {
    events.iter().any(|e| {
        if e.kind == "kill" {
            e.incarnation == prev.incarnation && prev.at <= e.at && e.at <= next.at
        } else if super::pause::is_worker_event(&e.kind) {
            false // a worker's pause or lost lease, not a store fault: see `pause`
        } else {
            prev.at - 1_000_000 <= e.at && e.at <= next.at
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(key: i64, incarnation: i32, at: i64) -> Run {
        Run {
            key,
            incarnation,
            at,
        }
    }

    fn ev(kind: &str, incarnation: i32, at: i64) -> Event {
        Event {
            kind: kind.into(),
            incarnation,
            at,
        }
    }

    #[test]
    fn a_run_after_a_reported_completion_is_a_violation() {
        let c = Contents {
            runs: vec![run(1, 1, 10), run(1, 2, 5_000_000)],
            seen: vec![(1, 100)],
            events: vec![ev("kill", 1, 200)],
        };
        assert_eq!(check(&c, false).violations.len(), 1);
    }

    #[test]
    fn a_rerun_after_the_first_runner_was_killed_is_explained() {
        let c = Contents {
            runs: vec![run(1, 1, 10), run(1, 2, 3_000_000)],
            seen: vec![],
            events: vec![ev("kill", 1, 20), ev("kill", 2, 4_000_000)],
        };
        let v = check(&c, false);
        assert!(v.violations.is_empty(), "{:?}", v.violations);
        assert_eq!(v.explained, 1);
    }

    #[test]
    fn two_runs_with_nothing_between_them_are_a_violation() {
        let c = Contents {
            runs: vec![run(1, 1, 10_000_000), run(1, 2, 13_000_000)],
            seen: vec![],
            // A kill of another worker, and a fault long before the first run.
            events: vec![ev("kill", 3, 11_000_000), ev("restart", 0, 1_000_000)],
        };
        assert_eq!(check(&c, false).violations.len(), 1);
    }

    #[test]
    fn a_failover_loss_counts_only_when_the_model_allows_it() {
        let c = Contents {
            runs: vec![run(1, 1, 10), run(1, 2, 9_000_000)],
            seen: vec![(1, 1_000)],
            events: vec![ev("failover", 0, 2_000), ev("promoted", 0, 3_000_000)],
        };
        let lossy = check(&c, true);
        assert!(lossy.violations.is_empty());
        assert_eq!(lossy.lost_in_failover, vec![1_000]);
        assert_eq!(check(&c, false).violations.len(), 1);
    }
}
