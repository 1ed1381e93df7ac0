//! Reading the ledger and the history against the failure model.
//!
//! Per key, with its body runs in order of their start and the times callers were told
//! it is completed:
//!
//! 1. A run that starts after a caller was told the key is completed means a completed
//!    record was lost: a violation on every store and setting the chaos program runs,
//!    except a failover or a split brain without `wait_for_replicas`, where the failure
//!    model (docs/failure-model.md) says the completions not yet replicated may be
//!    lost; those are counted with their age at the moment the primary was lost (the
//!    window: up to the promotion after a kill; in a split brain, up to the old
//!    primary's demotion, which comes after the network heals: its writes until then
//!    are dropped when it rejoins as a replica).
//!    A paused worker's own late effect (`pause::late`: landed between its stop and
//!    shortly after its resume), or a cut worker's (`cut_holder`: its call was in
//!    flight at the cut), is the documented window of plain dedup, counted.
//! 2. Two runs of a key with no completion between them are what the failure model
//!    allows after a crash or a store fault in flight: the first run's worker was killed
//!    or cut from the store between a second before its start and the second start, or
//!    a store fault happened then. In a split brain without `wait_for_replicas`, a run
//!    on the old primary's side during the split may be doubled on the other side:
//!    counted, not a violation. A pause of the first run's worker past its lease
//!    (`pause::explains`) or a completion of it the store refused (`lost <key>`, a lost
//!    lease, counted: `pause::lost_lease_explains`) explains it too; the workers' own
//!    events (`pause`, `resume`, `lost <key>`) are not store faults and explain nothing
//!    else. Either run may be the faulted holder's: a holder's body runs on past its
//!    lease, so its effect can land after the takeover's. Otherwise it is a violation
//!    (two runs with nothing to explain them).
//! 3. A worker cut from the store answers nothing but `Error::Store` for a call made
//!    wholly within the cut, and runs no body for a call it started during the cut (no
//!    body runs without a claim). Every effect names the claim (owner) it ran under, and
//!    no claim has two effects.
//!
//! Keys left in progress past their lease and errors of an unexpected kind are counted
//! by the caller and added to the violations. Each violation found here names its key
//! and a window; [`Violation::ops`] lists the operations of that key and the faults
//! around it, as Jepsen's checkers do.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use super::ledger::{Call, Contents, Event, Run};

/// One breach of the failure model, with what it involves.
#[derive(Debug, Clone)]
pub(crate) struct Violation {
    pub(crate) key: i64,
    /// The window of the history it involves (µs).
    pub(crate) from: i64,
    pub(crate) to: i64,
    pub(crate) what: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "key {}: {}", self.key, self.what)
    }
}

impl Violation {
    fn new(key: i64, from: i64, to: i64, what: String) -> Violation {
        Violation {
            key,
            from,
            to,
            what,
        }
    }

    /// The operations on its key and the faults from 2 s before its window to 1 s after,
    /// one per line, oldest first (at most 40).
    pub(crate) fn ops(&self, c: &Contents) -> String {
        let (from, to) = (self.from - 2_000_000, self.to + 1_000_000);
        let origin = c
            .calls
            .first()
            .map(|x| x.start)
            .into_iter()
            .chain(c.events.first().map(|e| e.at))
            .min()
            .unwrap_or(0);
        let t = |at: i64| format!("{:>10.6}s", (at - origin) as f64 / 1e6);
        let who = |inc: i32| {
            if inc == 0 {
                "controller".to_owned()
            } else {
                format!("worker {inc}")
            }
        };
        let mut lines: Vec<(i64, String)> = Vec::new();
        for x in c
            .calls
            .iter()
            .filter(|x| x.key == self.key && x.end >= from && x.start <= to)
        {
            let took = if x.cut_short() {
                "its process killed before it ended".to_owned()
            } else {
                format!("{} ms", (x.end - x.start) / 1000)
            };
            lines.push((
                x.start,
                format!(
                    "  {} {:<11} call  pay-{} -> {} ({took})",
                    t(x.start),
                    who(x.incarnation),
                    x.key,
                    x.outcome,
                ),
            ));
        }
        for r in c
            .runs
            .iter()
            .filter(|r| r.key == self.key && (from..=to).contains(&r.at))
        {
            lines.push((
                r.at,
                format!(
                    "  {} {:<11} effect pay-{} under claim {:016x}",
                    t(r.at),
                    who(r.incarnation),
                    r.key,
                    r.owner
                ),
            ));
        }
        for &(k, at) in &c.seen {
            if k == self.key && (from..=to).contains(&at) {
                lines.push((
                    at,
                    format!("  {} {:<11} told pay-{k} is completed", t(at), ""),
                ));
            }
        }
        for e in c.events.iter().filter(|e| (from..=to).contains(&e.at)) {
            let whom = if e.incarnation == 0 {
                String::new()
            } else {
                format!(" of worker {}", e.incarnation)
            };
            lines.push((
                e.at,
                format!("  {} {:<11} fault {}{whom}", t(e.at), "nemesis", e.kind),
            ));
        }
        lines.sort_by_key(|l| l.0);
        let n = lines.len();
        let mut out: String = lines.into_iter().take(40).map(|(_, l)| l + "\n").collect();
        if n > 40 {
            out.push_str(&format!("  … {} more\n", n - 40));
        }
        out
    }
}

/// What the ledger and the history show.
#[derive(Debug, Default)]
pub(crate) struct Verdict {
    pub(crate) effects: usize,
    pub(crate) keys: usize,
    /// Calls in the history.
    pub(crate) calls: usize,
    /// Calls made wholly within a cut by a cut worker, and how many of them ended in
    /// `Error::Store`.
    pub(crate) cut_calls: usize,
    pub(crate) cut_calls_failed: usize,
    /// The longest call of a cut worker that overlapped its cut (µs).
    pub(crate) longest_cut_call_us: i64,
    /// Keys that ran more than once, each time explained by a kill or a store fault.
    pub(crate) explained: usize,
    /// Calls whose body ran and whose completion got an error, not an answer (a store
    /// fault in flight at the completion; none without store faults).
    pub(crate) unanswered_completions: usize,
    /// Completions lost in a failover or split brain where the failure model allows it,
    /// with their age (µs) when the primary was lost.
    pub(crate) lost_in_failover: Vec<i64>,
    /// Completions lost in a split brain where the failure model allows it.
    pub(crate) lost_in_split: usize,
    /// Keys that ran on both sides of a split brain (allowed without
    /// `wait_for_replicas` only).
    pub(crate) doubled_in_split: usize,
    pub(crate) violations: Vec<Violation>,
}

/// Checks `c`; `lossy_failover`: failovers and split brains may lose unreplicated
/// completions and double keys (no `wait_for_replicas`).
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
        calls: c.calls.iter().filter(|x| !x.cut_short()).count(),
        unanswered_completions: c
            .calls
            .iter()
            .filter(|x| x.outcome == "ran-unacked")
            .count(),
        ..Verdict::default()
    };
    for (key, (runs, mut seen)) in by_key {
        if runs.is_empty() {
            let at = seen.first().copied().unwrap_or(0);
            v.violations.push(Violation::new(
                key,
                at,
                at,
                "reported completed but its body never ran".into(),
            ));
            continue;
        }
        v.keys += 1;
        seen.sort_unstable();
        let mut repeated = false;
        let mut split_doubled = false;
        for (i, r) in runs.iter().enumerate() {
            // Rule 1: the earliest completion reported before this run started.
            if let Some(&done) = seen.iter().find(|&&s| s < r.at) {
                // A paused or cut worker's body that ran on after its key was taken over.
                if super::pause::late(&c.events, r) || cut_holder(&c.events, &c.calls, r) {
                    repeated = true;
                    continue;
                }
                match failover_between(&c.events, done, r.at) {
                    Some(("split", _)) if lossy_failover => {
                        v.lost_in_split += 1;
                        repeated = true;
                    }
                    Some((_, lost)) if lossy_failover => {
                        v.lost_in_failover.push((lost - done).max(0));
                        repeated = true;
                    }
                    _ => v.violations.push(Violation::new(
                        key,
                        done,
                        r.at,
                        format!(
                            "ran again {} ms after a caller was told it completed",
                            (r.at - done) / 1000
                        ),
                    )),
                }
                continue;
            }
            if i == 0 {
                continue;
            }
            // Rule 2.
            let prev = &runs[i - 1];
            if lossy_failover && in_split(&c.events, prev.at) {
                split_doubled = true;
            } else if explained(&c.events, &c.calls, prev, r)
                || super::pause::explains(&c.events, prev, r)
                || super::pause::lost_lease_explains(&c.events, prev, r)
            {
                repeated = true;
            } else {
                v.violations.push(Violation::new(
                    key,
                    prev.at,
                    r.at,
                    format!(
                        "ran twice ({} ms apart) with no kill or store fault to explain it",
                        (r.at - prev.at) / 1000
                    ),
                ));
            }
        }
        if split_doubled {
            v.doubled_in_split += 1;
        } else if repeated {
            v.explained += 1;
        }
    }
    check_claims(c, &mut v);
    check_cuts(c, &mut v);
    v
}

/// Every effect ran under a claim, and no claim has two effects.
fn check_claims(c: &Contents, v: &mut Verdict) {
    let mut by_owner: HashMap<i64, &Run> = HashMap::new();
    for r in &c.runs {
        if r.owner == 0 {
            v.violations.push(Violation::new(
                r.key,
                r.at,
                r.at,
                format!("worker {} ran the body without a claim", r.incarnation),
            ));
        } else if let Some(first) = by_owner.insert(r.owner, r) {
            v.violations.push(Violation::new(
                r.key,
                first.at,
                r.at,
                format!("two effects under one claim ({:016x})", r.owner),
            ));
        }
    }
}

/// Rule 3: what cut workers did during their cuts.
fn check_cuts(c: &Contents, v: &mut Verdict) {
    for (i, e) in c.events.iter().enumerate() {
        if e.kind != "partition" {
            continue;
        }
        // The cut lasts until this worker's heal (or its kill, or the end).
        let until = c.events[i + 1..]
            .iter()
            .find(|h| h.incarnation == e.incarnation && (h.kind == "heal" || h.kind == "kill"))
            .map_or(i64::MAX, |h| h.at);
        let calls: Vec<&Call> = c
            .calls
            .iter()
            .filter(|x| x.incarnation == e.incarnation && x.end >= e.at && x.start <= until)
            .collect();
        for x in calls.iter().filter(|x| !x.cut_short()) {
            v.longest_cut_call_us = v.longest_cut_call_us.max(x.end - x.start);
            if x.start >= e.at && x.end <= until {
                v.cut_calls += 1;
                if x.outcome == "store-error" {
                    v.cut_calls_failed += 1;
                } else {
                    v.violations.push(Violation::new(
                        x.key,
                        x.start,
                        x.end,
                        format!(
                            "worker {} was cut from the store, yet its call answered {}",
                            x.incarnation, x.outcome
                        ),
                    ));
                }
            }
        }
        // No body runs for a call started within the cut.
        for r in c
            .runs
            .iter()
            .filter(|r| r.incarnation == e.incarnation && e.at <= r.at && r.at <= until)
        {
            let call = calls.iter().find(|x| made(x, r));
            if call.is_some_and(|x| x.start >= e.at) {
                v.violations.push(Violation::new(
                    r.key,
                    e.at,
                    r.at,
                    format!(
                        "worker {} ran the body of a call it made while cut from the store",
                        r.incarnation
                    ),
                ));
            }
        }
    }
}

/// The loss of a primary (a failover's kill, or a split brain's cut) after which
/// `done` could still be lost and that happened before `rerun`: its kind and time. A
/// failover loses what the dead primary had not replicated when the replica was
/// promoted; a split brain loses what the old primary took until it was demoted.
fn failover_between(events: &[Event], done: i64, rerun: i64) -> Option<(&str, i64)> {
    events.iter().enumerate().find_map(|(i, e)| {
        let end_kind = match e.kind.as_str() {
            "failover" => "promoted",
            "split" => "rejoined",
            _ => return None,
        };
        if e.at > rerun {
            return None;
        }
        let end = events[i + 1..]
            .iter()
            .find(|p| p.kind == end_kind)
            .map_or(i64::MAX, |p| p.at);
        (done <= end).then_some((e.kind.as_str(), e.at))
    })
}

/// Whether `at` falls within a split brain (from the cut to the old primary's
/// demotion).
fn in_split(events: &[Event], at: i64) -> bool {
    events.iter().enumerate().any(|(i, e)| {
        e.kind == "split"
            && e.at <= at
            && at
                <= events[i + 1..]
                    .iter()
                    .find(|h| h.kind == "rejoined")
                    .map_or(i64::MAX, |h| h.at)
    })
}

/// The longest lease of a chaos run (µs): 1 s, the netem run's.
const LEASE_US: i64 = 1_000_000;

fn explained(events: &[Event], calls: &[Call], prev: &Run, next: &Run) -> bool {
    // A cut explains a run that was in flight at it (failure model: "the keys in flight
    // at the cut ... run again after their lease"), up to the next run; and the next run
    // itself when it is a cut holder's (see `cut_holder`).
    let lease_before = prev.at - LEASE_US;
    cut_in_flight(events, calls, prev, next.at)
        || cut_holder(events, calls, next)
        || unacknowledged(calls, prev)
        || events.iter().any(|e| match e.kind.as_str() {
            "kill" => e.incarnation == prev.incarnation && prev.at <= e.at && e.at <= next.at,
            // Cuts are `cut_in_flight`'s; the ends of faults explain nothing.
            "partition" | "heal" | "healed" | "promoted" | "rejoined" => false,
            // A worker's pause or lost lease, not a store fault: see `pause`.
            kind if super::pause::is_worker_event(kind) => false,
            _ => lease_before <= e.at && e.at <= next.at,
        })
}

/// Whether `r`'s call ran its body and then got an error, not an answer, from its
/// completion: a store fault in flight at the completion (on the slow, lossy link, a
/// request that outlived the store timeout). The completion may never have landed, so
/// the key is free again when the lease ends, and the next caller runs it (failure
/// model: a holder past its lease). That call may have started after any fault event,
/// since the link is slow for the whole run.
fn unacknowledged(calls: &[Call], r: &Run) -> bool {
    calls
        .iter()
        .any(|c| made(c, r) && c.outcome == "ran-unacked")
}

/// Whether `c` is the call that made `r`: its worker's call of that key, in flight when
/// the effect was written.
fn made(c: &Call, r: &Run) -> bool {
    c.incarnation == r.incarnation && c.key == r.key && c.start <= r.at && r.at <= c.end
}

/// Whether `r` is a cut holder's effect: its worker was cut from the store while `r`'s
/// call was in flight, before the effect. Its lease may have run out during the cut and
/// its body runs on after the heal (plain dedup has no fence), so its effect may land
/// after the one, or even the reported completion, of the worker that took the key
/// over (failure model: a holder past its lease).
fn cut_holder(events: &[Event], calls: &[Call], r: &Run) -> bool {
    cut_in_flight(events, calls, r, r.at)
}

/// Whether `r`'s worker was cut from the store between the moment `r` counts as in
/// flight and `until`. In flight means from the start of its call, when the history has
/// it: a claim sent before the cut can be answered only after the heal, well past its
/// lease, and its body then runs. A call its worker's kill cut short counts from its
/// start too (its request may be held up on the cut link until after the heal, so its
/// effect can land more than a lease after the cut began). Without a call (a
/// recoverer's run), within a lease before the effect.
fn cut_in_flight(events: &[Event], calls: &[Call], r: &Run, until: i64) -> bool {
    let lease_before = r.at - LEASE_US;
    let from = calls
        .iter()
        .find(|c| made(c, r))
        .map_or(lease_before, |c| c.start.min(lease_before));
    events.iter().any(|e| {
        e.kind == "partition" && e.incarnation == r.incarnation && from <= e.at && e.at <= until
    })
}

#[cfg(test)]
pub(crate) mod tests;
