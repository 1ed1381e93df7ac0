//! An `Idempotency-Key` layer for tower and axum services, on any idem store.
//!
//! Clients retry. A mobile app resends `POST /payments` after a timeout, a partner
//! replays a webhook, a user double-clicks "Pay". [`IdempotencyLayer`] makes such routes
//! safe to retry: the handler runs once per key, and every retry gets the first
//! response back. It follows draft-ietf-httpapi-idempotency-key-header where the draft
//! speaks and Stripe's API where it is silent, and works on every store of
//! [`idem_runtime`] (memory, Redis, SQL), so retries that land on another server replica
//! are caught too.
//!
//! ```
//! use axum::{Json, Router, http::StatusCode, routing::post};
//! use idem_http::IdempotencyLayer;
//! use idem_runtime::Idem;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
//! async fn pay(Json(order): Json<serde_json::Value>) -> (StatusCode, Json<serde_json::Value>) {
//!     let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
//!     (StatusCode::CREATED, Json(serde_json::json!({ "order": order["order"], "payment_id": run })))
//! }
//!
//! let idem = Idem::builder().namespace("shop").build(); // or a RedisStore, a SqlStore
//! // On the routes it guards (`route_layer`), not the whole router (`layer`): a POST to
//! // a mistyped path is then the router's 404, and never takes the key.
//! let app = Router::new()
//!     .route("/payments", post(pay))
//!     .route_layer(IdempotencyLayer::new(idem));
//!
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let url = format!("http://{}/payments", listener.local_addr()?);
//! tokio::spawn(async move { axum::serve(listener, app).await });
//!
//! let client = reqwest::Client::new();
//! let send = || {
//!     client.post(&url)
//!         .header("Idempotency-Key", "\"order-7\"")
//!         .header("Content-Type", "application/json")
//!         .body(r#"{"order":7}"#)
//! };
//! let first = send().send().await?;
//! assert_eq!(first.status(), 201);
//! let first = first.text().await?;
//!
//! let retry = send().send().await?;
//! assert_eq!(retry.status(), 201);                          // the stored status,
//! assert_eq!(retry.headers()["idempotent-replayed"], "true");
//! assert_eq!(retry.text().await?, first);                   // the same body: same payment_id
//! assert_eq!(RUNS.load(std::sync::atomic::Ordering::SeqCst), 1);
//!
//! let other = client.post(&url)
//!     .header("Idempotency-Key", "order-7") // bare: the same key as "order-7" quoted
//!     .header("Content-Type", "application/json")
//!     .body(r#"{"order":8}"#);
//! assert_eq!(other.send().await?.status(), 422);            // same key, another request
//! # Ok(()) }
//! ```
//!
//! # The contract
//!
//! | situation | answer |
//! |---|---|
//! | key missing on a required route | 400 |
//! | key malformed: not a Structured Field string or bare key of 1–255 printable ASCII characters, with parameters (`k;a=1`, `"k";a=1`), or several keys | 400 |
//! | the same key sent quoted (`"abc"`) and bare (`abc`) | one key: the second is a retry of the first |
//! | same key, different request (method, path, query, body digest, Content-Type) | 422 |
//! | same key, twin still in flight and `wait` ran out | 409 with `Retry-After` |
//! | same key, completed | the stored status, body and allow-listed headers, plus `Idempotent-Replayed: true` |
//! | request body over `max_request_bytes` | 413; the handler does not run |
//! | the store down or timing out | 503 with `Retry-After`; the handler does not run |
//! | token mode: token unknown, forged or expired | 400 |
//! | token mode: token already used | the stored response is replayed to the caller that used it (409 if the layer is set to reject); 422 if sent with a different request or by another caller |
//! | token mode: more tokens asked for than [`IdempotencyLayer::token_limit`] allows, in all or ([`IdempotencyLayer::token_limit_per_caller`]) by one caller | 429 with `Retry-After` |
//!
//! - Every answer of the layer's own is an RFC 9457 `application/problem+json` body
//!   ([`Problem`]) with a stable `code`; with [`IdempotencyLayer::docs`] its `type` is
//!   the operator's documentation, also linked as `Link: <...>; rel="describedby"`.
//! - Stored: every response of the handler, except
//!   - 5xx, 408 and 429: "try again" answers;
//!   - 400, 401, 405, 413, 415 and 422: a framework's (or an authentication layer's)
//!     rejections before the handler started
//!     (a body that does not parse, no `Content-Type`, a method the route lacks), so
//!     the corrected retry under the same key runs;
//!   - any response carrying [`ReleaseKey`], which every [`Problem`] does: an
//!     [`idem_runtime::Error`] a handler maps through `Problem` (`Problem::from(e)`;
//!     transient ones are 409 or 503 with `Retry-After`) is never replayed, and a retry
//!     after its cause is gone runs the handler.
//!
//!   Those release the key, so a retry runs the handler again. The statuses are
//!   configurable with [`IdempotencyLayer::store_status`] (default
//!   [`stored_by_default`]). Replayed headers come from an allow-list (`Content-Type`,
//!   `Location`, `ETag` and those added with [`IdempotencyLayer::replay_header`]);
//!   `Set-Cookie` is never replayed. The body is stored as the bytes the handler
//!   produced, never re-encoded, in a checksummed record: a damaged record is a 500
//!   problem, never replayed.
//! - A response over `max_response_bytes` still reaches its client whole (its start
//!   buffered, the rest streamed). Its key is recorded as completed without a
//!   replayable body: retries get 410 ([`Problem::NotReplayable`]), and the handler
//!   never runs again.
//! - A client that disconnects, resets its stream or times out mid-handler does not
//!   cancel the handler: its effect may already be in flight. The request runs on,
//!   detached from its connection, to its end (as a connected one does: a cancel
//!   cannot recall a statement already sent), its response is recorded, and the
//!   client's retry waits for it or gets 409, then the replay. With
//!   [`IdempotencyLayer::detached_timeout`] idem cancels it past that bound, but keeps
//!   its key until its lease ends, so what it sent has that long to land. A server that crashes mid-handler leaves the key held until its lease
//!   ends ([`IdempotencyLayer::lease`]); then another server takes it over, and an
//!   effect the dead server had in flight may still land (see the failure model).
//! - Keys are scoped per caller, so another caller sending the same key and body gets
//!   a record of its own, never someone else's response. Keys and credentials are
//!   stored as digests, never in the clear.
//!   - Recommended: scope by the user the application's authentication established,
//!     [`IdempotencyLayer::scope_by_extension`] (a value an auth middleware put in the
//!     request's extensions), or [`IdempotencyLayer::scope`] (a closure over the
//!     request). A client that refreshes its token between a timeout and its retry is
//!     still that user, and its retry replays.
//!   - Default: the request's credentials (its `Authorization` header, scheme
//!     case-insensitive and spaces folded, and the cookie named with
//!     [`IdempotencyLayer::session_cookie`]). A raw-credential scope splits at a token
//!     refresh: the retry under the new token is another caller, and runs the handler
//!     again.
//!   - [`IdempotencyLayer::unscoped`] is the explicit opt-out to one key space for all.
//! - Each layer has a key space of its own: key mode, token mode and webhook mode on
//!   one `Idem` never see each other's keys (an anonymous `Idempotency-Key` cannot take
//!   a webhook's event id), and [`IdempotencyLayer::name`] sets layers of one mode
//!   apart.
//!
//! # Features
//!
//! - `axum`: [`IdempotencyKey`] as an extractor, [`Problem`] as `IntoResponse`, and
//!   `IdempotencyLayer::token_route`. The layer itself needs no feature: it is a plain
//!   [`tower::Layer`] over [`http`] and [`http_body`] types.
//! - `webhooks`: Standard Webhooks signature verification in webhook mode
//!   ([`IdempotencyLayer::signing_secret`]), on `hmac` and `sha2`.
//! - `metrics`: counts requests by outcome ([`observe`]) through the `metrics` facade,
//!   beside the runtime's own metrics.
//!
//! # What is buffered, what streams
//!
//! A handled request (a method in [`IdempotencyLayer::methods`] carrying a key) is
//! buffered whole, up to `max_request_bytes`, before anything else, so that it can be
//! fingerprinted: the handler gets it as a [`RequestBody`]. Other requests stream
//! through untouched, as do responses that are not stored (5xx, ...). A stored response
//! is buffered up to `max_response_bytes` before it is sent; trailers are neither
//! stored nor replayed.
//!
//! # Token mode
//!
//! [`IdempotencyLayer::tokens`] is the one-time-token flow: the client first gets a
//! token from `GET /token` ([`token_response`]; with axum,
//! [`IdempotencyLayer::token_route`](IdempotencyLayer)), then sends it as its
//! `Idempotency-Key`. Only tokens this service issued and that have not expired are
//! accepted; each runs the handler once, for one request: the token sent again with a
//! different request is 422, as a reused key is. A used token belongs to the caller
//! that used it (scoped as key mode scopes keys): another caller sending it gets 422,
//! never that caller's response.
//!
//! Tokens live 30 s ([`IdempotencyLayer::token_ttl`]), and the token route issues at
//! most 1,000 a second per process ([`IdempotencyLayer::token_limit`]; 429 past it), so
//! about 30,000 tokens at most are alive at once, each a record in the store. One
//! caller gets at most 100 of them a second
//! ([`IdempotencyLayer::token_limit_per_caller`]), so its flood leaves the rest to the
//! others.
//!
//! Put the token layer on the routes that consume tokens (axum's `route_layer`), not
//! on the whole router: an unknown path is then the router's 404 and a wrong method
//! its 405, and neither uses up a token. (405, like the other rejections before a
//! handler, is never stored anyway, so it returns the token.)
//!
//! # Webhooks
//!
//! Webhook senders (Stripe, GitHub, and everyone on the Standard Webhooks spec) retry
//! a delivery until they get a 2xx, and a slow handler gets the same event again while
//! it is still running. [`IdempotencyLayer::webhooks`] makes the receiving route run
//! once per event: the sender's event id (the `webhook-id` header, or another with
//! [`IdempotencyLayer::id_header`]) is the key.
//!
//! | delivery | answer |
//! |---|---|
//! | first of its event | the handler runs |
//! | its event completed | the stored 2xx, with `Idempotent-Replayed: true`; the handler does not run |
//! | its event still running | waits for it ([`DEFAULT_WEBHOOK_WAIT`], 30 s), then the replay; 409 past the wait |
//! | its event's handler answered 5xx (or anything not stored) | the handler runs again |
//! | no event id | 400 |
//! | with [`IdempotencyLayer::signing_secret`] (feature `webhooks`): no valid `v1,` signature, or `webhook-timestamp` more than 5 minutes off | 401 ([`Problem::SignatureInvalid`]), never stored, the id not claimed |
//!
//! Problems name the id header (`webhook-id`), never an `Idempotency-Key` the sender
//! did not send. Event ids are a key space of their own, apart from any key-mode
//! layer's keys, and one key space by default (no credentials scope: senders sign rather
//! than authenticate); when several senders post to one route, name each with
//! [`IdempotencyLayer::scope`].
//!
//! ```
//! use axum::{Router, routing::post};
//! use idem_http::IdempotencyLayer;
//! use idem_runtime::Idem;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
//! async fn on_event(body: String) -> String {
//!     let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
//!     format!("run {run}: {body}") // credit the order, send the receipt, ...
//! }
//!
//! let hooks = IdempotencyLayer::webhooks(Idem::builder().namespace("shop").build());
//! // With the `webhooks` feature: `.signing_secret("whsec_...")?` checks signatures.
//! let app = Router::new().route("/webhooks/payments", post(on_event).route_layer(hooks));
//!
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let url = format!("http://{}/webhooks/payments", listener.local_addr()?);
//! tokio::spawn(async move { axum::serve(listener, app).await });
//!
//! let client = reqwest::Client::new();
//! let deliver = || client.post(&url).header("webhook-id", "msg_2KWPBgLl").body("{\"paid\":7}");
//! let first = deliver().send().await?;
//! assert_eq!(first.status(), 200);
//! let first = first.text().await?;
//! let redelivered = deliver().send().await?;                 // the sender retries
//! assert_eq!(redelivered.status(), 200);
//! assert_eq!(redelivered.text().await?, first);             // the same answer, unrun
//! assert_eq!(RUNS.load(std::sync::atomic::Ordering::SeqCst), 1);
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
mod axum;
mod body;
mod config;
mod fingerprint;
mod future;
mod key;
mod layer;
pub mod observe;
mod problem;
mod record;
mod scope;
mod service;
mod token;
#[cfg(feature = "webhooks")]
#[cfg_attr(docsrs, doc(cfg(feature = "webhooks")))]
mod webhook;

pub use body::{RequestBody, ResponseBody};
pub use config::stored_by_default;
pub use future::ResponseFuture;
pub use key::{
    IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED, IdempotencyKey, KeyError, MAX_KEY_LEN, WEBHOOK_ID,
};
pub use layer::{
    DEFAULT_DETACHED_TIMEOUT, DEFAULT_MAX_REQUEST_BYTES, DEFAULT_MAX_RESPONSE_BYTES,
    DEFAULT_TOKEN_LIMIT, DEFAULT_TOKEN_LIMIT_PER_CALLER, DEFAULT_TOKEN_TTL,
    DEFAULT_WEBHOOK_TOLERANCE, DEFAULT_WEBHOOK_WAIT, IdempotencyLayer,
};
pub use problem::{Problem, ReleaseKey};
pub use service::Idempotency;
#[allow(deprecated)]
pub use token::issue_token;
pub use token::token_response;
#[cfg(feature = "webhooks")]
pub use webhook::SecretError;
