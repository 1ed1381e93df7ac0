//! Durable steps in a handler behind the layer: a 5xx releases the key, and the client's
//! retry replays the steps the first attempt finished and runs only the rest. On
//! MemoryStore and on RedisStore.

#![allow(clippy::unwrap_used)]

mod support;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use idem_http::{IdempotencyLayer, RequestBody};
use idem_runtime::{Error, step};
use support::{Backend, idem};
use tower::{Layer, Service, service_fn};

#[derive(Default)]
struct Effects {
    charges: AtomicU64,
    mails: AtomicU64,
    /// The first attempt's mail server is down.
    mail_down: AtomicBool,
}

async fn checkout(effects: Arc<Effects>) -> Result<Response<Full<Bytes>>, Error> {
    let charges = &effects.charges;
    let charge: u64 = step("charge", |s| async move {
        assert!(s.key().starts_with("idem-"));
        Ok::<_, Error>(charges.fetch_add(1, Ordering::SeqCst) + 1)
    })
    .await?;
    if effects.mail_down.swap(false, Ordering::SeqCst) {
        let mut res = Response::new(Full::new(Bytes::from_static(b"mail server down")));
        *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        return Ok(res);
    }
    let mail: u64 = step("mail", |_| async {
        Ok::<_, Error>(effects.mails.fetch_add(1, Ordering::SeqCst) + 1)
    })
    .await?;
    let mut res = Response::new(Full::new(Bytes::from(format!(
        "charge {charge} mail {mail}"
    ))));
    *res.status_mut() = StatusCode::CREATED;
    Ok(res)
}

async fn a_5xx_retry_resumes_the_handlers_steps(b: Backend) {
    let idem = idem(b, "steps").await;
    let effects = Arc::new(Effects::default());
    effects.mail_down.store(true, Ordering::SeqCst);
    let handler = {
        let effects = effects.clone();
        service_fn(move |_req: Request<RequestBody<Full<Bytes>>>| {
            let effects = effects.clone();
            async move {
                Ok::<_, Infallible>(checkout(effects).await.unwrap_or_else(|e| {
                    let mut res = Response::new(Full::new(Bytes::from(e.to_string())));
                    *res.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
                    res
                }))
            }
        })
    };
    let mut svc = IdempotencyLayer::new(idem).layer(handler);
    let mut answers = Vec::new();
    for _ in 0..3 {
        std::future::poll_fn(|cx| svc.poll_ready(cx)).await.unwrap();
        let req = Request::post("/checkout")
            .header("idempotency-key", "order-7")
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap();
        let res = svc.call(req).await.unwrap();
        let replayed = res.headers().contains_key("idempotent-replayed");
        let status = res.status();
        let body = res.into_body().collect().await.unwrap().to_bytes();
        answers.push((
            status,
            replayed,
            String::from_utf8_lossy(&body).into_owned(),
        ));
    }
    assert_eq!(answers[0].0, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        answers[1],
        (StatusCode::CREATED, false, "charge 1 mail 1".to_owned()),
        "the retry resumes: the charge is replayed from the journal"
    );
    assert_eq!(
        answers[2],
        (StatusCode::CREATED, true, "charge 1 mail 1".to_owned())
    );
    assert_eq!(effects.charges.load(Ordering::SeqCst), 1, "charged twice");
    assert_eq!(effects.mails.load(Ordering::SeqCst), 1);
}

mod memory {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_5xx_retry_resumes_the_handlers_steps() {
        super::a_5xx_retry_resumes_the_handlers_steps(super::Backend::Memory).await
    }
}

mod redis {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_5xx_retry_resumes_the_handlers_steps() {
        super::a_5xx_retry_resumes_the_handlers_steps(super::Backend::Redis).await
    }
}
