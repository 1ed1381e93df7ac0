//! The `http` family: requests/s and p50/p99 through idem-http's `IdempotencyLayer`
//! against the same axum app without it, at 1 and 50 connections, on MemoryStore and
//! (with `--redis`) RedisStore, for a new key and a replay.
//!
//! Both apps are served in this process on loopback ports and driven by one reqwest
//! client with a connection per task, so the client, the servers and the store share the
//! machine alike for every case.
//!
//! On a shared machine the bare app's own rate swings by a third from one second to the
//! next, so one window of each case says little. The cases run in `ROUNDS` rounds of
//! one window each, in an order that rotates from round to round (so no case always
//! follows another). A ratio is the median over rounds of that round's layered rate over
//! its bare rate: the two windows of a round are seconds apart and see the same machine.
//! The table keeps each case's median window.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use idem_http::IdempotencyLayer;
use idem_runtime::{Idem, MemoryStore, RedisStore};

use crate::args::Args;
use crate::load::{self, Outcome};
use crate::report::{Report, Summary};

/// The connection counts measured.
const CONNECTIONS: [usize; 2] = [1, 50];

/// Rounds of the three cases per connection count.
const ROUNDS: usize = 9;

/// How many rounds a run makes: [`ROUNDS`], or one with `--quick`.
pub(crate) fn rounds(args: &Args) -> usize {
    if args.quick { 1 } else { ROUNDS }
}

const BODY: &str = r#"{"order":42,"cents":1999}"#;

#[derive(serde::Deserialize)]
struct Pay {
    order: u64,
    cents: u64,
}

/// The handler both apps run: parse the payment, answer 201 with a new id.
async fn pay(Json(p): Json<Pay>) -> (StatusCode, Json<serde_json::Value>) {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    let body = serde_json::json!({
        "payment_id": format!("pay_{id}"),
        "order": p.order,
        "cents": p.cents,
        "status": "paid",
    });
    (StatusCode::CREATED, Json(body))
}

async fn serve(router: Router) -> Result<String, std::io::Error> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    Ok(format!("http://{addr}/payments"))
}

#[derive(Clone, Copy)]
enum Case {
    Bare,
    NewKey,
    Replay,
}

impl Case {
    fn name(self) -> &'static str {
        match self {
            Case::Bare => "bare axum app",
            Case::NewKey => "layer, new key",
            Case::Replay => "layer, replay",
        }
    }
}

/// Runs the family.
pub(crate) async fn run(args: &Args, report: &mut Report) {
    let ns = format!("bench-http-{}", load::run_tag());
    let mut stores = vec![(
        "memory",
        Idem::builder()
            .store(MemoryStore::new())
            .namespace(ns.clone())
            .build(),
    )];
    if let Some(url) = &args.redis {
        match RedisStore::connect(url) {
            Ok(store) => stores.push(("redis", Idem::builder().store(store).namespace(ns).build())),
            Err(e) => report.note(format!("http/redis skipped: {e}")),
        }
    }
    let bare = match serve(Router::new().route("/payments", post(pay))).await {
        Ok(url) => url,
        Err(e) => return report.note(format!("http skipped: cannot listen: {e}")),
    };
    for (store, idem) in stores {
        let router = Router::new()
            .route("/payments", post(pay))
            .layer(IdempotencyLayer::new(idem));
        let layered = match serve(router).await {
            Ok(url) => url,
            Err(e) => return report.note(format!("http skipped: cannot listen: {e}")),
        };
        for conns in CONNECTIONS {
            measure(args, report, store, conns, &bare, &layered).await;
        }
    }
}

async fn measure(
    args: &Args,
    report: &mut Report,
    store: &'static str,
    conns: usize,
    bare: &str,
    layered: &str,
) {
    let client = match reqwest::Client::builder()
        .pool_max_idle_per_host(conns)
        .build()
    {
        Ok(c) => c,
        Err(e) => return report.note(format!("http skipped: client: {e}")),
    };
    let cases = [Case::Bare, Case::NewKey, Case::Replay];
    let mut runs: Vec<Vec<Outcome>> = vec![Vec::new(); cases.len()];
    let tag = load::run_tag();
    for round in 0..rounds(args) {
        for turn in 0..cases.len() {
            let i = (round + turn) % cases.len();
            let case = cases[i];
            let url: Arc<str> = Arc::from(match case {
                Case::Bare => bare,
                _ => layered,
            });
            let client = client.clone();
            let op = move |ctx: load::Ctx| {
                let (client, url) = (client.clone(), url.clone());
                // Every request carries a key, so the bare app reads the same bytes.
                let key = match case {
                    Case::NewKey | Case::Bare => format!("\"new-{tag}-{}\"", ctx.id),
                    // One key per connection, stored by its first (warm-up) request.
                    Case::Replay => format!("\"replay-{tag}-{store}-{conns}-{}\"", ctx.task),
                };
                async move {
                    let res = client
                        .post(&*url)
                        .header("idempotency-key", key)
                        .header("content-type", "application/json")
                        .body(BODY)
                        .send()
                        .await
                        .map_err(|e| e.to_string())?;
                    let status = res.status();
                    let replayed = res.headers().contains_key("idempotent-replayed");
                    let body = res.bytes().await.map_err(|e| e.to_string())?;
                    match (case, status.as_u16(), replayed) {
                        (Case::Bare | Case::NewKey, 201, false) | (Case::Replay, 201, _) => Ok(()),
                        _ => Err(format!(
                            "{}: {status} {}",
                            case.name(),
                            String::from_utf8_lossy(&body)
                        )),
                    }
                }
            };
            runs[i].push(load::run(args.plan(conns), op).await);
        }
    }
    // Per round, layered over bare, before the windows are sorted for the table.
    let paired = |i: usize| -> Vec<f64> {
        runs[i]
            .iter()
            .zip(&runs[0])
            .map(|(layered, bare)| layered.ops_per_sec() / bare.ops_per_sec())
            .collect()
    };
    let (new_ratios, replay_ratios) = (paired(1), paired(2));
    let group = format!("http {store} {conns} conn");
    let mut sums: Vec<Summary> = Vec::new();
    for (case, mut outs) in cases.into_iter().zip(runs) {
        outs.sort_by(|a, b| a.ops_per_sec().total_cmp(&b.ops_per_sec()));
        let errors: u64 = outs.iter().map(|o| o.errors).sum();
        let first_error = outs.iter().find_map(|o| o.first_error.clone());
        let mut median = outs.swap_remove(outs.len() / 2);
        median.errors = errors;
        median.first_error = first_error;
        sums.push(report.add(&group, case.name(), median));
    }
    let what = "requests/s through the layer / the bare axum app's, median over rounds";
    report.ratio_of(
        format!("http-{store}-new-{conns}"),
        new_ratios,
        &sums[1],
        &sums[0],
        what,
    );
    report.ratio_of(
        format!("http-{store}-replay-{conns}"),
        replay_ratios,
        &sums[2],
        &sums[0],
        what,
    );
}
