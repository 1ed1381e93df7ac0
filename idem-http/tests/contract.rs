//! The contract table, one test per row, against an axum app served on a loopback port
//! and driven by a real HTTP client, on MemoryStore, RedisStore and PostgreSQL.

#![allow(clippy::unwrap_used)]

mod support;

use std::sync::atomic::Ordering;
use std::time::Duration;

use idem_http::IdempotencyLayer;
use idem_runtime::{Idem, OnDuplicate, RedisStore};
use support::{Answer, Backend, Proxy, client, idem, post_key, shop};

on_every_store!(
    missing_key_is_400,
    malformed_key_is_400,
    quoted_and_bare_are_one_key,
    different_request_is_422,
    in_flight_twin_is_409_with_retry_after,
    completed_key_replays_status_body_and_allowed_headers,
    request_over_max_request_bytes_is_413,
    store_down_or_timing_out_is_503,
    token_unknown_forged_or_expired_is_400,
    token_used_replays_or_409,
    unstored_statuses_release_the_key,
    response_over_max_response_bytes_never_runs_twice,
    disconnected_client_does_not_cancel_the_handler,
    scoped_callers_do_not_see_each_other,
    other_methods_and_optional_keys_pass_through,
    problems_link_to_docs,
);

/// Row: key missing on a required route → 400.
async fn missing_key_is_400(b: Backend) {
    let (base, shop) = shop(IdempotencyLayer::new(idem(b, "missing").await)).await;
    let res = client()
        .post(format!("{base}/payments"))
        .body("{}")
        .send()
        .await
        .unwrap();
    Answer::of(res)
        .await
        .assert_problem(400, "idempotency-key-missing");
    assert_eq!(shop.runs.load(Ordering::SeqCst), 0);
}

/// Row: key malformed (not an sf-string nor a bare key of 1–255 printable ASCII
/// characters, or several keys) → 400. Also the garbage cases: huge, non-ASCII, empty,
/// list-valued.
async fn malformed_key_is_400(b: Backend) {
    let (base, shop) = shop(IdempotencyLayer::new(idem(b, "malformed").await)).await;
    let c = client();
    let huge = "k".repeat(8 * 1024);
    let just_over = "k".repeat(256);
    let raw: Vec<&[u8]> = vec![
        b"",
        b"\"\"",
        b"   ",
        huge.as_bytes(),
        just_over.as_bytes(),
        b"caf\xc3\xa9",
        b"\"caf\xc3\xa9\"",
        b"\xff\xfe",
        b"\"a\", \"b\"",
        b"a,b",
        b"\"unterminated",
        b"\"a\";param=1",
        b"two words",
        b"\"bad \\escape\"",
        b"(1 2 3)",
    ];
    for value in raw {
        let res = c
            .post(format!("{base}/payments"))
            .header(
                "idempotency-key",
                reqwest::header::HeaderValue::from_bytes(value).unwrap(),
            )
            .body("{}")
            .send()
            .await
            .unwrap();
        let a = Answer::of(res).await;
        assert_eq!(a.status, 400, "{:?}: {a:?}", String::from_utf8_lossy(value));
        a.assert_problem(400, "idempotency-key-malformed");
    }
    // The header twice.
    let res = c
        .post(format!("{base}/payments"))
        .header("idempotency-key", "a")
        .header("idempotency-key", "b")
        .body("{}")
        .send()
        .await
        .unwrap();
    Answer::of(res)
        .await
        .assert_problem(400, "idempotency-key-malformed");
    assert_eq!(shop.runs.load(Ordering::SeqCst), 0, "no handler ran");
    // The longest key accepted.
    let longest = "k".repeat(255);
    assert_eq!(
        post_key(&c, &base, "/payments", &longest, "{}")
            .await
            .status,
        201
    );
}

/// Row: the same key quoted and bare is one key; the second is a retry of the first.
async fn quoted_and_bare_are_one_key(b: Backend) {
    let (base, shop) = shop(IdempotencyLayer::new(idem(b, "quoted").await)).await;
    let c = client();
    let first = post_key(&c, &base, "/payments", "\"abc\"", r#"{"order":1}"#).await;
    assert_eq!(first.status, 201);
    assert!(!first.replayed());
    let second = post_key(&c, &base, "/payments", "abc", r#"{"order":1}"#).await;
    assert_eq!(second.status, 201);
    assert!(second.replayed());
    assert_eq!(second.body, first.body);
    assert_eq!(
        first.json()["key"],
        "abc",
        "the handler sees the key unquoted"
    );
    assert_eq!(shop.runs.load(Ordering::SeqCst), 1);
}

/// Row: same key, different request (method, path, query, body, Content-Type) → 422.
async fn different_request_is_422(b: Backend) {
    let layer = IdempotencyLayer::new(idem(b, "mismatch").await).methods([
        http::Method::POST,
        http::Method::PATCH,
        http::Method::PUT,
    ]);
    let (base, shop) = shop(layer).await;
    let c = client();
    assert_eq!(
        post_key(&c, &base, "/payments", "k1", r#"{"order":1}"#)
            .await
            .status,
        201
    );
    // Another body, path, query.
    for (path, body) in [
        ("/payments", r#"{"order":2}"#),
        ("/refunds", r#"{"order":1}"#),
        ("/payments?x=1", r#"{"order":1}"#),
    ] {
        post_key(&c, &base, path, "k1", body)
            .await
            .assert_problem(422, "idempotency-key-reused");
    }
    // Another Content-Type.
    let res = c
        .post(format!("{base}/payments"))
        .header("idempotency-key", "k1")
        .header("content-type", "text/plain")
        .body(r#"{"order":1}"#)
        .send()
        .await
        .unwrap();
    Answer::of(res)
        .await
        .assert_problem(422, "idempotency-key-reused");
    // Another method.
    let res = c
        .put(format!("{base}/payments"))
        .header("idempotency-key", "k1")
        .header("content-type", "application/json")
        .body(r#"{"order":1}"#)
        .send()
        .await
        .unwrap();
    Answer::of(res)
        .await
        .assert_problem(422, "idempotency-key-reused");
    assert_eq!(shop.runs.load(Ordering::SeqCst), 1);
    // The original request still replays.
    assert!(
        post_key(&c, &base, "/payments", "k1", r#"{"order":1}"#)
            .await
            .replayed()
    );
}

/// Row: same key, twin in flight, `wait` ran out → 409 with Retry-After; after the
/// twin completes the duplicate gets its response.
async fn in_flight_twin_is_409_with_retry_after(b: Backend) {
    for wait in [Duration::ZERO, Duration::from_millis(50)] {
        let layer = IdempotencyLayer::new(idem(b, "inflight").await).wait(wait);
        let (base, shop) = shop(layer).await;
        let c = client();
        let started = shop.started_note.notified();
        let first = tokio::spawn({
            let (c, base) = (c.clone(), base.clone());
            async move { post_key(&c, &base, "/payments?sleep_ms=1500", "slow", "{}").await }
        });
        started.await;
        let twin = post_key(&c, &base, "/payments?sleep_ms=1500", "slow", "{}").await;
        twin.assert_problem(409, "idempotency-key-in-flight");
        assert!(twin.header("retry-after").unwrap().parse::<u32>().unwrap() >= 1);
        let first = first.await.unwrap();
        assert_eq!(first.status, 201);
        let after = post_key(&c, &base, "/payments?sleep_ms=1500", "slow", "{}").await;
        assert!(after.replayed());
        assert_eq!(after.body, first.body);
        assert_eq!(shop.runs.load(Ordering::SeqCst), 1);
    }
}

/// Row: completed → the stored status, body and allow-listed headers, plus
/// `Idempotent-Replayed: true`; never `Set-Cookie` nor other headers.
async fn completed_key_replays_status_body_and_allowed_headers(b: Backend) {
    let layer = IdempotencyLayer::new(idem(b, "replay").await)
        .replay_header(http::header::SET_COOKIE)
        .replay_header(http::HeaderName::from_static("x-unused"));
    let (base, shop) = shop(layer).await;
    let c = client();
    let first = post_key(&c, &base, "/payments?status=202", "r1", r#"{"order":9}"#).await;
    assert_eq!(first.status, 202);
    assert_eq!(
        first.header("set-cookie"),
        Some("session=secret"),
        "the first response is whole"
    );
    assert_eq!(first.header("x-run"), Some("1"));
    for _ in 0..3 {
        let again = post_key(&c, &base, "/payments?status=202", "r1", r#"{"order":9}"#).await;
        assert_eq!(again.status, 202);
        assert!(again.replayed());
        assert_eq!(again.body, first.body, "the bytes as they were");
        for h in ["content-type", "location", "etag"] {
            assert_eq!(again.header(h), first.header(h), "{h}");
        }
        assert_eq!(again.header("set-cookie"), None);
        assert_eq!(again.header("x-run"), None);
    }
    assert_eq!(shop.runs.load(Ordering::SeqCst), 1);
    // 4xx responses are results too: stored and replayed.
    let bad = post_key(&c, &base, "/payments?status=404", "r2", "{}").await;
    assert_eq!(bad.status, 404);
    let again = post_key(&c, &base, "/payments?status=404", "r2", "{}").await;
    assert_eq!((again.status, again.replayed()), (404, true));
    assert_eq!(shop.runs.load(Ordering::SeqCst), 2);
}

/// Row: request body over `max_request_bytes` → 413, the handler does not run; with a
/// Content-Length and with a streamed body of unknown length.
async fn request_over_max_request_bytes_is_413(b: Backend) {
    let layer = IdempotencyLayer::new(idem(b, "toolarge").await).max_request_bytes(1000);
    let (base, shop) = shop(layer).await;
    let c = client();
    post_key(&c, &base, "/payments", "big", &"x".repeat(1001))
        .await
        .assert_problem(413, "idempotency-request-too-large");
    // Chunked, with no Content-Length: the bound holds while reading.
    let raw = support::raw_request(
        &base,
        "POST /payments HTTP/1.1\r\nHost: x\r\nIdempotency-Key: big\r\n\
         Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n\
         258\r\n{a}\r\n258\r\n{a}\r\n0\r\n\r\n",
        &"y".repeat(600),
    )
    .await;
    assert!(raw.starts_with("HTTP/1.1 413"), "{raw}");
    assert!(raw.contains("idempotency-request-too-large"), "{raw}");
    assert_eq!(shop.runs.load(Ordering::SeqCst), 0);
    // Nothing was claimed: the key is free for a request of the right size.
    assert_eq!(
        post_key(&c, &base, "/payments", "big", &"x".repeat(1000))
            .await
            .status,
        201
    );
}

/// Row: the store down or timing out → 503 with Retry-After; the handler does not
/// run. On the stores that can fail: Redis and PostgreSQL behind a proxy that is cut
/// (connections closed) or frozen (nothing forwarded). An in-process MemoryStore has
/// no such failure.
async fn store_down_or_timing_out_is_503(b: Backend) {
    let target = match b {
        Backend::Memory => return,
        Backend::Redis => "127.0.0.1:6379",
        Backend::Postgres => "127.0.0.1:5432",
    };
    for fault in ["cut", "freeze"] {
        let proxy = Proxy::start(target).await;
        let timeout = Duration::from_millis(400);
        let ns = support::namespace("down");
        let idem = match b {
            Backend::Redis => Idem::builder()
                .store(
                    RedisStore::builder()
                        .timeout(timeout)
                        .connect(&format!("redis://{}", proxy.addr))
                        .unwrap(),
                )
                .namespace(ns)
                .build(),
            _ => Idem::builder()
                .store(
                    support::postgres(&format!("postgres://postgres@{}/test", proxy.addr), timeout)
                        .await,
                )
                .namespace(ns)
                .build(),
        };
        let (base, shop) = shop(IdempotencyLayer::new(idem)).await;
        let c = client();
        assert_eq!(
            post_key(&c, &base, "/payments", "before", "{}")
                .await
                .status,
            201
        );
        match fault {
            "cut" => proxy.cut(),
            _ => proxy.freeze(),
        }
        for key in ["during-1", "during-2"] {
            let a = post_key(&c, &base, "/payments", key, "{}").await;
            a.assert_problem(503, "idempotency-store-unavailable");
            assert!(a.header("retry-after").is_some());
        }
        assert_eq!(
            shop.runs.load(Ordering::SeqCst),
            1,
            "{fault}: no handler ran without its claim"
        );
    }
}

/// Row (token mode): a token unknown, forged or expired → 400.
async fn token_unknown_forged_or_expired_is_400(b: Backend) {
    let layer = IdempotencyLayer::tokens(idem(b, "tokbad").await).ttl(Duration::from_secs(1));
    let (base, shop) = shop(layer).await;
    let c = client();
    let a = post_key(&c, &base, "/payments", "", "{}").await;
    assert_eq!(a.status, 400);
    let token = Answer::of(c.get(format!("{base}/token")).send().await.unwrap()).await;
    assert_eq!(token.status, 200);
    let token = token.json();
    assert_eq!(token["expires_in"], 1);
    let token = token["token"].as_str().unwrap().to_owned();
    let mut forged = token.clone().into_bytes();
    forged[0] = if forged[0] == b'a' { b'b' } else { b'a' };
    let forged = String::from_utf8(forged).unwrap();
    for bad in [
        "0123456789abcdef0123456789abcdef",
        "not-a-token",
        forged.as_str(),
    ] {
        post_key(&c, &base, "/payments", bad, "{}")
            .await
            .assert_problem(400, "idempotency-token-invalid");
    }
    tokio::time::sleep(Duration::from_millis(1300)).await;
    post_key(&c, &base, "/payments", &token, "{}")
        .await
        .assert_problem(400, "idempotency-token-invalid");
    assert_eq!(shop.runs.load(Ordering::SeqCst), 0);
}

/// Row (token mode): a token already used → the stored response is replayed, or 409
/// when the layer rejects duplicates.
async fn token_used_replays_or_409(b: Backend) {
    for policy in [OnDuplicate::Replay, OnDuplicate::Reject] {
        let layer = IdempotencyLayer::tokens(idem(b, "tokused").await).on_duplicate(policy);
        let (base, shop) = shop(layer).await;
        let c = client();
        let token = Answer::of(c.get(format!("{base}/token")).send().await.unwrap()).await;
        assert_eq!(token.header("cache-control"), Some("no-store"));
        let token = token.json()["token"].as_str().unwrap().to_owned();
        let first = post_key(&c, &base, "/payments", &token, r#"{"order":3}"#).await;
        assert_eq!(first.status, 201);
        // The token quoted is the same token.
        let again = post_key(
            &c,
            &base,
            "/payments",
            &format!("\"{token}\""),
            r#"{"order":3}"#,
        )
        .await;
        match policy {
            OnDuplicate::Replay => {
                assert_eq!(again.status, 201);
                assert!(again.replayed());
                assert_eq!(again.body, first.body);
            }
            OnDuplicate::Reject => again.assert_problem(409, "idempotency-token-used"),
        }
        assert_eq!(shop.runs.load(Ordering::SeqCst), 1);
    }
}

/// 5xx, 408 and 429 are not stored: they release the key and a retry runs again.
async fn unstored_statuses_release_the_key(b: Backend) {
    let (base, shop) = shop(IdempotencyLayer::new(idem(b, "release").await)).await;
    let c = client();
    for (n, status) in [500u16, 503, 408, 429].into_iter().enumerate() {
        let path = format!("/payments?status={status}");
        let key = format!("rel-{status}");
        let a = post_key(&c, &base, &path, &key, "{}").await;
        assert_eq!((a.status, a.replayed()), (status, false));
        let a = post_key(&c, &base, &path, &key, "{}").await;
        assert_eq!((a.status, a.replayed()), (status, false), "ran again");
        assert_eq!(shop.runs.load(Ordering::SeqCst), 2 * (n as u64 + 1));
    }
    // A custom policy: store 503 too.
    let layer = IdempotencyLayer::new(idem(b, "release2").await).store_status(|_| true);
    let (base, shop) = support::shop(layer).await;
    post_key(&c, &base, "/payments?status=503", "x", "{}").await;
    let a = post_key(&c, &base, "/payments?status=503", "x", "{}").await;
    assert_eq!((a.status, a.replayed()), (503, true));
    assert_eq!(shop.runs.load(Ordering::SeqCst), 1);
}

/// A response over `max_response_bytes` reaches its client whole; retries get the
/// documented 410 and the handler never runs again.
async fn response_over_max_response_bytes_never_runs_twice(b: Backend) {
    let layer = IdempotencyLayer::new(idem(b, "bigres").await).max_response_bytes(64 * 1024);
    let (base, shop) = shop(layer).await;
    let c = client();
    let first = post_key(&c, &base, "/payments?size=200000", "big", "{}").await;
    assert_eq!(first.status, 201);
    assert_eq!(first.body.len(), 200_000);
    for _ in 0..2 {
        let again = post_key(&c, &base, "/payments?size=200000", "big", "{}").await;
        again.assert_problem(410, "idempotency-response-not-replayable");
        assert!(again.replayed());
    }
    assert_eq!(shop.runs.load(Ordering::SeqCst), 1);
    // Just under the bound is stored.
    let first = post_key(&c, &base, "/payments?size=65536", "fits", "{}").await;
    let again = post_key(&c, &base, "/payments?size=65536", "fits", "{}").await;
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
}

/// A client that disconnects mid-handler does not cancel it: the handler runs on and
/// its response is recorded; the retry gets 409 while it runs, then the replay, and the
/// handler runs once.
async fn disconnected_client_does_not_cancel_the_handler(b: Backend) {
    let (base, shop) = shop(IdempotencyLayer::new(idem(b, "cancel").await)).await;
    let started = shop.started_note.notified();
    let gone = tokio::spawn({
        let base = base.clone();
        async move { post_key(&client(), &base, "/payments?sleep_ms=1500", "c1", "{}").await }
    });
    started.await;
    gone.abort();
    let _ = gone.await;
    let c = client();
    let mut replayed = None;
    for _ in 0..400 {
        let retry = post_key(&c, &base, "/payments?sleep_ms=1500", "c1", "{}").await;
        if retry.status == 409 {
            retry.assert_problem(409, "idempotency-key-in-flight");
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        replayed = Some(retry);
        break;
    }
    let retry = replayed.expect("the handler's response was never recorded");
    assert_eq!((retry.status, retry.replayed()), (201, true));
    assert_eq!(
        retry.json()["payment_id"],
        "pay_1",
        "the handler's own response"
    );
    assert_eq!(
        shop.started.load(Ordering::SeqCst),
        1,
        "the handler ran once"
    );
    assert_eq!(shop.runs.load(Ordering::SeqCst), 1);
}

/// Keys scoped to two callers do not see each other's responses.
async fn scoped_callers_do_not_see_each_other(b: Backend) {
    let layer = IdempotencyLayer::new(idem(b, "scope").await).scope(|parts| {
        parts
            .headers
            .get("x-api-key")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    });
    let (base, shop) = shop(layer).await;
    let c = client();
    let send = |caller: Option<&'static str>| {
        let mut r = c
            .post(format!("{base}/payments"))
            .header("idempotency-key", "shared-key")
            .body("{}");
        if let Some(caller) = caller {
            r = r.header("x-api-key", caller);
        }
        async move { Answer::of(r.send().await.unwrap()).await }
    };
    let alice = send(Some("alice")).await;
    let bob = send(Some("bob")).await;
    let nobody = send(None).await;
    assert!(!alice.replayed() && !bob.replayed() && !nobody.replayed());
    assert_ne!(alice.json()["payment_id"], bob.json()["payment_id"]);
    assert_eq!(shop.runs.load(Ordering::SeqCst), 3);
    let alice2 = send(Some("alice")).await;
    assert!(alice2.replayed());
    assert_eq!(alice2.body, alice.body);
    let bob2 = send(Some("bob")).await;
    assert_eq!(bob2.body, bob.body);
    assert_eq!(shop.runs.load(Ordering::SeqCst), 3);
}

/// Methods outside `methods` pass through untouched; `required(false)` runs a request
/// without a key as a plain one.
async fn other_methods_and_optional_keys_pass_through(b: Backend) {
    let (base, _) = shop(IdempotencyLayer::new(idem(b, "through").await)).await;
    let c = client();
    let a = Answer::of(c.get(format!("{base}/payments")).send().await.unwrap()).await;
    assert_eq!((a.status, a.body.as_str()), (200, "listing"));
    let layer = IdempotencyLayer::new(idem(b, "optional").await).required(false);
    let (base, shop) = shop(layer).await;
    for _ in 0..2 {
        let res = c
            .post(format!("{base}/payments"))
            .body("{}")
            .send()
            .await
            .unwrap();
        let a = Answer::of(res).await;
        assert_eq!((a.status, a.replayed()), (201, false));
    }
    assert_eq!(shop.runs.load(Ordering::SeqCst), 2);
}

/// Problems link to the operator's documentation.
async fn problems_link_to_docs(b: Backend) {
    let docs = "https://docs.example/idempotency";
    let (base, _) = shop(IdempotencyLayer::new(idem(b, "docs").await).docs(docs)).await;
    let res = client()
        .post(format!("{base}/payments"))
        .send()
        .await
        .unwrap();
    let a = Answer::of(res).await;
    a.assert_problem(400, "idempotency-key-missing");
    assert_eq!(
        a.header("link"),
        Some(format!("<{docs}>; rel=\"describedby\"").as_str())
    );
    assert_eq!(a.json()["type"], docs);
}
