//! axum helpers (feature `axum`): the key as an extractor, problems as responses, and
//! the token route.

use axum::extract::{FromRequestParts, OptionalFromRequestParts};
use axum::response::{IntoResponse, Response};
use std::net::SocketAddr;

use axum::extract::ConnectInfo;
use http::request::Parts;

use crate::scope::{Caller, Scope, digest_of};
use crate::{IdempotencyKey, IdempotencyLayer, Problem};

/// Whom a token request counts against: its scope, or for an anonymous caller its
/// address (its IP: one client opens connections from many ports), when the server
/// gives it.
fn caller(scope: &Scope, parts: &Parts) -> [u8; 16] {
    match scope.of(parts) {
        Caller::Shared => {
            let ip = parts
                .extensions
                .get::<ConnectInfo<SocketAddr>>()
                .map(|ConnectInfo(addr)| addr.ip());
            digest_of(&ip)
        }
        named => digest_of(&named),
    }
}

/// The key of a request under the layer (set in its extensions before the handler
/// runs), else parsed from the header. A missing or malformed key is the 400 problem.
///
/// ```
/// use idem_http::IdempotencyKey;
/// async fn create(key: IdempotencyKey) -> String {
///     format!("paid under {key}")
/// }
/// let app: axum::Router = axum::Router::new().route("/payments", axum::routing::post(create));
/// # let _ = app;
/// ```
impl<S: Send + Sync> FromRequestParts<S> for IdempotencyKey {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Problem> {
        if let Some(key) = parts.extensions.get::<IdempotencyKey>() {
            return Ok(key.clone());
        }
        match IdempotencyKey::from_headers(&parts.headers) {
            Ok(Some(key)) => Ok(key),
            Ok(None) => Err(Problem::KeyMissing),
            Err(_) => Err(Problem::KeyMalformed),
        }
    }
}

/// `Option<IdempotencyKey>`: `None` when the request has no key (a route where the key
/// is optional); a malformed one is still the 400 problem.
impl<S: Send + Sync> OptionalFromRequestParts<S> for IdempotencyKey {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Option<Self>, Problem> {
        if let Some(key) = parts.extensions.get::<IdempotencyKey>() {
            return Ok(Some(key.clone()));
        }
        IdempotencyKey::from_headers(&parts.headers).map_err(|_| Problem::KeyMalformed)
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        self.response(None)
    }
}

impl IdempotencyLayer {
    /// `GET` handler issuing tokens for this layer's store and namespace, each valid
    /// for its [`token_ttl`](IdempotencyLayer::token_ttl) (30 s; never longer than its
    /// [`ttl`](IdempotencyLayer::ttl)), at most
    /// [`token_limit`](IdempotencyLayer::token_limit) of them per window, and at most
    /// [`token_limit_per_caller`](IdempotencyLayer::token_limit_per_caller) to one
    /// caller (else 429); see [`token_response`](crate::token_response). Callers are told
    /// apart by the layer's scope, so put the route behind the same authentication as
    /// the routes that consume its tokens.
    ///
    /// Put the token layer on the routes that consume tokens, with `route_layer`, not
    /// on the whole router: then an unknown path is the router's 404 and a wrong method
    /// its 405, and neither uses up the client's token.
    ///
    /// ```
    /// use axum::{Router, routing::post};
    /// use idem_http::IdempotencyLayer;
    /// let tokens = IdempotencyLayer::tokens(idem_runtime::Idem::builder().build());
    /// let app: Router = Router::new()
    ///     .route("/token", tokens.token_route())
    ///     .route("/pay", post(|| async { "paid" }).route_layer(tokens));
    /// # let _ = app;
    /// ```
    pub fn token_route<S: Clone + Send + Sync + 'static>(&self) -> axum::routing::MethodRouter<S> {
        let idem = self.idem.clone();
        // The record's ttl caps a token's life too: a token must not outlive the
        // answer it is for.
        let ttl = self.token_ttl.min(self.ttl);
        let limit = self.token_limit.clone();
        let callers = self.caller_limit.clone();
        let scope = self.scope.clone();
        let docs = self.docs.clone();
        axum::routing::get(move |parts: Parts| {
            let idem = idem.clone();
            let admitted = callers.admit(caller(&scope, &parts), &limit);
            let docs = docs.clone();
            async move {
                if !admitted {
                    return Problem::TokenLimit.response(docs.as_deref());
                }
                crate::token_response::<axum::body::Body>(&idem, ttl).await
            }
        })
    }
}
