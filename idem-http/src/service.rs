//! The service: [`Idempotency`], and the flow of one request through it.

use std::fmt;
use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use http::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderValue};
use http::{Request, Response, request};
use http_body::Body;
use http_body_util::BodyExt;
use idem_runtime::{Error, Fingerprint, Options};
use pin_project_lite::pin_project;

use crate::body::{Chunks, RequestBody, ResponseBody};
use crate::key::{IDEMPOTENT_REPLAYED, IdempotencyKey};
use crate::layer::{IdempotencyLayer, Mode};
use crate::observe::{self, Outcome};
use crate::problem::{Problem, ReleaseKey};
use crate::record::{Failed, Ran, ResponseCodec, Stored};
use crate::scope::{Caller, Scoped};

/// The configuration shared by the clones of one service.
struct Shared {
    layer: IdempotencyLayer,
    opts: Options,
}

/// The service [`IdempotencyLayer`] wraps around `S`.
///
/// `S` gets requests whose body is a [`RequestBody`] (the buffered bytes of a request
/// the layer handled, the original body otherwise) and answers with any
/// [`http_body::Body`]; the layer answers with a [`ResponseBody`].
pub struct Idempotency<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S: Clone> Clone for Idempotency<S> {
    fn clone(&self) -> Self {
        Idempotency {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for Idempotency<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Idempotency")
            .field("inner", &self.inner)
            .field("layer", &self.shared.layer)
            .finish()
    }
}

// Beside the service rather than the layer, so the service's module is the only one
// that knows both: the layer is configuration and imports nothing back.
impl<S> tower::Layer<S> for IdempotencyLayer {
    type Service = Idempotency<S>;

    fn layer(&self, inner: S) -> Idempotency<S> {
        Idempotency::new(inner, self)
    }
}

impl<S> Idempotency<S> {
    fn new(inner: S, layer: &IdempotencyLayer) -> Self {
        Idempotency {
            inner,
            shared: Arc::new(Shared {
                opts: layer.options(),
                layer: layer.clone(),
            }),
        }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Boxed<B, E> = Pin<Box<dyn Future<Output = Result<Response<ResponseBody<B>>, E>> + Send>>;

impl<S, ReqB, ResB> tower::Service<Request<ReqB>> for Idempotency<S>
where
    S: tower::Service<Request<RequestBody<ReqB>>, Response = Response<ResB>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqB: Body + Send + 'static,
    ReqB::Data: Send,
    ReqB::Error: Into<BoxError>,
    ResB: Body + Send + 'static,
    ResB::Data: Send,
    ResB::Error: Send,
{
    type Response = Response<ResponseBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResB, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let layer = &self.shared.layer;
        if !layer.methods.contains(req.method()) {
            observe::count(Outcome::Passed);
            return ResponseFuture::inner(self.inner.call(req.map(RequestBody::streaming)));
        }
        let key = match IdempotencyKey::from_header(req.headers(), &layer.id_header) {
            Ok(Some(key)) => key,
            Ok(None) if !layer.required => {
                observe::count(Outcome::Passed);
                return ResponseFuture::inner(self.inner.call(req.map(RequestBody::streaming)));
            }
            Ok(None) => return ResponseFuture::ready(problem(layer, Problem::KeyMissing)),
            Err(_) => return ResponseFuture::ready(problem(layer, Problem::KeyMalformed)),
        };
        // The service that was polled ready goes with the request; its clone stays.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        ResponseFuture::handled(Detach {
            fut: Some(Box::pin(run(self.shared.clone(), inner, key, req))),
            polled: false,
            timeout: layer.detached_timeout,
            spawn: detach::<ResB, S::Error>,
        })
    }
}

/// A handled request's future, which its client's going away does not cancel.
///
/// Dropped after it was first polled and before it finished (hyper drops a service's
/// future when the client hangs up or resets its stream; so does a timeout above the
/// layer), it runs on in a task of its own, bounded by the layer's `detached_timeout`:
/// the handler's effect may already be in flight, so its key must stay claimed until
/// the handler's response is recorded, and a retry then waits for it or replays it.
/// Nothing is spawned on the way through: a request that finishes costs nothing more.
struct Detach<B: Body, E> {
    fut: Option<Boxed<B, E>>,
    polled: bool,
    timeout: Duration,
    /// Made where the bounds that let the future move to a task are known, so they do
    /// not spread to [`ResponseFuture`]'s type.
    spawn: fn(Boxed<B, E>, Duration),
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
fn detach<B, E>(fut: Boxed<B, E>, timeout: Duration)
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

/// The layer's answer instead of the handler's, counted.
fn problem<B: Body>(layer: &IdempotencyLayer, p: Problem) -> Response<ResponseBody<B>> {
    observe::count(Outcome::Problem(p));
    p.response(layer.docs.as_deref())
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
    fn inner(fut: F) -> Self {
        ResponseFuture {
            kind: Kind::Inner { fut },
        }
    }
    fn ready(res: Response<ResponseBody<B>>) -> Self {
        ResponseFuture {
            kind: Kind::Ready { res: Some(res) },
        }
    }
    fn handled(run: Detach<B, E>) -> Self {
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

/// One handled request: buffer and fingerprint it, then claim its key and run the
/// handler once, or replay, or answer the problem.
async fn run<S, ReqB, ResB>(
    shared: Arc<Shared>,
    inner: S,
    key: IdempotencyKey,
    req: Request<ReqB>,
) -> Result<Response<ResponseBody<ResB>>, S::Error>
where
    S: tower::Service<Request<RequestBody<ReqB>>, Response = Response<ResB>>,
    ReqB: Body,
    ReqB::Error: Into<BoxError>,
    ResB: Body,
{
    let layer = &shared.layer;
    // In a block, so the request's parts (borrowed for the fingerprint) take no room in
    // this future once the handler has them.
    let (handler, fingerprint, scope) = {
        let (parts, body) = req.into_parts();
        let declared = parts
            .headers
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        if declared.is_some_and(|n| n > layer.max_request_bytes as u64) {
            return Ok(problem(layer, Problem::RequestTooLarge));
        }
        let bytes = match read_request(body, layer.max_request_bytes).await {
            Ok(bytes) => bytes,
            Err(p) => return Ok(problem(layer, p)),
        };
        // Signed webhooks are checked before their id is claimed: a forged delivery
        // must neither run nor hold the id of the real one. (Whatever the mode: a
        // secret that was set is never skipped.)
        #[cfg(feature = "webhooks")]
        if let Some(secret) = &layer.secret {
            let id = parts
                .headers
                .get(&layer.id_header)
                .map_or(&b""[..], |v| v.as_bytes());
            if !secret.verify(&parts.headers, id, &bytes, layer.tolerance) {
                return Ok(problem(layer, Problem::SignatureInvalid));
            }
        }
        let fingerprint = fingerprint(&parts, &bytes);
        // Tokens are unguessable and need no scope: their credentials are not hashed.
        let scope = match layer.mode {
            Mode::Keys | Mode::Webhooks => layer.scope.of(&parts),
            Mode::Tokens => Caller::Shared,
        };
        let req = Request::from_parts(parts, RequestBody::buffered(bytes));
        // Boxed on its own: the runtime's call future nests the body several levels
        // deep, and a pointer moves through them where the handler's state would be
        // copied.
        // Token mode keeps the fingerprint in its record and checks it itself (below).
        let request = (layer.mode == Mode::Tokens).then_some(fingerprint);
        let handler = Box::pin(handle(layer, inner, key.clone(), req, request));
        (handler, fingerprint, scope)
    };
    // The runtime's call is boxed apart from this future too, so that neither
    // allocation is over a kilobyte: above that size glibc's malloc leaves its
    // per-thread caches for a slow path that sorts and merges free chunks.
    let result = match layer.mode {
        Mode::Keys | Mode::Webhooks => {
            let scoped = Scoped(&scope, key.as_str());
            Box::pin(layer.idem.dedup_with::<ResponseCodec, _, _, _>(
                &shared.opts,
                scoped,
                Some(fingerprint),
                handler,
            ))
            .await
        }
        Mode::Tokens => {
            Box::pin(layer.idem.consume_token::<ResponseCodec, _, _, _>(
                &shared.opts,
                key.as_str(),
                handler,
            ))
            .await
        }
    };
    // A used token sent with another request: 422, as for a reused key, never the
    // other request's response.
    if let Ok(
        Ran::Replayed(Stored {
            request: Some(ran), ..
        })
        | Ran::NotReplayable(Some(ran)),
    ) = &result
        && *ran != fingerprint
    {
        return Ok(problem(layer, Problem::KeyReused));
    }
    Ok(match result {
        Ok(Ran::Fresh { parts, stored }) => {
            observe::count(Outcome::Ran);
            Response::from_parts(parts, ResponseBody::full(stored.body))
        }
        Ok(Ran::Spilled {
            parts,
            prefix,
            rest,
            error,
            ..
        }) => {
            observe::count(Outcome::Ran);
            Response::from_parts(parts, ResponseBody::spilled(prefix, rest, error))
        }
        Ok(Ran::Replayed(stored)) => {
            observe::count(Outcome::Replayed);
            replay(stored)
        }
        Ok(Ran::NotReplayable(_)) => {
            let mut res = problem(layer, Problem::NotReplayable);
            res.headers_mut()
                .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
            res
        }
        Err(Failed::NotStored(res)) => {
            observe::count(Outcome::NotStored);
            res.map(ResponseBody::inner)
        }
        Err(Failed::Inner(e)) => {
            observe::count(Outcome::ServiceError);
            return Err(e);
        }
        Err(Failed::Idem(e)) => problem(layer, verdict(layer.mode, &e)),
    })
}

/// Reads a request body of at most `max` bytes.
async fn read_request<B>(body: B, max: usize) -> Result<Bytes, Problem>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    let mut body = pin!(body);
    let mut chunks = Chunks::default();
    while let Some(frame) = body.as_mut().frame().await {
        let frame = frame.map_err(|_| Problem::BodyUnreadable)?;
        // Trailers are not part of what is fingerprinted.
        if let Ok(mut data) = frame.into_data() {
            chunks.push(data.copy_to_bytes(data.remaining()));
            if chunks.len() > max {
                return Err(Problem::RequestTooLarge);
            }
        }
    }
    Ok(chunks.into_bytes())
}

/// Runs the handler, with the key in the request's extensions, and reads its response
/// for storing. (Only polled once the key is claimed: a replay never gets here.)
async fn handle<S, ReqB, ResB>(
    layer: &IdempotencyLayer,
    mut inner: S,
    key: IdempotencyKey,
    mut req: Request<RequestBody<ReqB>>,
    request: Option<Fingerprint>,
) -> Result<Ran<ResB>, Failed<Response<ResB>, S::Error>>
where
    S: tower::Service<Request<RequestBody<ReqB>>, Response = Response<ResB>>,
    ResB: Body,
{
    req.extensions_mut().insert(key);
    let res = inner.call(req).await.map_err(Failed::Inner)?;
    if !layer.stores(res.status()) || res.extensions().get::<ReleaseKey>().is_some() {
        return Err(Failed::NotStored(res));
    }
    let (parts, body) = res.into_parts();
    let max = layer.max_response_bytes;
    let mut body = Box::pin(body);
    let mut chunks = Chunks::default();
    let spilled = |parts, chunks: Chunks, rest, error| {
        Ok(Ran::Spilled {
            parts,
            prefix: chunks.into_list(),
            rest,
            error,
            request,
        })
    };
    if body.size_hint().lower() > max as u64 {
        return spilled(parts, chunks, Some(body), None);
    }
    while let Some(frame) = body.as_mut().frame().await {
        match frame {
            // Trailers are neither stored nor replayed.
            Ok(frame) => {
                if let Ok(mut data) = frame.into_data() {
                    chunks.push(data.copy_to_bytes(data.remaining()));
                    if chunks.len() > max {
                        return spilled(parts, chunks, Some(body), None);
                    }
                }
            }
            // The handler ran, so its key must not run again; the client gets what was
            // read, then the error.
            Err(e) => return spilled(parts, chunks, None, Some(e)),
        }
    }
    let body = chunks.into_bytes();
    let mut headers = Vec::new();
    for name in &layer.replay_headers {
        for value in parts.headers.get_all(name) {
            headers.push((name.clone(), value.clone()));
        }
    }
    let stored = Stored {
        status: parts.status,
        headers,
        body,
        request,
    };
    Ok(Ran::Fresh { parts, stored })
}

fn replay<B: Body>(stored: Stored) -> Response<ResponseBody<B>> {
    let mut res = Response::new(ResponseBody::full(stored.body));
    *res.status_mut() = stored.status;
    let h = res.headers_mut();
    for (name, value) in stored.headers {
        h.append(name, value);
    }
    h.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    res
}

/// The answer to each way the runtime refuses a request.
fn verdict(mode: Mode, e: &Error) -> Problem {
    match e {
        Error::InProgress { .. } => Problem::InFlight,
        Error::PayloadMismatch { .. } => Problem::KeyReused,
        Error::Duplicate { .. } if mode == Mode::Tokens => Problem::TokenUsed,
        Error::Duplicate { .. } => Problem::Completed,
        Error::TokenInvalid { .. } => Problem::TokenInvalid,
        Error::Store(_) => {
            tracing::warn!(error = %e, "idem-http: store unavailable; request not run");
            Problem::StoreUnavailable
        }
        Error::Corrupt { .. } | Error::Codec { .. } => {
            tracing::error!(error = %e, "idem-http: stored response unreadable; request not run");
            Problem::RecordCorrupt
        }
        _ => {
            tracing::error!(error = %e, "idem-http: request not run");
            Problem::Internal
        }
    }
}

/// What makes two requests under one key "the same request": method, path, query,
/// Content-Type and a digest of the body, each length-framed.
fn fingerprint(parts: &request::Parts, body: &[u8]) -> Fingerprint {
    let content_type = parts.headers.get(CONTENT_TYPE);
    let fields: [&[u8]; 5] = [
        parts.method.as_str().as_bytes(),
        parts.uri.path().as_bytes(),
        parts.uri.query().unwrap_or_default().as_bytes(),
        content_type.map_or(&b""[..], |v| v.as_bytes()),
        body,
    ];
    digest(fields)
}

/// Requests up to this many framed bytes are hashed in one call from a stack copy.
const INLINE_FINGERPRINT: usize = 256;

/// BLAKE3 of the length-framed fields. Most requests are small, and for them the
/// hasher's cost per `update` call outweighs hashing the bytes, so they are framed into
/// a stack buffer and hashed at once; larger ones stream. The bytes hashed are the same
/// either way, and so is the fingerprint.
fn digest(fields: [&[u8]; 5]) -> Fingerprint {
    let framed: usize = fields.iter().map(|f| 8 + f.len()).sum();
    let hash = if framed <= INLINE_FINGERPRINT {
        let mut buf = [0u8; INLINE_FINGERPRINT];
        let mut at = 0;
        for f in fields {
            buf[at..at + 8].copy_from_slice(&(f.len() as u64).to_le_bytes());
            buf[at + 8..at + 8 + f.len()].copy_from_slice(f);
            at += 8 + f.len();
        }
        blake3::hash(&buf[..at])
    } else {
        let mut h = blake3::Hasher::new();
        for f in fields {
            h.update(&(f.len() as u64).to_le_bytes());
            h.update(f);
        }
        h.finalize()
    };
    let mut out = [0u8; 16];
    out.copy_from_slice(&hash.as_bytes()[..16]);
    Fingerprint(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The framed stream, hashed without the stack copy: what every fingerprint must be.
    fn streamed(fields: [&[u8]; 5]) -> Fingerprint {
        let mut h = blake3::Hasher::new();
        for f in fields {
            h.update(&(f.len() as u64).to_le_bytes());
            h.update(f);
        }
        let mut out = [0u8; 16];
        out.copy_from_slice(&h.finalize().as_bytes()[..16]);
        Fingerprint(out)
    }

    #[test]
    fn small_and_large_requests_fingerprint_alike() {
        // Bodies on both sides of the inline limit, so both paths are checked.
        for len in [0, 1, 100, 190, 191, 192, 193, 256, 1000] {
            let body = vec![b'x'; len];
            let fields: [&[u8]; 5] = [b"POST", b"/payments", b"a=1", b"application/json", &body];
            assert_eq!(digest(fields), streamed(fields), "body of {len} bytes");
        }
    }

    #[test]
    fn fields_are_framed() {
        // Moving bytes from one field to the next changes the fingerprint.
        let a = digest([b"POST", b"/a", b"", b"", b"b"]);
        let b = digest([b"POST", b"/ab", b"", b"", b""]);
        assert_ne!(a, b);
    }
}
