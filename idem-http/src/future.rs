//! [`ResponseFuture`], the future of the service's responses, and what keeps a handled
//! request running when its client goes away ([`Detach`]), or cancels it without
//! releasing its key ([`Slot`]).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use http::Response;
use http_body::Body;
use pin_project_lite::pin_project;

use crate::body::ResponseBody;

/// A handled request's boxed future.
pub(crate) type Boxed<B, E> =
    Pin<Box<dyn Future<Output = Result<Response<ResponseBody<B>>, E>> + Send>>;

/// A handled request's future, which its client's going away does not cancel.
///
/// Dropped after it was first polled and before it finished (hyper drops a service's
/// future when the client hangs up or resets its stream; so does a timeout above the
/// layer), it runs on in a task of its own, to its end unless the layer sets a
/// `detached_timeout` ([`Cancel`]): the handler's effect may already be in flight, so
/// its key must stay claimed until the handler's response is recorded, and a retry
/// then waits for it or replays it. Nothing is spawned on the way through: a request
/// that finishes costs nothing more.
pub(crate) struct Detach<B: Body, E> {
    fut: Option<Boxed<B, E>>,
    polled: bool,
    cancel: Option<Cancel>,
    /// Made where the bounds that let the future move to a task are known, so they do
    /// not spread to [`ResponseFuture`]'s type.
    spawn: fn(Boxed<B, E>, Option<Cancel>),
}

/// How a detached request is cancelled, when the layer bounds it: after `timeout`,
/// `abandon` drops the handler, and the runtime's call (which would release the key if
/// dropped) is kept unpolled for `hold`, so its heartbeat stops and its claim runs out
/// with its lease instead.
pub(crate) struct Cancel {
    pub(crate) timeout: Duration,
    pub(crate) hold: Duration,
    pub(crate) abandon: Box<dyn FnOnce() -> bool + Send>,
}

impl<B: Body, E> Detach<B, E> {
    /// `fut`, run on to its end (or until `cancel` says) by `spawn` if dropped once
    /// polled.
    pub(crate) fn new(
        fut: Boxed<B, E>,
        cancel: Option<Cancel>,
        spawn: fn(Boxed<B, E>, Option<Cancel>),
    ) -> Self {
        Detach {
            fut: Some(fut),
            polled: false,
            cancel,
            spawn,
        }
    }
}

impl<B: Body, E> Drop for Detach<B, E> {
    fn drop(&mut self) {
        if let Some(fut) = self.fut.take()
            && self.polled
        {
            (self.spawn)(fut, self.cancel.take());
        }
    }
}

/// Runs a handled request whose client went away to its end, on the runtime it was
/// dropped on; or, with `cancel`, until its timeout.
pub(crate) fn detach<B, E>(mut fut: Boxed<B, E>, cancel: Option<Cancel>)
where
    B: Body + Send + 'static,
    E: Send + 'static,
{
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        // No runtime to run it on (the process is shutting down): it ends here, as it
        // would with the process, and its lease frees the key.
        tracing::warn!("idem-http: a handled request was dropped outside a runtime; not finished");
        return;
    };
    rt.spawn(async move {
        let Some(cancel) = cancel else {
            let _ = fut.await;
            return;
        };
        if tokio::time::timeout(cancel.timeout, &mut fut).await.is_ok() {
            return;
        }
        if !(cancel.abandon)() {
            // The handler had already returned: only its record is being written, and
            // that must finish.
            let _ = fut.await;
            return;
        }
        tracing::warn!(
            timeout = ?cancel.timeout,
            "idem-http: a request whose client went away ran past detached_timeout; \
             cancelled, its key held until its lease ends"
        );
        // Not polled, the call's heartbeat stops; not dropped, it does not release.
        tokio::time::sleep(cancel.hold).await;
        drop(fut);
    });
}

/// Where a bounded request's handler runs: the runtime's call polls it through
/// [`Slot::future`], and the detached task can empty it ([`Slot::abandon`]) without
/// the call seeing its body end (an end, `Ok` or `Err`, would complete or release the
/// key at once).
pub(crate) struct Slot<T>(Arc<Mutex<State<T>>>);

enum State<T> {
    /// The handler is not made yet (the key is being claimed).
    Empty,
    Running(Pin<Box<dyn Future<Output = T> + Send>>),
    Done,
    Abandoned,
}

impl<T: 'static> Slot<T> {
    pub(crate) fn new() -> Slot<T> {
        Slot(Arc::new(Mutex::new(State::Empty)))
    }

    /// The closure that drops the handler: true if it had not returned yet.
    pub(crate) fn abandoner(&self) -> Box<dyn FnOnce() -> bool + Send>
    where
        T: Send,
    {
        let slot = self.0.clone();
        Box::new(move || {
            let mut state = slot.lock().unwrap_or_else(PoisonError::into_inner);
            match std::mem::replace(&mut *state, State::Abandoned) {
                State::Done => {
                    *state = State::Done;
                    false
                }
                // Dropped outside the lock: a handler's drop may be slow.
                old => {
                    drop(state);
                    drop(old);
                    true
                }
            }
        })
    }

    /// Puts the handler in the slot; the future polls it there.
    pub(crate) fn future(
        &self,
        handler: Pin<Box<dyn Future<Output = T> + Send>>,
    ) -> impl Future<Output = T> + Send + use<T>
    where
        T: Send,
    {
        {
            let mut state = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            if matches!(*state, State::Empty) {
                *state = State::Running(handler);
            }
        }
        let slot = self.0.clone();
        std::future::poll_fn(move |cx| {
            let mut state = slot.lock().unwrap_or_else(PoisonError::into_inner);
            let State::Running(handler) = &mut *state else {
                // Abandoned: never ends, and is never polled again anyway.
                return Poll::Pending;
            };
            let out = handler.as_mut().poll(cx);
            if out.is_ready() {
                *state = State::Done;
            }
            out
        })
    }
}

pin_project! {
    /// The future of [`Idempotency`]'s responses. A request the layer does not handle
    /// is the inner service's future, unboxed; one it handles is boxed (it lives across
    /// the buffering, the store and the handler).
    pub struct ResponseFuture<F, B: Body, E> {
        #[pin]
        kind: Kind<F, B, E>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F, B: Body, E> {
        Inner { #[pin] fut: F },
        Ready { res: Option<Response<ResponseBody<B>>> },
        Handled { run: Detach<B, E> },
    }
}

impl<F, B: Body, E> ResponseFuture<F, B, E> {
    pub(crate) fn inner(fut: F) -> Self {
        ResponseFuture {
            kind: Kind::Inner { fut },
        }
    }
    pub(crate) fn ready(res: Response<ResponseBody<B>>) -> Self {
        ResponseFuture {
            kind: Kind::Ready { res: Some(res) },
        }
    }
    pub(crate) fn handled(run: Detach<B, E>) -> Self {
        ResponseFuture {
            kind: Kind::Handled { run },
        }
    }
}

impl<F, B: Body, E> fmt::Debug for ResponseFuture<F, B, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ResponseFuture")
    }
}

impl<F, B, E> Future for ResponseFuture<F, B, E>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: Body,
{
    type Output = Result<Response<ResponseBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Inner { fut } => fut
                .poll(cx)
                .map(|r| r.map(|res| res.map(ResponseBody::inner))),
            KindProj::Ready { res } => match res.take() {
                Some(res) => Poll::Ready(Ok(res)),
                None => panic!("ResponseFuture polled after completion"),
            },
            KindProj::Handled { run } => {
                let Some(fut) = run.fut.as_mut() else {
                    panic!("ResponseFuture polled after completion")
                };
                run.polled = true;
                let out = fut.as_mut().poll(cx);
                if out.is_ready() {
                    run.fut = None;
                }
                out
            }
        }
    }
}
