//! Issuing one-time tokens over HTTP (`GET /token`).

use std::time::Duration;

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderValue};
use http::{Response, StatusCode};
use idem_runtime::Idem;

use crate::problem::Problem;

/// Issues a one-time token on `idem`'s store, valid for `ttl`, as the response
/// `200 {"token": "...", "expires_in": SECONDS}` (`Cache-Control: no-store`). A store
/// that is down gives the 503 problem. Serve it as `GET /token` beside routes under
/// [`IdempotencyLayer::tokens`](crate::IdempotencyLayer::tokens) with the same `idem`
/// (with the `axum` feature, `IdempotencyLayer::token_route` does that).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use http_body_util::{BodyExt, Full};
/// let idem = idem_runtime::Idem::builder().build();
/// let res = idem_http::issue_token::<Full<bytes::Bytes>>(&idem, std::time::Duration::from_secs(600)).await;
/// assert_eq!(res.status(), 200);
/// let body = res.into_body().collect().await.unwrap().to_bytes();
/// let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
/// assert_eq!(json["expires_in"], 600);
/// assert_eq!(json["token"].as_str().unwrap().len(), 32);
/// # }
/// ```
pub async fn issue_token<B: From<Bytes>>(idem: &Idem, ttl: Duration) -> Response<B> {
    match idem.issue_token(ttl).await {
        Ok(token) => {
            let body = serde_json::json!({ "token": token, "expires_in": ttl.as_secs() });
            let mut res = Response::new(B::from(Bytes::from(body.to_string())));
            *res.status_mut() = StatusCode::OK;
            let h = res.headers_mut();
            h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
            res
        }
        Err(e) => {
            tracing::warn!(error = %e, "idem-http: could not issue a token");
            Problem::StoreUnavailable.response(None)
        }
    }
}
