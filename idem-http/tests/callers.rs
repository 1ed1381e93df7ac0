//! What is kept, and for whom: the caller's credentials scope its keys by default
//! (however their scheme and spaces are written), the user an authentication layer
//! established scopes them across a token refresh, an idem error a handler maps
//! through `Problem` is never stored, and a rejection before the handler started (a
//! framework's, an authentication layer's 401) is not kept against the corrected
//! retry. On MemoryStore, RedisStore and PostgreSQL, through a real HTTP client.

#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use axum::Router;
use axum::extract::Request;
use axum::extract::State;
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use idem_http::{IdempotencyLayer, Problem};
use support::{Answer, Backend, client, idem, serve, shop};

/// The user a request speaks for, as the test app's authentication found out.
#[derive(Clone, Hash)]
struct User(String);

/// `Bearer <user>` or `Bearer <user>.<session>` (the scheme in any case) is `<user>`;
/// any other `Authorization` is 401; none is anonymous.
async fn authenticate(mut req: Request, next: Next) -> Response {
    if let Some(v) = req.headers().get("authorization") {
        let user = v.to_str().ok().and_then(|v| {
            let (scheme, token) = v.trim().split_once(' ')?;
            let user = token.trim().split('.').next()?;
            (scheme.eq_ignore_ascii_case("bearer") && !user.is_empty()).then(|| user.to_owned())
        });
        let Some(user) = user else {
            return StatusCode::UNAUTHORIZED.into_response();
        };
        req.extensions_mut().insert(User(user));
    }
    next.run(req).await
}

/// The test app with `layer` scoped by the authenticated user, the authentication
/// outside the layer (it runs first), as the docs set it up; or, with `auth_inside`,
/// behind it, so that its 401s reach the layer as the handler's answer.
async fn authenticated(layer: IdempotencyLayer, auth_inside: bool) -> (String, Arc<support::Shop>) {
    let shop = Arc::new(support::Shop::default());
    let layer = layer.scope_by_extension::<User>();
    let routes = Router::new().route("/payments", post(support::pay));
    let app = if auth_inside {
        routes
            .layer(middleware::from_fn(authenticate))
            .route_layer(layer)
    } else {
        routes
            .route_layer(layer)
            .layer(middleware::from_fn(authenticate))
    };
    (serve(app.with_state(shop.clone())).await, shop)
}

on_every_store!(
    two_callers_one_key_one_body_never_share_a_response,
    one_caller_however_its_scheme_and_spaces_are_written,
    a_refreshed_session_replays,
    two_users_never_share_a_response,
    unknown_credentials_are_401_and_leave_the_key_free,
    a_session_cookie_scopes_keys_too,
    an_idem_error_mapped_through_problem_is_never_stored,
    rejections_before_the_handler_are_not_kept,
);

/// `POST /payments` with `key`, a fixed body, and the caller's headers.
async fn pay_as(base: &str, key: &str, headers: &[(&str, &str)]) -> Answer {
    let mut r = client()
        .post(format!("{base}/payments"))
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(r#"{"order":7,"cents":700}"#);
    for (n, v) in headers {
        r = r.header(*n, *v);
    }
    Answer::of(r.send().await.unwrap()).await
}

/// Issue 20's leak: alice pays under `leak-1`; mallory sends the same key and body
/// with her own credentials and must get a run of her own, not alice's payment.
async fn two_callers_one_key_one_body_never_share_a_response(b: Backend) {
    let (base, shop) = shop(IdempotencyLayer::new(idem(b, "leak").await)).await;
    let alice = [("authorization", "Bearer alice-token")];
    let mallory = [("authorization", "Bearer mallory-token")];
    let a = pay_as(&base, "leak-1", &alice).await;
    assert_eq!((a.status, a.replayed()), (201, false));
    let m = pay_as(&base, "leak-1", &mallory).await;
    assert_eq!(m.status, 201);
    assert!(!m.replayed(), "mallory got a replay: {m:?}");
    assert_ne!(m.json()["payment_id"], a.json()["payment_id"]);
    // Each caller's retry replays its own response.
    let a2 = pay_as(&base, "leak-1", &alice).await;
    assert!(a2.replayed());
    assert_eq!(a2.body, a.body);
    let m2 = pay_as(&base, "leak-1", &mallory).await;
    assert!(m2.replayed());
    assert_eq!(m2.body, m.body);
    // A caller without credentials is a scope of its own too.
    let anon = pay_as(&base, "leak-1", &[]).await;
    assert!(!anon.replayed());
    assert_eq!(shop.runs.load(Ordering::SeqCst), 3);

    // The explicit opt-out shares one key space, as its name says.
    let layer = IdempotencyLayer::new(idem(b, "leak-unscoped").await).unscoped();
    let (base, shop) = support::shop(layer).await;
    let a = pay_as(&base, "leak-2", &alice).await;
    let m = pay_as(&base, "leak-2", &mallory).await;
    assert!(m.replayed());
    assert_eq!(m.body, a.body);
    assert_eq!(shop.runs.load(Ordering::SeqCst), 1);
}

/// Issue 32: `Authorization` schemes are case-insensitive and spaces do not matter, so
/// the default scope by credentials reads one caller from all these spellings.
async fn one_caller_however_its_scheme_and_spaces_are_written(b: Backend) {
    let (base, shop) = shop(IdempotencyLayer::new(idem(b, "spelling").await)).await;
    let first = pay_as(&base, "sp-1", &[("authorization", "Bearer alice")]).await;
    assert_eq!((first.status, first.replayed()), (201, false));
    for same in [
        "bearer alice",
        "BEARER alice",
        "Bearer   alice",
        "Bearer\talice ",
    ] {
        let again = pay_as(&base, "sp-1", &[("authorization", same)]).await;
        assert!(again.replayed(), "{same:?} is another caller: {again:?}");
        assert_eq!(again.body, first.body);
    }
    let other = pay_as(&base, "sp-1", &[("authorization", "Bearer ALICE")]).await;
    assert!(!other.replayed(), "credentials are case-sensitive");
    assert_eq!(shop.runs.load(Ordering::SeqCst), 2);
}

/// Issue 32: a client times out, refreshes its session (a new bearer token, the same
/// user) and retries under the same key: the retry replays, one payment.
async fn a_refreshed_session_replays(b: Backend) {
    {
        let (base, shop) =
            authenticated(IdempotencyLayer::new(idem(b, "refresh").await), false).await;
        let first = pay_as(&base, "r-1", &[("authorization", "Bearer carol.session1")]).await;
        assert_eq!((first.status, first.replayed()), (201, false), "{first:?}");
        let retry = pay_as(&base, "r-1", &[("authorization", "bearer carol.session2")]).await;
        assert_eq!((retry.status, retry.replayed()), (201, true), "{retry:?}");
        assert_eq!(retry.body, first.body);
        assert_eq!(shop.runs.load(Ordering::SeqCst), 1);
    }
}

/// Issue 32: two users who pick one key, under any spelling of the scheme, get a
/// payment each; an anonymous caller gets one of its own, and never theirs.
async fn two_users_never_share_a_response(b: Backend) {
    let (base, shop) = authenticated(IdempotencyLayer::new(idem(b, "users").await), false).await;
    let alice = pay_as(&base, "u-1", &[("authorization", "bearer alice.s1")]).await;
    let bob = pay_as(&base, "u-1", &[("authorization", "BEARER bob.s1")]).await;
    assert_eq!((alice.status, bob.status), (201, 201));
    assert!(!bob.replayed(), "bob got alice's payment: {bob:?}");
    assert_ne!(alice.json()["payment_id"], bob.json()["payment_id"]);
    let anon = pay_as(&base, "u-1", &[]).await;
    assert!(!anon.replayed());
    let mallory = pay_as(&base, "u-1", &[("authorization", "Bearer mallory")]).await;
    assert!(!mallory.replayed(), "mallory got the anonymous payment");
    assert_eq!(shop.runs.load(Ordering::SeqCst), 4);
}

/// Issue 32: credentials the authentication does not know are 401 wherever it sits
/// (before the layer, or behind it, where the 401 reaches the layer as an answer),
/// never stored: the key stays free, and an anonymous request with it runs.
async fn unknown_credentials_are_401_and_leave_the_key_free(b: Backend) {
    for auth_inside in [false, true] {
        let (base, shop) =
            authenticated(IdempotencyLayer::new(idem(b, "unknown").await), auth_inside).await;
        let basic = pay_as(&base, "x-1", &[("authorization", "Basic YWxpY2U6cHc=")]).await;
        assert_eq!(basic.status, 401, "{basic:?}");
        let empty = pay_as(&base, "x-1", &[("authorization", "Bearer ")]).await;
        assert_eq!(empty.status, 401, "{empty:?}");
        let anon = pay_as(&base, "x-1", &[]).await;
        assert_eq!((anon.status, anon.replayed()), (201, false), "{anon:?}");
        assert_eq!(shop.runs.load(Ordering::SeqCst), 1);
    }
}

async fn a_session_cookie_scopes_keys_too(b: Backend) {
    let layer = IdempotencyLayer::new(idem(b, "cookie").await).session_cookie("sid");
    let (base, shop) = shop(layer).await;
    let a = pay_as(&base, "c-1", &[("cookie", "theme=dark; sid=alice-session")]).await;
    let m = pay_as(&base, "c-1", &[("cookie", "sid=mallory-session")]).await;
    assert!(!a.replayed() && !m.replayed());
    assert_ne!(a.json()["payment_id"], m.json()["payment_id"]);
    let a2 = pay_as(&base, "c-1", &[("cookie", "sid=alice-session")]).await;
    assert!(
        a2.replayed(),
        "another cookie beside the session one changes nothing"
    );
    assert_eq!(a2.body, a.body);
    assert_eq!(shop.runs.load(Ordering::SeqCst), 2);
}

/// A handler whose inner idem call fails while `cause` holds, and pays once it is gone.
#[derive(Default)]
struct Flaky {
    cause: AtomicBool,
    transient: AtomicBool,
    runs: AtomicU64,
}

async fn flaky(State(f): State<Arc<Flaky>>) -> Response {
    let run = f.runs.fetch_add(1, Ordering::SeqCst) + 1;
    if f.cause.load(Ordering::SeqCst) {
        let e = if f.transient.load(Ordering::SeqCst) {
            idem_runtime::Error::store("connection refused")
        } else {
            idem_runtime::Error::InvalidTransition {
                from: Some("draft".into()),
                to: "shipped".into(),
            }
        };
        return Problem::from(e).into_response();
    }
    (StatusCode::CREATED, format!("shipped by run {run}")).into_response()
}

async fn an_idem_error_mapped_through_problem_is_never_stored(b: Backend) {
    for transient in [false, true] {
        let f = Arc::new(Flaky::default());
        f.cause.store(true, Ordering::SeqCst);
        f.transient.store(transient, Ordering::SeqCst);
        let layer = IdempotencyLayer::new(idem(b, "problem").await);
        let app = Router::new()
            .route("/ship", post(flaky))
            .with_state(f.clone())
            .layer(layer);
        let base = serve(app).await;
        let c = client();
        let ship = || async {
            let res = c
                .post(format!("{base}/ship"))
                .header("idempotency-key", "ship-1")
                .body("{}")
                .send()
                .await
                .unwrap();
            Answer::of(res).await
        };
        let first = ship().await;
        if transient {
            first.assert_problem(503, "idempotency-unavailable");
            assert_eq!(first.header("retry-after"), Some("1"));
        } else {
            first.assert_problem(409, "idempotency-state-conflict");
        }
        // The cause is gone: the retry runs the handler, and that answer is kept.
        f.cause.store(false, Ordering::SeqCst);
        let retry = ship().await;
        assert_eq!((retry.status, retry.replayed()), (201, false), "{retry:?}");
        assert_eq!(retry.body, "shipped by run 2");
        let again = ship().await;
        assert_eq!((again.status, again.replayed()), (201, true));
        assert_eq!(f.runs.load(Ordering::SeqCst), 2);
    }
}

#[derive(serde::Deserialize)]
struct Order {
    order: u64,
}

/// A framework's 415 (no Content-Type) and 422 (a body that does not fit) come before
/// the handler; the corrected retry under the same key runs it.
async fn rejections_before_the_handler_are_not_kept(b: Backend) {
    let runs = Arc::new(AtomicU64::new(0));
    let app = Router::new()
        .route(
            "/orders",
            post(
                |State(runs): State<Arc<AtomicU64>>, axum::Json(o): axum::Json<Order>| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    (StatusCode::CREATED, format!("order {}", o.order))
                },
            ),
        )
        .with_state(runs.clone())
        .layer(IdempotencyLayer::new(idem(b, "rejected").await));
    let base = serve(app).await;
    let c = client();
    let send = |content_type: Option<&'static str>, body: &'static str| {
        let mut r = c
            .post(format!("{base}/orders"))
            .header("idempotency-key", "fix-1")
            .body(body);
        if let Some(ct) = content_type {
            r = r.header("content-type", ct);
        }
        async move { Answer::of(r.send().await.unwrap()).await }
    };
    let no_type = send(None, r#"{"order":5}"#).await;
    assert_eq!(no_type.status, 415);
    let wrong = send(Some("application/json"), r#"{"id":5}"#).await;
    assert_eq!((wrong.status, wrong.replayed()), (422, false));
    let fixed = send(Some("application/json"), r#"{"order":5}"#).await;
    assert_eq!((fixed.status, fixed.replayed()), (201, false), "{fixed:?}");
    let again = send(Some("application/json"), r#"{"order":5}"#).await;
    assert_eq!((again.status, again.replayed()), (201, true));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
