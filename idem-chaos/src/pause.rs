//! `--faults pause`: a worker stopped (SIGSTOP) for longer than its lease, then resumed
//! (SIGCONT), as a long GC pause, a VM migration or a laptop lid would.
//!
//! While it is stopped its heartbeats stop, its claims end with their lease and other
//! workers take its keys over. When it wakes, its bodies that were in flight go on: the
//! workload's bodies are plain dedup bodies (an effect written to the ledger, nothing
//! downstream to refuse it), so an effect they had not yet made lands beside the
//! taker's. Their completions are refused (counted as lost leases). That is the window
//! the failure model documents for plain dedup; the lock strategy's fencing token and the
//! SQL transactional mode close it (`tests/tests/redis_pause.rs`,
//! `tests/tests/sql_postgres_pause.rs`).
//!
//! The controller records a `pause` and a `resume` event (with the worker's incarnation)
//! around each stop; [`late`] and [`explains`] tell the checker which runs that window
//! accounts for, and [`Summary`] counts them.

use std::time::Duration;

use super::ledger::{Contents, Event, Run, lost_event};
use super::worker::LEASE;

/// How long a worker stays stopped: past its lease, by a second.
pub(crate) const HOLD: Duration = Duration::from_millis(LEASE.as_millis() as u64 + 1000);

/// How long after its resume a woken worker's in-flight bodies may still land an effect.
const AFTER: i64 = 2 * LEASE.as_micros() as i64;

/// Stops process `pid` (worker incarnation `inc`) for `hold`, then resumes it; records
/// both in the ledger. A worker killed meanwhile is simply gone.
pub(crate) async fn pause(
    pid: u32,
    inc: i32,
    hold: Duration,
    ledger: &super::ledger::Ledger,
) -> Result<(), String> {
    ledger.event("pause", inc).await?;
    signal("-STOP", pid)?;
    tokio::time::sleep(hold).await;
    // Resumed even if the event cannot be written: a worker must never stay stopped.
    let resumed = signal("-CONT", pid);
    ledger.event("resume", inc).await?;
    resumed
}

fn signal(sig: &str, pid: u32) -> Result<(), String> {
    let status = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .stderr(std::process::Stdio::null())
        .status()
        .map_err(|e| format!("kill {sig}: {e}"))?;
    // A worker that already exited (killed, or done) cannot be signalled: not a fault.
    let _ = status;
    Ok(())
}

/// The pauses of a run: (incarnation, stop, resume), µs by the ledger's clock. A pause
/// with no resume recorded lasted until the end.
fn pauses(events: &[Event]) -> Vec<(i32, i64, i64)> {
    events
        .iter()
        .enumerate()
        .filter(|(_, e)| e.kind == "pause")
        .map(|(i, p)| {
            let resumed = events[i + 1..]
                .iter()
                .find(|r| r.kind == "resume" && r.incarnation == p.incarnation)
                .map_or(i64::MAX / 2, |r| r.at);
            (p.incarnation, p.at, resumed)
        })
        .collect()
}

/// Whether `r` is a paused worker's late effect: a run of that worker that landed
/// between its stop and shortly after its resume (a body in flight when it was stopped).
pub(crate) fn late(events: &[Event], r: &Run) -> bool {
    pauses(events)
        .iter()
        .any(|&(inc, stop, resume)| inc == r.incarnation && stop <= r.at && r.at <= resume + AFTER)
}

/// Whether a pause explains `next` running after `prev` with no completion between:
/// `prev`'s worker was stopped after it started `prev` (within a lease of it) and before
/// `next` started, so `prev`'s claim ended with its lease; or `next` is a late effect.
pub(crate) fn explains(events: &[Event], prev: &Run, next: &Run) -> bool {
    let lease = LEASE.as_micros() as i64;
    late(events, next)
        || pauses(events).iter().any(|&(inc, stop, resume)| {
            inc == prev.incarnation
                && prev.at - lease <= stop
                && prev.at <= resume
                && stop <= next.at
        })
}

/// Whether `kind` is an event about one worker (a pause, a resume, a lost lease) rather
/// than a fault of the store.
pub(crate) fn is_worker_event(kind: &str) -> bool {
    kind == "pause" || kind == "resume" || kind.starts_with("lost ")
}

/// Whether `next` running after `prev` is a visible double: the worker of either run
/// reported, after its run, that the store refused its completion of that key (lease
/// lost, counted in `idem_lease_lost_total`). The refused one may be the later effect:
/// a holder whose lease ran out runs its body on, after the key was taken over.
pub(crate) fn lost_lease_explains(events: &[Event], prev: &Run, next: &Run) -> bool {
    let kind = lost_event(u64::try_from(prev.key).unwrap_or(u64::MAX));
    debug_assert_eq!(prev.key, next.key);
    events.iter().any(|e| {
        e.kind == kind
            && [prev, next]
                .iter()
                .any(|r| e.incarnation == r.incarnation && e.at >= r.at)
    })
}

/// Keys that ran more than once where every extra run follows a lost lease of the run
/// before it (visible doubles).
pub(crate) fn lost_lease_doubles(c: &Contents) -> usize {
    let mut keys = std::collections::BTreeMap::<i64, Vec<&Run>>::new();
    for r in &c.runs {
        keys.entry(r.key).or_default().push(r);
    }
    keys.values()
        .filter(|runs| {
            runs.windows(2)
                .any(|w| lost_lease_explains(&c.events, w[0], w[1]))
        })
        .count()
}

/// What the pauses of a run did.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Summary {
    /// Workers stopped past their lease.
    pub(crate) pauses: usize,
    /// Keys a paused worker was running (a run within a lease before its stop, or
    /// landing during it) that another worker ran again after the stop.
    pub(crate) taken_over: usize,
    /// Effects of a paused worker that landed after its stop began (sent just before
    /// it, or made by a body that went on when it woke), for a key another worker ran
    /// after the stop: the doubles plain dedup lets through.
    pub(crate) late_effects: usize,
    /// Of those, the ones made after the worker woke.
    pub(crate) after_waking: usize,
}

/// Counts what the pauses in `c` did.
pub(crate) fn summary(c: &Contents) -> Summary {
    let lease = LEASE.as_micros() as i64;
    let all = pauses(&c.events);
    let mut s = Summary {
        pauses: all.len(),
        ..Summary::default()
    };
    let mut keys = std::collections::BTreeMap::<i64, Vec<&Run>>::new();
    for r in &c.runs {
        keys.entry(r.key).or_default().push(r);
    }
    for runs in keys.values() {
        let mut taken = false;
        for r in runs {
            for &(inc, stop, resume) in &all {
                if inc != r.incarnation || r.at < stop - lease || r.at > resume + AFTER {
                    continue;
                }
                let again = runs.iter().any(|o| o.incarnation != inc && o.at >= stop);
                if !again {
                    continue;
                }
                taken = true;
                if r.at >= stop {
                    s.late_effects += 1;
                    if r.at >= resume {
                        s.after_waking += 1;
                    }
                }
            }
        }
        if taken {
            s.taken_over += 1;
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::tests::{ev, run};

    const S: i64 = 1_000_000;

    #[test]
    fn a_late_effect_is_the_paused_workers_own_run_after_its_stop() {
        let events = [ev("pause", 1, 10 * S), ev("resume", 1, 13 * S)];
        assert!(late(&events, &run(7, 1, 13 * S + 5_000)));
        assert!(late(&events, &run(7, 1, 11 * S)), "landed while stopped");
        assert!(!late(&events, &run(7, 2, 13 * S)), "another worker");
        assert!(!late(&events, &run(7, 1, 9 * S)), "before the stop");
        assert!(!late(&events, &run(7, 1, 30 * S)), "long after waking");
    }

    #[test]
    fn a_takeover_during_a_pause_is_explained_and_counted() {
        let c = Contents {
            // Worker 1 started key 7, was stopped; worker 2 took it over; 1 woke and
            // wrote its effect again (a body that writes after waking).
            runs: vec![
                run(7, 1, 10 * S - 5_000),
                run(7, 2, 12 * S),
                run(7, 1, 13 * S + 1),
            ],
            seen: vec![(7, 12 * S + 100)],
            events: vec![ev("pause", 1, 10 * S), ev("resume", 1, 13 * S)],
            calls: vec![],
        };
        assert!(explains(&c.events, &c.runs[0], &c.runs[1]));
        assert!(late(&c.events, &c.runs[2]));
        let s = summary(&c);
        assert_eq!(
            (s.pauses, s.taken_over, s.late_effects, s.after_waking),
            (1, 1, 1, 1)
        );
        // Without the pause nothing explains the second run.
        assert!(!explains(&[], &c.runs[0], &c.runs[1]));
    }

    #[test]
    fn a_lost_lease_explains_the_next_run_of_that_key_only() {
        let runs = [
            run(7, 1, 10 * S),
            run(7, 2, 12 * S),
            run(8, 1, 10 * S),
            run(8, 2, 12 * S),
        ];
        let events = [ev(&lost_event(7), 1, 12 * S + 10)];
        assert!(lost_lease_explains(&events, &runs[0], &runs[1]));
        assert!(
            !lost_lease_explains(&events, &runs[2], &runs[3]),
            "another key"
        );
        let before = [ev(&lost_event(7), 1, 9 * S)];
        assert!(
            !lost_lease_explains(&before, &runs[0], &runs[1]),
            "an older loss"
        );
    }
}
