//! Webhook mode: a sender's redeliveries of one event run the handler once, on
//! MemoryStore, RedisStore and PostgreSQL; signatures are checked before the event id
//! is claimed.
#![cfg(feature = "webhooks")]
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, KeyInit, Mac};
use idem_http::{IdempotencyLayer, SecretError};
use sha2::Sha256;
use support::{Answer, Backend, client, idem, serve};

on_every_store!(
    twenty_concurrent_deliveries_run_once_and_all_get_2xx,
    a_redelivery_after_completion_replays_unrun,
    a_5xx_releases_the_event_so_the_retry_runs,
    a_bad_signature_is_401_and_not_stored,
    a_stale_timestamp_is_401,
    senders_named_by_scope_have_ids_of_their_own,
    an_anonymous_key_equal_to_a_webhook_id_leaves_the_event_to_run_once,
    webhook_problems_speak_of_the_webhook_id,
    layers_named_apart_never_share_keys,
);

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// The receiving endpoint: counts runs; slow or failing on demand.
#[derive(Default)]
struct Hook {
    runs: AtomicU64,
    fail: AtomicBool,
    sleep_ms: AtomicU64,
}

async fn receive(State(hook): State<Arc<Hook>>, body: String) -> (StatusCode, String) {
    let ms = hook.sleep_ms.load(Ordering::SeqCst);
    if ms > 0 {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    if hook.fail.load(Ordering::SeqCst) {
        return (StatusCode::SERVICE_UNAVAILABLE, "down".into());
    }
    let run = hook.runs.fetch_add(1, Ordering::SeqCst) + 1;
    (StatusCode::OK, format!("run {run} of {body}"))
}

async fn endpoint(layer: IdempotencyLayer) -> (String, Arc<Hook>) {
    let hook = Arc::new(Hook::default());
    let router = Router::new()
        .route("/hooks", post(receive))
        .with_state(hook.clone())
        .layer(layer);
    (serve(router).await, hook)
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// `v1,<base64 HMAC-SHA256 of "{id}.{ts}.{body}">`, as the Standard Webhooks spec
/// has senders sign.
fn sign(secret: &str, id: &str, ts: u64, body: &str) -> String {
    let key = STANDARD
        .decode(secret.strip_prefix("whsec_").unwrap())
        .unwrap();
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).unwrap();
    mac.update(format!("{id}.{ts}.{body}").as_bytes());
    format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
}

/// One delivery of event `id`, signed with `secret` at `ts` when given.
async fn deliver(
    c: &reqwest::Client,
    base: &str,
    id: &str,
    body: &str,
    signed: Option<(&str, u64)>,
) -> Answer {
    let mut req = c
        .post(format!("{base}/hooks"))
        .header("webhook-id", id)
        .header("content-type", "application/json")
        .body(body.to_owned());
    if let Some((secret, ts)) = signed {
        req = req
            .header("webhook-timestamp", ts.to_string())
            .header("webhook-signature", sign(secret, id, ts, body));
    }
    Answer::of(req.send().await.unwrap()).await
}

async fn twenty_concurrent_deliveries_run_once_and_all_get_2xx(b: Backend) {
    let layer = IdempotencyLayer::webhooks(idem(b, "hook-twenty").await)
        .signing_secret(SECRET)
        .unwrap();
    let (base, hook) = endpoint(layer).await;
    // Slow enough that the deliveries overlap the first run: they wait for it.
    hook.sleep_ms.store(300, Ordering::SeqCst);
    let c = client();
    let ts = now();
    let calls = (0..20).map(|_| {
        let (c, base) = (c.clone(), base.clone());
        tokio::spawn(async move {
            deliver(
                &c,
                &base,
                "msg_twenty",
                r#"{"amount":5}"#,
                Some((SECRET, ts)),
            )
            .await
        })
    });
    let answers: Vec<Answer> = futures_util::future::join_all(calls)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(hook.runs.load(Ordering::SeqCst), 1, "the handler ran once");
    for a in &answers {
        assert_eq!(a.status, 200, "{a:?}");
        assert_eq!(a.body, r#"run 1 of {"amount":5}"#);
    }
    assert_eq!(answers.iter().filter(|a| !a.replayed()).count(), 1);
}

async fn a_redelivery_after_completion_replays_unrun(b: Backend) {
    let (base, hook) = endpoint(IdempotencyLayer::webhooks(idem(b, "hook-replay").await)).await;
    let c = client();
    let first = deliver(&c, &base, "msg_1", "{}", None).await;
    assert_eq!((first.status, first.replayed()), (200, false));
    let again = deliver(&c, &base, "msg_1", "{}", None).await;
    assert_eq!((again.status, again.replayed()), (200, true));
    assert_eq!(again.body, first.body);
    assert_eq!(hook.runs.load(Ordering::SeqCst), 1);
    // Another event runs; a delivery without an id is refused before the handler.
    assert!(!deliver(&c, &base, "msg_2", "{}", None).await.replayed());
    let bare = c
        .post(format!("{base}/hooks"))
        .body("{}")
        .send()
        .await
        .unwrap();
    Answer::of(bare)
        .await
        .assert_problem(400, "idempotency-key-missing");
    assert_eq!(hook.runs.load(Ordering::SeqCst), 2);
}

async fn a_5xx_releases_the_event_so_the_retry_runs(b: Backend) {
    let (base, hook) = endpoint(IdempotencyLayer::webhooks(idem(b, "hook-5xx").await)).await;
    let c = client();
    hook.fail.store(true, Ordering::SeqCst);
    assert_eq!(deliver(&c, &base, "msg_f", "{}", None).await.status, 503);
    hook.fail.store(false, Ordering::SeqCst);
    let retry = deliver(&c, &base, "msg_f", "{}", None).await;
    assert_eq!((retry.status, retry.replayed()), (200, false), "{retry:?}");
    assert_eq!(hook.runs.load(Ordering::SeqCst), 1);
}

async fn a_bad_signature_is_401_and_not_stored(b: Backend) {
    let layer = IdempotencyLayer::webhooks(idem(b, "hook-sig").await)
        .signing_secret(SECRET)
        .unwrap();
    let (base, hook) = endpoint(layer).await;
    let c = client();
    let ts = now();
    let other = "whsec_c2VjcmV0LW9mLXNvbWVvbmUtZWxzZQ==";
    deliver(&c, &base, "msg_s", "{}", Some((other, ts)))
        .await
        .assert_problem(401, "webhook-signature-invalid");
    // Unsigned, and signed over another body: 401 too.
    deliver(&c, &base, "msg_s", "{}", None)
        .await
        .assert_problem(401, "webhook-signature-invalid");
    let forged = c
        .post(format!("{base}/hooks"))
        .header("webhook-id", "msg_s")
        .header("webhook-timestamp", ts.to_string())
        .header("webhook-signature", sign(SECRET, "msg_s", ts, "{}"))
        .body(r#"{"amount":1000000}"#)
        .send()
        .await
        .unwrap();
    Answer::of(forged)
        .await
        .assert_problem(401, "webhook-signature-invalid");
    assert_eq!(hook.runs.load(Ordering::SeqCst), 0);
    // None of them held or stored the id: the real delivery runs.
    let real = deliver(&c, &base, "msg_s", "{}", Some((SECRET, ts))).await;
    assert_eq!((real.status, real.replayed()), (200, false), "{real:?}");
    assert_eq!(hook.runs.load(Ordering::SeqCst), 1);
}

async fn a_stale_timestamp_is_401(b: Backend) {
    let layer = IdempotencyLayer::webhooks(idem(b, "hook-stale").await)
        .signing_secret(SECRET)
        .unwrap();
    let (base, hook) = endpoint(layer).await;
    let c = client();
    let stale = now() - 600;
    deliver(&c, &base, "msg_old", "{}", Some((SECRET, stale)))
        .await
        .assert_problem(401, "webhook-signature-invalid");
    let future = now() + 600;
    deliver(&c, &base, "msg_old", "{}", Some((SECRET, future)))
        .await
        .assert_problem(401, "webhook-signature-invalid");
    assert_eq!(hook.runs.load(Ordering::SeqCst), 0);
}

#[test]
fn a_malformed_secret_is_refused_at_configuration() {
    let idem = idem_runtime::Idem::builder().build();
    let e = IdempotencyLayer::webhooks(idem.clone())
        .signing_secret("MfKQ9r8GKYqrTwjU")
        .unwrap_err();
    assert_eq!(e, SecretError::Prefix);
    let e = IdempotencyLayer::webhooks(idem)
        .signing_secret("whsec_***")
        .unwrap_err();
    assert_eq!(e, SecretError::Base64);
}

async fn senders_named_by_scope_have_ids_of_their_own(b: Backend) {
    let layer = IdempotencyLayer::webhooks(idem(b, "hook-senders").await).scope(|parts| {
        let sender = parts.headers.get("x-sender")?;
        sender.to_str().ok().map(str::to_owned)
    });
    let (base, hook) = endpoint(layer).await;
    let c = client();
    let from = |sender: &'static str| {
        c.post(format!("{base}/hooks"))
            .header("webhook-id", "msg_1")
            .header("x-sender", sender)
            .body("{}")
            .send()
    };
    let a = Answer::of(from("billing").await.unwrap()).await;
    let b2 = Answer::of(from("shipping").await.unwrap()).await;
    let again = Answer::of(from("billing").await.unwrap()).await;
    assert_eq!(
        (a.replayed(), b2.replayed(), again.replayed()),
        (false, false, true)
    );
    assert_eq!(
        hook.runs.load(Ordering::SeqCst),
        2,
        "one run per sender's event"
    );
}

/// Issue 32: an anonymous client sends `POST /payments` with an `Idempotency-Key` equal
/// to an upcoming event id. The genuine, signed delivery of that event still runs
/// once, and its redeliveries replay it: key mode and webhook mode never share keys.
async fn an_anonymous_key_equal_to_a_webhook_id_leaves_the_event_to_run_once(b: Backend) {
    let idem = idem(b, "hook-collide").await;
    let hook = Arc::new(Hook::default());
    let hooks = IdempotencyLayer::webhooks(idem.clone())
        .signing_secret(SECRET)
        .unwrap();
    let app = Router::new()
        .route(
            "/payments",
            post(|body: String| async move { (StatusCode::CREATED, format!("paid {body}")) })
                .route_layer(IdempotencyLayer::new(idem)),
        )
        .route("/hooks", post(receive).route_layer(hooks))
        .with_state(hook.clone());
    let base = serve(app).await;
    let c = client();
    let body = r#"{"type":"payment.succeeded"}"#;
    let squat = c
        .post(format!("{base}/payments"))
        .header("idempotency-key", "msg_2KWPBgLl")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(squat.status(), 201);
    let ts = now();
    let deliver = || {
        c.post(format!("{base}/hooks"))
            .header("webhook-id", "msg_2KWPBgLl")
            .header("webhook-timestamp", ts.to_string())
            .header("webhook-signature", sign(SECRET, "msg_2KWPBgLl", ts, body))
            .body(body)
            .send()
    };
    for attempt in 0..3 {
        let a = Answer::of(deliver().await.unwrap()).await;
        assert_eq!(a.status, 200, "delivery {attempt}: {a:?}");
        assert_eq!(a.replayed(), attempt > 0, "{a:?}");
    }
    assert_eq!(hook.runs.load(Ordering::SeqCst), 1, "the event ran once");
}

/// Issue 32: a webhook sender never sent an `Idempotency-Key`; the problems it gets
/// name its `webhook-id` (or the id header the layer reads).
async fn webhook_problems_speak_of_the_webhook_id(b: Backend) {
    let (base, hook) = endpoint(IdempotencyLayer::webhooks(idem(b, "hook-words").await)).await;
    let c = client();
    let missing = Answer::of(
        c.post(format!("{base}/hooks"))
            .body("{}")
            .send()
            .await
            .unwrap(),
    )
    .await;
    missing.assert_problem(400, "idempotency-key-missing");
    let send = |body: &'static str| {
        c.post(format!("{base}/hooks"))
            .header("webhook-id", "msg_words")
            .body(body)
            .send()
    };
    assert_eq!(send("{\"a\":1}").await.unwrap().status(), 200);
    let reused = Answer::of(send("{\"a\":2}").await.unwrap()).await;
    reused.assert_problem(422, "idempotency-key-reused");
    for p in [missing.json(), reused.json()] {
        let text = format!("{} {}", p["title"], p["detail"]);
        assert!(text.contains("webhook-id"), "{text}");
        assert!(!text.contains("Idempotency-Key"), "{text}");
    }
    assert_eq!(hook.runs.load(Ordering::SeqCst), 1);

    // Another id header is named as such.
    let layer = IdempotencyLayer::webhooks(idem(b, "hook-words-gh").await)
        .id_header(http::HeaderName::from_static("x-github-delivery"));
    let (base, _) = endpoint(layer).await;
    let missing = Answer::of(
        c.post(format!("{base}/hooks"))
            .body("{}")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert!(
        missing.json()["detail"]
            .as_str()
            .unwrap()
            .contains("x-github-delivery")
    );
}

/// Issue 32: two key-mode layers on one `Idem` named apart never meet, even when a
/// client sends both the same key.
async fn layers_named_apart_never_share_keys(b: Backend) {
    let idem = idem(b, "named").await;
    let runs = Arc::new(AtomicU64::new(0));
    let count = |runs: Arc<AtomicU64>| {
        post(move || async move {
            let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
            (StatusCode::CREATED, format!("run {n}"))
        })
    };
    let app: Router = Router::new()
        .route(
            "/payments",
            count(runs.clone()).route_layer(IdempotencyLayer::new(idem.clone()).name("payments")),
        )
        .route(
            "/refunds",
            count(runs.clone()).route_layer(IdempotencyLayer::new(idem).name("refunds")),
        );
    let base = serve(app).await;
    let c = client();
    for path in ["/payments", "/refunds", "/payments", "/refunds"] {
        let a = support::post_key(&c, &base, path, "k-1", "{}").await;
        assert_eq!(a.status, 201, "{path}: {a:?}");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 2, "one run per layer");
}
