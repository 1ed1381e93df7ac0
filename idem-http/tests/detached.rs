//! A client that goes away does not cancel its handler: the service's response future
//! is dropped while the handler's effect is in flight, and the retry gets the handler's
//! own response, with exactly one effect, however long the handler is blocked. A
//! cancel idem makes itself (an opt-in `detached_timeout`) keeps the key until its
//! lease ends. Driven through the service directly, so the drop happens at a known
//! point, on MemoryStore, RedisStore and PostgreSQL.

#![allow(clippy::unwrap_used)]

mod support;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use idem_http::{IdempotencyLayer, RequestBody};
use idem_runtime::Idem;
use support::{Backend, idem};
use tokio::sync::{Notify, Semaphore};
use tower::{Layer, Service};

/// A handler whose effect starts, says so, then waits for the gate before answering.
#[derive(Clone)]
struct Handler {
    effects: Arc<AtomicU64>,
    started: Arc<Notify>,
    gate: Arc<Semaphore>,
    /// Runs dropped before they answered.
    cancelled: Arc<AtomicU64>,
}

/// Counts a run dropped before it answered.
struct Cancelled(Option<Arc<AtomicU64>>);

impl Drop for Cancelled {
    fn drop(&mut self) {
        if let Some(n) = self.0.take() {
            n.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl Handler {
    fn new() -> Handler {
        Handler {
            effects: Arc::new(AtomicU64::new(0)),
            started: Arc::new(Notify::new()),
            gate: Arc::new(Semaphore::new(0)),
            cancelled: Arc::new(AtomicU64::new(0)),
        }
    }

    fn service(&self) -> Handler {
        self.clone()
    }
}

impl Service<Request<RequestBody<Full<Bytes>>>> for Handler {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Response<Full<Bytes>>, Infallible>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _req: Request<RequestBody<Full<Bytes>>>) -> Self::Future {
        let h = self.clone();
        Box::pin(async move {
            let mut cancelled = Cancelled(Some(h.cancelled.clone()));
            let n = h.effects.fetch_add(1, Ordering::SeqCst) + 1;
            // A permit stays stored if nobody waits yet: the test cannot miss it.
            h.started.notify_one();
            let _pass = h.gate.acquire().await.unwrap();
            cancelled.0 = None;
            let mut res = Response::new(Full::new(Bytes::from(format!("payment {n}"))));
            *res.status_mut() = StatusCode::CREATED;
            Ok(res)
        })
    }
}

fn request(key: &str) -> Request<Full<Bytes>> {
    Request::post("/payments")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(br#"{"order":7}"#)))
        .unwrap()
}

async fn send<S>(svc: &mut S, key: &str) -> (StatusCode, bool, String)
where
    S: Service<Request<Full<Bytes>>, Response = Response<idem_http::ResponseBody<Full<Bytes>>>>,
    S::Error: std::fmt::Debug,
{
    std::future::poll_fn(|cx| svc.poll_ready(cx)).await.unwrap();
    let res = svc.call(request(key)).await.unwrap();
    let replayed = res.headers().contains_key("idempotent-replayed");
    let status = res.status();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        replayed,
        String::from_utf8_lossy(&body).into_owned(),
    )
}

/// The client gives up mid-handler; its retry gets 409 while the handler runs on, and
/// the handler's own response once it is recorded. One effect.
async fn dropped_mid_handler_runs_once_and_retry_gets_its_response(b: Backend) {
    let idem: Idem = idem(b, "detached").await;
    let h = Handler::new();
    // Two services on one store: one answering duplicates at once, one waiting.
    let mut impatient = IdempotencyLayer::new(idem.clone()).layer(h.service());
    let mut patient = IdempotencyLayer::new(idem)
        .wait(Duration::from_secs(20))
        .layer(h.service());

    {
        std::future::poll_fn(|cx| impatient.poll_ready(cx))
            .await
            .unwrap();
        let mut first = Box::pin(impatient.call(request("gone-1")));
        tokio::select! {
            _ = &mut first => panic!("the handler answered before its gate opened"),
            _ = h.started.notified() => {}
        }
        // The client goes away: its response future is dropped, the effect in flight.
    }

    // Bounded: were the key released, this retry would run the handler and wait at
    // its gate.
    let (status, replayed, _) =
        tokio::time::timeout(Duration::from_secs(10), send(&mut impatient, "gone-1"))
            .await
            .expect("the retry ran the handler again: the key was released");
    assert_eq!(
        (status, replayed),
        (StatusCode::CONFLICT, false),
        "the key is still held by the handler that runs on"
    );
    assert_eq!(h.effects.load(Ordering::SeqCst), 1);

    h.gate.add_permits(100);
    let (status, replayed, body) = send(&mut patient, "gone-1").await;
    assert_eq!(status, StatusCode::CREATED);
    assert!(replayed, "the retry gets the recorded response");
    assert_eq!(body, "payment 1", "the handler's own response");
    let (status, replayed, body) = send(&mut impatient, "gone-1").await;
    assert_eq!(
        (status, replayed, body.as_str()),
        (StatusCode::CREATED, true, "payment 1")
    );
    assert_eq!(h.effects.load(Ordering::SeqCst), 1, "exactly one effect");
}

/// Issue 32: the handler is blocked (on a database lock, say) far longer than the 60 s
/// idem used to allow a detached request, and its client hung up long ago. Nothing
/// cancels it: retries get 409 all along, then its own response. One effect.
async fn a_blocked_handler_outlives_its_gone_client(
    b: Backend,
    blocked: Duration,
    lease: Duration,
) {
    let idem: Idem = idem(b, "detached-blocked").await;
    let h = Handler::new();
    let mut impatient = IdempotencyLayer::new(idem.clone())
        .lease(lease)
        .layer(h.service());
    {
        std::future::poll_fn(|cx| impatient.poll_ready(cx))
            .await
            .unwrap();
        let mut first = Box::pin(impatient.call(request("blocked-1")));
        tokio::select! {
            _ = &mut first => panic!("the handler answered before its gate opened"),
            _ = h.started.notified() => {}
        }
    }
    tokio::time::sleep(blocked).await;
    // Were the key released, this retry would run the handler and wait at its gate.
    let (status, replayed, _) =
        tokio::time::timeout(Duration::from_secs(10), send(&mut impatient, "blocked-1"))
            .await
            .expect("the retry ran the handler again: the key was released");
    assert_eq!((status, replayed), (StatusCode::CONFLICT, false));
    assert_eq!(
        h.cancelled.load(Ordering::SeqCst),
        0,
        "the handler was cancelled"
    );

    h.gate.add_permits(100);
    let mut patient = IdempotencyLayer::new(idem)
        .lease(lease)
        .wait(Duration::from_secs(20))
        .layer(h.service());
    let (status, replayed, body) = send(&mut patient, "blocked-1").await;
    assert_eq!(
        (status, replayed, body.as_str()),
        (StatusCode::CREATED, true, "payment 1")
    );
    assert_eq!(h.effects.load(Ordering::SeqCst), 1, "exactly one effect");
}

/// With a `detached_timeout`, idem cancels a handler whose client went away, but a
/// cancel cannot recall what the handler already sent: the key stays held (retries get
/// 409) until the claim's lease ends, then a retry runs the handler again.
async fn a_detached_timeout_holds_the_key_until_the_lease_ends(b: Backend) {
    let idem: Idem = idem(b, "detached-timeout").await;
    let h = Handler::new();
    let mut svc = IdempotencyLayer::new(idem)
        .detached_timeout(Duration::from_millis(50))
        .lease(Duration::from_secs(5))
        .layer(h.service());
    {
        std::future::poll_fn(|cx| svc.poll_ready(cx)).await.unwrap();
        let mut first = Box::pin(svc.call(request("gone-2")));
        tokio::select! {
            _ = &mut first => panic!("the handler answered before its gate opened"),
            _ = h.started.notified() => {}
        }
    }
    // The detached run is cancelled at its timeout...
    for _ in 0..500 {
        if h.cancelled.load(Ordering::SeqCst) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(h.cancelled.load(Ordering::SeqCst), 1, "never cancelled");
    // ... and a release at the cancel would have happened by now.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, _, _) = tokio::time::timeout(Duration::from_secs(10), send(&mut svc, "gone-2"))
        .await
        .expect("the retry ran the handler again: the key was released at the cancel");
    assert_eq!(
        status,
        StatusCode::CONFLICT,
        "the key is held after the cancel"
    );
    assert_eq!(h.effects.load(Ordering::SeqCst), 1);

    // Once the lease runs out (the heartbeat stopped with the cancel), a retry runs.
    let mut released = false;
    for _ in 0..400 {
        if h.effects.load(Ordering::SeqCst) > 1 {
            released = true;
            break;
        }
        let retry = tokio::time::timeout(Duration::from_millis(100), send(&mut svc, "gone-2"));
        // Err: the retry claimed the key and its handler waits at the gate.
        if let Ok((status, _, _)) = retry.await {
            assert_eq!(status, StatusCode::CONFLICT);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(released, "the cancelled run's claim never ended");
    h.gate.add_permits(100);
}

mod memory {
    use std::time::Duration;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dropped_mid_handler_runs_once_and_retry_gets_its_response() {
        super::dropped_mid_handler_runs_once_and_retry_gets_its_response(super::Backend::Memory)
            .await
    }
    /// 75 s of the runtime's own clock, paused and advanced when idle: the memory
    /// store's leases and the heartbeat run on it too.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_blocked_handler_outlives_its_gone_client() {
        super::a_blocked_handler_outlives_its_gone_client(
            super::Backend::Memory,
            Duration::from_secs(75),
            Duration::from_secs(30),
        )
        .await
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_detached_timeout_holds_the_key_until_the_lease_ends() {
        super::a_detached_timeout_holds_the_key_until_the_lease_ends(super::Backend::Memory).await
    }
}

/// On a server store the clock cannot be paused (its timeouts would fire while it
/// answers): the handler stays blocked for several leases of real time instead.
macro_rules! on_server_store {
    ($store:ident, $backend:ident) => {
        mod $store {
            use std::time::Duration;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn dropped_mid_handler_runs_once_and_retry_gets_its_response() {
                super::dropped_mid_handler_runs_once_and_retry_gets_its_response(
                    super::Backend::$backend,
                )
                .await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_blocked_handler_outlives_its_gone_client() {
                super::a_blocked_handler_outlives_its_gone_client(
                    super::Backend::$backend,
                    Duration::from_secs(3),
                    Duration::from_millis(600),
                )
                .await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_detached_timeout_holds_the_key_until_the_lease_ends() {
                super::a_detached_timeout_holds_the_key_until_the_lease_ends(
                    super::Backend::$backend,
                )
                .await
            }
        }
    };
}

on_server_store!(redis, Redis);
on_server_store!(postgres, Postgres);
