//! Issuing one-time tokens over HTTP (`GET /token`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
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
/// let res = idem_http::token_response::<Full<bytes::Bytes>>(&idem, std::time::Duration::from_secs(600)).await;
/// assert_eq!(res.status(), 200);
/// let body = res.into_body().collect().await.unwrap().to_bytes();
/// let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
/// assert_eq!(json["expires_in"], 600);
/// assert_eq!(json["token"].as_str().unwrap().len(), 32);
/// # }
/// ```
pub async fn token_response<B: From<Bytes>>(idem: &Idem, ttl: Duration) -> Response<B> {
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

/// A bound on token issuance: at most `limit` tokens per window of `per`, in this
/// process. With the token lifetime it bounds the tokens alive at once (about
/// `limit × token_ttl / per` per process), each a record in the store until it expires.
///
/// Only the axum token route issues tokens through it; without the `axum` feature the
/// layer still takes the setting, and nothing reads it.
#[cfg_attr(not(feature = "axum"), allow(dead_code))]
pub(crate) struct TokenLimit {
    limit: u32,
    per: Duration,
    epoch: std::time::Instant,
    /// Start of the current window, in nanoseconds since `epoch`.
    window: AtomicU64,
    issued: AtomicU32,
}

impl TokenLimit {
    pub(crate) fn new(limit: u32, per: Duration) -> TokenLimit {
        TokenLimit {
            limit,
            per: per.max(Duration::from_millis(1)),
            epoch: std::time::Instant::now(),
            window: AtomicU64::new(0),
            issued: AtomicU32::new(0),
        }
    }

    /// Counts one token against the current window; false when the window is full.
    /// (A fixed window, approximate at its edge: a few tokens more or less there do
    /// not change the bound.)
    #[cfg_attr(not(feature = "axum"), allow(dead_code))]
    pub(crate) fn admit(&self) -> bool {
        let now = u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let per = u64::try_from(self.per.as_nanos()).unwrap_or(u64::MAX);
        let start = self.window.load(Ordering::Acquire);
        if now.saturating_sub(start) >= per
            && self
                .window
                .compare_exchange(start, now, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            self.issued.store(0, Ordering::Release);
        }
        self.issued.fetch_add(1, Ordering::AcqRel) < self.limit
    }
}

/// A bound on token issuance to each caller: at most `limit` tokens per window of
/// `per`, counted per caller digest, within the process-wide [`TokenLimit`].
///
/// A caller is only counted once a token is issued to it, so the table holds at most
/// as many callers as the global bound admits in one window, whatever a flood of made-up
/// credentials sends.
#[cfg_attr(not(feature = "axum"), allow(dead_code))]
pub(crate) struct CallerLimit {
    limit: u32,
    per: Duration,
    /// The current window's start and its counts. Held for a lookup and an increment,
    /// never across an await.
    counts: Mutex<(std::time::Instant, HashMap<[u8; 16], u32>)>,
}

impl CallerLimit {
    pub(crate) fn new(limit: u32, per: Duration) -> CallerLimit {
        CallerLimit {
            limit,
            per: per.max(Duration::from_millis(1)),
            counts: Mutex::new((std::time::Instant::now(), HashMap::new())),
        }
    }

    /// Counts one token for `caller`, if both its own bound and `global` have room.
    #[cfg_attr(not(feature = "axum"), allow(dead_code))]
    pub(crate) fn admit(&self, caller: [u8; 16], global: &TokenLimit) -> bool {
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        let (start, table) = &mut *counts;
        if start.elapsed() >= self.per {
            *start = std::time::Instant::now();
            table.clear();
        }
        let used = table.get(&caller).copied().unwrap_or(0);
        if used >= self.limit || !global.admit() {
            return false;
        }
        table.insert(caller, used + 1);
        true
    }
}

impl std::fmt::Debug for CallerLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallerLimit")
            .field("limit", &self.limit)
            .field("per", &self.per)
            .finish()
    }
}

impl std::fmt::Debug for TokenLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenLimit")
            .field("limit", &self.limit)
            .field("per", &self.per)
            .finish()
    }
}

/// The old name of [`token_response`]: idem has one `issue_token`,
/// [`Idem::issue_token`](idem_runtime::Idem::issue_token), and this is the HTTP answer
/// around it.
#[deprecated(since = "0.1.0", note = "renamed `token_response`")]
pub async fn issue_token<B: From<Bytes>>(idem: &Idem, ttl: Duration) -> Response<B> {
    token_response(idem, ttl).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_window_refuses() {
        let l = TokenLimit::new(3, Duration::from_secs(3600));
        assert!((0..3).all(|_| l.admit()));
        assert!(!l.admit());
        assert!(!l.admit());
    }

    #[test]
    fn one_callers_flood_leaves_the_rest_to_others() {
        let global = TokenLimit::new(10, Duration::from_secs(3600));
        let callers = CallerLimit::new(3, Duration::from_secs(3600));
        let (flood, other) = ([1; 16], [2; 16]);
        assert_eq!(
            (0..100).filter(|_| callers.admit(flood, &global)).count(),
            3
        );
        assert_eq!((0..5).filter(|_| callers.admit(other, &global)).count(), 3);
        // The global ceiling still holds over many callers.
        let admitted = (3..100u8)
            .filter(|c| callers.admit([*c; 16], &global))
            .count();
        assert_eq!(admitted, 4, "10 in all");
    }
}
