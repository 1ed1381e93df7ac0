//! What every strategy does with a claim: wait for a busy key, keep the lease alive while
//! the body runs, and give the claim back if the call is dropped.

use std::future::{Future, poll_fn};
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::time::{Instant, Sleep, sleep, sleep_until};

use crate::store::{BoxFuture, ClaimOutcome, ClaimRequest, Owner, Store, Subscription};
use crate::{Error, Fingerprint, Key};

/// Polling steps for stores whose subscriptions never fire (or when subscribing failed).
const POLL_MIN: Duration = Duration::from_millis(2);
const POLL_MAX: Duration = Duration::from_millis(100);

/// Claims `key`, waiting up to `wait` while another owner holds it.
///
/// Returns the first outcome that is not `Busy`, or `Ok(None)` when `wait` ran out.
/// A busy key is re-checked after subscribing to its changes, so a completion between
/// the claim and the subscription is not missed; then the caller sleeps until the
/// subscription fires, the holder's lease ends, or the deadline passes, whichever is first.
pub(crate) async fn claim_waiting(
    store: &dyn Store,
    key: &Key,
    req: &ClaimRequest,
    wait: Duration,
) -> Result<Option<ClaimOutcome>, Error> {
    let mut deadline: Option<Instant> = None;
    let mut sub: Option<Subscription> = None;
    let mut poll = POLL_MIN;
    loop {
        let (retry_in, fingerprint) = match store.claim(key, req).await? {
            ClaimOutcome::Busy {
                retry_in,
                fingerprint,
            } => (retry_in, fingerprint),
            other => return Ok(Some(other)),
        };
        check_fingerprint(key, req.fingerprint, fingerprint)?;
        let now = Instant::now();
        let deadline = *deadline.get_or_insert(now + wait);
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
                if !s.is_never() {
                    // Subscribed: look again before sleeping, the twin may have just ended.
                    sub = Some(s);
                    continue;
                }
                s
            }
        };
        // Wake at the latest when the holder's lease ends, so a crashed holder is taken
        // over promptly; a store without notifications is polled with backoff.
        let nap = if s.is_never() {
            poll = (poll * 2).min(POLL_MAX);
            poll.min(retry_in + Duration::from_millis(1))
        } else {
            retry_in + Duration::from_millis(1)
        };
        let until = (now + nap).min(deadline);
        let never = s.is_never();
        tokio::select! {
            _ = s.changed() => {}
            _ = sleep_until(until) => {}
        }
        if never {
            sub = Some(Subscription::never());
        }
    }
}

/// A stored fingerprint that differs from the caller's is a payload mismatch. A record
/// without one (written before fingerprints were added) is accepted.
pub(crate) fn check_fingerprint(
    key: &Key,
    ours: Option<Fingerprint>,
    theirs: Option<Fingerprint>,
) -> Result<(), Error> {
    match (ours, theirs) {
        (Some(a), Some(b)) if a != b => Err(Error::PayloadMismatch { key: key.clone() }),
        _ => Ok(()),
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
}

impl ClaimGuard {
    pub(crate) fn new(store: Arc<dyn Store>, key: Key, owner: Owner) -> Self {
        ClaimGuard {
            store,
            key,
            owner,
            armed: true,
        }
    }

    pub(crate) fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for ClaimGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let store = self.store.clone();
        let key = self.key.clone();
        let owner = self.owner;
        let mut release: BoxFuture<'static, ()> = Box::pin(async move {
            if let Err(e) = store.release(&key, owner).await {
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

/// Runs `body` while renewing the lease every third of it. Returns the body's output and
/// whether the lease was lost meanwhile (another owner may then hold the key).
///
/// The body is polled first on every wake-up, and the renewal timer is only armed if the
/// body does not finish on its first poll, so short bodies pay nothing for the heartbeat.
pub(crate) async fn with_heartbeat<F: Future>(
    store: &dyn Store,
    key: &Key,
    owner: Owner,
    lease: Duration,
    body: F,
) -> (F::Output, bool) {
    let period = (lease / 3).max(Duration::from_millis(1));
    let mut body = pin!(body);
    // Created on the first pending poll: a body that is ready at once never touches the
    // timer wheel.
    let mut timer = pin!(None::<Sleep>);
    let mut renewing: Option<BoxFuture<'_, Result<bool, Error>>> = None;
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
                    Ok(true) => {}
                    Ok(false) => {
                        lost = true;
                        tracing::warn!(%key, "lease lost while the body runs");
                        break;
                    }
                    // A store hiccup: keep the body running and try again next period.
                    Err(e) => tracing::warn!(%key, error = %e, "lease renewal failed"),
                }
                timer.set(Some(sleep(period)));
            } else if lost {
                break;
            } else {
                if timer.is_none() {
                    timer.set(Some(sleep(period)));
                }
                let fired = timer
                    .as_mut()
                    .as_pin_mut()
                    .is_some_and(|t| t.poll(cx).is_ready());
                if !fired {
                    break;
                }
                renewing = Some(store.renew(key, owner, lease));
            }
        }
        Poll::Pending
    })
    .await;
    (out, lost)
}
