//! State-machine guards: a declared transition table and atomic moves on the store.
//!
//! For status flows (an order, an approval): each key has a state; a move to `to` is
//! one atomic step on the store that checks the current state against the table and
//! writes the new one, so two racing movers cannot both move, and a replayed move (a
//! retried request, a redelivered event) finds the key already at `to` and succeeds
//! without effect. A body tied to a move ([`Idem::transition_with`]) runs only for the
//! caller that performs it.
//!
//! When the state already is a column of your own table (`orders.status`), keep it
//! there: `StateMachine::stored_in` (SQL features) moves the row itself with the same
//! rules; see [Own table](#own-table) below.
//!
#![doc = include_str!("../guide/state_machine.md")]

use std::collections::HashMap;
use std::fmt;
use std::future::{Future, poll_fn};
use std::ops::Deref;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::time::{Instant, sleep};

use crate::options::{DEFAULT_LEASE, DEFAULT_WAIT};
use crate::store::{
    BoxFuture, Owner, Settle, StateStore, Store, TransitionOutcome, TransitionRequest,
};
use crate::{Error, Idem, Key};

#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
mod own_table;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite")))
)]
pub use own_table::{StateColumn, StateDatabase};

const POLL_MIN: Duration = Duration::from_millis(2);
const MAX_STATE_LEN: usize = 255;
const POLL_MAX: Duration = Duration::from_millis(100);

/// A transition table: states, which moves are allowed, which states are initial (may
/// be entered by a key with no state yet) and which are terminal (no move out).
///
/// Built once with [`StateMachine::builder`]; [`build`](StateMachineBuilder::build)
/// checks the table and refuses unknown states, moves out of terminal states, a missing
/// initial state and duplicates, all reported at once.
///
/// ```
/// use idem_runtime::toolbox::StateMachine;
/// let order = StateMachine::builder("shop::order")
///     .states(["created", "paid", "shipped", "delivered", "cancelled"])
///     .initial("created")
///     .allow("created", ["paid", "cancelled"])
///     .allow("paid", ["shipped", "cancelled"])
///     .allow("shipped", ["delivered"])
///     .terminal(["delivered", "cancelled"])
///     .build()
///     .unwrap();
/// assert!(order.allows(Some("paid"), "shipped"));
/// assert!(!order.allows(Some("cancelled"), "paid"));
///
/// let broken = StateMachine::builder("bad")
///     .states(["open", "closed"])
///     .initial("open")
///     .allow("open", ["closed", "archived"])
///     .allow("closed", ["open"])
///     .terminal(["closed"])
///     .build();
/// let msg = broken.unwrap_err().to_string();
/// assert!(msg.contains("\"archived\"") && msg.contains("terminal"), "{msg}");
/// ```
#[derive(Debug, Clone)]
pub struct StateMachine {
    name: &'static str,
    states: Vec<&'static str>,
    initial: Vec<&'static str>,
    terminal: Vec<&'static str>,
    /// For each state, the states that may move into it.
    sources: HashMap<&'static str, Vec<&'static str>>,
    ttl: Option<Duration>,
    lease: Duration,
    wait: Duration,
}

/// Declares a [`StateMachine`]; see there.
#[derive(Debug, Clone)]
#[must_use]
pub struct StateMachineBuilder {
    name: &'static str,
    states: Vec<&'static str>,
    initial: Vec<&'static str>,
    moves: Vec<(&'static str, &'static str)>,
    terminal: Vec<&'static str>,
    ttl: Option<Duration>,
    lease: Duration,
    wait: Duration,
}

impl StateMachineBuilder {
    /// Declares states (may be called several times).
    pub fn states(mut self, states: impl IntoIterator<Item = &'static str>) -> Self {
        self.states.extend(states);
        self
    }

    /// Declares a state that a key with no state yet may enter (at least one).
    pub fn initial(mut self, state: &'static str) -> Self {
        self.initial.push(state);
        self
    }

    /// Allows moves from `from` to each of `to`.
    pub fn allow(mut self, from: &'static str, to: impl IntoIterator<Item = &'static str>) -> Self {
        self.moves.extend(to.into_iter().map(|t| (from, t)));
        self
    }

    /// Declares terminal states: no move may leave them.
    pub fn terminal(mut self, states: impl IntoIterator<Item = &'static str>) -> Self {
        self.terminal.extend(states);
        self
    }

    /// Each state record disappears `ttl` after its last move (default: kept without
    /// expiry). A key whose record expired has no state again.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// The lease of a move held while its body runs ([`Idem::transition_with`]):
    /// renewed while the body runs, so it only matters after a crash. Default 30 s.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease.max(Duration::from_millis(1));
        self
    }

    /// How long a move waits while another caller's body holds a move on the same key,
    /// before [`Error::InProgress`]. Default 10 s; zero fails at once.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// Checks the table and builds the machine; every problem is listed in one
    /// [`Error::Config`].
    pub fn build(self) -> Result<StateMachine, Error> {
        let mut problems = Vec::new();
        let known = |s: &str| self.states.contains(&s);
        for (i, s) in self.states.iter().enumerate() {
            if s.is_empty() {
                problems.push("a state name is empty".to_owned());
            }
            // Every store keeps a state in 255 bytes (a MySQL VARBINARY(255) column).
            if s.len() > MAX_STATE_LEN {
                problems.push(format!("state {s:?} is longer than {MAX_STATE_LEN} bytes"));
            }
            if self.states[..i].contains(s) {
                problems.push(format!("state {s:?} is declared twice"));
            }
        }
        if self.states.is_empty() {
            problems.push("no states declared".to_owned());
        }
        if self.initial.is_empty() {
            problems.push("no initial state: declare the state a new key enters".to_owned());
        }
        for (what, list) in [("initial", &self.initial), ("terminal", &self.terminal)] {
            for s in list.iter().filter(|s| !known(s)) {
                problems.push(format!("{what} state {s:?} is not a declared state"));
            }
        }
        for (i, &(from, to)) in self.moves.iter().enumerate() {
            for s in [from, to] {
                if !known(s) {
                    problems.push(format!(
                        "move {from:?} -> {to:?}: {s:?} is not a declared state"
                    ));
                }
            }
            if from == to {
                problems.push(format!(
                    "move {from:?} -> {to:?} goes nowhere (a key already at {to:?} succeeds without a move)"
                ));
            }
            if self.terminal.contains(&from) {
                problems.push(format!(
                    "move {from:?} -> {to:?} leaves the terminal state {from:?}"
                ));
            }
            if self.moves[..i].contains(&(from, to)) {
                problems.push(format!("move {from:?} -> {to:?} is declared twice"));
            }
        }
        if !problems.is_empty() {
            return Err(Error::Config(format!(
                "state machine {}: {}",
                self.name,
                problems.join("; ")
            )));
        }
        let mut sources: HashMap<&'static str, Vec<&'static str>> =
            self.states.iter().map(|&s| (s, Vec::new())).collect();
        for (from, to) in self.moves {
            sources.entry(to).or_default().push(from);
        }
        Ok(StateMachine {
            name: self.name,
            states: self.states,
            initial: self.initial,
            terminal: self.terminal,
            sources,
            ttl: self.ttl,
            lease: self.lease,
            wait: self.wait,
        })
    }
}

impl StateMachine {
    /// Starts a table named `name` (part of every key, as a function's path is for dedup).
    pub fn builder(name: &'static str) -> StateMachineBuilder {
        StateMachineBuilder {
            name,
            states: Vec::new(),
            initial: Vec::new(),
            moves: Vec::new(),
            terminal: Vec::new(),
            ttl: None,
            lease: DEFAULT_LEASE,
            wait: DEFAULT_WAIT,
        }
    }

    /// The table's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The declared states.
    pub fn states(&self) -> &[&'static str] {
        &self.states
    }

    /// Whether `state` is terminal.
    pub fn is_terminal(&self, state: &str) -> bool {
        self.terminal.contains(&state)
    }

    /// Whether the table allows a move from `from` (`None`: no state yet) to `to`.
    pub fn allows(&self, from: Option<&str>, to: &str) -> bool {
        match from {
            None => self.initial.contains(&to),
            Some(f) => self.sources.get(to).is_some_and(|s| s.contains(&f)),
        }
    }

    fn request<'a>(&'a self, to: &'a str) -> Result<TransitionRequest<'a>, Error> {
        let from = self.sources.get(to).ok_or_else(|| {
            Error::Config(format!("state machine {} has no state {to:?}", self.name))
        })?;
        Ok(TransitionRequest::new(from, self.initial.contains(&to), to).ttl(self.ttl))
    }
}

/// The result of a state-machine move.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Moved<T = ()> {
    /// This call performed the move (and, for [`Idem::transition_with`], ran the body,
    /// whose `Ok` value this is).
    Performed {
        /// The state the key left (`None`: it had no state).
        from: Option<String>,
        /// The body's value (`()` for a plain move).
        value: T,
    },
    /// The key already was in the target state: nothing was done, no body ran.
    AlreadyThere,
}

/// The old name of [`Moved`], kept for one release: beside the durable [`step`](crate::step)s,
/// a "step" that is a state-machine move read as the other thing.
#[deprecated(since = "0.1.0", note = "renamed `Moved`")]
pub type Step<T = ()> = Moved<T>;

impl<T> Moved<T> {
    /// True if this call performed the move.
    pub fn performed(&self) -> bool {
        matches!(self, Moved::Performed { .. })
    }

    /// The body's value if this call performed the move.
    pub fn value(self) -> Option<T> {
        match self {
            Moved::Performed { value, .. } => Some(value),
            Moved::AlreadyThere => None,
        }
    }
}

/// The state-machine move with a body: `key` already rendered under the machine's name.
/// `idem` is owned (a reference, or the borrowed-or-scoped current runtime) so that entry
/// points can return this future directly.
/// [`Idem::state`]'s flow.
pub(crate) async fn state(
    idem: &Idem,
    machine: &StateMachine,
    key: impl fmt::Display,
) -> Result<Option<String>, Error> {
    let key = idem.state_key(machine, key);
    states(&**idem.store())?.load_state(&key).await
}

/// [`Idem::transition`]'s flow.
pub(crate) fn transition<'a>(
    idem: &'a Idem,
    machine: &'a StateMachine,
    key: impl fmt::Display,
    to: &'a str,
) -> impl Future<Output = Result<Moved, Error>> + Send + 'a {
    let key = idem.state_key(machine, key);
    async move {
        let req = machine.request(to)?;
        match drive(states(&**idem.store())?, machine, &key, &req).await? {
            TransitionOutcome::Moved { from } => Ok(Moved::Performed { from, value: () }),
            TransitionOutcome::Already => Ok(Moved::AlreadyThere),
            other => Err(unexpected(&key, &other)),
        }
    }
}

pub(crate) async fn run_move<T, E, F>(
    idem: impl Deref<Target = Idem>,
    machine: &StateMachine,
    key: Key,
    to: &str,
    body: F,
) -> Result<Moved<T>, E>
where
    E: From<Error>,
    F: Future<Output = Result<T, E>>,
{
    let store = idem.store();
    let moves = states(&**store)?;
    let owner = Owner::next();
    let req = machine.request(to)?.hold(owner, machine.lease);
    let from = match drive(moves, machine, &key, &req).await? {
        TransitionOutcome::Held { from } => from,
        TransitionOutcome::Already => return Ok(Moved::AlreadyThere),
        other => return Err(unexpected(&key, &other).into()),
    };
    let mut guard = HoldGuard {
        store: store.clone(),
        key,
        owner,
        armed: true,
    };
    let (result, lost) = with_renewal(moves, &key, owner, machine.lease, body).await;
    let action = match result {
        Ok(_) => Settle::Commit { ttl: machine.ttl },
        Err(_) => Settle::Abort,
    };
    let settled = moves.settle_transition(&key, owner, action).await;
    guard.armed = false;
    match settled {
        Ok(true) => {}
        Ok(false) => idem.lease_lost(&key, lost),
        Err(e) => {
            // The body's effect happened; the hold stays until its lease ends, then the
            // move may be performed (and its body run) again.
            idem.count_store_failure();
            tracing::error!(%key, error = %e, to, "could not settle the held move; it ends with its lease");
        }
    }
    result.map(|value| Moved::Performed { from, value })
}

/// Asks for the move until it is decided, waiting while another owner's hold is live.
async fn drive(
    store: &dyn StateStore,
    machine: &StateMachine,
    key: &Key,
    req: &TransitionRequest<'_>,
) -> Result<TransitionOutcome, Error> {
    let mut deadline = None;
    let mut poll = POLL_MIN;
    loop {
        let retry_in = match store.transition(key, req).await? {
            TransitionOutcome::Refused { current } => {
                return Err(Error::InvalidTransition {
                    from: current,
                    to: req.to.to_owned(),
                });
            }
            TransitionOutcome::Pending { retry_in, .. } => retry_in,
            decided => return Ok(decided),
        };
        let now = Instant::now();
        let deadline = *deadline.get_or_insert(now + machine.wait);
        if now >= deadline {
            return Err(Error::InProgress { key: *key });
        }
        // Holds are settled by their owner, usually well before their lease ends: poll
        // with backoff, and at the latest when the lease ends (a crashed holder).
        let nap = poll.min(retry_in + Duration::from_millis(1));
        poll = (poll * 2).min(POLL_MAX);
        tokio::time::sleep_until((now + nap).min(deadline)).await;
    }
}

/// The store's state records, or [`Error::Unsupported`] for a store without them.
fn states(store: &dyn Store) -> Result<&dyn StateStore, Error> {
    store.states().ok_or(Error::Unsupported("state machines"))
}

fn unexpected(key: &Key, outcome: &TransitionOutcome) -> Error {
    Error::store(format!(
        "the store answered {outcome:?} to a move on {key} it could not give"
    ))
}

/// Drops a held move when the call is dropped (cancelled) or its body panics, so the key
/// is free at once rather than after the lease.
struct HoldGuard {
    store: Arc<dyn Store>,
    key: Key,
    owner: Owner,
    armed: bool,
}

impl Drop for HoldGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (store, key, owner) = (self.store.clone(), self.key, self.owner);
        let mut abort: BoxFuture<'static, ()> = Box::pin(async move {
            let abort = async {
                states(&*store)?
                    .settle_transition(&key, owner, Settle::Abort)
                    .await
            };
            if let Err(e) = abort.await {
                tracing::warn!(%key, error = %e, "dropping a cancelled move failed; it ends with its lease");
            }
        });
        // A store that answers without I/O (memory) is done inside `drop`; otherwise the
        // abort continues on a task.
        if abort
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
            .is_pending()
        {
            match tokio::runtime::Handle::try_current() {
                Ok(handle) => {
                    handle.spawn(abort);
                }
                Err(_) => {
                    tracing::warn!(key = %self.key, "move dropped outside a tokio runtime; it ends with its lease")
                }
            }
        }
    }
}

/// Runs `body`, renewing the hold every third of the lease; returns the body's output and
/// whether the hold was lost meanwhile.
async fn with_renewal<F: Future>(
    store: &dyn StateStore,
    key: &Key,
    owner: Owner,
    lease: Duration,
    body: F,
) -> (F::Output, bool) {
    let period = (lease / 3).max(Duration::from_millis(1));
    let mut body = pin!(body);
    let mut lost = false;
    loop {
        // The body first: one that is ready at once never touches the timer.
        if let Poll::Ready(out) = poll_fn(|cx| Poll::Ready(body.as_mut().poll(cx))).await {
            return (out, lost);
        }
        tokio::select! {
            biased;
            out = &mut body => return (out, lost),
            () = sleep(period), if !lost => {
                match store.settle_transition(key, owner, Settle::Renew(lease)).await {
                    Ok(true) => {}
                    Ok(false) => {
                        lost = true;
                        tracing::warn!(%key, "a held move was lost while its body ran");
                    }
                    // A store hiccup: keep the body running and try again next period.
                    Err(e) => tracing::warn!(%key, error = %e, "renewing a held move failed"),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_errors_are_all_reported() {
        let err = StateMachine::builder("t")
            .states(["a", "b", "a"])
            .allow("a", ["a", "zz"])
            .allow("b", ["a"])
            .terminal(["b", "qq"])
            .build()
            .unwrap_err()
            .to_string();
        let long = StateMachine::builder("t")
            .states(["x", Box::leak("y".repeat(256).into_boxed_str())])
            .initial("x")
            .build()
            .unwrap_err()
            .to_string();
        assert!(long.contains("longer than 255 bytes"), "{long}");
        for needle in [
            "declared twice",
            "no initial state",
            "\"qq\" is not a declared state",
            "\"zz\" is not a declared state",
            "goes nowhere",
            "leaves the terminal state \"b\"",
        ] {
            assert!(err.contains(needle), "missing {needle:?} in {err}");
        }
    }

    #[test]
    fn allows_follows_the_table() {
        let m = StateMachine::builder("t")
            .states(["new", "open", "done"])
            .initial("new")
            .allow("new", ["open"])
            .allow("open", ["done"])
            .terminal(["done"])
            .build()
            .unwrap();
        assert!(m.allows(None, "new"));
        assert!(!m.allows(None, "open"));
        assert!(m.allows(Some("new"), "open"));
        assert!(!m.allows(Some("new"), "done"));
        assert!(m.is_terminal("done"));
        assert!(matches!(m.request("nope"), Err(Error::Config(_))));
    }

    #[test]
    fn invalid_transition_prints_the_states_plainly() {
        let paid = Error::InvalidTransition {
            from: Some("paid".into()),
            to: "created".into(),
        };
        assert_eq!(
            paid.to_string(),
            "transition from paid to created is not allowed"
        );
        let none = Error::InvalidTransition {
            from: None,
            to: "shipped".into(),
        };
        assert_eq!(
            none.to_string(),
            "transition from (none) to shipped is not allowed"
        );
    }
}
