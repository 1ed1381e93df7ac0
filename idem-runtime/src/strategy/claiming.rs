//! What every strategy does with a claim: wait for a busy key, keep the lease alive while
//! the body runs, and give the claim back if the call is dropped.

use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::{Instant, Sleep, sleep, sleep_until};

use crate::fingerprint::check_fingerprint;
use crate::observe::{self, Op};
use crate::store::{
    BoxFuture, ClaimOutcome, ClaimRequest, Journal, Memo, Owner, Store, Subscription,
};
use crate::{Error, Fingerprint, Key};

/// Polling steps for stores whose subscriptions never fire (or when subscribing failed).
const POLL_MIN: Duration = Duration::from_millis(2);
const POLL_MAX: Duration = Duration::from_millis(100);

/// What claims a key, once and again while waiting for a busy one: the store itself
/// ([`Direct`]), or a transaction in transactional mode. The waiting is the same.
pub(crate) trait Claimer {
    /// One claim of `key` per `req`.
    async fn claim(&mut self, key: &Key, req: &ClaimRequest) -> Result<ClaimOutcome, Error>;
}

/// Claims straight on the store, each claim one round trip that a dropped call cannot
/// strand (see [`claim_once`]).
pub(crate) struct Direct<'a>(pub(crate) &'a Arc<dyn Store>);

impl Claimer for Direct<'_> {
    async fn claim(&mut self, key: &Key, req: &ClaimRequest) -> Result<ClaimOutcome, Error> {
        claim_once(self.0, key, req).await
    }
}

/// Claims `key`: one claim, and only if another owner holds the key, the waiting loop.
///
/// Returns the first outcome that is not `Busy`, or `None` when `wait` ran out, and
/// whether the call had to wait. The waiting loop is boxed: it holds timers and
/// subscriptions that the uncontended path (a new key, a replay) never needs, and
/// keeping them out of the caller's future keeps that future small and cheap to move.
pub(crate) async fn claim(
    store: &Arc<dyn Store>,
    key: &Key,
    req: &ClaimRequest,
    wait: Duration,
) -> Result<(Option<ClaimOutcome>, bool), Error> {
    claim_with(&**store, &mut Direct(store), key, req, wait).await
}

/// [`claim`] through `claimer`, waiting on `store`'s change notifications.
pub(crate) async fn claim_with(
    store: &dyn Store,
    claimer: &mut impl Claimer,
    key: &Key,
    req: &ClaimRequest,
    wait: Duration,
) -> Result<(Option<ClaimOutcome>, bool), Error> {
    match claimer.claim(key, req).await? {
        ClaimOutcome::Busy { .. } if calls_itself(key) => Ok((None, false)),
        ClaimOutcome::Busy {
            retry_in,
            fingerprint,
        } => Ok((
            Box::pin(wait_busy(
                store,
                claimer,
                key,
                req,
                wait,
                retry_in,
                fingerprint,
            ))
            .await?,
            true,
        )),
        other => Ok((Some(other), false)),
    }
}

/// [`claim`] through the store's in-process fast path when it has one ([`Store::local`]):
/// no boxed future, and a completed record comes with the decoded value kept beside it.
pub(crate) async fn claim_memo(
    store: &Arc<dyn Store>,
    key: &Key,
    req: &ClaimRequest,
    wait: Duration,
) -> Result<(Option<ClaimOutcome>, Option<Memo>, bool), Error> {
    let Some(local) = store.local() else {
        let (outcome, waited) = claim(store, key, req, wait).await?;
        return Ok((outcome, None, waited));
    };
    match local.claim_now(key, req)? {
        (ClaimOutcome::Busy { .. }, _) if calls_itself(key) => Ok((None, None, false)),
        (
            ClaimOutcome::Busy {
                retry_in,
                fingerprint,
            },
            _,
        ) => {
            let waited = Box::pin(wait_busy(
                &**store,
                &mut Direct(store),
                key,
                req,
                wait,
                retry_in,
                fingerprint,
            ))
            .await?;
            Ok((waited, None, true))
        }
        (other, memo) => Ok((Some(other), memo, false)),
    }
}

/// Whether the busy `key` is held by a body running in this very task: a function that
/// calls itself with its own key. Waiting would only wait for itself, so the call fails
/// at once (as a busy key whose wait ran out), and says why.
fn calls_itself(key: &Key) -> bool {
    let held = super::call_ctx::held_here(key);
    if held {
        tracing::error!(
            %key,
            "a call with this key is already running in this task (the function calls \
             itself with its own key); failing at once instead of waiting for itself"
        );
    }
    held
}

/// Waits up to `wait` while another owner holds `key`, claiming again whenever it may
/// have changed. `retry_in` and `fingerprint` are from the `Busy` answer just received.
///
/// A busy key is re-checked after subscribing to its changes, so a completion between
/// the claim and the subscription is not missed; then the caller sleeps until the
/// subscription fires, the holder's lease ends, or the deadline passes, whichever is first.
async fn wait_busy(
    store: &dyn Store,
    claimer: &mut impl Claimer,
    key: &Key,
    req: &ClaimRequest,
    wait: Duration,
    retry_in: Duration,
    fingerprint: Option<Fingerprint>,
) -> Result<Option<ClaimOutcome>, Error> {
    let start = Instant::now();
    let out = wait_loop(
        store,
        claimer,
        key,
        req,
        start + wait,
        retry_in,
        fingerprint,
    )
    .await;
    observe::waited(start.elapsed());
    out
}

async fn wait_loop(
    store: &dyn Store,
    claimer: &mut impl Claimer,
    key: &Key,
    req: &ClaimRequest,
    deadline: Instant,
    mut retry_in: Duration,
    mut fingerprint: Option<Fingerprint>,
) -> Result<Option<ClaimOutcome>, Error> {
    let mut sub: Option<Subscription> = None;
    let mut poll = POLL_MIN;
    loop {
        check_fingerprint(key, req.fingerprint, fingerprint)?;
        let now = Instant::now();
        if now >= deadline {
            return Ok(None);
        }
        let s = match sub.take() {
            Some(s) => s,
            None => {
                let s = store.subscribe(key).await.unwrap_or_else(|e| {
                    tracing::debug!(%key, error = %e, "subscribe failed; polling instead");
                    Subscription::never()
                });
                if s.is_never() {
                    s
                } else {
                    // Subscribed: look again before sleeping, the twin may have just ended.
                    sub = Some(s);
                    (retry_in, fingerprint) = match claimer.claim(key, req).await? {
                        ClaimOutcome::Busy {
                            retry_in,
                            fingerprint,
                        } => (retry_in, fingerprint),
                        other => return Ok(Some(other)),
                    };
                    continue;
                }
            }
        };
        // Wake at the latest when the holder's lease ends, so a crashed holder is taken
        // over promptly; a store without notifications is polled with backoff.
        let never = s.is_never();
        let nap = if never {
            poll = (poll * 2).min(POLL_MAX);
            poll.min(retry_in + Duration::from_millis(1))
        } else {
            retry_in + Duration::from_millis(1)
        };
        let until = (now + nap).min(deadline);
        tokio::select! {
            _ = s.changed() => {}
            _ = sleep_until(until) => {}
        }
        if never {
            sub = Some(Subscription::never());
        }
        (retry_in, fingerprint) = match claimer.claim(key, req).await? {
            ClaimOutcome::Busy {
                retry_in,
                fingerprint,
            } => (retry_in, fingerprint),
            other => return Ok(Some(other)),
        };
    }
}

/// One claim round trip that a dropped call cannot strand.
///
/// A remote store's server applies a claim once the request has left, whether or not
/// anyone reads the answer. A call cancelled mid round trip (a `timeout`, a `select!`)
/// would leave a key claimed by nobody for a whole lease, so the claim runs as a future
/// of its own: dropped before its answer, it is finished in the background, and what it
/// took is given back. Releasing only after the answer, rather than at once, keeps the
/// release from overtaking the claim on another connection (or in a later batch).
///
/// An in-process store answers on the first poll, so nothing is ever in flight there:
/// its claim is awaited directly, at no cost.
async fn claim_once(
    store: &Arc<dyn Store>,
    key: &Key,
    req: &ClaimRequest,
) -> Result<ClaimOutcome, Error> {
    if store.local().is_some() {
        return observe::store_call(true, Op::Claim, store.claim(key, req)).await;
    }
    let (s, k, r) = (store.clone(), *key, req.clone());
    let sent: BoxFuture<'static, Result<ClaimOutcome, Error>> =
        Box::pin(async move { s.claim(&k, &r).await });
    let (store, key, owner) = (store.clone(), *key, req.owner);
    let claim = Finishing::new(sent, move |answer| {
        if matches!(
            answer,
            Ok(ClaimOutcome::Claimed { .. }) | Err(Error::Store(_))
        ) {
            drop(ClaimGuard::new(store, key, owner));
        }
    });
    observe::store_call(false, Op::Claim, claim).await
}

/// A store call owned by its future that must reach its end even if that future is
/// dropped: dropped before the call answered, the call is moved to a task of its own and
/// `then` gets its answer there. Awaited to its end, `then` is not called.
pub(crate) struct Finishing<T: Send + 'static, G: FnOnce(T) + Send + Unpin + 'static> {
    call: Option<BoxFuture<'static, T>>,
    then: Option<G>,
}

impl<T: Send + 'static, G: FnOnce(T) + Send + Unpin + 'static> Finishing<T, G> {
    pub(crate) fn new(call: BoxFuture<'static, T>, then: G) -> Self {
        Finishing {
            call: Some(call),
            then: Some(then),
        }
    }
}

impl<T: Send + 'static, G: FnOnce(T) + Send + Unpin + 'static> Future for Finishing<T, G> {
    type Output = T;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let this = self.get_mut();
        let Some(call) = this.call.as_mut() else {
            return Poll::Pending;
        };
        let out = std::task::ready!(call.as_mut().poll(cx));
        this.call = None;
        this.then = None;
        Poll::Ready(out)
    }
}

impl<T: Send + 'static, G: FnOnce(T) + Send + Unpin + 'static> Drop for Finishing<T, G> {
    fn drop(&mut self) {
        let (Some(call), Some(then)) = (self.call.take(), self.then.take()) else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(async move { then(call.await) });
            }
            Err(_) => tracing::warn!(
                "a store call was dropped outside a tokio runtime before it answered; \
                 its claim ends with its lease"
            ),
        }
    }
}

/// Completes (`Some((value, ttl))`) or releases (`None`) a claim whose body has returned.
///
/// The body's effect has happened, so from here a cancelled call must never give the key
/// back to run again: on a remote store the step is a [`Finishing`] call, which a drop
/// lets finish in the background (and a store error there is retried as
/// [`retry_settle`] does). An in-process store answers at once, so it is called directly.
pub(crate) async fn settle(
    store: &Arc<dyn Store>,
    key: Key,
    owner: Owner,
    settle: Option<(Bytes, Duration)>,
    recoverable: bool,
) -> Result<bool, Error> {
    let op = if settle.is_some() {
        Op::Complete
    } else {
        Op::Release
    };
    if store.local().is_some() {
        let done = settle_call(&**store, &key, owner, settle, recoverable);
        return observe::store_call(true, op, done).await;
    }
    // A second handle on the value, for a retry after a drop (a remote round trip
    // dwarfs the one allocation it may cost).
    let again = settle.clone();
    let s = store.clone();
    let sent: BoxFuture<'static, Result<bool, Error>> =
        Box::pin(async move { settle_call(&*s, &key, owner, settle, recoverable).await });
    let store = store.clone();
    let call = Finishing::new(sent, move |done: Result<bool, Error>| match done {
        Ok(true) => {}
        Ok(false) => {
            if again.is_some() {
                observe::lease_lost();
            }
            tracing::warn!(
                %key,
                "the claim was lost before the result of a cancelled call was recorded"
            )
        }
        Err(e) => {
            tracing::warn!(%key, error = %e, "recording the result of a cancelled call failed; retrying");
            retry_settle(store, key, owner, again, recoverable);
        }
    });
    observe::store_call(false, op, call).await
}

/// The store call that ends a claim whose body returned: a completion (`Some`) or a
/// release (`None`); a recoverable call's, through the recovery index, which drops the
/// call's recovery data in the same step.
fn settle_call<'a>(
    store: &'a dyn Store,
    key: &'a Key,
    owner: Owner,
    settle: Option<(Bytes, Duration)>,
    recoverable: bool,
) -> BoxFuture<'a, Result<bool, Error>> {
    // `recoverable` first: a plain call does not even ask the store for its index.
    let index = if recoverable { store.recovery() } else { None };
    match (index, settle) {
        (Some(recovery), settle) => recovery.settle(key, owner, settle),
        (None, Some((value, ttl))) => store.complete(key, owner, value, ttl),
        (None, None) => store.release(key, owner),
    }
}

/// Gives a claim back when dropped while armed: the call was cancelled (its future
/// dropped) or its body panicked. The release is started right away, not left to the
/// lease: for a store that answers without I/O (memory) it completes inside `drop`;
/// otherwise it continues on a spawned task.
pub(crate) struct ClaimGuard {
    store: Arc<dyn Store>,
    key: Key,
    owner: Owner,
    armed: bool,
    /// A recoverable call's claim: a drop abandons it (a recoverer finishes it) rather
    /// than releasing it (see [`RecoveryStore::abandon`](crate::store::RecoveryStore)).
    recoverable: bool,
}

impl ClaimGuard {
    pub(crate) fn new(store: Arc<dyn Store>, key: Key, owner: Owner) -> Self {
        ClaimGuard {
            store,
            key,
            owner,
            armed: true,
            recoverable: false,
        }
    }

    /// The guard of a recoverable claim: dropped armed, it abandons the call.
    pub(crate) fn recoverable(mut self, recoverable: bool) -> Self {
        self.recoverable = recoverable;
        self
    }

    pub(crate) fn disarm(&mut self) {
        self.armed = false;
    }

    /// Dropped disarmed: the body returned, so its claim is settled, never released.
    pub(crate) fn disarmed(mut self) {
        self.disarm();
    }

    /// Releases the claim once every journal write in flight has answered (each holds a
    /// share of `writes`): a release that overtook a finished step's write would make the
    /// owner check refuse it, and the next attempt would run the step again.
    pub(crate) fn release_after(mut self, writes: Arc<tokio::sync::RwLock<()>>) {
        self.release(Some(writes));
        self.disarm();
    }

    /// Starts the release, after the writes in `after` if any: for a store that answers
    /// without I/O (memory) and no write in flight it completes here; otherwise it
    /// continues on a spawned task.
    fn release(&self, after: Option<Arc<tokio::sync::RwLock<()>>>) {
        let (store, key, owner) = (self.store.clone(), self.key, self.owner);
        let abandon = self.recoverable;
        let mut release: BoxFuture<'static, ()> = Box::pin(async move {
            let _all = match after {
                Some(writes) => Some(writes.write_owned().await),
                None => None,
            };
            // As in `settle_call`: a plain call's guard does not ask for the index.
            let index = if abandon { store.recovery() } else { None };
            let given_back = match index {
                Some(recovery) => recovery.abandon(&key, owner).await,
                None => store.release(&key, owner).await,
            };
            if let Err(e) = given_back {
                tracing::warn!(%key, error = %e, "releasing a cancelled claim failed; it ends with its lease");
            }
        });
        let mut cx = Context::from_waker(Waker::noop());
        if release.as_mut().poll(&mut cx).is_pending() {
            match tokio::runtime::Handle::try_current() {
                Ok(handle) => {
                    handle.spawn(release);
                }
                Err(_) => tracing::warn!(
                    key = %self.key,
                    "claim dropped outside a tokio runtime; it ends with its lease"
                ),
            }
        }
    }
}

impl Drop for ClaimGuard {
    fn drop(&mut self) {
        if self.armed {
            self.release(None);
        }
    }
}

/// A claim that failed with a store error (a timeout, a connection cut after the request
/// left) may still have been applied by the server, which would keep the key busy for a
/// whole lease. Release it in the background: release checks the owner, so it is
/// harmless when the claim never happened.
pub(crate) fn undo_uncertain_claim(store: &Arc<dyn Store>, key: Key, owner: Owner, err: &Error) {
    if matches!(err, Error::Store(_)) {
        drop(ClaimGuard::new(store.clone(), key, owner));
    }
}

/// Retries, in the background, a completion (`Some((value, ttl))`) or a release (`None`)
/// that failed with a store error: a transient failure (a busy database, a dropped
/// connection) must not leave the key claimed for a whole lease. Both are guarded by
/// the owner, so a retry after someone else took the key changes nothing. Gives up after
/// about five seconds of backoff; the lease then ends the claim.
pub(crate) fn retry_settle(
    store: Arc<dyn Store>,
    key: Key,
    owner: Owner,
    settle: Option<(Bytes, Duration)>,
    recoverable: bool,
) {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    handle.spawn(async move {
        let mut delay = Duration::from_millis(20);
        for _ in 0..8 {
            sleep(delay).await;
            let done = settle_call(&*store, &key, owner, settle.clone(), recoverable).await;
            match done {
                Ok(true) => return,
                // A completion refused: the lease ran out while the store was failing,
                // and another owner may run the key. Counted, so it is never silent.
                Ok(false) if settle.is_some() => {
                    observe::lease_lost();
                    tracing::warn!(%key, "the lease was lost before the result could be recorded");
                    return;
                }
                Ok(false) => return,
                Err(e) => tracing::debug!(%key, error = %e, "settling the claim failed again"),
            }
            delay = (delay * 2).min(Duration::from_secs(2));
        }
        tracing::warn!(%key, "gave up recording the result; the claim ends with its lease");
    });
}

/// Runs `body` while renewing the lease every third of it. Returns the body's output and
/// whether the lease was lost meanwhile (another owner may then hold the key). `renewed`
/// hears of each renewal (`Some`: sent at that instant, and it succeeded) and of the loss
/// (`None`), so a body's durable steps know how long the claim is theirs.
///
/// The body is polled first on every wake-up, and the renewal timer is only armed if the
/// body does not finish on its first poll, so short bodies pay nothing for the heartbeat.
pub(crate) async fn with_heartbeat<F: Future>(
    store: &dyn Store,
    key: &Key,
    owner: Owner,
    lease: Duration,
    mut renewed: impl FnMut(Option<Instant>),
    body: F,
) -> (F::Output, bool) {
    let period = (lease / 3).max(Duration::from_millis(1));
    let mut body = pin!(body);
    // Created (and boxed, to keep this future small) on the first pending poll: a body
    // that is ready at once never touches the timer wheel.
    let mut timer: Option<Pin<Box<Sleep>>> = None;
    let mut renewing: Option<BoxFuture<'_, Result<bool, Error>>> = None;
    let mut sent = Instant::now();
    let mut lost = false;
    let out = poll_fn(|cx| {
        if let Poll::Ready(out) = body.as_mut().poll(cx) {
            return Poll::Ready(out);
        }
        loop {
            if let Some(r) = renewing.as_mut() {
                let Poll::Ready(res) = r.as_mut().poll(cx) else {
                    break;
                };
                renewing = None;
                match res {
                    // The body's steps learn how long the claim is theirs.
                    Ok(true) => renewed(Some(sent)),
                    Ok(false) => {
                        lost = true;
                        renewed(None);
                        tracing::warn!(%key, "lease lost while the body runs");
                        break;
                    }
                    // A store hiccup: keep the body running and try again next period.
                    Err(e) => tracing::warn!(%key, error = %e, "lease renewal failed"),
                }
                timer = Some(Box::pin(sleep(period)));
            } else if lost {
                break;
            } else {
                let fired = timer
                    .get_or_insert_with(|| Box::pin(sleep(period)))
                    .as_mut()
                    .poll(cx)
                    .is_ready();
                if !fired {
                    break;
                }
                let local = store.local().is_some();
                sent = Instant::now();
                let renew = store.renew(key, owner, lease);
                renewing = Some(Box::pin(observe::store_call(local, Op::Renew, renew)));
            }
        }
        Poll::Pending
    })
    .await;
    (out, lost)
}

/// A claim's answer as the strategies get it: the outcome (`None`: the wait ran out),
/// what the store's fast path kept beside it, and whether the call waited.
pub(crate) type Claimed<X> = Result<(Option<ClaimOutcome>, X, bool), Error>;

/// Takes the journal a claim carried out of its answer, for the claimed body's steps.
pub(crate) fn take_journal<X>(claimed: &mut Claimed<X>) -> Option<Journal> {
    match claimed {
        Ok((Some(ClaimOutcome::Claimed { journal, .. }), _, _)) => journal.take(),
        _ => None,
    }
}
