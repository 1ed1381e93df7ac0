//! What the HTTP tests share: stores on the loopback servers, a test app served on a
//! port of its own, and a TCP proxy that can cut or freeze a store's connections.
#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use idem_http::{IdempotencyKey, IdempotencyLayer};
use idem_runtime::store::sql::sqlx;
use idem_runtime::{Idem, RedisStore, SqlStore};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

pub const REDIS: &str = "redis://127.0.0.1:6379";
pub const POSTGRES: &str = "postgres://postgres@127.0.0.1:5432/test";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Memory,
    Redis,
    Postgres,
}

/// A namespace no other test (or run) uses.
pub fn namespace(test: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "http-{test}-{}-{nanos}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A runtime on `backend` in a namespace of its own.
pub async fn idem(backend: Backend, test: &str) -> Idem {
    let ns = namespace(test);
    match backend {
        Backend::Memory => Idem::builder().namespace(ns).build(),
        Backend::Redis => Idem::builder()
            .store(RedisStore::connect(REDIS).expect("redis url"))
            .namespace(ns)
            .build(),
        Backend::Postgres => Idem::builder()
            .store(postgres(POSTGRES, Duration::from_secs(5)).await)
            .namespace(ns)
            .build(),
    }
}

/// A SqlStore on a pool of the size `SqlStore::connect` uses. Connections open on
/// demand, so parallel tests stay under the server's limit. (On a pool of 4, a hundred
/// waiters polling a busy key starve the holder's completion until its lease ends.)
pub async fn postgres(url: &str, timeout: Duration) -> SqlStore {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(16)
        .acquire_timeout(timeout)
        .connect(url)
        .await
        .unwrap_or_else(|e| {
            panic!("PostgreSQL at {url}: {e} (start it, e.g. `pg_ctlcluster 16 main start`)")
        });
    SqlStore::from_pg_pool(pool)
        .await
        .expect("idem table")
        .with_timeout(timeout)
}

/// The test app's state: how many times handlers ran.
#[derive(Default)]
pub struct Shop {
    pub runs: AtomicU64,
    /// Handlers that started; a slow handler counts here before it sleeps.
    pub started: AtomicU64,
    pub started_note: Notify,
    /// Every handler sleeps this long (milliseconds; 0: only when asked).
    pub sleep_ms: AtomicU64,
}

#[derive(serde::Deserialize, Default)]
pub struct Ask {
    /// Answer with this status.
    pub status: Option<u16>,
    /// Sleep this long first.
    pub sleep_ms: Option<u64>,
    /// Answer with a body of this many bytes.
    pub size: Option<usize>,
}

/// `POST /payments` (and `/refunds`, `/pay`): counts the run, answers 201 with a
/// `payment_id` new for every run, a `Location`, an `ETag`, a `Set-Cookie` and a header
/// that is not allow-listed. Query parameters make it slow, fail or answer big.
pub async fn pay(
    State(shop): State<Arc<Shop>>,
    Query(ask): Query<Ask>,
    key: Option<IdempotencyKey>,
    body: axum::body::Bytes,
) -> Response {
    shop.started.fetch_add(1, Ordering::SeqCst);
    shop.started_note.notify_waiters();
    let ms = ask
        .sleep_ms
        .unwrap_or(0)
        .max(shop.sleep_ms.load(Ordering::SeqCst));
    if ms > 0 {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    let run = shop.runs.fetch_add(1, Ordering::SeqCst) + 1;
    let status = StatusCode::from_u16(ask.status.unwrap_or(201)).unwrap();
    let body = match ask.size {
        Some(n) => "x".repeat(n),
        None => serde_json::json!({
            "payment_id": format!("pay_{run}"),
            "key": key.map(IdempotencyKey::into_string),
            "request": String::from_utf8_lossy(&body),
        })
        .to_string(),
    };
    let mut h = HeaderMap::new();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert(
        header::LOCATION,
        format!("/payments/{run}").parse().unwrap(),
    );
    h.insert(header::ETAG, format!("\"{run}\"").parse().unwrap());
    h.insert(
        header::SET_COOKIE,
        HeaderValue::from_static("session=secret"),
    );
    h.insert("x-run", run.into());
    (status, h, body).into_response()
}

/// `GET /stats`: how many handlers started and completed in this process.
async fn stats(State(shop): State<Arc<Shop>>) -> axum::Json<serde_json::Value> {
    axum::Json(serde_json::json!({
        "started": shop.started.load(Ordering::SeqCst),
        "runs": shop.runs.load(Ordering::SeqCst),
    }))
}

/// The test app behind `layer`.
pub fn app(layer: IdempotencyLayer) -> (Router, Arc<Shop>) {
    let shop = Arc::new(Shop::default());
    let router = Router::new()
        .route("/payments", post(pay).get(|| async { "listing" }))
        .route("/refunds", post(pay))
        .route("/token", layer.token_route())
        .route("/stats", get(stats))
        .with_state(shop.clone())
        .layer(layer);
    (router, shop)
}

/// Serves `router` on a fresh loopback port; returns its base URL.
pub async fn serve(router: Router) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    format!("http://{addr}")
}

/// The layer on `backend` served with the test app.
pub async fn shop(layer: IdempotencyLayer) -> (String, Arc<Shop>) {
    let (router, shop) = app(layer);
    (serve(router).await, shop)
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(200)
        .build()
        .unwrap()
}

/// A response read whole.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: String,
}

impl Answer {
    pub async fn of(res: reqwest::Response) -> Answer {
        Answer {
            status: res.status().as_u16(),
            headers: res.headers().clone(),
            body: res.text().await.unwrap(),
        }
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }

    pub fn replayed(&self) -> bool {
        self.header("idempotent-replayed") == Some("true")
    }

    /// Asserts an RFC 9457 problem with `status` and `code`.
    pub fn assert_problem(&self, status: u16, code: &str) {
        assert_eq!(self.status, status, "{self:?}");
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json")
        );
        let p = self.json();
        assert_eq!(p["status"], status);
        assert_eq!(p["code"], code, "{p}");
        assert!(p["title"].is_string() && p["detail"].is_string(), "{p}");
    }
}

/// `POST {base}{path}` with `key` (raw header value) and `body`.
pub async fn post_key(
    c: &reqwest::Client,
    base: &str,
    path: &str,
    key: &str,
    body: &str,
) -> Answer {
    let res = c
        .post(format!("{base}{path}"))
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .unwrap();
    Answer::of(res).await
}

/// A TCP proxy in front of a store, which a test can cut (close every connection and
/// refuse new ones) or freeze (keep connections open, forward nothing).
pub struct Proxy {
    pub addr: SocketAddr,
    cut: Arc<AtomicBool>,
    frozen: Arc<AtomicBool>,
    cut_now: Arc<Notify>,
}

impl Proxy {
    pub async fn start(target: &'static str) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let cut = Arc::new(AtomicBool::new(false));
        let frozen = Arc::new(AtomicBool::new(false));
        let cut_now = Arc::new(Notify::new());
        let (c, f, n) = (cut.clone(), frozen.clone(), cut_now.clone());
        tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                if c.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                let Ok(server) = TcpStream::connect(target).await else {
                    continue;
                };
                let (f, n) = (f.clone(), n.clone());
                tokio::spawn(async move {
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    tokio::select! {
                        _ = pump(cr, sw, f.clone()) => {}
                        _ = pump(sr, cw, f) => {}
                        _ = n.notified() => {}
                    }
                });
            }
        });
        Proxy {
            addr,
            cut,
            frozen,
            cut_now,
        }
    }

    /// Closes every connection and refuses new ones: the store is down.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        self.cut_now.notify_waiters();
    }

    /// Forwards nothing more: the store hangs.
    pub fn freeze(&self) {
        self.frozen.store(true, Ordering::SeqCst);
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    frozen: Arc<AtomicBool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        while frozen.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// Instantiates each named `async fn(Backend)` as a test on every store.
#[macro_export]
macro_rules! on_every_store {
    ($($name:ident),* $(,)?) => {
        mod memory {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
               async fn $name() { super::$name($crate::support::Backend::Memory).await } )*
        }
        mod redis {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
               async fn $name() { super::$name($crate::support::Backend::Redis).await } )*
        }
        mod postgres {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
               async fn $name() { super::$name($crate::support::Backend::Postgres).await } )*
        }
    };
}

/// Unused by some test binaries.
pub fn get_route() -> axum::routing::MethodRouter {
    get(|| async { "ok" })
}

/// Sends `head` (with every `{a}` replaced by `a`) on a raw connection to `base`, and
/// returns all the server wrote back.
pub async fn raw_request(base: &str, head: &str, a: &str) -> String {
    let addr = base.trim_start_matches("http://");
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(head.replace("{a}", a).as_bytes())
        .await
        .unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}
