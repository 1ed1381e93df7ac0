//! What a run prints: the line that opens it, and at the end what was done to it, what
//! the workers and the checker counted, and every violation.

use super::backend::Backend;
use super::faults::Schedule;
use super::fleet::Fleet;
use super::lab::Lab;
use crate::check::Verdict;
use crate::ledger::Contents;
use crate::proxy::Proxy;
use crate::worker::LEASE;
use crate::{Fault, GRACE, Opts, pause};

/// The run's opening line: the store, the workload and the faults asked for.
pub(super) fn opening(o: &Opts, backend: &Backend, replicas: usize, keys: u64) -> String {
    format!(
        "idem-chaos: store {}, {} s, {} workers x {} tasks, {keys} keys, seed {}{}",
        backend.describe(o, replicas),
        o.seconds,
        o.workers,
        o.tasks,
        o.seed,
        if o.faults.is_empty() {
            String::new()
        } else {
            let named: Vec<String> = o
                .faults
                .iter()
                .map(|&f| {
                    let how = match f {
                        Fault::Partition => "network namespaces, nftables drop",
                        Fault::Pause => "SIGSTOP past the lease",
                        Fault::Netem => "a slow, lossy proxy",
                    };
                    format!("{} ({how})", f.name())
                })
                .collect();
            format!(", faults: {}", named.join(", "))
        }
    )
}

/// How the run ended, besides the checker's verdict.
pub(super) struct Ending {
    /// Keys still in progress after their lease in the final sweep.
    pub(super) stuck: usize,
    /// Keys the store never answered in the final sweep.
    pub(super) unanswered: Vec<String>,
    /// Workers still calling after the grace period.
    pub(super) stragglers: usize,
    /// Calls still recoverable (not parked) once the controller's recoverer had the
    /// lease, its interval and a slack to finish them.
    pub(super) unrecovered: Vec<String>,
}

/// Prints the end of the run; returns the number of violations.
#[allow(clippy::too_many_arguments)]
pub(super) fn print(
    o: &Opts,
    fleet: &Fleet,
    lab: Option<&Lab>,
    netem: Option<&Proxy>,
    schedule: &Schedule,
    ending: &Ending,
    contents: &Contents,
    verdict: &Verdict,
) -> usize {
    let reports = fleet.reports.lock().unwrap_or_else(|p| p.into_inner());
    let total = reports.total();
    // The checker's violations are printed with their operations; these without.
    let mut violations: Vec<String> = reports.unexpected.clone();
    violations
        .extend((0..ending.stuck).map(|_| "a key still in progress after its lease".to_owned()));
    violations.extend(
        ending
            .unanswered
            .iter()
            .map(|k| format!("key {k}: no answer from the store in the final sweep")),
    );
    violations.extend(ending.unrecovered.iter().map(|c| {
        format!("{c}: still recoverable after the lease, the recovery interval and a slack")
    }));
    if lab.is_some() {
        // A call outlives its bounds only if it hangs; a hung worker does not stop.
        violations.extend((0..ending.stragglers).map(|_| {
            format!(
                "a worker still calling {} s after the deadline (a call not bounded by its timeout)",
                GRACE.as_secs()
            )
        }));
    }

    println!(
        "workers killed: {} (SIGKILL), {} more exited early and were replaced",
        schedule.killed, fleet.failed_starts
    );
    let (faults, fault_kind) = (schedule.faults, schedule.fault_kind);
    let fault_name = match fault_kind {
        "cut" => "connection cuts",
        "restart" => "restarts (SIGKILL)",
        "failover" => "failovers (primary SIGKILLed, replica promoted)",
        "partition" => "partitions (nftables drop, healed)",
        _ => "store faults",
    };
    println!("store faults: {faults} {fault_name}");
    if let Some(lab) = lab {
        println!(
            "partitions: {} app-store cuts ({} worker hosts cut in all), {} split brains (primary cut from its replica and two sentinels, replica promoted, healed)",
            lab.cuts, lab.slots_cut, lab.splits
        );
    }
    println!(
        "failovers: {}",
        if fault_kind == "failover" {
            faults
        } else {
            lab.map_or(0, |l| l.splits)
        }
    );
    println!(
        "calls: {} (body ran {}, replayed {}, store errors {}, in progress {}, unexpected {})",
        total[0], total[1], total[2], total[3], total[4], total[5]
    );
    counts(verdict);
    if o.has(Fault::Pause) {
        let p = pause::summary(contents);
        println!(
            "pauses: {} workers stopped {} ms (past their {} ms lease); {} keys taken over; \
             {} effects of paused workers landed after the stop, {} of them made after waking \
             (plain dedup: a body goes on when it wakes)",
            p.pauses,
            pause::HOLD.as_millis(),
            LEASE.as_millis(),
            p.taken_over,
            p.late_effects,
            p.after_waking
        );
    }
    if let Some(proxy) = netem {
        println!(
            "netem: 50-200 ms each way, 5% loss, 1 s leases; {}",
            proxy.stats.line()
        );
    }
    println!(
        "leases lost: {} (completions refused, idem_lease_lost_total); {} keys ran again after a lost lease, each counted",
        total[6],
        pause::lost_lease_doubles(contents)
    );
    println!("stuck keys: {}", ending.stuck);
    for v in verdict.violations.iter().take(10) {
        println!("violation: {v}");
        print!("{}", v.ops(contents));
    }
    for v in verdict.violations.iter().skip(10).take(20) {
        println!("violation: {v}");
    }
    for v in violations.iter().take(20) {
        println!("violation: {v}");
    }
    let n = verdict.violations.len() + violations.len();
    println!("violations: {n}");
    n
}

/// The checker's counts.
fn counts(verdict: &Verdict) {
    if verdict.longest_cut_call_us == 0 {
        println!("history: {} calls recorded", verdict.calls);
    } else {
        println!(
            "history: {} calls recorded; {} made wholly within a cut by a cut worker, {} of them Error::Store; the longest call overlapping a cut took {} ms",
            verdict.calls,
            verdict.cut_calls,
            verdict.cut_calls_failed,
            verdict.longest_cut_call_us / 1000
        );
    }
    println!(
        "effects: {} for {} keys; {} keys ran more than once, each after a kill or store fault in flight",
        verdict.effects, verdict.keys, verdict.explained
    );
    if verdict.unanswered_completions > 0 {
        println!(
            "completions unanswered: {} calls ran their body and got a store error from their completion (idem retried it in the background; the key is free again when the lease ends)",
            verdict.unanswered_completions
        );
    }
    if !verdict.lost_in_failover.is_empty() {
        let max = verdict.lost_in_failover.iter().max().copied().unwrap_or(0);
        println!(
            "lost in failovers (no wait_for_replicas): {} completed keys ran again; the oldest was confirmed {} ms before the primary was lost",
            verdict.lost_in_failover.len(),
            max / 1000
        );
    }
    if verdict.lost_in_split > 0 {
        println!(
            "lost in split brains (no wait_for_replicas): {} completed keys ran again (completions the old primary acknowledged before it was demoted)",
            verdict.lost_in_split
        );
    }
    if verdict.doubled_in_split > 0 {
        println!(
            "doubled in split brains (no wait_for_replicas): {} keys ran on both sides",
            verdict.doubled_in_split
        );
    }
}
