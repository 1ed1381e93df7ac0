//! RFC 9457 problem responses: every answer the layer gives instead of the handler's.

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue, LINK, RETRY_AFTER};
use http::{Response, StatusCode};

/// One of the layer's own answers, rendered as `application/problem+json`.
///
/// `code` is a stable, machine-readable name (an extension member); `type` is the
/// operator's documentation URL when the layer has one ([`docs`]), else `about:blank`,
/// and the documentation is also linked with `Link: <...>; rel="describedby"`.
///
/// [`docs`]: crate::IdempotencyLayer::docs
///
/// ```
/// use idem_http::Problem;
/// let res = Problem::KeyMissing.response::<http_body_util::Full<bytes::Bytes>>(Some("https://docs.example/idempotency"));
/// assert_eq!(res.status(), 400);
/// assert_eq!(res.headers()["content-type"], "application/problem+json");
/// assert_eq!(res.headers()["link"], "<https://docs.example/idempotency>; rel=\"describedby\"");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Problem {
    /// 400: the route requires a key and none was sent.
    KeyMissing,
    /// 400: the header is not one well-formed key.
    KeyMalformed,
    /// 422: the key was first used for a different request.
    KeyReused,
    /// 409: the key's first request is still being processed.
    InFlight,
    /// 410: the key's first request completed, but its response was too large (or
    /// failed while being read) and was not kept, so it cannot be replayed. The request
    /// is not run again.
    NotReplayable,
    /// 413: the request body is over `max_request_bytes`.
    RequestTooLarge,
    /// 400: the request body could not be read.
    BodyUnreadable,
    /// 503: the idempotency store is down or timing out; nothing ran.
    StoreUnavailable,
    /// 500: the stored record of this key is damaged; nothing ran.
    RecordCorrupt,
    /// 400 (token mode): the token was never issued, is forged or has expired.
    TokenInvalid,
    /// 409 (token mode, rejecting): the token was already used.
    TokenUsed,
    /// 409 (rejecting duplicates): the request for this key already completed.
    Completed,
    /// 500: the store refused the operation for another reason; nothing ran.
    Internal,
    /// 409, with `Retry-After` (from a handler's [`idem_runtime::Error`]): what the
    /// request needs is busy in another call (in progress, locked, or changed
    /// concurrently). Never stored: a retry runs the handler again.
    Busy,
    /// 503, with `Retry-After` (from a handler's [`idem_runtime::Error`]): the store is
    /// down or timing out, a lease was lost, or a write was not replicated. Never
    /// stored: a retry runs the handler again.
    Unavailable,
    /// 409 (from a handler's [`idem_runtime::Error::InvalidTransition`]): the resource's
    /// state does not allow the change asked for. Never stored: once the state allows
    /// it, a retry runs the handler again.
    StateConflict,
    /// 404 (from a handler's [`idem_runtime::Error::NoSuchRow`]): the row a state move
    /// names does not exist. Never stored: once it exists, a retry runs the handler again.
    NoSuchRow,
    /// 429, with `Retry-After` (token mode): the token route issued as many tokens as
    /// its bound allows for now ([`token_limit`](crate::IdempotencyLayer::token_limit)).
    TokenLimit,
    /// 401 (webhook mode with a signing secret): the delivery's Standard Webhooks
    /// signature is missing or wrong, or its timestamp is too far from now. Never
    /// stored: a correctly signed delivery of the same event runs.
    SignatureInvalid,
}

/// Put in a response's extensions, it tells the layer not to store the response: the
/// key is released and a retry runs the handler again, as for a 5xx.
///
/// Every [`Problem`] response carries it, so an [`idem_runtime::Error`] that a handler
/// maps through [`Problem`] is never replayed to later retries. A handler can set it on
/// any answer that says "not now" rather than "done":
///
/// ```
/// use idem_http::ReleaseKey;
/// let mut res = http::Response::new("the ledger is being migrated; retry".to_string());
/// *res.status_mut() = http::StatusCode::CONFLICT;
/// res.extensions_mut().insert(ReleaseKey);
/// # let _ = res;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReleaseKey;

/// The answer to an [`idem_runtime::Error`] a handler met (from an `#[idempotent]` call,
/// a lock, a state machine): transient ones are 409 or 503 with `Retry-After`, and no
/// [`Problem`] response is stored by the layer.
///
/// ```
/// use idem_http::Problem;
/// use idem_runtime::Error;
/// let p = Problem::from(Error::store("connection refused"));
/// assert_eq!((p.status(), p.retry_after()), (http::StatusCode::SERVICE_UNAVAILABLE, Some(1)));
/// let p = Problem::from(Error::InvalidTransition { from: Some("paid".into()), to: "paid".into() });
/// assert_eq!(p.status(), http::StatusCode::CONFLICT);
/// ```
impl From<idem_runtime::Error> for Problem {
    fn from(e: idem_runtime::Error) -> Problem {
        Problem::from(&e)
    }
}

impl From<&idem_runtime::Error> for Problem {
    fn from(e: &idem_runtime::Error) -> Problem {
        use idem_runtime::Error;
        match e {
            Error::InProgress { .. } | Error::Locked { .. } | Error::Conflict { .. } => {
                Problem::Busy
            }
            // A replication shortfall is a store error holding `NotReplicated`.
            Error::Store(_) | Error::LeaseLost { .. } => Problem::Unavailable,
            Error::PayloadMismatch { .. } => Problem::KeyReused,
            Error::Duplicate { .. } => Problem::Completed,
            Error::TokenInvalid { .. } => Problem::TokenInvalid,
            Error::InvalidTransition { .. } => Problem::StateConflict,
            Error::NoSuchRow { .. } => Problem::NoSuchRow,
            Error::Corrupt { .. } | Error::Codec { .. } => Problem::RecordCorrupt,
            _ => Problem::Internal,
        }
    }
}

impl Problem {
    /// The status it is answered with.
    pub fn status(self) -> StatusCode {
        match self {
            Problem::KeyMissing
            | Problem::KeyMalformed
            | Problem::BodyUnreadable
            | Problem::TokenInvalid => StatusCode::BAD_REQUEST,
            Problem::KeyReused => StatusCode::UNPROCESSABLE_ENTITY,
            Problem::InFlight
            | Problem::TokenUsed
            | Problem::Completed
            | Problem::Busy
            | Problem::StateConflict => StatusCode::CONFLICT,
            Problem::NotReplayable => StatusCode::GONE,
            Problem::RequestTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Problem::StoreUnavailable | Problem::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Problem::TokenLimit => StatusCode::TOO_MANY_REQUESTS,
            Problem::NoSuchRow => StatusCode::NOT_FOUND,
            Problem::SignatureInvalid => StatusCode::UNAUTHORIZED,
            Problem::RecordCorrupt | Problem::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// Its stable machine-readable name (the `code` member).
    pub const fn code(self) -> &'static str {
        match self {
            Problem::KeyMissing => "idempotency-key-missing",
            Problem::KeyMalformed => "idempotency-key-malformed",
            Problem::KeyReused => "idempotency-key-reused",
            Problem::InFlight => "idempotency-key-in-flight",
            Problem::NotReplayable => "idempotency-response-not-replayable",
            Problem::RequestTooLarge => "idempotency-request-too-large",
            Problem::BodyUnreadable => "idempotency-request-unreadable",
            Problem::StoreUnavailable => "idempotency-store-unavailable",
            Problem::RecordCorrupt => "idempotency-record-corrupt",
            Problem::TokenInvalid => "idempotency-token-invalid",
            Problem::TokenUsed => "idempotency-token-used",
            Problem::Completed => "idempotency-key-completed",
            Problem::Internal => "idempotency-internal",
            Problem::Busy => "idempotency-busy",
            Problem::Unavailable => "idempotency-unavailable",
            Problem::StateConflict => "idempotency-state-conflict",
            Problem::NoSuchRow => "idempotency-no-such-row",
            Problem::TokenLimit => "idempotency-token-limit",
            Problem::SignatureInvalid => "webhook-signature-invalid",
        }
    }

    /// A short summary (the `title` member).
    pub fn title(self) -> &'static str {
        match self {
            Problem::KeyMissing => "Idempotency-Key is missing",
            Problem::KeyMalformed => "Idempotency-Key is malformed",
            Problem::KeyReused => "Idempotency-Key is already used",
            Problem::InFlight => "A request is outstanding for this Idempotency-Key",
            Problem::NotReplayable => "The response to this Idempotency-Key was not kept",
            Problem::RequestTooLarge => "Request body too large",
            Problem::BodyUnreadable => "Request body could not be read",
            Problem::StoreUnavailable => "Idempotency store unavailable",
            Problem::RecordCorrupt => "Idempotency record is damaged",
            Problem::TokenInvalid => "Idempotency token is unknown or expired",
            Problem::TokenUsed => "Idempotency token already used",
            Problem::Completed => "Idempotency-Key already completed",
            Problem::Internal => "Idempotency check failed",
            Problem::Busy => "Busy in another request",
            Problem::Unavailable => "Temporarily unavailable",
            Problem::StateConflict => "Not allowed in the current state",
            Problem::NoSuchRow => "No such resource",
            Problem::TokenLimit => "Too many tokens issued",
            Problem::SignatureInvalid => "Webhook signature invalid",
        }
    }

    /// The explanation (the `detail` member).
    pub fn detail(self) -> &'static str {
        match self {
            Problem::KeyMissing => {
                "This operation is idempotent and requires an Idempotency-Key header."
            }
            Problem::KeyMalformed => {
                "Send one Idempotency-Key: a Structured Field string (\"...\") or a bare key \
                 of 1 to 255 printable ASCII characters."
            }
            Problem::KeyReused => {
                "This Idempotency-Key was first used with a different request (method, path, \
                 query, body or Content-Type). Use a new key for a new request."
            }
            Problem::InFlight => {
                "A request with the same Idempotency-Key is being processed. Retry after the \
                 time given in Retry-After to get its response."
            }
            Problem::NotReplayable => {
                "The request with this Idempotency-Key completed, but its response was not \
                 kept (too large to store). It was not run again."
            }
            Problem::RequestTooLarge => "The request body is over the size this route accepts.",
            Problem::BodyUnreadable => "The request body ended early or could not be read.",
            Problem::StoreUnavailable => {
                "The idempotency store did not answer; the request was not run. Retry with \
                 the same Idempotency-Key."
            }
            Problem::RecordCorrupt => {
                "The stored record of this Idempotency-Key is damaged; the request was not run."
            }
            Problem::TokenInvalid => {
                "The Idempotency-Key must carry a token issued by this service that has not \
                 expired."
            }
            Problem::TokenUsed => "This token was already used; request a new one.",
            Problem::Completed => {
                "The request with this Idempotency-Key already completed; it is not run again."
            }
            Problem::Internal => "The idempotency store refused the operation; nothing ran.",
            Problem::Busy => {
                "What this request needs is in progress, locked or changed in another \
                 request; it was not completed. Retry after the time given in Retry-After."
            }
            Problem::Unavailable => {
                "A store this request needs is down, timing out or lost a write; the request \
                 was not completed. Retry after the time given in Retry-After."
            }
            Problem::TokenLimit => {
                "This service issued as many idempotency tokens as it allows for now. Retry \
                 after the time given in Retry-After."
            }
            Problem::SignatureInvalid => {
                "The webhook-signature header holds no valid signature of this delivery, or \
                 its webhook-timestamp is too far from now. Nothing ran."
            }
            Problem::StateConflict => {
                "The resource's current state does not allow this change. This answer is not \
                 kept: once the state allows it, the same request runs."
            }
            Problem::NoSuchRow => {
                "The resource this request changes does not exist. This answer is not kept: \
                 once it exists, the same request runs."
            }
        }
    }

    /// Seconds a client should wait before retrying, for the retryable ones.
    pub fn retry_after(self) -> Option<u32> {
        match self {
            Problem::InFlight
            | Problem::StoreUnavailable
            | Problem::Busy
            | Problem::Unavailable
            | Problem::TokenLimit => Some(1),
            _ => None,
        }
    }

    /// The response, linking to `docs` when given. It carries [`ReleaseKey`], so the
    /// layer never stores it.
    pub fn response<B: From<Bytes>>(self, docs: Option<&str>) -> Response<B> {
        self.response_naming(docs, None)
    }

    /// The response, with `header` (webhook mode's `webhook-id`) named where the text
    /// speaks of the `Idempotency-Key`.
    pub(crate) fn response_naming<B: From<Bytes>>(
        self,
        docs: Option<&str>,
        header: Option<&str>,
    ) -> Response<B> {
        let name = |text: &'static str| match header {
            None => std::borrow::Cow::Borrowed(text),
            Some(h) => std::borrow::Cow::Owned(
                text.replace("an Idempotency-Key", &format!("a {h}"))
                    .replace("Idempotency-Key", h),
            ),
        };
        let body = serde_json::json!({
            "type": docs.unwrap_or("about:blank"),
            "title": name(self.title()),
            "status": self.status().as_u16(),
            "detail": name(self.detail()),
            "code": self.code(),
        });
        let mut res = Response::new(B::from(Bytes::from(body.to_string())));
        *res.status_mut() = self.status();
        res.extensions_mut().insert(ReleaseKey);
        let h = res.headers_mut();
        h.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(secs) = self.retry_after() {
            h.insert(RETRY_AFTER, HeaderValue::from(secs));
        }
        if let Some(link) =
            docs.and_then(|d| HeaderValue::try_from(format!("<{d}>; rel=\"describedby\"")).ok())
        {
            h.insert(LINK, link);
        }
        res
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.title(), self.status())
    }
}
