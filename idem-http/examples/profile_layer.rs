//! A fixed workload for profiling the Idempotency-Key layer in process, without sockets
//! (deterministic instruction counts, unlike wall time on a shared machine):
//!
//! `valgrind --tool=callgrind target/release/examples/profile_layer 100000 [bare|new|replay]`
//!
//! Each request goes through the same axum app as idem-bench's `http` family serves, with the
//! layer (`new`: a fresh key per request; `replay`: one key) or without it (`bare`), so
//! the difference of two runs is what the layer costs per request. Without valgrind it
//! prints nanoseconds per request.

use std::hint::black_box;
use std::time::Instant;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use idem_http::IdempotencyLayer;
use idem_runtime::{Idem, MemoryStore};
use tower::Service as _;

const BODY: &str = r#"{"order":42,"cents":1999}"#;

#[derive(serde::Deserialize)]
struct Pay {
    order: u64,
    cents: u64,
}

async fn pay(Json(p): Json<Pay>) -> (StatusCode, Json<serde_json::Value>) {
    let body = serde_json::json!({
        "payment_id": format!("pay_{}", p.order),
        "order": p.order,
        "cents": p.cents,
        "status": "paid",
    });
    (StatusCode::CREATED, Json(body))
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(100_000);
    let mode = args.next().unwrap_or_else(|| "new".to_owned());
    let mut app = Router::new().route("/payments", post(pay));
    if mode != "bare" {
        let idem = Idem::builder().store(MemoryStore::new()).build();
        app = app.layer(IdempotencyLayer::new(idem));
    }
    // Build the routes (and apply the layer) once, as `axum::serve` does, rather than
    // on every request.
    let app = app.with_state::<()>(());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let start = Instant::now();
        for i in 0..n {
            let key = match mode.as_str() {
                "replay" => "\"replay\"".to_owned(),
                _ => format!("\"new-{i}\""),
            };
            let req = Request::post("/payments")
                .header("idempotency-key", key)
                .header("content-type", "application/json")
                .body(Body::from(BODY))
                .expect("request");
            let mut svc = app.clone();
            std::future::poll_fn(|cx| {
                <Router as tower::Service<Request<Body>>>::poll_ready(&mut svc, cx)
            })
            .await
            .expect("infallible");
            let res = svc.call(req).await.expect("infallible");
            assert_eq!(res.status(), StatusCode::CREATED);
            let body = axum::body::to_bytes(res.into_body(), usize::MAX).await;
            black_box(body.expect("body"));
        }
        let ns = start.elapsed().as_nanos() as f64 / n as f64;
        println!("{mode}: {ns:.0} ns/request over {n}");
    });
}
