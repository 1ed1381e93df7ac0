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
use crate::token::{CallerLimit, TokenLimit};

/// The operation name a key-mode layer without a [`name`](IdempotencyLayer::name)
/// stores its keys under (part of every record's key). The other modes add theirs, so
/// that layers of different modes on one `Idem` never share a key space.
pub(crate) const OPERATION: &str = "idem_http";

/// A bound on how long a handled request runs on after its client went away, for
/// [`IdempotencyLayer::detached_timeout`]: 60 s. Not applied unless asked for: by
/// default a request whose client went away runs to its end, as a connected one does.
pub const DEFAULT_DETACHED_TIMEOUT: Duration = Duration::from_secs(60);

/// Default lifetime of an issued token: 30 s, enough for a client to send the request
/// it was asked for, short enough that unused tokens do not pile up in the store.
pub const DEFAULT_TOKEN_TTL: Duration = Duration::from_secs(30);

/// Default bound on token issuance through
/// [`IdempotencyLayer::token_route`](IdempotencyLayer): 1,000 tokens per second per
/// process, so at most about 30,000 tokens are alive at once with the default lifetime.
pub const DEFAULT_TOKEN_LIMIT: (u32, Duration) = (1000, Duration::from_secs(1));

/// Default bound on token issuance to one caller (one scope; one client address for
/// anonymous callers): 100 tokens per second, so that one caller's flood leaves the
/// rest of [`DEFAULT_TOKEN_LIMIT`] to the others.
pub const DEFAULT_TOKEN_LIMIT_PER_CALLER: (u32, Duration) = (100, Duration::from_secs(1));

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
    pub(crate) name: Option<Arc<str>>,
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
    pub(crate) detached_timeout: Option<Duration>,
    pub(crate) token_ttl: Duration,
    pub(crate) token_limit: Arc<TokenLimit>,
    pub(crate) caller_limit: Arc<CallerLimit>,
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
            .field("name", &self.name)
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
            .field("caller_limit", &self.caller_limit)
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
    /// request's credentials (its `Authorization` header, normalised: see
    /// [`scope_by_extension`](Self::scope_by_extension) for the scope that survives a
    /// token refresh); 1 MiB bounds on buffered request and stored response bodies;
    /// every status is stored except 5xx, 408, 429 and the rejections before a
    /// handler starts (400, 401, 405, 413, 415, 422); `Content-Type`, `Location` and
    /// `ETag` are replayed; a handler whose client went away runs to its end (no
    /// [`detached_timeout`](Self::detached_timeout)).
    pub fn new(idem: Idem) -> Self {
        IdempotencyLayer {
            idem,
            mode: Mode::Keys,
            name: None,
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
            detached_timeout: None,
            token_ttl: DEFAULT_TOKEN_TTL,
            token_limit: Arc::new(TokenLimit::new(
                DEFAULT_TOKEN_LIMIT.0,
                DEFAULT_TOKEN_LIMIT.1,
            )),
            caller_limit: Arc::new(CallerLimit::new(
                DEFAULT_TOKEN_LIMIT_PER_CALLER.0,
                DEFAULT_TOKEN_LIMIT_PER_CALLER.1,
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
    /// only; event ids are a key space apart from every key-mode layer's keys, and are
    /// not scoped by credentials (senders sign rather than authenticate), so one
    /// sender's ids share one key space unless [`scope`](Self::scope) names senders;
    /// problems name the id header, not an `Idempotency-Key`; a delivery of an event still running waits
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
    /// service issued ([`token_response`](crate::token_response), served as `GET /token`) and
    /// that was not used yet. A used token replays the stored response to the caller
    /// that used it (409 with [`on_duplicate`](Self::on_duplicate)`(OnDuplicate::Reject)`),
    /// and is 422 for any other caller (another scope, as key mode scopes keys) or
    /// request; an unknown, forged or expired one is 400. An issued token stays valid for
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
    ///
    /// Name the *user* here, never a credential that changes while its user stays (an
    /// OAuth access token, a session id): a client that times out, refreshes its token
    /// and retries under the same key would be another scope, and pay twice. With an
    /// authentication layer, [`scope_by_extension`](Self::scope_by_extension) is the
    /// shorter way.
    pub fn scope<F>(mut self, f: F) -> Self
    where
        F: Fn(&request::Parts) -> Option<String> + Send + Sync + 'static,
    {
        self.scope = Scope::Custom(Arc::new(f));
        self
    }

    /// Scopes keys by the user the application's authentication established: the value
    /// of type `T` that an earlier layer (an auth middleware) put in the request's
    /// extensions, digested through its `Hash`. This is the recommended set-up: a
    /// client that refreshes its token between a timeout and its retry is the same
    /// user, so its retry replays, where the default scope by credentials would run it
    /// again. Requests without a `T` share the scope of anonymous callers; an auth layer
    /// that turns away bad credentials (401) before this layer keeps them out of it.
    ///
    /// `T`'s `Hash` must be the same in every replica sharing the store (derive it on
    /// the user's id, not on a pointer or a random state).
    ///
    /// ```
    /// use axum::{Router, extract::Request, http::StatusCode, middleware::{self, Next}, routing::post};
    /// use idem_http::IdempotencyLayer;
    ///
    /// /// Who the request speaks for, as the app's authentication found out.
    /// #[derive(Clone, Hash)]
    /// struct UserId(u64);
    ///
    /// async fn authenticate(mut req: Request, next: Next) -> Result<axum::response::Response, StatusCode> {
    ///     let user = match req.headers().get("authorization") {
    ///         None => return Ok(next.run(req).await), // anonymous
    ///         Some(v) => lookup(v.as_bytes()).ok_or(StatusCode::UNAUTHORIZED)?,
    ///     };
    ///     req.extensions_mut().insert(user);
    ///     Ok(next.run(req).await)
    /// }
    /// # fn lookup(_: &[u8]) -> Option<UserId> { Some(UserId(7)) }
    ///
    /// let keys = IdempotencyLayer::new(idem_runtime::Idem::builder().build())
    ///     .scope_by_extension::<UserId>();
    /// let app: Router = Router::new()
    ///     .route("/payments", post(|| async { "paid" }).route_layer(keys))
    ///     // Added last, so it runs first: the user is known when the key is scoped.
    ///     .layer(middleware::from_fn(authenticate));
    /// # let _ = app;
    /// ```
    pub fn scope_by_extension<T: std::hash::Hash + Send + Sync + 'static>(mut self) -> Self {
        self.scope = Scope::extension::<T>();
        self
    }

    /// This layer's key space: keys (and used tokens) of layers with different names
    /// on one `Idem` never meet, even on one route. Without a name, each mode has a
    /// key space of its own (key mode, token mode, webhook mode), so that an anonymous
    /// client's `Idempotency-Key` can never take a webhook's event id; name layers of
    /// one mode that must not share keys (`.name("payments")`, `.name("refunds")`).
    ///
    /// The name is part of every record's key: renaming a layer starts it afresh, as a
    /// new key space.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(Arc::from(name.into()));
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
    /// (transient), and 400, 401, 405, 413, 415 and 422 (a framework's or an
    /// authentication layer's rejections before the handler started: Stripe too keeps
    /// no result for a request that failed validation). Those release the key, so the retry (the corrected request) runs
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

    /// Bounds how long a handled request may run on after its client went away
    /// (default: no bound; [`DEFAULT_DETACHED_TIMEOUT`] is a common one).
    ///
    /// A client that hangs up, resets its stream or times out does not cancel the
    /// handler: its effect may already be in flight. The request runs on in a task of
    /// its own until its response is recorded, so the client's retry waits for it (with
    /// [`wait`](Self::wait)) or gets 409 and then the replay, and the handler runs once,
    /// as for a client that stayed connected.
    ///
    /// Past this bound the handler is cancelled, but its key is not released: a cancel
    /// cannot recall what the handler already sent (a statement waiting on a lock still
    /// commits). The claim keeps its key until its [`lease`](Self::lease) runs out,
    /// with its heartbeat stopped, so that what was sent has that long to land; then a
    /// retry runs the handler again. An effect still pending after the lease may land
    /// after that retry: a handler whose effect may outlive it should make it
    /// idempotent downstream (a step with `StepCtx::key()`, or a transaction).
    pub fn detached_timeout(mut self, timeout: Duration) -> Self {
        self.detached_timeout = Some(timeout);
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
    /// `limit × token_ttl / per` per process. The bound is shared by all callers; each
    /// caller also has a bound of its own
    /// ([`token_limit_per_caller`](Self::token_limit_per_caller)), so one caller's flood
    /// does not use it all.
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

    /// At most `limit` tokens issued by [`token_route`](IdempotencyLayer) to one caller
    /// per `per` (default [`DEFAULT_TOKEN_LIMIT_PER_CALLER`], 100 per second), within
    /// [`token_limit`](Self::token_limit); past it that caller gets 429 while others are
    /// still served. A caller is the layer's scope (by default its credentials, with
    /// [`scope_by_extension`](Self::scope_by_extension) its user); anonymous callers are
    /// told apart by their address when the server provides it (axum's
    /// `ConnectInfo<SocketAddr>`, from `into_make_service_with_connect_info`), else
    /// they share one bound.
    ///
    /// Credentials that no authentication checks can be made up by the thousand, each a
    /// new caller: only [`token_limit`](Self::token_limit) bounds those. Scope by the
    /// authenticated user, behind a layer that answers bad credentials with 401.
    pub fn token_limit_per_caller(mut self, limit: u32, per: Duration) -> Self {
        self.caller_limit = Arc::new(CallerLimit::new(limit, per));
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
        let operation = self.operation();
        let base = match self.mode {
            Mode::Keys | Mode::Webhooks => Options::dedup(operation),
            Mode::Tokens => Options::token(operation),
        };
        Config {
            idem: self.idem.clone(),
            opts: base
                .ttl(self.ttl)
                .lease(self.lease)
                .wait(self.wait)
                .on_duplicate(self.on_duplicate),
            mode: self.mode,
            operation,
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

    /// The operation this layer's records are keyed under: its mode and name. Key mode
    /// without a name keeps the name it always had, so its records stay valid.
    pub(crate) fn operation(&self) -> &'static str {
        let mode = match self.mode {
            Mode::Keys => "keys",
            Mode::Tokens => "tokens",
            Mode::Webhooks => "webhooks",
        };
        match (&self.name, self.mode) {
            (None, Mode::Keys) => OPERATION,
            (None, _) => intern(format!("{OPERATION}::{mode}")),
            (Some(name), _) => intern(format!("{OPERATION}::{mode}::{name}")),
        }
    }
}

/// `name` as a `&'static str` (the runtime's options take one), leaked once per
/// distinct name: a process has as many as its layers.
fn intern(name: String) -> &'static str {
    static NAMES: std::sync::Mutex<Vec<&'static str>> = std::sync::Mutex::new(Vec::new());
    let mut names = NAMES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(known) = names.iter().find(|n| **n == name) {
        return known;
    }
    let leaked: &'static str = Box::leak(name.into_boxed_str());
    names.push(leaked);
    leaked
}

impl<S> tower::Layer<S> for IdempotencyLayer {
    type Service = Idempotency<S>;

    fn layer(&self, inner: S) -> Idempotency<S> {
        Idempotency::new(inner, Arc::new(self.config()))
    }
}
