//! The faults, one function each, and the schedule that draws when each strikes next:
//! a worker killed, a store fault, some workers cut from the store, a Sentinel split
//! brain, a worker paused past its lease. Every draw comes from one seeded generator in
//! a fixed order, so a seed repeats its run.

use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use super::backend::Backend;
use super::fleet::Fleet;
use super::lab::Lab;
use crate::ledger::Ledger;
use crate::netns::Host;
use crate::rng::Rng;
use crate::servers::Sentinels;
use crate::{Fault, Opts, pause};

/// When each fault strikes next, and what has struck so far.
pub(super) struct Schedule {
    rng: Rng,
    /// The end of the run: no fault starts that would not be over by then.
    pub(super) end: Instant,
    next_kill: Instant,
    next_fault: Instant,
    next_pause: Instant,
    pub(super) killed: usize,
    /// Store faults or partitions made, and the last one's kind.
    pub(super) faults: usize,
    pub(super) fault_kind: &'static str,
    /// The paused workers' pauses, each resuming its worker when it ends.
    pauses: Vec<JoinHandle<Result<(), String>>>,
}

impl Schedule {
    pub(super) fn new(o: &Opts, end: Instant) -> Schedule {
        let mut rng = Rng::new(o.seed);
        let next_kill = Instant::now() + Duration::from_millis(1000 + rng.below(1500));
        let next_fault = Instant::now() + Duration::from_millis(4000 + rng.below(3000));
        // (The seed draws nothing for pauses otherwise, so a run without them repeats.)
        let mut next_pause = Instant::now();
        if o.has(Fault::Pause) {
            next_pause += Duration::from_millis(2000 + rng.below(2000));
        }
        Schedule {
            rng,
            end,
            next_kill,
            next_fault,
            next_pause,
            killed: 0,
            faults: 0,
            fault_kind: "",
            pauses: Vec::new(),
        }
    }

    /// When due: SIGKILLs a worker at random and starts its replacement in its slot;
    /// returns the new incarnation with its slot.
    pub(super) async fn kill(
        &mut self,
        now: Instant,
        fleet: &mut Fleet,
        ledger: &Ledger,
    ) -> Result<Option<(i32, usize)>, String> {
        if now < self.next_kill
            || fleet.workers.is_empty()
            || now + Duration::from_secs(1) >= self.end
        {
            return Ok(None);
        }
        let i = usize::try_from(self.rng.below(fleet.workers.len() as u64)).unwrap_or(0);
        let slot = fleet.kill(i, ledger).await?;
        self.killed += 1;
        let new = (fleet.spawn(slot)?, slot);
        self.next_kill = Instant::now() + Duration::from_millis(800 + self.rng.below(2000));
        Ok(Some(new))
    }

    /// When due, one fault of the store itself (a connection cut, a restart, a failover).
    pub(super) async fn store_fault(
        &mut self,
        now: Instant,
        backend: &mut Backend,
        ledger: &Ledger,
        run: &str,
    ) -> Result<(), String> {
        if now < self.next_fault || now + Duration::from_secs(3) >= self.end {
            return Ok(());
        }
        if let Some(kind) = backend.fault(ledger, run).await? {
            self.faults += 1;
            self.fault_kind = kind;
        }
        self.next_fault = Instant::now() + Duration::from_millis(6000 + self.rng.below(6000));
        Ok(())
    }

    /// A partition run's turn: cuts the workers just started on a cut host too, heals a
    /// cut that is over, and when due makes the next partition: on Sentinel a split
    /// brain first (so a short run has one), then cuts and split brains in turn.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn partition(
        &mut self,
        now: Instant,
        o: &Opts,
        backend: &Backend,
        lab: &mut Lab,
        fleet: &Fleet,
        ledger: &Ledger,
        new: Vec<(i32, usize)>,
    ) -> Result<(), String> {
        for (inc, slot) in new {
            if lab.cut.contains(&slot) {
                ledger.event("partition", inc).await?;
            }
        }
        if lab.heal_at.is_some_and(|t| now >= t) {
            lab.heal(fleet, ledger).await?;
            self.next_fault = Instant::now() + Duration::from_millis(2000 + self.rng.below(4000));
        }
        if lab.heal_at.is_some()
            || now < self.next_fault
            || now + Duration::from_secs(8) >= self.end
        {
            return Ok(());
        }
        match backend {
            Backend::Sentinel(s) if self.faults.is_multiple_of(2) => {
                split_brain(s, lab, ledger, &mut self.rng).await?;
            }
            _ => self.cut(o, lab, fleet, ledger).await?,
        }
        self.faults += 1;
        self.fault_kind = "partition";
        self.next_fault = Instant::now() + Duration::from_millis(2000 + self.rng.below(4000));
        Ok(())
    }

    /// Some workers (at least one, at times all) cut from the store for 0.5 to 5 s:
    /// shorter and longer than the lease.
    async fn cut(
        &mut self,
        o: &Opts,
        lab: &mut Lab,
        fleet: &Fleet,
        ledger: &Ledger,
    ) -> Result<(), String> {
        let n = 1 + self.rng.below(o.workers as u64) as usize;
        let mut slots: Vec<usize> = (0..o.workers).collect();
        for i in 0..slots.len() {
            let j = i + self.rng.below((slots.len() - i) as u64) as usize;
            slots.swap(i, j);
        }
        slots.truncate(n);
        let heal_at = Instant::now() + Duration::from_millis(500 + self.rng.below(4500));
        lab.cut_from_store(slots, heal_at, fleet, ledger).await
    }

    /// When due (`--faults pause`): a worker at random stopped (SIGSTOP) past its lease,
    /// resumed by a task of its own.
    pub(super) fn pause(&mut self, now: Instant, o: &Opts, fleet: &Fleet, ledger: &Ledger) {
        if !o.has(Fault::Pause)
            || now < self.next_pause
            || fleet.workers.is_empty()
            || now + pause::HOLD + Duration::from_secs(2) >= self.end
        {
            return;
        }
        let i = usize::try_from(self.rng.below(fleet.workers.len() as u64)).unwrap_or(0);
        let w = &fleet.workers[i];
        if let Some(pid) = w.child.id() {
            let (inc, ledger) = (w.inc, ledger.clone());
            self.pauses.push(tokio::spawn(async move {
                pause::pause(pid, inc, pause::HOLD, &ledger).await
            }));
        }
        self.next_pause = Instant::now() + Duration::from_millis(3000 + self.rng.below(3000));
    }

    /// Waits for every pause to end, so no worker stays stopped.
    pub(super) async fn resume_all(&mut self) -> Result<(), String> {
        for p in self.pauses.drain(..) {
            p.await.map_err(|e| e.to_string())??;
        }
        Ok(())
    }
}

/// A Sentinel split brain: the primary's host (its server and one sentinel) and the
/// workers of its site are cut from the replica's site, the third sentinel and the
/// other workers. The majority promotes the replica; both sides keep calling for 1 to
/// 3 s more; then the network heals and the old primary rejoins as a replica.
async fn split_brain(
    s: &Sentinels,
    lab: &mut Lab,
    ledger: &Ledger,
    rng: &mut Rng,
) -> Result<(), String> {
    let old = tokio::task::block_in_place(|| s.primary()).ok_or("no primary to split off")?;
    // Data node i runs on server host i; worker slot j's site is j % 2.
    let minority: Vec<&Host> = std::iter::once(&lab.servers[old])
        .chain(
            lab.slots
                .iter()
                .enumerate()
                .filter(|(j, _)| j % 2 == old)
                .map(|(_, h)| h),
        )
        .collect();
    let majority: Vec<&Host> = lab
        .servers
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != old)
        .map(|(_, h)| h)
        .chain(
            lab.slots
                .iter()
                .enumerate()
                .filter(|(j, _)| j % 2 != old)
                .map(|(_, h)| h),
        )
        .collect();
    let (minority, majority): (Vec<Host>, Vec<Host>) = (
        minority.into_iter().cloned().collect(),
        majority.into_iter().cloned().collect(),
    );
    lab.net.partition(
        &minority.iter().collect::<Vec<_>>(),
        &majority.iter().collect::<Vec<_>>(),
    )?;
    ledger.event("split", 0).await?;
    lab.splits += 1;
    let took = tokio::task::block_in_place(|| s.wait_promoted(old));
    let took = match took {
        Ok(t) => t,
        Err(e) => {
            ledger.event("healed", 0).await?;
            lab.net.heal()?;
            return Err(e);
        }
    };
    ledger.event("promoted", 0).await?;
    tokio::time::sleep(Duration::from_millis(1000 + rng.below(2000))).await;
    ledger.event("healed", 0).await?;
    lab.net.heal()?;
    // Healed, the old primary is still a primary until a sentinel demotes it: the split
    // brain lasts until then.
    let healed = Instant::now();
    let rejoined = tokio::task::block_in_place(|| s.wait_rejoined(old));
    ledger.event("rejoined", 0).await?;
    rejoined?;
    println!(
        "split brain: replica promoted {} ms after the cut; healed; the old primary was a primary for {} ms more, then rejoined as a replica ({} workers on its side)",
        took.as_millis(),
        healed.elapsed().as_millis(),
        minority.len() - 1
    );
    Ok(())
}
