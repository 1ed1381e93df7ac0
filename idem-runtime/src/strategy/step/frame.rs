//! The per-call state of durable steps: what a claimed body's steps know of their
//! record's journal, which step names the call has used, whether the call still owns
//! its claim, and the writes still in flight that a release must wait for.
//!
//! One frame per claimed dedup or token call, in a task-local of its own beside the
//! call's [`call_ctx`](super::super::call_ctx) frame; a lock's body hides it (`None`), as
//! a lock runs its body on every call and keeps no journal. Everything that costs memory
//! is allocated by the first step, so a body without steps pays for a frame only.

use std::cell::{Cell, RefCell};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{OwnedRwLockReadGuard, RwLock};
use tokio::time::Instant;

use super::super::claiming::ClaimGuard;
use crate::store::{Journal, Owner, Store};
use crate::{Error, Key};

tokio::task_local! {
    /// The step frame of the claimed body running in this task (`None` in a lock's body).
    static STEPS: Option<StepFrame>;
    /// The step whose closure is running (its call's owner and its id in that call), so
    /// a step started inside it knows its parent.
    static PARENT: (Owner, u32);
}

/// What the journal holds for one step, as far as this call knows.
#[derive(Debug, Clone)]
pub(crate) enum Journaled {
    /// No entry.
    Absent,
    /// A verified step's intent: its effect may have started, and whether it landed is
    /// unknown, so the step asks `verify` before it runs again.
    Intent,
    /// The step finished: its encoded value.
    Done(Bytes),
}

/// The claim a body's steps write under, and what the call knows of its steps.
pub(crate) struct StepFrame {
    key: Key,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) owner: Owner,
    /// How long the journal lives after a write: the record's lease plus its ttl, so a
    /// slow body that fails after its ttl still leaves its journal to the next attempt.
    pub(crate) ttl: Duration,
    lease: Duration,
    /// The function's path, for the steps' span and metric.
    pub(crate) function: &'static str,
    /// When the claim's lease ends by this process's clock unless renewed: taken when the
    /// claim answered (later than the store started the lease by at most a round trip;
    /// the store's owner check stays the guard), pushed on by each renewal.
    lease_until: Cell<Instant>,
    /// The store refused a write of this call for ownership, or the heartbeat found the
    /// claim lost: no later step runs.
    lost: Cell<bool>,
    /// Gives the claim back if the body is dropped before it returned; disarmed (taken)
    /// once it returned.
    guard: RefCell<Option<ClaimGuard>>,
    /// Allocated by the first step (or by the claim, when it returned a journal).
    state: RefCell<Option<Box<StepState>>>,
}

#[derive(Default)]
struct StepState {
    /// What this call knows of its record's journal, by step name: the entries its claim
    /// returned, then what its own steps wrote. Kept for the whole call, so a step tried
    /// again within the call replays its value or asks `verify` for its intent.
    known: Vec<(Arc<str>, Journaled)>,
    /// Steps of this call that are running or finished: a second use of a name is
    /// `StepReused` (loops name their steps).
    used: Vec<Used>,
    next_id: u32,
    /// Journal writes in flight hold it shared; a release after a drop takes it whole,
    /// so it never overtakes a write whose step's effect happened.
    writes: Option<Arc<RwLock<()>>>,
}

struct Used {
    /// Shared with the step's [`StepStart`], its `StepCtx` and what the call knows of
    /// it: one allocation per step.
    name: Arc<str>,
    id: u32,
    /// The step this one ran inside, if any.
    parent: Option<u32>,
}

impl StepFrame {
    pub(crate) fn new(
        key: Key,
        guard: ClaimGuard,
        store: Arc<dyn Store>,
        owner: Owner,
        (lease, ttl): (Duration, Duration),
        function: &'static str,
        journal: Option<Journal>,
    ) -> Self {
        let state = journal.map(|journal| {
            Box::new(StepState {
                known: journal
                    .into_iter()
                    .map(|e| {
                        let j = match e.value {
                            Some(v) => Journaled::Done(v),
                            None => Journaled::Intent,
                        };
                        (Arc::from(e.name), j)
                    })
                    .collect(),
                ..StepState::default()
            })
        });
        StepFrame {
            key,
            store,
            owner,
            ttl: ttl.saturating_add(lease),
            lease,
            function,
            lease_until: Cell::new(Instant::now() + lease),
            lost: Cell::new(false),
            guard: RefCell::new(Some(guard)),
            state: RefCell::new(state),
        }
    }

    /// `Err(LeaseLost)` if the call no longer owns its claim, as far as it knows: the
    /// store refused a write, the heartbeat lost the lease, or the lease ran out by this
    /// process's clock without a renewal (a process paused past its lease that just woke
    /// must not start an effect; another owner may be running the key).
    fn check_owned(&self, key: Key) -> Result<(), Error> {
        if !self.lost.get() && Instant::now() < self.lease_until.get() {
            return Ok(());
        }
        self.lost.set(true);
        Err(Error::LeaseLost { key })
    }
}

impl Drop for StepFrame {
    fn drop(&mut self) {
        // Armed: the body was dropped before it returned. Writes still in flight finish
        // first, so the release cannot overtake a finished step's journal entry.
        let Some(guard) = self.guard.get_mut().take() else {
            return;
        };
        match self.state.get_mut().as_mut().and_then(|s| s.writes.take()) {
            Some(writes) => guard.release_after(writes),
            None => drop(guard),
        }
    }
}

/// What a step starting in this task needs to know: where to write, and what the
/// journal holds for it.
pub(crate) struct StepStart {
    pub(crate) key: Key,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) owner: Owner,
    pub(crate) ttl: Duration,
    pub(crate) function: &'static str,
    pub(crate) journaled: Journaled,
    /// The step's id in its call.
    pub(crate) id: u32,
    /// The step's name.
    pub(crate) name: Arc<str>,
}

/// `body`, run with `steps` as the step frame of its task (`None`: steps are refused).
pub(crate) fn scope<F: Future>(
    steps: Option<StepFrame>,
    body: F,
) -> impl Future<Output = F::Output> {
    STEPS.scope(steps, body)
}

/// Runs `f` with the key and the step frame of the claimed dedup or token body running
/// in this task; `None` outside one (no call, a lock's body, a spawned task).
fn in_frame<R>(f: impl FnOnce(Key, &StepFrame) -> R) -> Option<R> {
    STEPS
        .try_with(|s| s.as_ref().map(|s| f(s.key, s)))
        .ok()
        .flatten()
}

/// Starts step `name` in the claimed body running in this task: checks that there is
/// one, that it still owns its claim, and that `name` is not in use in this call.
pub(crate) fn start(name: &str) -> Result<StepStart, Error> {
    let outside = || Error::StepOutsideClaim {
        step: name.to_owned(),
    };
    in_frame(|key, steps| {
        if steps.lost.get() {
            return Err(Error::LeaseLost { key });
        }
        let mut state = steps.state.borrow_mut();
        let state = state.get_or_insert_with(Box::default);
        if state.used.iter().any(|u| *u.name == *name) {
            return Err(Error::StepReused {
                key,
                step: name.to_owned(),
            });
        }
        let id = state.next_id;
        state.next_id += 1;
        let parent = PARENT
            .try_with(|&(owner, id)| (owner == steps.owner).then_some(id))
            .ok()
            .flatten();
        let name: Arc<str> = name.into();
        state.used.push(Used {
            name: name.clone(),
            id,
            parent,
        });
        let journaled = state
            .known
            .iter()
            .find(|(n, _)| **n == *name)
            .map_or(Journaled::Absent, |(_, j)| j.clone());
        Ok(StepStart {
            key,
            store: steps.store.clone(),
            owner: steps.owner,
            ttl: steps.ttl,
            function: steps.function,
            journaled,
            id,
            name,
        })
    })
    .unwrap_or_else(|| Err(outside()))
}

/// Before a step's closure (or its `verify`) runs: the call must still own its claim.
pub(crate) fn check_owned() -> Result<(), Error> {
    in_frame(|key, steps| steps.check_owned(key)).unwrap_or(Ok(()))
}

/// Runs `fut`, a closure of step `start`, as the parent of the steps started in it.
pub(crate) async fn within<F: Future>(start: &StepStart, fut: F) -> F::Output {
    PARENT.scope((start.owner, start.id), fut).await
}

/// What this call now knows of step `name`'s entry (its value, or an intent), whether
/// or not the write reaches the store: a step tried again within the call uses it.
pub(crate) fn remember(name: &Arc<str>, journaled: Journaled) {
    in_frame(|_, steps| {
        let mut state = steps.state.borrow_mut();
        let state = state.get_or_insert_with(Box::default);
        match state.known.iter_mut().find(|(n, _)| **n == **name) {
            Some((_, j)) => *j = journaled,
            None => state.known.push((name.clone(), journaled)),
        }
    });
}

/// Step `id` did not finish (an `Err`, or its future was dropped): the call may try it
/// again under the same name (and so the same downstream key), as a loop retrying a
/// declined charge does. The steps that finished inside it are freed too, so the retry
/// replays them from what the call knows instead of refusing them as reused.
pub(crate) fn stopped(id: u32) {
    in_frame(|_, steps| {
        let mut state = steps.state.borrow_mut();
        let Some(state) = state.as_mut() else {
            return;
        };
        let mut gone = vec![id];
        while let Some(i) = state
            .used
            .iter()
            .position(|u| u.id == id || u.parent.is_some_and(|p| gone.contains(&p)))
        {
            gone.push(state.used.swap_remove(i).id);
        }
    });
}

/// A share of the call's in-flight writes, held by a journal write until it answered:
/// a release after a drop waits for it. `None` outside a claimed body.
pub(crate) fn write_permit() -> Option<OwnedRwLockReadGuard<()>> {
    in_frame(|_, steps| {
        let mut state = steps.state.borrow_mut();
        let state = state.get_or_insert_with(Box::default);
        let writes = state.writes.get_or_insert_with(Arc::default).clone();
        // Only a release takes the lock whole, after the body (and every step) is gone.
        writes.try_read_owned().ok()
    })
    .flatten()
}

/// The store refused a write of the call for ownership: no later step of it runs.
pub(crate) fn claim_lost() {
    in_frame(|_, steps| steps.lost.set(true));
}

/// The heartbeat of the claim `owner` holds in this task: renewed (a renewal sent at
/// `sent` succeeded), or found lost.
pub(crate) fn heartbeat(owner: Owner, renewed_at: Option<Instant>) {
    in_frame(|_, steps| {
        if steps.owner != owner {
            return;
        }
        match renewed_at {
            Some(sent) => steps.lease_until.set(sent + steps.lease),
            None => steps.lost.set(true),
        }
    });
}

/// The claimed body returned: from here a drop never releases the claim (its effect
/// happened; the completion finishes in the background).
pub(crate) fn body_returned() {
    in_frame(|_, steps| steps.guard.borrow_mut().take().map(ClaimGuard::disarmed));
}
