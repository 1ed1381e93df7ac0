//! What a service reads for each request: the settings of its [`IdempotencyLayer`],
//! copied into one value when the layer wraps a service, so that the layer stays a
//! builder and the service owns what it runs with.
//!
//! [`IdempotencyLayer`]: crate::IdempotencyLayer

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::header::HeaderName;
use http::{Method, Response, StatusCode};
use http_body::Body;
use idem_runtime::{Idem, Options};

use crate::body::ResponseBody;
use crate::observe::{self, Outcome};
use crate::problem::Problem;
use crate::scope::Scope;

/// Which statuses are stored, when the application says (`store_status`).
pub(crate) type StoreFn = dyn Fn(StatusCode) -> bool + Send + Sync;

/// Whether the header carries a client's key or a server-issued token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Keys,
    Tokens,
    /// Key mode on a sender's event id (`webhook-id`), with signatures checked first.
    Webhooks,
}

/// The settings one service runs with (shared by its clones).
pub(crate) struct Config {
    pub(crate) idem: Idem,
    /// The options the runtime is called with.
    pub(crate) opts: Options,
    pub(crate) mode: Mode,
    /// The operation its records are keyed under: the layer's mode and name.
    pub(crate) operation: &'static str,
    pub(crate) required: bool,
    pub(crate) methods: Vec<Method>,
    pub(crate) id_header: HeaderName,
    pub(crate) scope: Scope,
    pub(crate) stores: Option<Arc<StoreFn>>,
    pub(crate) max_request_bytes: usize,
    pub(crate) max_response_bytes: usize,
    pub(crate) replay_headers: Vec<HeaderName>,
    pub(crate) docs: Option<Arc<str>>,
    pub(crate) detached_timeout: Option<Duration>,
    #[cfg(feature = "webhooks")]
    pub(crate) secret: Option<crate::webhook::Secret>,
    #[cfg(feature = "webhooks")]
    pub(crate) tolerance: Duration,
}

impl Config {
    /// Whether a response with `status` is recorded (and replayed).
    pub(crate) fn stores(&self, status: StatusCode) -> bool {
        match &self.stores {
            Some(f) => f(status),
            None => stored_by_default(status),
        }
    }

    /// The layer's answer instead of the handler's, counted. In webhook mode it speaks
    /// of the sender's id header, which is what the sender knows, not of an
    /// `Idempotency-Key` it never sent.
    pub(crate) fn problem<B: Body>(&self, p: Problem) -> Response<ResponseBody<B>> {
        observe::count(Outcome::Problem(p));
        let header = (self.mode == Mode::Webhooks).then(|| self.id_header.as_str());
        p.response_naming(self.docs.as_deref(), header)
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("idem", &self.idem)
            .field("mode", &self.mode)
            .field("operation", &self.operation)
            .field("required", &self.required)
            .field("methods", &self.methods)
            .field("id_header", &self.id_header)
            .field("scope", &self.scope)
            .field("max_request_bytes", &self.max_request_bytes)
            .field("max_response_bytes", &self.max_response_bytes)
            .field("replay_headers", &self.replay_headers)
            .field("detached_timeout", &self.detached_timeout)
            .finish_non_exhaustive()
    }
}

/// The default of [`IdempotencyLayer::store_status`](crate::IdempotencyLayer::store_status): every status except those that
/// say "try again" (5xx, 408, 429) and those a framework answers before the handler
/// started (400, 401, 405, 413, 415, 422: a body that does not parse, credentials an
/// authentication layer turned away, a missing
/// `Content-Type`, a method the route lacks). A retry of either kind runs the handler.
pub fn stored_by_default(status: StatusCode) -> bool {
    !(status.is_server_error()
        || matches!(
            status,
            StatusCode::REQUEST_TIMEOUT
                | StatusCode::TOO_MANY_REQUESTS
                | StatusCode::BAD_REQUEST
                | StatusCode::UNAUTHORIZED
                | StatusCode::METHOD_NOT_ALLOWED
                | StatusCode::PAYLOAD_TOO_LARGE
                | StatusCode::UNSUPPORTED_MEDIA_TYPE
                | StatusCode::UNPROCESSABLE_ENTITY
        ))
}
