//! The layer's configuration: [`IdempotencyLayer`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::header::{CONTENT_TYPE, ETAG, HeaderName, LOCATION, SET_COOKIE};
use http::{Method, StatusCode, request};
use idem_runtime::{Idem, OnDuplicate, Options};

use crate::config::{Config, Mode, StoreFn};
use crate::key::{IDEMPOTENCY_KEY, WEBHOOK_ID};
use crate::scope::Scope;
use crate::service::Idempotency;
use crate::token::TokenLimit;

/// The operation name keys are stored under (part of every record's key).
pub(crate) const OPERATION: &str = "idem_http";

/// Default bound on how long a handled request runs on after its client went away: 60 s.
pub const DEFAULT_DETACHED_TIMEOUT: Duration = Duration::from_secs(60);

/// Default lifetime of an issued token: 30 s, enough for a client to send the request
/// it was asked for, short enough that unused tokens do not pile up in the store.
pub const DEFAULT_TOKEN_TTL: Duration = Duration::from_secs(30);

/// Default bound on token issuance through
/// [`IdempotencyLayer::token_route`](IdempotencyLayer): 1,000 tokens per second per
/// process, so at most about 30,000 tokens are alive at once with the default lifetime.
pub const DEFAULT_TOKEN_LIMIT: (u32, Duration) = (1000, Duration::from_secs(1));

/// Default wait of a duplicate delivery for its in-flight twin in webhook mode: 30 s.
/// Senders retry what they do not get a 2xx for, so answering 409 at once only brings
/// the event back again.
pub const DEFAULT_WEBHOOK_WAIT: Duration = Duration::from_secs(30);

/// Default tolerance of a webhook's `webhook-timestamp` against this server's clock: 5
/// minutes either way, as the Standard Webhooks reference libraries.
pub const DEFAULT_WEBHOOK_TOLERANCE: Duration = Duration::from_secs(300);

/// Default bound on a buffered request body: 1 MiB.
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 1 << 20;
/// Default bound on a stored response body: 1 MiB.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 1 << 20;

/// A [`tower::Layer`] that makes the requests it wraps idempotent by their
/// `Idempotency-Key` header. See the [crate docs](crate) for the contract.
///
/// ```
/// use std::time::Duration;
/// use idem_http::IdempotencyLayer;
/// use idem_runtime::Idem;
///
/// let layer = IdempotencyLayer::new(Idem::builder().namespace("shop").build())
///     .ttl(Duration::from_secs(3600))
///     .wait(Duration::from_secs(2))
///     // Keys are per API key: two callers never see each other's responses.
///     .scope(|parts| {
///         parts.headers.get("x-api-key").and_then(|v| v.to_str().ok()).map(str::to_owned)
///     })
///     .replay_header(http::HeaderName::from_static("x-request-cost"));
/// # let _ = layer;
/// ```
#[derive(Clone)]
#[must_use]
pub struct IdempotencyLayer {
    pub(crate) idem: Idem,
    pub(crate) mode: Mode,
    pub(crate) required: bool,
    pub(crate) methods: Vec<Method>,
    pub(crate) ttl: Duration,
    pub(crate) lease: Duration,
    pub(crate) wait: Duration,
    pub(crate) on_duplicate: OnDuplicate,
    pub(crate) scope: Scope,
    pub(crate) stores: Option<Arc<StoreFn>>,
    pub(crate) max_request_bytes: usize,
    pub(crate) max_response_bytes: usize,
    pub(crate) replay_headers: Vec<HeaderName>,
    pub(crate) docs: Option<Arc<str>>,
    pub(crate) detached_timeout: Duration,
    pub(crate) token_ttl: Duration,
    pub(crate) token_limit: Arc<TokenLimit>,
    pub(crate) id_header: HeaderName,
    #[cfg(feature = "webhooks")]
    pub(crate) secret: Option<crate::webhook::Secret>,
    #[cfg(feature = "webhooks")]
    pub(crate) tolerance: Duration,
}

impl fmt::Debug for IdempotencyLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("idem", &self.idem)
            .field("mode", &self.mode)
            .field("required", &self.required)
            .field("methods", &self.methods)
            .field("ttl", &self.ttl)
            .field("lease", &self.lease)
            .field("wait", &self.wait)
            .field("on_duplicate", &self.on_duplicate)
            .field("scope", &self.scope)
            .field("max_request_bytes", &self.max_request_bytes)
            .field("max_response_bytes", &self.max_response_bytes)
            .field("replay_headers", &self.replay_headers)
            .field("docs", &self.docs)
            .field("detached_timeout", &self.detached_timeout)
            .field("token_ttl", &self.token_ttl)
            .field("token_limit", &self.token_limit)
            .field("id_header", &self.id_header)
            .finish_non_exhaustive()
    }
}

impl IdempotencyLayer {
    /// The layer in key mode on `idem`'s store and namespace: the client picks the key.
    ///
    /// Defaults: a key is required; `POST` and `PATCH` are handled (other methods pass
    /// through untouched); records are kept 24 h; the lease is the runtime's (30 s);
    /// `wait` is 0 (an in-flight duplicate gets 409 at once); keys are scoped by the
    /// request's credentials (its `Authorization` header); 1 MiB bounds on buffered request and stored response bodies;
    /// every status is stored except 5xx, 408, 429 and the rejections before a
    /// handler starts (400, 405, 413, 415, 422); `Content-Type`, `Location` and
    /// `ETag` are replayed.
    pub fn new(idem: Idem) -> Self {
        IdempotencyLayer {
            idem,
            mode: Mode::Keys,
            required: true,
            methods: vec![Method::POST, Method::PATCH],
            ttl: idem_runtime::options::DEFAULT_TTL,
            lease: idem_runtime::options::DEFAULT_LEASE,
            wait: Duration::ZERO,
            on_duplicate: OnDuplicate::Replay,
            scope: Scope::Credentials { cookie: None },
            stores: None,
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            replay_headers: vec![CONTENT_TYPE, LOCATION, ETAG],
            docs: None,
            detached_timeout: DEFAULT_DETACHED_TIMEOUT,
            token_ttl: DEFAULT_TOKEN_TTL,
            token_limit: Arc::new(TokenLimit::new(
                DEFAULT_TOKEN_LIMIT.0,
                DEFAULT_TOKEN_LIMIT.1,
            )),
            id_header: IDEMPOTENCY_KEY,
            #[cfg(feature = "webhooks")]
            secret: None,
            #[cfg(feature = "webhooks")]
            tolerance: DEFAULT_WEBHOOK_TOLERANCE,
        }
    }

    /// The layer in webhook mode: the sender's event id (the Standard Webhooks
    /// `webhook-id` header; another with [`id_header`](Self::id_header)) is the key,
    /// so each event runs the handler once however often it is delivered. See
    /// [Webhooks](crate#webhooks).
    ///
    /// It is key mode with other defaults: the id is required (400 without it); `POST`
    /// only; keys are not scoped by credentials (senders sign rather than
    /// authenticate), so one sender's ids share one key space unless
    /// [`scope`](Self::scope) names senders; a delivery of an event still running waits
    /// for it up to [`DEFAULT_WEBHOOK_WAIT`] (30 s) and gets its response, since a 409
    /// would only make the sender retry. A 5xx (or any status not stored) releases the
    /// key: the sender's retry runs the handler again. With the `webhooks` feature,
    /// [`signing_secret`](Self::signing_secret) checks signatures first.
    pub fn webhooks(idem: Idem) -> Self {
        IdempotencyLayer {
            mode: Mode::Webhooks,
            methods: vec![Method::POST],
            wait: DEFAULT_WEBHOOK_WAIT,
            scope: Scope::Unscoped,
            id_header: WEBHOOK_ID,
            ..Self::new(idem)
        }
    }

    /// Webhook mode: the header carrying the sender's event id (default `webhook-id`;
    /// GitHub's is `x-github-delivery`). Its value is read as a bare key (1–255
    /// printable ASCII characters without `"`, `,`, `;`).
    pub fn id_header(mut self, name: HeaderName) -> Self {
        self.id_header = name;
        self
    }

    /// Verifies Standard Webhooks signatures (meant for webhook mode) with this secret
    /// (`whsec_` then the key in base64), before the event id is claimed. A delivery
    /// whose `webhook-signature` holds no valid `v1,` HMAC-SHA256 of
    /// `{webhook-id}.{webhook-timestamp}.{body}`, or whose timestamp is further than
    /// [`timestamp_tolerance`](Self::timestamp_tolerance) from now, is answered 401
    /// ([`Problem::SignatureInvalid`](crate::Problem)), never stored: a correctly
    /// signed delivery of the same id runs afterwards.
    ///
    /// ```
    /// use idem_http::{IdempotencyLayer, SecretError};
    /// let idem = idem_runtime::Idem::builder().build();
    /// let layer = IdempotencyLayer::webhooks(idem.clone())
    ///     .signing_secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")?;
    /// # let _ = layer;
    /// assert_eq!(
    ///     IdempotencyLayer::webhooks(idem).signing_secret("MfKQ9r8G").unwrap_err(),
    ///     SecretError::Prefix,
    /// );
    /// # Ok::<(), SecretError>(())
    /// ```
    #[cfg(feature = "webhooks")]
    #[cfg_attr(docsrs, doc(cfg(feature = "webhooks")))]
    pub fn signing_secret(mut self, secret: &str) -> Result<Self, crate::webhook::SecretError> {
        self.secret = Some(crate::webhook::Secret::parse(secret)?);
        Ok(self)
    }

    /// How far a signed delivery's `webhook-timestamp` may be from this server's
    /// clock, either way (default [`DEFAULT_WEBHOOK_TOLERANCE`], 5 minutes). Past it
    /// the delivery is 401: a captured delivery cannot be replayed later.
    #[cfg(feature = "webhooks")]
    #[cfg_attr(docsrs, doc(cfg(feature = "webhooks")))]
    pub fn timestamp_tolerance(mut self, tolerance: Duration) -> Self {
        self.tolerance = tolerance;
        self
    }

    /// The layer in token mode: the `Idempotency-Key` header must carry a token this
    /// service issued ([`issue_token`](crate::issue_token), served as `GET /token`) and
    /// that was not used yet. A used token replays the stored response (409 with
    /// [`on_duplicate`](Self::on_duplicate)`(OnDuplicate::Reject)`); an unknown, forged
    /// or expired one is 400. An issued token stays valid for
    /// [`token_ttl`](Self::token_ttl) (30 s); `ttl` is how long its response is kept
    /// for replays once it is used.
    pub fn tokens(idem: Idem) -> Self {
        IdempotencyLayer {
            mode: Mode::Tokens,
            ..Self::new(idem)
        }
    }

    /// Whether a handled request without the header is refused with 400 (default
    /// `true`); `false` lets it through, run as a plain request.
    pub fn required(mut self, required: bool) -> Self {
        self.required = required;
        self
    }

    /// The methods handled (default `POST` and `PATCH`); others pass through untouched.
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.methods = methods.into_iter().collect();
        self
    }

    /// How long a completed response is kept for replays (default 24 h).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// The in-flight lease: renewed while the handler runs, so it only decides how soon
    /// another server takes over the key of a server that crashed mid-handler.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How long a duplicate of an in-flight request waits for it (default 0: 409 with
    /// `Retry-After` at once). A duplicate that waits gets the replayed response.
    ///
    /// The default differs from the attribute's 10 s on purpose: a waiting HTTP request
    /// holds a connection and a server slot, and its client has a timeout of its own.
    /// Answering at once, as Stripe does, lets the client decide; its retry after
    /// `Retry-After` gets the replay.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// A completed key: replay its response (default) or answer 409.
    pub fn on_duplicate(mut self, on_duplicate: OnDuplicate) -> Self {
        self.on_duplicate = on_duplicate;
        self
    }

    /// Scopes keys per caller the application's way: the same key from two scopes
    /// names two records. `f` reads the caller's identity from the request (an API key
    /// header, a tenant, an authenticated user put in the extensions by an earlier
    /// layer); `None` is the one shared scope of unidentified callers. This replaces
    /// the default scope by credentials.
    pub fn scope<F>(mut self, f: F) -> Self
    where
        F: Fn(&request::Parts) -> Option<String> + Send + Sync + 'static,
    {
        self.scope = Scope::Custom(Arc::new(f));
        self
    }

    /// With the default scope by credentials, the value of the cookie `name` (a
    /// session id) takes part in the scope too, beside the `Authorization` header.
    ///
    /// ```
    /// use idem_http::IdempotencyLayer;
    /// let layer = IdempotencyLayer::new(idem_runtime::Idem::builder().build())
    ///     .session_cookie("sid");
    /// # let _ = layer;
    /// ```
    pub fn session_cookie(mut self, name: impl Into<String>) -> Self {
        self.scope = Scope::Credentials {
            cookie: Some(Arc::from(name.into())),
        };
        self
    }

    /// Opts out of scoping: one key space for all callers, so two callers that send
    /// the same key and body get the same response. Only for services whose callers
    /// are one party (an internal API behind its own authentication), or whose keys
    /// are unguessable and never shared.
    pub fn unscoped(mut self) -> Self {
        self.scope = Scope::Unscoped;
        self
    }

    /// Which response statuses are stored and replayed. Default
    /// ([`stored_by_default`](crate::stored_by_default)): all but 5xx, 408 and 429
    /// (transient), and 400, 405, 413, 415 and 422 (a framework's rejections before the
    /// handler started: Stripe too keeps no result for a request that failed
    /// validation). Those release the key, so the retry (the corrected request) runs
    /// the handler. A response carrying [`ReleaseKey`](crate::ReleaseKey) is never
    /// stored, whatever its status.
    ///
    /// ```
    /// use idem_http::{IdempotencyLayer, stored_by_default};
    /// // Also keep 422s: this API's handler validates after charging.
    /// let layer = IdempotencyLayer::new(idem_runtime::Idem::builder().build())
    ///     .store_status(|s| s == 422 || stored_by_default(s));
    /// # let _ = layer;
    /// ```
    pub fn store_status<F>(mut self, f: F) -> Self
    where
        F: Fn(StatusCode) -> bool + Send + Sync + 'static,
    {
        self.stores = Some(Arc::new(f));
        self
    }

    /// The largest request body buffered (default 1 MiB); a larger one is answered 413
    /// and the handler does not run.
    pub fn max_request_bytes(mut self, n: usize) -> Self {
        self.max_request_bytes = n;
        self
    }

    /// The largest response body stored (default 1 MiB). A larger response still
    /// reaches its client whole; its key is recorded as completed without a replayable
    /// body, and retries get 410 ([`Problem::NotReplayable`](crate::Problem)), never a
    /// second run.
    pub fn max_response_bytes(mut self, n: usize) -> Self {
        self.max_response_bytes = n;
        self
    }

    /// Also replays this response header (beside `Content-Type`, `Location` and
    /// `ETag`). `Set-Cookie` is never replayed: adding it does nothing.
    pub fn replay_header(mut self, name: HeaderName) -> Self {
        if name != SET_COOKIE && !self.replay_headers.contains(&name) {
            self.replay_headers.push(name);
        }
        self
    }

    /// How long a handled request may run on after its client went away (default
    /// [`DEFAULT_DETACHED_TIMEOUT`], 60 s).
    ///
    /// A client that hangs up, resets its stream or times out does not cancel the
    /// handler: its effect may already be in flight. The request runs on in a task of
    /// its own until its response is recorded, so the client's retry waits for it (with
    /// [`wait`](Self::wait)) or gets 409 and then the replay, and the handler runs once.
    /// Past this bound the handler is cancelled and its key released, as a handler that
    /// failed: a retry runs it again.
    pub fn detached_timeout(mut self, timeout: Duration) -> Self {
        self.detached_timeout = timeout;
        self
    }

    /// How long a token issued by [`token_route`](IdempotencyLayer) stays valid
    /// (default [`DEFAULT_TOKEN_TTL`], 30 s, and never longer than [`ttl`](Self::ttl)).
    /// Token mode only.
    pub fn token_ttl(mut self, ttl: Duration) -> Self {
        self.token_ttl = ttl;
        self
    }

    /// At most `limit` tokens issued by [`token_route`](IdempotencyLayer) per `per`, in
    /// this process (default [`DEFAULT_TOKEN_LIMIT`], 1,000 per second); past it the
    /// route answers 429 ([`Problem::TokenLimit`](crate::Problem)) with `Retry-After`.
    ///
    /// Every token is a record in the store until it expires, so this and
    /// [`token_ttl`](Self::token_ttl) bound the tokens alive at once: about
    /// `limit × token_ttl / per` per process. The bound is shared by all callers; to
    /// keep one caller from using it all, put a per-caller rate limiter in front of the
    /// token route.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem_http::IdempotencyLayer;
    /// let tokens = IdempotencyLayer::tokens(idem_runtime::Idem::builder().build())
    ///     .token_ttl(Duration::from_secs(30))
    ///     .token_limit(200, Duration::from_secs(1)); // ≤ 6,000 tokens alive
    /// # let _ = tokens;
    /// ```
    pub fn token_limit(mut self, limit: u32, per: Duration) -> Self {
        self.token_limit = Arc::new(TokenLimit::new(limit, per));
        self
    }

    /// The operator's documentation of the contract: the `type` of every problem
    /// response, and linked from each with `Link: <url>; rel="describedby"`.
    pub fn docs(mut self, url: impl Into<String>) -> Self {
        self.docs = Some(Arc::from(url.into()));
        self
    }

    /// What a service runs with: copied from this layer's settings once per service.
    fn config(&self) -> Config {
        let base = match self.mode {
            Mode::Keys | Mode::Webhooks => Options::dedup(OPERATION),
            Mode::Tokens => Options::token(OPERATION),
        };
        Config {
            idem: self.idem.clone(),
            opts: base
                .ttl(self.ttl)
                .lease(self.lease)
                .wait(self.wait)
                .on_duplicate(self.on_duplicate),
            mode: self.mode,
            required: self.required,
            methods: self.methods.clone(),
            id_header: self.id_header.clone(),
            scope: self.scope.clone(),
            stores: self.stores.clone(),
            max_request_bytes: self.max_request_bytes,
            max_response_bytes: self.max_response_bytes,
            replay_headers: self.replay_headers.clone(),
            docs: self.docs.clone(),
            detached_timeout: self.detached_timeout,
            #[cfg(feature = "webhooks")]
            secret: self.secret.clone(),
            #[cfg(feature = "webhooks")]
            tolerance: self.tolerance,
        }
    }
}

impl<S> tower::Layer<S> for IdempotencyLayer {
    type Service = Idempotency<S>;

    fn layer(&self, inner: S) -> Idempotency<S> {
        Idempotency::new(inner, Arc::new(self.config()))
    }
}
