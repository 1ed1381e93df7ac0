//! The `shop_api` example as its users drive it: a real server process, a real HTTP
//! client, the routes docs/http.md's curl session uses, the ledger counted from outside,
//! and the Prometheus scrape on `GET /metrics`.

#![allow(clippy::unwrap_used)]

use std::process::Stdio;
use std::time::Duration;

use idem_runtime::store::sql::sqlx;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const PG: &str = "postgres://postgres@127.0.0.1:5432/test";

/// A `shop_api` server on a free loopback port, killed on drop.
struct Server {
    child: Child,
    base: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

async fn serve(extra: &[&str]) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_shop_api"))
        .args(["--listen", "127.0.0.1:0"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start shop_api");
    let stdout = child.stdout.take().expect("piped stdout");
    let mut lines = BufReader::new(stdout).lines();
    let first = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let line = lines.next_line().await.expect("read stdout");
            match line {
                Some(l) if l.contains("listening on") => return l,
                Some(_) => continue,
                None => panic!("shop_api exited before listening"),
            }
        }
    })
    .await
    .expect("shop_api says where it listens");
    let base = first
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no address in {first:?}"))
        .to_string();
    Server { child, base }
}

fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{prefix}-{}-{nanos}", std::process::id())
}

#[tokio::test]
async fn payments_run_once_per_key_and_metrics_count_them() {
    let ns = unique("shop-api-test");
    let server = serve(&["--ledger", PG, "--namespace", &ns]).await;
    let client = reqwest::Client::new();
    let key = unique("order-7");
    let pay = |key: String, body: &'static str| {
        client
            .post(format!("{}/payments", server.base))
            .header("Idempotency-Key", key)
            .header("Content-Type", "application/json")
            .body(body)
            .send()
    };

    let first = pay(format!("\"{key}\""), r#"{"order": 7, "cents": 1999}"#)
        .await
        .unwrap();
    assert_eq!(first.status(), 201);
    assert!(first.headers().get("idempotent-replayed").is_none());
    let first_body: serde_json::Value = first.json().await.unwrap();
    assert!(first_body["payment_id"].is_string() || first_body["payment_id"].is_number());

    // The same key, sent bare this time: a retry, answered from the record.
    let retry = pay(key.clone(), r#"{"order": 7, "cents": 1999}"#)
        .await
        .unwrap();
    assert_eq!(retry.status(), 201);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    let retry_body: serde_json::Value = retry.json().await.unwrap();
    assert_eq!(retry_body, first_body);

    // The same key with another amount, and no key at all.
    let other = pay(key.clone(), r#"{"order": 7, "cents": 5}"#)
        .await
        .unwrap();
    assert_eq!(other.status(), 422);
    assert_eq!(other.headers()["content-type"], "application/problem+json");
    let keyless = client
        .post(format!("{}/payments", server.base))
        .header("Content-Type", "application/json")
        .body(r#"{"order": 8, "cents": 1}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(keyless.status(), 400);

    // Token mode: a token pays once, its second use replays.
    let token: serde_json::Value = client
        .get(format!("{}/token", server.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let token = token["token"].as_str().expect("a token").to_string();
    let by_token = || {
        client
            .post(format!("{}/pay", server.base))
            .header("Idempotency-Key", token.clone())
            .header("Content-Type", "application/json")
            .body(r#"{"order": 9, "cents": 500}"#)
            .send()
    };
    assert_eq!(by_token().await.unwrap().status(), 201);
    let again = by_token().await.unwrap();
    assert_eq!(again.headers()["idempotent-replayed"], "true");

    // One handler run for the key, counted outside idem.
    let pool = sqlx::PgPool::connect(PG).await.unwrap();
    let runs: i64 =
        sqlx::query_scalar("SELECT count(*) FROM shop_payments WHERE idempotency_key LIKE $1")
            .bind(format!("%{key}%"))
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(runs, 1);

    // The scrape names the calls by outcome.
    let scrape = client
        .get(format!("{}/metrics", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(scrape.status(), 200);
    assert!(
        scrape.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain")
    );
    let text = scrape.text().await.unwrap();
    let calls = |outcome: &str| -> f64 {
        text.lines()
            .filter(|l| {
                l.starts_with("idem_calls_total{") && l.contains(&format!("outcome=\"{outcome}\""))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    assert!(calls("ran") >= 2.0, "{text}");
    assert!(calls("replayed") >= 2.0, "{text}");
    assert!(calls("mismatch") >= 1.0, "{text}");
    assert!(text.contains("# TYPE idem_calls_total counter"), "{text}");
    // The layer's own counter: two handler runs (key and token), two replays, the 422
    // and the 400 for the missing key.
    let requests = |outcome: &str| -> f64 {
        text.lines()
            .filter(|l| {
                l.starts_with("idem_http_requests_total{")
                    && l.contains(&format!("outcome=\"{outcome}\""))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    assert_eq!(requests("ran"), 2.0, "{text}");
    assert_eq!(requests("replayed"), 2.0, "{text}");
    assert_eq!(requests("idempotency-key-reused"), 1.0, "{text}");
    assert_eq!(requests("idempotency-key-missing"), 1.0, "{text}");
    assert!(
        text.contains("# TYPE idem_http_requests_total counter"),
        "{text}"
    );

    assert_eq!(
        client
            .get(format!("{}/healthz", server.base))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
}

/// Issue 20's leak, against the example: two accounts, one key, one body. Each gets a
/// payment of its own, never the other's.
#[tokio::test]
async fn two_accounts_with_one_key_never_see_each_other() {
    let server = serve(&["--namespace", &unique("shop-api-scope")]).await;
    let client = reqwest::Client::new();
    let pay = |token: &'static str| {
        client
            .post(format!("{}/payments", server.base))
            .header("Idempotency-Key", "leak-1")
            .header("Authorization", format!("Bearer {token}"))
            .header("Content-Type", "application/json")
            .body(r#"{"order": 1, "cents": 100}"#)
            .send()
    };
    let alice = pay("alice-token").await.unwrap();
    assert_eq!(alice.status(), 201);
    let alice: serde_json::Value = alice.json().await.unwrap();
    let mallory = pay("mallory-token").await.unwrap();
    assert_eq!(mallory.status(), 201);
    assert!(mallory.headers().get("idempotent-replayed").is_none());
    let mallory: serde_json::Value = mallory.json().await.unwrap();
    assert_ne!(alice["payment_id"], mallory["payment_id"]);
    let again = pay("alice-token").await.unwrap();
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    let again: serde_json::Value = again.json().await.unwrap();
    assert_eq!(again, alice);
}

/// Issue 21 HTTP 3 and 4, against the example: an unknown path is 404, a token sent to
/// a path that does not consume tokens survives, and tokens live 30 s.
#[tokio::test]
async fn unknown_paths_are_404_and_leave_tokens_alone() {
    let server = serve(&["--namespace", &unique("shop-api-paths")]).await;
    let client = reqwest::Client::new();
    let post = |path: &str, key: Option<&str>| {
        let mut r = client
            .post(format!("{}{path}", server.base))
            .header("Content-Type", "application/json")
            .body(r#"{"order": 4, "cents": 400}"#);
        if let Some(key) = key {
            r = r.header("Idempotency-Key", key.to_owned());
        }
        r.send()
    };
    assert_eq!(post("/nope", None).await.unwrap().status(), 404);
    let issued: serde_json::Value = client
        .get(format!("{}/token", server.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(issued["expires_in"], 30);
    let token = issued["token"].as_str().expect("a token").to_string();
    assert_eq!(post("/nope", Some(&token)).await.unwrap().status(), 404);
    assert_eq!(post("/token", Some(&token)).await.unwrap().status(), 405);
    assert_eq!(
        post("/payments/x", Some(&token)).await.unwrap().status(),
        404
    );
    let paid = post("/pay", Some(&token)).await.unwrap();
    assert_eq!(paid.status(), 201);
    assert!(
        paid.headers().get("idempotent-replayed").is_none(),
        "the token was still unused"
    );
}

/// `v1,<base64 HMAC-SHA256 of "{id}.{ts}.{body}">` under a `whsec_` secret, as
/// Standard Webhooks senders sign.
fn sign(secret: &str, id: &str, ts: u64, body: &str) -> String {
    use base64::Engine;
    use base64::engine::general_purpose::STANDARD;
    use hmac::{KeyInit, Mac};
    let key = STANDARD
        .decode(secret.strip_prefix("whsec_").expect("whsec_ prefix"))
        .expect("base64 secret");
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&key).expect("any key length");
    mac.update(format!("{id}.{ts}.{body}").as_bytes());
    format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
}

#[tokio::test]
async fn webhook_redeliveries_run_once_and_forgeries_are_401() {
    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let ns = unique("shop-api-hooks");
    let server = serve(&[
        "--ledger",
        PG,
        "--namespace",
        &ns,
        "--webhook-secret",
        SECRET,
    ])
    .await;
    let client = reqwest::Client::new();
    let event = unique("evt");
    let body = r#"{"type":"payment.succeeded","order":7}"#;
    let ts = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let deliver = |secret: &'static str| {
        client
            .post(format!("{}/webhooks/payments", server.base))
            .header("webhook-id", &event)
            .header("webhook-timestamp", ts.to_string())
            .header("webhook-signature", sign(secret, &event, ts, body))
            .header("content-type", "application/json")
            .body(body)
            .send()
    };

    // A forgery first: 401, and it does not claim the event.
    let forged = deliver("whsec_c2VjcmV0LW9mLXNvbWVvbmUtZWxzZQ==")
        .await
        .unwrap();
    assert_eq!(forged.status(), 401);

    // Five deliveries at once, as a sender retrying a slow endpoint: one run, all 200.
    let answers = futures_util::future::join_all((0..5).map(|_| deliver(SECRET))).await;
    let mut bodies = Vec::new();
    for a in answers {
        let a = a.unwrap();
        assert_eq!(a.status(), 200);
        bodies.push(a.text().await.unwrap());
    }
    assert!(bodies.iter().all(|b| *b == bodies[0]), "{bodies:?}");

    let pool = sqlx::PgPool::connect(PG).await.unwrap();
    let (rows,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM shop_webhook_events WHERE event_id = $1")
            .bind(&event)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(rows, 1, "the handler ran once for the event");
}

/// A ledger of the test's own: a schema that `shop_api` creates its tables in (through
/// the connection's `search_path`), so the test can lock them without blocking others.
async fn own_ledger(pool: &sqlx::PgPool, name: &str) -> (String, String) {
    let schema = unique(name).replace('-', "_");
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
        .execute(pool)
        .await
        .unwrap();
    let url = format!("{PG}?options=-c%20search_path%3D{schema}");
    (schema, url)
}

async fn rows(pool: &sqlx::PgPool, table: &str, column: &str, value: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {table} WHERE {column} = $1"
    )))
    .bind(value)
    .fetch_one(pool)
    .await
    .unwrap()
}

fn payment(
    client: &reqwest::Client,
    base: &str,
    key: &str,
    auth: Option<&str>,
) -> reqwest::RequestBuilder {
    let mut r = client
        .post(format!("{base}/payments"))
        .header("Idempotency-Key", key)
        .header("Content-Type", "application/json")
        .body(r#"{"order": 32, "cents": 3200}"#);
    if let Some(auth) = auth {
        r = r.header("Authorization", auth);
    }
    r
}

/// Issue 32: two users who pick one key, whatever case their scheme is written in, get
/// two payments; credentials `shop_api` does not know are 401 and leave the key free.
#[tokio::test]
async fn users_are_told_apart_and_unknown_credentials_are_401() {
    let pool = sqlx::PgPool::connect(PG).await.unwrap();
    let (schema, ledger) = own_ledger(&pool, "shop-users").await;
    let server = serve(&[
        "--store",
        "redis://127.0.0.1:6379",
        "--ledger",
        &ledger,
        "--namespace",
        &unique("shop-api-users"),
    ])
    .await;
    let client = reqwest::Client::new();
    let key = unique("shared-key");
    let alice = payment(&client, &server.base, &key, Some("bearer alice.s1"))
        .send()
        .await
        .unwrap();
    let bob = payment(&client, &server.base, &key, Some("BEARER bob.s1"))
        .send()
        .await
        .unwrap();
    assert_eq!((alice.status().as_u16(), bob.status().as_u16()), (201, 201));
    assert!(bob.headers().get("idempotent-replayed").is_none());
    let alice: serde_json::Value = alice.json().await.unwrap();
    let bob: serde_json::Value = bob.json().await.unwrap();
    assert_ne!(
        alice["payment_id"], bob["payment_id"],
        "bob got alice's payment"
    );
    let table = format!("{schema}.shop_payments");
    assert_eq!(rows(&pool, &table, "idempotency_key", &key).await, 2);

    let free = unique("free-key");
    for auth in ["Basic YWxpY2U6cHc=", "Bearer ", "Token alice", "bearer"] {
        let refused = payment(&client, &server.base, &free, Some(auth))
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status(), 401, "{auth:?}");
    }
    let anon = payment(&client, &server.base, &free, None)
        .send()
        .await
        .unwrap();
    assert_eq!(anon.status(), 201, "the key stayed free");
    assert!(anon.headers().get("idempotent-replayed").is_none());
    assert_eq!(rows(&pool, &table, "idempotency_key", &free).await, 1);
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
        .execute(&pool)
        .await
        .unwrap();
}

/// Issue 32: the ledger is locked, so carol's payment hangs; her client times out,
/// refreshes its session and retries under the same key. The retry is the same user:
/// 409 while the first run is blocked (a long while after its client left), then the
/// first run's payment. One row.
#[tokio::test]
async fn a_refreshed_session_after_a_timeout_pays_once() {
    let pool = sqlx::PgPool::connect(PG).await.unwrap();
    let (schema, ledger) = own_ledger(&pool, "shop-carol").await;
    let server = serve(&[
        "--store",
        "redis://127.0.0.1:6379",
        "--ledger",
        &ledger,
        "--namespace",
        &unique("shop-api-carol"),
    ])
    .await;
    let client = reqwest::Client::new();
    let key = unique("carol-key");
    // A first payment creates nothing new, but proves the tables exist to be locked.
    let warm = payment(&client, &server.base, &unique("warm"), None)
        .send()
        .await
        .unwrap();
    assert_eq!(warm.status(), 201);
    let table = format!("{schema}.shop_payments");
    let mut lock = pool.begin().await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "LOCK TABLE {table} IN EXCLUSIVE MODE"
    )))
    .execute(&mut *lock)
    .await
    .unwrap();

    let first = payment(&client, &server.base, &key, Some("Bearer carol.session1"))
        .timeout(Duration::from_secs(1))
        .send()
        .await;
    assert!(
        first.as_ref().is_err_and(reqwest::Error::is_timeout),
        "the payment did not block on the locked ledger: {first:?}"
    );
    // Blocked for several leases' worth of heartbeats after its client left.
    for _ in 0..3 {
        let retry = payment(&client, &server.base, &key, Some("Bearer carol.session2"))
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .expect("the retry ran the payment again and blocked: another scope");
        assert_eq!(retry.status(), 409);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    lock.rollback().await.unwrap();

    let mut paid = None;
    for _ in 0..200 {
        let retry = payment(&client, &server.base, &key, Some("bearer carol.session2"))
            .send()
            .await
            .unwrap();
        if retry.status() == 409 {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        assert_eq!(retry.status(), 201);
        assert_eq!(retry.headers()["idempotent-replayed"], "true");
        paid = Some(retry.json::<serde_json::Value>().await.unwrap());
        break;
    }
    assert!(paid.is_some(), "the first run never completed");
    assert_eq!(rows(&pool, &table, "idempotency_key", &key).await, 1);
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
        .execute(&pool)
        .await
        .unwrap();
}

/// Issue 32: an anonymous payment takes an upcoming event's id as its key; the signed
/// delivery of that event still runs once, and its redelivery replays.
#[tokio::test]
async fn a_payment_key_never_takes_a_webhook_id() {
    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let pool = sqlx::PgPool::connect(PG).await.unwrap();
    let server = serve(&[
        "--store",
        "redis://127.0.0.1:6379",
        "--ledger",
        PG,
        "--namespace",
        &unique("shop-api-squat"),
        "--webhook-secret",
        SECRET,
    ])
    .await;
    let client = reqwest::Client::new();
    let event = unique("msg");
    let squat = payment(&client, &server.base, &event, None)
        .send()
        .await
        .unwrap();
    assert_eq!(squat.status(), 201);
    let body = r#"{"type":"payment.succeeded","order":32}"#;
    let ts = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    for attempt in 0..3 {
        let a = client
            .post(format!("{}/webhooks/payments", server.base))
            .header("webhook-id", &event)
            .header("webhook-timestamp", ts.to_string())
            .header("webhook-signature", sign(SECRET, &event, ts, body))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(a.status(), 200, "delivery {attempt}");
        assert_eq!(a.headers().contains_key("idempotent-replayed"), attempt > 0);
    }
    assert_eq!(
        rows(&pool, "shop_webhook_events", "event_id", &event).await,
        1
    );
}

/// A client that sends half a request head and then nothing is disconnected, rather
/// than holding its connection open for as long as it likes.
#[tokio::test]
async fn a_slow_request_head_is_cut_off() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = serve(&["--namespace", &unique("shop-api-slow")]).await;
    let addr = server.base.trim_start_matches("http://");
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    conn.write_all(b"POST /payments HTTP/1.1\r\nHost: shop\r\n")
        .await
        .unwrap();
    let mut rest = Vec::new();
    // Far past the server's 10 s bound: without one, this read never ends.
    let closed = tokio::time::timeout(Duration::from_secs(60), conn.read_to_end(&mut rest)).await;
    assert!(
        closed.is_ok(),
        "the half-sent request still holds its connection"
    );
}
