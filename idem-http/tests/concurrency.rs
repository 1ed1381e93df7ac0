//! 100 concurrent identical POSTs over real connections run the handler once, on
//! MemoryStore, RedisStore and PostgreSQL.

#![allow(clippy::unwrap_used)]

mod support;

use std::sync::atomic::Ordering;
use std::time::Duration;

use idem_http::IdempotencyLayer;
use support::{Answer, Backend, client, idem, post_key, shop};

on_every_store!(
    hundred_duplicates_waiting_all_get_one_body,
    hundred_duplicates_not_waiting_get_the_original_or_409
);

const N: usize = 100;

async fn hundred(base: &str, path: &str) -> Vec<Answer> {
    let c = client();
    let calls = (0..N).map(|_| {
        let (c, base, path) = (c.clone(), base.to_owned(), path.to_owned());
        tokio::spawn(async move {
            post_key(
                &c,
                &base,
                &path,
                "\"same-key\"",
                r#"{"order":1,"cents":500}"#,
            )
            .await
        })
    });
    let mut out = Vec::with_capacity(N);
    for call in futures_util::future::join_all(calls).await {
        out.push(call.unwrap());
    }
    out
}

/// With `wait` > 0, every duplicate waits for its twin: all 100 get the same body.
async fn hundred_duplicates_waiting_all_get_one_body(b: Backend) {
    let layer = IdempotencyLayer::new(idem(b, "hundred-wait").await).wait(Duration::from_secs(30));
    let (base, shop) = shop(layer).await;
    let answers = hundred(&base, "/payments?sleep_ms=300").await;
    assert_eq!(shop.runs.load(Ordering::SeqCst), 1, "the handler ran once");
    let first = &answers
        .iter()
        .find(|a| !a.replayed())
        .expect("one original")
        .body;
    for a in &answers {
        assert_eq!(a.status, 201, "{a:?}");
        assert_eq!(&a.body, first);
    }
    assert_eq!(answers.iter().filter(|a| !a.replayed()).count(), 1);
}

/// With `wait` 0 (the default), each answer is the original response or a 409.
async fn hundred_duplicates_not_waiting_get_the_original_or_409(b: Backend) {
    let (base, shop) = shop(IdempotencyLayer::new(idem(b, "hundred-nowait").await)).await;
    let answers = hundred(&base, "/payments?sleep_ms=300").await;
    assert_eq!(shop.runs.load(Ordering::SeqCst), 1, "the handler ran once");
    let original = answers
        .iter()
        .filter(|a| a.status == 201)
        .collect::<Vec<_>>();
    assert!(!original.is_empty());
    for a in &answers {
        match a.status {
            201 => assert_eq!(a.body, original[0].body),
            _ => {
                a.assert_problem(409, "idempotency-key-in-flight");
                assert!(a.header("retry-after").is_some());
            }
        }
    }
    // After the twin completed, a retry replays it.
    let c = client();
    let retry = post_key(
        &c,
        &base,
        "/payments?sleep_ms=300",
        "same-key",
        r#"{"order":1,"cents":500}"#,
    )
    .await;
    assert!(retry.replayed());
    assert_eq!(retry.body, original[0].body);
}
