//! Token mode as callers misuse it: a used token sent with another request or by
//! another caller, tokens sent to paths that do not consume them, and how many tokens
//! the route hands out, in all and to one caller.
//! On MemoryStore, RedisStore and PostgreSQL, through a real HTTP client.

#![allow(clippy::unwrap_used)]

mod support;

use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::Router;
use axum::routing::post;
use idem_http::IdempotencyLayer;
use support::{Answer, Backend, client, idem, post_key, serve};

on_every_store!(
    a_used_token_with_another_request_is_422,
    tokens_are_consumed_only_by_their_routes,
    tokens_live_30_seconds_and_their_issue_is_bounded,
    a_used_token_is_422_for_another_caller,
    one_callers_token_flood_leaves_others_served,
    anonymous_callers_are_bounded_by_their_address,
);

/// The shop's routes with the token layer on the consuming route only, as the
/// `token_route` docs show.
async fn token_app(layer: IdempotencyLayer) -> (String, std::sync::Arc<support::Shop>) {
    let shop = std::sync::Arc::new(support::Shop::default());
    let app = Router::new()
        .route("/token", layer.token_route())
        .route("/pay", post(support::pay).route_layer(layer))
        .with_state(shop.clone());
    (serve(app).await, shop)
}

async fn token(base: &str) -> String {
    token_as(base, None).await
}

async fn token_as(base: &str, auth: Option<&str>) -> String {
    let mut req = client().get(format!("{base}/token"));
    if let Some(auth) = auth {
        req = req.header("authorization", auth);
    }
    let res = req.send().await.unwrap();
    let a = Answer::of(res).await;
    assert_eq!(a.status, 200, "{a:?}");
    a.json()["token"].as_str().unwrap().to_owned()
}

/// Issue 21 HTTP 2: the second use of a token with another body is 422, as a reused
/// key is, never the first request's success.
async fn a_used_token_with_another_request_is_422(b: Backend) {
    let (base, shop) = token_app(IdempotencyLayer::tokens(idem(b, "tok-fp").await)).await;
    let c = client();
    let t = token(&base).await;
    let first = post_key(&c, &base, "/pay", &t, r#"{"order":1,"cents":100}"#).await;
    assert_eq!((first.status, first.replayed()), (201, false));
    let other = post_key(&c, &base, "/pay", &t, r#"{"order":2,"cents":99999}"#).await;
    other.assert_problem(422, "idempotency-key-reused");
    let same = post_key(&c, &base, "/pay", &t, r#"{"order":1,"cents":100}"#).await;
    assert_eq!((same.status, same.replayed()), (201, true));
    assert_eq!(same.body, first.body);
    assert_eq!(shop.runs.load(Ordering::SeqCst), 1);
}

/// Issue 21 HTTP 3: an unknown path is 404 and a wrong method 405, with or without a
/// token, and neither uses the token up.
async fn tokens_are_consumed_only_by_their_routes(b: Backend) {
    let (base, shop) = token_app(IdempotencyLayer::tokens(idem(b, "tok-route").await)).await;
    let c = client();
    let nope = c
        .post(format!("{base}/nope"))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(nope.status(), 404, "no key: the router's 404");
    let t = token(&base).await;
    let nope = post_key(&c, &base, "/nope", &t, "{}").await;
    assert_eq!(nope.status, 404);
    let wrong = post_key(&c, &base, "/token", &t, "{}").await;
    assert_eq!(wrong.status, 405);
    let paid = post_key(&c, &base, "/pay", &t, r#"{"order":3}"#).await;
    assert_eq!((paid.status, paid.replayed()), (201, false), "{paid:?}");
    assert_eq!(shop.runs.load(Ordering::SeqCst), 1);
}

/// Issue 21 HTTP 4: a token lives 30 s unless told otherwise, and the route stops
/// issuing past its bound, with 429 and `Retry-After`.
async fn tokens_live_30_seconds_and_their_issue_is_bounded(b: Backend) {
    let layer = IdempotencyLayer::tokens(idem(b, "tok-limit").await)
        .token_limit(3, Duration::from_secs(3600));
    let (base, _) = token_app(layer).await;
    let c = client();
    for _ in 0..3 {
        let a = Answer::of(c.get(format!("{base}/token")).send().await.unwrap()).await;
        assert_eq!(a.status, 200);
        assert_eq!(a.json()["expires_in"], 30);
    }
    let refused = Answer::of(c.get(format!("{base}/token")).send().await.unwrap()).await;
    refused.assert_problem(429, "idempotency-token-limit");
    assert_eq!(refused.header("retry-after"), Some("1"));

    // A token past its own lifetime is refused; the layer's record ttl does not keep
    // it alive.
    let layer = IdempotencyLayer::tokens(idem(b, "tok-ttl").await)
        .token_ttl(Duration::from_secs(1))
        .ttl(Duration::from_secs(3600));
    let (base, shop) = token_app(layer).await;
    let t = token(&base).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let late = post_key(&c, &base, "/pay", &t, "{}").await;
    late.assert_problem(400, "idempotency-token-invalid");
    assert_eq!(shop.runs.load(Ordering::SeqCst), 0);
}

async fn pay_with(base: &str, token: &str, auth: Option<&str>) -> Answer {
    let mut req = client()
        .post(format!("{base}/pay"))
        .header("idempotency-key", token)
        .header("content-type", "application/json")
        .body(r#"{"order":5,"cents":500}"#);
    if let Some(auth) = auth {
        req = req.header("authorization", auth);
    }
    Answer::of(req.send().await.unwrap()).await
}

/// Issue 32: a used token replays only to the caller that used it; another caller
/// (other credentials, or none) sending it with the very same request gets 422, never
/// that caller's response.
async fn a_used_token_is_422_for_another_caller(b: Backend) {
    let (base, shop) = token_app(IdempotencyLayer::tokens(idem(b, "tok-scope").await)).await;
    let alice = Some("Bearer alice");
    let t = token_as(&base, alice).await;
    let first = pay_with(&base, &t, alice).await;
    assert_eq!((first.status, first.replayed()), (201, false), "{first:?}");
    let again = pay_with(&base, &t, Some("bearer  alice")).await;
    assert_eq!((again.status, again.replayed()), (201, true), "{again:?}");
    assert_eq!(again.body, first.body);
    pay_with(&base, &t, Some("Bearer mallory"))
        .await
        .assert_problem(422, "idempotency-key-reused");
    pay_with(&base, &t, None)
        .await
        .assert_problem(422, "idempotency-key-reused");
    assert_eq!(shop.runs.load(Ordering::SeqCst), 1);
}

/// Issue 32: one caller flooding `GET /token` uses up its own bound, not everyone's:
/// another caller is still served.
async fn one_callers_token_flood_leaves_others_served(b: Backend) {
    let layer = IdempotencyLayer::tokens(idem(b, "tok-flood").await)
        .token_limit(50, Duration::from_secs(3600))
        .token_limit_per_caller(10, Duration::from_secs(3600));
    let (base, _) = token_app(layer).await;
    let c = client();
    let ask = |auth: String| {
        let c = c.clone();
        let base = base.clone();
        async move {
            let res = c
                .get(format!("{base}/token"))
                .header("authorization", auth)
                .send()
                .await
                .unwrap();
            Answer::of(res).await
        }
    };
    let flood = futures_util::future::join_all((0..60).map(|_| ask("Bearer mallory".into()))).await;
    let served = flood.iter().filter(|a| a.status == 200).count();
    assert_eq!(served, 10, "the flooding caller is bounded");
    for refused in flood.iter().filter(|a| a.status != 200) {
        refused.assert_problem(429, "idempotency-token-limit");
    }
    for _ in 0..10 {
        let a = ask("Bearer alice".into()).await;
        assert_eq!(a.status, 200, "another caller is starved: {a:?}");
    }
    // The global ceiling still bounds all callers together.
    let mut issued = 20;
    for i in 0..100 {
        if ask(format!("Bearer caller-{i}")).await.status == 200 {
            issued += 1;
        }
    }
    assert_eq!(issued, 50);
}

/// Issue 32: anonymous callers are told apart by their address when the server gives
/// it (`ConnectInfo`): one address's flood leaves another address served.
async fn anonymous_callers_are_bounded_by_their_address(b: Backend) {
    let layer = IdempotencyLayer::tokens(idem(b, "tok-addr").await)
        .token_limit_per_caller(5, Duration::from_secs(3600));
    let app = Router::new().route("/token", layer.token_route());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let app = app.into_make_service_with_connect_info::<std::net::SocketAddr>();
        axum::serve(listener, app).await.unwrap()
    });
    let from = |ip: [u8; 4]| {
        reqwest::Client::builder()
            .local_address(std::net::IpAddr::from(ip))
            .build()
            .unwrap()
    };
    let ask = |c: &reqwest::Client| {
        let req = c.get(format!("{base}/token"));
        async move { req.send().await.unwrap().status().as_u16() }
    };
    let (flood, other) = (from([127, 0, 0, 1]), from([127, 0, 0, 2]));
    let mut served = 0;
    for _ in 0..20 {
        if ask(&flood).await == 200 {
            served += 1;
        }
    }
    assert_eq!(served, 5, "one address is bounded");
    for _ in 0..5 {
        assert_eq!(ask(&other).await, 200, "another address is starved");
    }
    assert_eq!(ask(&other).await, 429);
}
