//! The service: [`Idempotency`], and the flow of one request through it.

use std::fmt;
use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use http::header::{CONTENT_LENGTH, HeaderValue};
use http::{Request, Response};
use http_body::Body;
use http_body_util::BodyExt;
use idem_runtime::{Error, Fingerprint};

use crate::body::{Chunks, RequestBody, ResponseBody};
use crate::config::{Config, Mode};
use crate::fingerprint::fingerprint;
use crate::future::{Cancel, Detach, ResponseFuture, Slot, detach};
use crate::key::{IDEMPOTENT_REPLAYED, IdempotencyKey};
use crate::observe::{self, Outcome};
use crate::problem::{Problem, ReleaseKey};
use crate::record::{Failed, Ran, ResponseCodec, Stored};
use crate::scope::{Caller, Scoped};

/// The service [`IdempotencyLayer`](crate::IdempotencyLayer) wraps around `S`.
///
/// `S` gets requests whose body is a [`RequestBody`] (the buffered bytes of a request
/// the layer handled, the original body otherwise) and answers with any
/// [`http_body::Body`]; the layer answers with a [`ResponseBody`].
pub struct Idempotency<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S: Clone> Clone for Idempotency<S> {
    fn clone(&self) -> Self {
        Idempotency {
            inner: self.inner.clone(),
            config: self.config.clone(),
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for Idempotency<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Idempotency")
            .field("inner", &self.inner)
            .field("config", &self.config)
            .finish()
    }
}

impl<S> Idempotency<S> {
    pub(crate) fn new(inner: S, config: Arc<Config>) -> Self {
        Idempotency { inner, config }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

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
        let config = &*self.config;
        if !config.methods.contains(req.method()) {
            observe::count(Outcome::Passed);
            return ResponseFuture::inner(self.inner.call(req.map(RequestBody::streaming)));
        }
        let key = match IdempotencyKey::from_header(req.headers(), &config.id_header) {
            Ok(Some(key)) => key,
            Ok(None) if !config.required => {
                observe::count(Outcome::Passed);
                return ResponseFuture::inner(self.inner.call(req.map(RequestBody::streaming)));
            }
            Ok(None) => return ResponseFuture::ready(config.problem(Problem::KeyMissing)),
            Err(_) => return ResponseFuture::ready(config.problem(Problem::KeyMalformed)),
        };
        // The service that was polled ready goes with the request; its clone stays.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        // Only a layer that bounds detached requests pays for the slot its handler can
        // be cancelled from.
        let slot = config.detached_timeout.map(|_| Slot::new());
        let cancel = config
            .detached_timeout
            .zip(slot.as_ref())
            .map(|(timeout, slot)| {
                let lease = config.opts.lease_for();
                Cancel {
                    timeout,
                    // A renewal sent just before the cancel may still land: one heartbeat
                    // period (a third of the lease) past the lease covers it.
                    hold: lease + lease / 3,
                    abandon: slot.abandoner(),
                }
            });
        ResponseFuture::handled(Detach::new(
            Box::pin(run(self.config.clone(), inner, key, req, slot)),
            cancel,
            detach::<ResB, S::Error>,
        ))
    }
}

/// What the handler gives the runtime's call.
type Handled<ResB, E> = Result<Ran<ResB>, Failed<Response<ResB>, E>>;

/// One handled request: buffer and fingerprint it, then claim its key and run the
/// handler once, or replay, or answer the problem.
async fn run<S, ReqB, ResB>(
    config: Arc<Config>,
    inner: S,
    key: IdempotencyKey,
    req: Request<ReqB>,
    slot: Option<Slot<Handled<ResB, S::Error>>>,
) -> Result<Response<ResponseBody<ResB>>, S::Error>
where
    S: tower::Service<Request<RequestBody<ReqB>>, Response = Response<ResB>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqB: Body + Send + 'static,
    ReqB::Data: Send,
    ReqB::Error: Into<BoxError>,
    ResB: Body + Send + 'static,
    ResB::Data: Send,
    ResB::Error: Send,
{
    // In a block, so the request's parts (borrowed for the fingerprint) take no room in
    // this future once the handler has them.
    let (handler, fingerprint, scope) = {
        let (parts, body) = req.into_parts();
        let declared = parts
            .headers
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        if declared.is_some_and(|n| n > config.max_request_bytes as u64) {
            return Ok(config.problem(Problem::RequestTooLarge));
        }
        let bytes = match read_request(body, config.max_request_bytes).await {
            Ok(bytes) => bytes,
            Err(p) => return Ok(config.problem(p)),
        };
        // Signed webhooks are checked before their id is claimed: a forged delivery
        // must neither run nor hold the id of the real one. (Whatever the mode: a
        // secret that was set is never skipped.)
        #[cfg(feature = "webhooks")]
        if let Some(secret) = &config.secret {
            let id = parts
                .headers
                .get(&config.id_header)
                .map_or(&b""[..], |v| v.as_bytes());
            if !secret.verify(&parts.headers, id, &bytes, config.tolerance) {
                return Ok(config.problem(Problem::SignatureInvalid));
            }
        }
        let scope = config.scope.of(&parts);
        let fingerprint = match config.mode {
            Mode::Keys | Mode::Webhooks => fingerprint(&parts, &bytes),
            // A token's key is the token alone, so its scope and layer go into the
            // fingerprint its record keeps: used by another caller or at another
            // layer, it is 422, never that caller's response.
            Mode::Tokens => {
                scoped_fingerprint(fingerprint(&parts, &bytes), config.operation, &scope)
            }
        };
        let req = Request::from_parts(parts, RequestBody::buffered(bytes));
        // Boxed on its own: the runtime's call future nests the body several levels
        // deep, and a pointer moves through them where the handler's state would be
        // copied.
        // Token mode keeps the fingerprint in its record and checks it itself (below).
        let request = (config.mode == Mode::Tokens).then_some(fingerprint);
        let handler = Box::pin(handle(config.clone(), inner, key.clone(), req, request));
        (handler, fingerprint, scope)
    };
    // A layer with a detached_timeout runs the handler in a slot it can be cancelled
    // from without the key being released (see `Slot`).
    let handler = match &slot {
        None => Handler::Direct(handler),
        Some(slot) => Handler::Slotted(Box::pin(slot.future(handler))),
    };
    // The runtime's call is boxed apart from this future too, so that neither
    // allocation is over a kilobyte: above that size glibc's malloc leaves its
    // per-thread caches for a slow path that sorts and merges free chunks.
    let result = match config.mode {
        Mode::Keys | Mode::Webhooks => {
            let scoped = Scoped(&scope, key.as_str());
            Box::pin(config.idem.dedup_with::<ResponseCodec, _, _, _>(
                &config.opts,
                scoped,
                Some(fingerprint),
                handler,
            ))
            .await
        }
        Mode::Tokens => {
            Box::pin(config.idem.consume_token::<ResponseCodec, _, _, _>(
                &config.opts,
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
        return Ok(config.problem(Problem::KeyReused));
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
            let mut res = config.problem(Problem::NotReplayable);
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
        Err(Failed::Idem(e)) => config.problem(verdict(config.mode, &e)),
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
    config: Arc<Config>,
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
    if !config.stores(res.status()) || res.extensions().get::<ReleaseKey>().is_some() {
        return Err(Failed::NotStored(res));
    }
    let (parts, body) = res.into_parts();
    let max = config.max_response_bytes;
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
    for name in &config.replay_headers {
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

/// The fingerprint a token's record keeps: the request's, its layer's and its caller's.
fn scoped_fingerprint(request: Fingerprint, operation: &str, caller: &Caller) -> Fingerprint {
    let mut h = blake3::Hasher::new();
    h.update(b"idem-http token\0");
    h.update(&request.0);
    h.update(&(operation.len() as u64).to_le_bytes());
    h.update(operation.as_bytes());
    h.update(Scoped(caller, "").to_string().as_bytes());
    let mut out = [0u8; 16];
    out.copy_from_slice(&h.finalize().as_bytes()[..16]);
    Fingerprint(out)
}

/// The handler as the runtime's call runs it: directly, or from the slot a detached
/// timeout can empty.
enum Handler<F: Future> {
    Direct(Pin<Box<F>>),
    Slotted(Pin<Box<dyn Future<Output = F::Output> + Send>>),
}

impl<F: Future> Future for Handler<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        match self.get_mut() {
            Handler::Direct(f) => f.as_mut().poll(cx),
            Handler::Slotted(f) => f.as_mut().poll(cx),
        }
    }
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
