//! [`ResponseFuture`], the future of the service's responses, and what keeps a handled
//! request running when its client goes away ([`Detach`]).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
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
/// layer), it runs on in a task of its own, bounded by the layer's `detached_timeout`:
/// the handler's effect may already be in flight, so its key must stay claimed until
/// the handler's response is recorded, and a retry then waits for it or replays it.
/// Nothing is spawned on the way through: a request that finishes costs nothing more.
pub(crate) struct Detach<B: Body, E> {
    fut: Option<Boxed<B, E>>,
    polled: bool,
    timeout: Duration,
    /// Made where the bounds that let the future move to a task are known, so they do
    /// not spread to [`ResponseFuture`]'s type.
    spawn: fn(Boxed<B, E>, Duration),
}

impl<B: Body, E> Detach<B, E> {
    /// `fut`, run on to its end (within `timeout`) by `spawn` if dropped once polled.
    pub(crate) fn new(
        fut: Boxed<B, E>,
        timeout: Duration,
        spawn: fn(Boxed<B, E>, Duration),
    ) -> Self {
        Detach {
            fut: Some(fut),
            polled: false,
            timeout,
            spawn,
        }
    }
}

impl<B: Body, E> Drop for Detach<B, E> {
    fn drop(&mut self) {
        if let Some(fut) = self.fut.take()
            && self.polled
        {
            (self.spawn)(fut, self.timeout);
        }
    }
}

/// Runs a handled request whose client went away to its end, on the runtime it was
/// dropped on.
pub(crate) fn detach<B, E>(fut: Boxed<B, E>, timeout: Duration)
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
        if tokio::time::timeout(timeout, fut).await.is_err() {
            tracing::warn!(
                ?timeout,
                "idem-http: a request whose client went away ran past detached_timeout; \
                 cancelled, its key released"
            );
        }
    });
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
