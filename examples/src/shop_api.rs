//! A payments API behind the `Idempotency-Key` layer: retries, double clicks and
//! replays from any client run each payment once.
//!
//! ```text
//! cargo run -p idem-examples --bin shop_api -- --listen 127.0.0.1:8080 \
//!     [--store URL] [--ledger postgres://...] [--namespace NAME] [--webhook-secret whsec_...]
//! ```
//!
//! Routes:
//!
//! - `POST /payments`, JSON `{"order": u64, "cents": u64}` with an `Idempotency-Key`:
//!   201 with a `payment_id` that is new for each run of the handler, behind the layer
//!   with its defaults (`wait` 0: a duplicate of an in-flight payment gets 409 at once)
//!   and keys scoped by the authenticated user, so two users who pick the same key
//!   never see each other's payments, and one user's retry after a session refresh
//!   replays its payment.
//! - `GET /token`, then `POST /pay` with the token as its `Idempotency-Key`: the same
//!   payment in token mode (a token pays once, for the user that used it). Tokens live
//!   30 s, and the route issues at most 200 a second (429 past that), so at most about
//!   6,000 are alive at once, and at most 20 a second to one user (or, anonymous, to
//!   one client address).
//! - `POST /webhooks/payments`: a payment provider's webhook, in webhook mode. The
//!   sender's `webhook-id` is the key, so its redeliveries run the handler once: a
//!   delivery of an event still running waits for it (up to 30 s) and gets its 200, a
//!   completed one gets the stored 200, and a 5xx (the ledger down) lets the sender's
//!   retry run. With `--webhook-secret whsec_...` every delivery must carry a valid
//!   Standard Webhooks signature (`webhook-timestamp` within 5 minutes): others are
//!   401 and never claim the event.
//!
//! - `GET /healthz`.
//! - `GET /metrics`: Prometheus text for the `idem_*` counters and histograms.
//!
//! The layers sit on the routes that use them (`route_layer`), not on the router: an
//! unknown path is 404 and a wrong method 405, and neither uses up a token.
//!
//! Authentication (a stand-in for a real one): on `/payments`, `/token` and `/pay`,
//! `Authorization: Bearer <user>` or `Bearer <user>.<session>` (the scheme in any case)
//! authenticates `<user>`, the part before the first `.`; any other `Authorization` is
//! 401, before the layer, so it is never stored and its key stays free. A request
//! without `Authorization` is anonymous; anonymous callers share one scope.
//!
//! The server closes a connection whose request head has not arrived within 10 s, so
//! slow clients cannot hold connections open (`axum::serve` sets no such bound).
//!
//! `--store` picks the idempotency store (`memory`, the default, `redis://...`,
//! `postgres://...`, ...): servers sharing one store share their keys. With `--ledger`,
//! every run of a payment handler also inserts one row into the table
//! `shop_payments(payment_id, idempotency_key, order_id, cents)` (created if absent, no
//! unique constraint), with the key as the client sent it, so runs can be counted from
//! outside. Every run of the webhook handler inserts one row into
//! `shop_webhook_events(event_id, run_id, payload)` (no unique constraint either).

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use idem_http::{IDEMPOTENCY_KEY, IdempotencyLayer, WEBHOOK_ID};
use idem_runtime::Idem;
use idem_runtime::store::sql::sqlx;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use serde::{Deserialize, Serialize};

const USAGE: &str = "usage: shop_api [--listen ADDR] [--store URL] [--ledger postgres://...] [--namespace NAME] [--webhook-secret whsec_...]
  --listen ADDR     where to serve (default 127.0.0.1:8080)
  --store URL       memory (default), redis://host:port/db, postgres://..., mysql://..., sqlite://path?mode=rwc
  --ledger URL      PostgreSQL database to record every handler run in (table shop_payments)
  --namespace NAME  the idempotency namespace (default shop_api)
  --webhook-secret whsec_...  verify Standard Webhooks signatures on POST /webhooks/payments";

struct Args {
    listen: SocketAddr,
    store: String,
    ledger: Option<String>,
    namespace: String,
    webhook_secret: Option<String>,
}

fn parse(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut a = Args {
        listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
        store: "memory".into(),
        ledger: None,
        namespace: "shop_api".into(),
        webhook_secret: None,
    };
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--listen" => {
                let v = value()?;
                a.listen = v
                    .parse()
                    .map_err(|_| format!("--listen takes host:port, not {v:?}"))?;
            }
            "--store" => a.store = value()?,
            "--ledger" => a.ledger = Some(value()?),
            "--namespace" => a.namespace = value()?,
            "--webhook-secret" => a.webhook_secret = Some(value()?),
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(a)
}

/// A payment as the client asks for it.
#[derive(Debug, Deserialize)]
struct PaymentRequest {
    order: u64,
    cents: u64,
}

/// What a payment run answers.
#[derive(Debug, Serialize)]
struct Payment {
    payment_id: String,
    order: u64,
    cents: u64,
    status: &'static str,
}

struct Shop {
    ledger: Option<sqlx::PgPool>,
    /// Makes payment ids unique within this process; the process id and start time
    /// make them unique across processes.
    seq: AtomicU64,
    prefix: String,
}

impl Shop {
    fn next_id(&self) -> String {
        format!(
            "pay_{}_{}",
            self.prefix,
            self.seq.fetch_add(1, Ordering::Relaxed)
        )
    }
}

/// Charges the order: this is the effect that must happen once per key.
async fn pay(
    State(shop): State<Arc<Shop>>,
    headers: HeaderMap,
    Json(req): Json<PaymentRequest>,
) -> Response {
    let payment = Payment {
        payment_id: shop.next_id(),
        order: req.order,
        cents: req.cents,
        status: "paid",
    };
    if let Some(pool) = &shop.ledger {
        // The key exactly as the client sent it (quoted or bare).
        let key = headers
            .get(IDEMPOTENCY_KEY)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        let inserted = sqlx::query(
            "INSERT INTO shop_payments (payment_id, idempotency_key, order_id, cents) VALUES ($1, $2, $3, $4)",
        )
        .bind(&payment.payment_id)
        .bind(key)
        .bind(i64::try_from(payment.order).unwrap_or(i64::MAX))
        .bind(i64::try_from(payment.cents).unwrap_or(i64::MAX))
        .execute(pool)
        .await;
        if let Err(e) = inserted {
            tracing::error!(error = %e, "ledger insert failed");
            // A 5xx releases the key: the client's retry runs the payment again.
            return (StatusCode::SERVICE_UNAVAILABLE, "ledger unavailable, retry").into_response();
        }
    }
    let location = format!("/payments/{}", payment.payment_id);
    (
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(payment),
    )
        .into_response()
}

/// A payment provider's event: runs once per `webhook-id`, however often it is
/// delivered (the layer replays the stored 200 to redeliveries).
async fn payment_event(
    State(shop): State<Arc<Shop>>,
    headers: HeaderMap,
    body: String,
) -> Response {
    let event_id = headers
        .get(WEBHOOK_ID)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .unwrap_or_default();
    let run_id = shop.next_id();
    if let Some(pool) = &shop.ledger {
        let inserted = sqlx::query(
            "INSERT INTO shop_webhook_events (event_id, run_id, payload) VALUES ($1, $2, $3)",
        )
        .bind(&event_id)
        .bind(&run_id)
        .bind(&body)
        .execute(pool)
        .await;
        if let Err(e) = inserted {
            tracing::error!(error = %e, "ledger insert failed");
            // A 5xx releases the event: the sender's retry runs the handler again.
            return (StatusCode::SERVICE_UNAVAILABLE, "ledger unavailable, retry").into_response();
        }
    }
    let answer =
        serde_json::json!({ "event_id": event_id, "run_id": run_id, "status": "processed" });
    (StatusCode::OK, Json(answer)).into_response()
}

/// The user a request speaks for, as [`authenticate`] established it. Idempotency keys
/// are scoped by it, not by the token: a refreshed session is the same user.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct User(String);

/// The user of an `Authorization` value: `Bearer <user>` or `Bearer <user>.<session>`,
/// the scheme in any case. (A stand-in for looking a session token up.)
fn user_of(authorization: &[u8]) -> Option<User> {
    let value = std::str::from_utf8(authorization).ok()?.trim();
    let (scheme, token) = value.split_once([' ', '\t'])?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let token = token.trim();
    let user = token.split('.').next()?;
    let printable = |s: &str| s.bytes().all(|b| b.is_ascii_graphic());
    (!user.is_empty() && printable(token)).then(|| User(user.to_owned()))
}

/// Puts the request's [`User`] in its extensions; credentials it does not know are 401
/// here, before the idempotency layer, so they never claim or store a key. A request
/// without `Authorization` goes on anonymous.
async fn authenticate(mut req: Request, next: Next) -> Response {
    let mut values = req.headers().get_all(header::AUTHORIZATION).iter();
    let user = match (values.next(), values.next()) {
        (None, _) => return next.run(req).await,
        (Some(v), None) => user_of(v.as_bytes()),
        // Two credentials: which one speaks is not ours to guess.
        (Some(_), Some(_)) => None,
    };
    let Some(user) = user else {
        let mut res = (
            StatusCode::UNAUTHORIZED,
            Json(serde_json::json!({
                "title": "Unknown credentials",
                "status": 401,
                "detail": "Send Authorization: Bearer <user> or Bearer <user>.<session>, or none.",
            })),
        )
            .into_response();
        res.headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        return res;
    };
    req.extensions_mut().insert(user);
    next.run(req).await
}

/// The routes; more can be merged in (metrics, admin) without touching these.
fn router(
    idem: Idem,
    shop: Arc<Shop>,
    metrics: PrometheusHandle,
    hooks: IdempotencyLayer,
) -> Router {
    let keys = IdempotencyLayer::new(idem.clone())
        .name("payments")
        .scope_by_extension::<User>();
    let tokens = IdempotencyLayer::tokens(idem)
        .name("payments")
        .scope_by_extension::<User>()
        .token_ttl(Duration::from_secs(30))
        .token_limit(200, Duration::from_secs(1))
        .token_limit_per_caller(20, Duration::from_secs(1));
    let auth = || middleware::from_fn(authenticate);
    // Each layer on the route it guards, so that the router's 404 and 405 answer
    // outside it: they never claim a key nor use up a token. Authentication wraps the
    // idempotency layer (added last, it runs first), so the user is known when the key
    // is scoped.
    Router::new()
        .route("/payments", post(pay).route_layer(keys).route_layer(auth()))
        .route("/token", tokens.token_route().route_layer(auth()))
        .route("/pay", post(pay).route_layer(tokens).route_layer(auth()))
        .route("/webhooks/payments", post(payment_event).route_layer(hooks))
        .route("/healthz", get(|| async { "ok" }))
        .route("/metrics", get(move || scrape(metrics.clone())))
        .with_state(shop)
}

/// Prometheus text for every `idem_*` counter and histogram (and anything else the
/// process records through the `metrics` facade).
async fn scrape(metrics: PrometheusHandle) -> Response {
    (
        [(CONTENT_TYPE, "text/plain; version=0.0.4")],
        metrics.render(),
    )
        .into_response()
}

async fn ledger(url: &str) -> Result<sqlx::PgPool, sqlx::Error> {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(8)
        .connect(url)
        .await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS shop_payments \
         (payment_id TEXT, idempotency_key TEXT, order_id BIGINT, cents BIGINT)",
    )
    .execute(&pool)
    .await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS shop_webhook_events \
         (event_id TEXT, run_id TEXT, payload TEXT)",
    )
    .execute(&pool)
    .await?;
    Ok(pool)
}

#[tokio::main]
async fn main() -> ExitCode {
    // Logs go to stderr: stdout carries the one line that says where the server listens.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = match parse(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("shop_api: {e}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    // Installed before the first call, so every idem metric lands in this recorder.
    let metrics = match PrometheusBuilder::new().install_recorder() {
        Ok(handle) => handle,
        Err(e) => {
            eprintln!("shop_api: metrics recorder: {e}");
            return ExitCode::FAILURE;
        }
    };
    idem_runtime::observe::describe_metrics();
    idem_http::observe::describe_metrics();
    // Histograms are summarized by the recorder's upkeep; without it they grow unbounded.
    let upkeep = metrics.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            upkeep.run_upkeep();
        }
    });
    let store = match idem_runtime::store::connect(&args.store).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("shop_api: store {}: {e}", args.store);
            return ExitCode::FAILURE;
        }
    };
    let idem = Idem::builder()
        .shared_store(store)
        .namespace(args.namespace.clone())
        .build();
    // A malformed secret stops the server here rather than failing every delivery.
    let hooks = IdempotencyLayer::webhooks(idem.clone());
    let hooks = match &args.webhook_secret {
        None => hooks,
        Some(secret) => match hooks.signing_secret(secret) {
            Ok(h) => h,
            Err(e) => {
                eprintln!("shop_api: --webhook-secret: {e}");
                return ExitCode::from(2);
            }
        },
    };
    let ledger = match &args.ledger {
        None => None,
        Some(url) => match ledger(url).await {
            Ok(pool) => Some(pool),
            Err(e) => {
                eprintln!("shop_api: ledger {url}: {e}");
                return ExitCode::FAILURE;
            }
        },
    };
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros());
    let shop = Arc::new(Shop {
        ledger,
        seq: AtomicU64::new(1),
        prefix: format!("{:x}{:x}", std::process::id(), started),
    });
    let listener = match tokio::net::TcpListener::bind(args.listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("shop_api: listen on {}: {e}", args.listen);
            return ExitCode::FAILURE;
        }
    };
    let addr = listener.local_addr().map_or(args.listen, |a| a);
    // The first line on stdout says where it listens (useful with port 0).
    println!("shop_api listening on http://{addr} (store {})", args.store);
    serve(listener, router(idem, shop, metrics, hooks), async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await;
    ExitCode::SUCCESS
}

/// How long a client may take to send a request's head (its request line and headers).
/// A slow client past it is disconnected: without a bound, a few hundred connections
/// that trickle their headers in hold the server's slots for as long as they like.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `app` on `listener` until `shutdown`, then lets requests in flight finish
/// (up to 30 s). Each request carries its client's address (`ConnectInfo`), which the
/// token route counts anonymous callers by.
async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    shutdown: impl std::future::Future<Output = ()>,
) {
    use hyper_util::rt::{TokioIo, TokioTimer};
    use tower::ServiceExt;

    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors, say: wait rather than spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let app = app
            .clone()
            .map_request(move |mut req: Request<hyper::body::Incoming>| {
                req.extensions_mut().insert(ConnectInfo(peer));
                req
            });
        let conn = http.serve_connection(
            TokioIo::new(stream),
            hyper_util::service::TowerToHyperService::new(app),
        );
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, %peer, "connection ended");
            }
        });
    }
    if tokio::time::timeout(Duration::from_secs(30), graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("requests still running after 30 s; stopping anyway");
    }
}
