//! The `idem` binary against records a service wrote, on Redis, PostgreSQL and SQLite:
//! inspect (text and `--json`), forget (with and without `--yes`), stats, tokens, and
//! the exit codes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use idem_runtime::codec::NoReplay;
use idem_runtime::store::{ClaimKind, ClaimOutcome, ClaimRequest, Owner, Recover};
use idem_runtime::{Error, Idem, Options};
use serde_json::Value;

static CHARGE: Options = Options::dedup("app::charge");
static TOKEN: Options = Options::token("app::redeem");

/// A namespace no other test, process or earlier run uses: an owner id's high half is
/// random per process and its low half unique within it.
fn unique(name: &str) -> String {
    format!("{name}-{:032x}", Owner::next().0)
}

/// Runs `idem ARGS` with stdin closed (not a terminal).
fn idem(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run the idem binary")
}

fn code(out: &Output) -> i32 {
    out.status.code().expect("exit code")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn json(out: &Output) -> Value {
    serde_json::from_str(stdout(out).trim()).unwrap_or_else(|e| {
        panic!(
            "not one JSON object ({e}): {}\nstderr: {}",
            stdout(out),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// The whole operator story on one store.
async fn operate(url: &str) {
    let ns = unique("cli");
    let store = idem_runtime::store::connect(url)
        .await
        .unwrap_or_else(|e| panic!("cannot reach {url}: {e}"));
    let service = Idem::builder()
        .shared_store(store.clone())
        .namespace(ns.clone())
        .build();

    // A completed record, and one stuck in progress (its holder "hung").
    let cents: u64 = service
        .dedup(&CHARGE, "charge:42", async { Ok::<_, Error>(100) })
        .await
        .unwrap();
    assert_eq!(cents, 100);
    let stuck = service.record_key(&CHARGE, "charge:7");
    // A lease far longer than the test, so that only `forget` can free the key even if
    // the machine stalls for a while (the whole VM paused, the store's clock stepped).
    let holder = ClaimRequest::new(ClaimKind::Dedup, Owner::next(), Duration::from_secs(3600));
    assert!(matches!(
        store.claim(&stuck, &holder).await.unwrap(),
        ClaimOutcome::Claimed { .. }
    ));

    // Inspect, with --function pasted from a log line (namespace and digest included).
    let done = service.record_key(&CHARGE, "charge:42");
    let pasted = done.to_string();
    let out = idem(&[
        "inspect",
        "--store",
        url,
        "--function",
        &pasted,
        "--key",
        "charge:42",
        "--json",
    ]);
    assert_eq!(code(&out), 0, "{out:?}");
    let v = json(&out);
    assert_eq!(v["state"], "completed");
    assert_eq!(v["namespace"], ns.as_str());
    assert_eq!(v["function"], "app::charge");
    assert_eq!(v["digest"], done.digest_hex().as_str());
    assert!(v["value_bytes"].as_u64().unwrap() > 0, "{v}");
    assert!(v["ttl_left_ms"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(v["owner"], Value::Null);

    // The stuck one, as text: who holds it and for how long.
    let out = idem(&[
        "inspect",
        "--store",
        url,
        "--namespace",
        &ns,
        "--function",
        "app::charge",
        "--key",
        "charge:7",
    ]);
    assert_eq!(code(&out), 0, "{out:?}");
    let text = stdout(&out);
    assert!(text.contains("in_progress"), "{text}");
    assert!(text.contains(&format!("{:032x}", holder.owner.0)), "{text}");
    assert!(text.contains("lease left"), "{text}");

    // No record: exit 1, and the JSON still says so.
    let out = idem(&[
        "inspect",
        "--store",
        url,
        "--namespace",
        &ns,
        "--function",
        "app::charge",
        "--key",
        "charge:nope",
        "--json",
    ]);
    assert_eq!(code(&out), 1, "{out:?}");
    assert_eq!(json(&out)["state"], "absent");

    // A key that does not match the pasted digest is a usage error, not "no record".
    let out = idem(&[
        "inspect",
        "--store",
        url,
        "--function",
        &pasted,
        "--key",
        "charge:43",
    ]);
    assert_eq!(code(&out), 2, "{out:?}");

    // Stats: this namespace's records by function and state.
    let out = idem(&["stats", "--store", url, "--namespace", &ns, "--json"]);
    assert_eq!(code(&out), 0, "{out:?}");
    let v = json(&out);
    let mut rows: Vec<(String, String, u64)> = v["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            assert_eq!(r["namespace"], ns.as_str());
            (
                r["function"].as_str().unwrap().to_owned(),
                r["state"].as_str().unwrap().to_owned(),
                r["count"].as_u64().unwrap(),
            )
        })
        .collect();
    rows.sort();
    assert_eq!(
        rows,
        vec![
            ("app::charge".into(), "completed".into(), 1),
            ("app::charge".into(), "in_progress".into(), 1),
        ]
    );
    assert_eq!(v["total"], 2);
    let out = idem(&["stats", "--store", url, "--namespace", &ns]);
    assert_eq!(code(&out), 0, "{out:?}");
    assert!(stdout(&out).contains("app::charge"), "{}", stdout(&out));

    // Forget asks for --yes when stdin is not a terminal, and then changes nothing.
    let forget = [
        "forget",
        "--store",
        url,
        "--namespace",
        &ns,
        "--function",
        "app::charge",
        "--key",
        "charge:7",
    ];
    let out = idem(&forget);
    assert_eq!(code(&out), 4, "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--yes"));
    assert!(store.inspect(&stuck).await.unwrap().is_some());

    let mut confirmed = forget.to_vec();
    confirmed.extend(["--yes", "--json"]);
    let out = idem(&confirmed);
    assert_eq!(code(&out), 0, "{out:?}");
    assert_eq!(json(&out)["forgotten"], true);
    assert!(store.inspect(&stuck).await.unwrap().is_none());
    // The next call runs; the hung holder's late completion is refused.
    let ran: u64 = service
        .dedup(&CHARGE, "charge:7", async { Ok::<_, Error>(7) })
        .await
        .unwrap();
    assert_eq!(ran, 7);
    assert!(
        !store
            .complete(
                &stuck,
                holder.owner,
                bytes::Bytes::from_static(b"late"),
                Duration::from_secs(60)
            )
            .await
            .unwrap()
    );
    let out = idem(&confirmed);
    assert_eq!(code(&out), 0, "{out:?}");
    let out = idem(&confirmed);
    assert_eq!(code(&out), 1, "nothing left to forget: {out:?}");

    // A token for support staff, valid in the service's namespace.
    let out = idem(&[
        "tokens",
        "issue",
        "--store",
        url,
        "--namespace",
        &ns,
        "--ttl",
        "30s",
        "--json",
    ]);
    assert_eq!(code(&out), 0, "{out:?}");
    let token = json(&out)["token"].as_str().unwrap().to_owned();
    assert_eq!(token.len(), 32);
    let out = idem(&[
        "inspect",
        "--store",
        url,
        "--namespace",
        &ns,
        "--function",
        "token",
        "--key",
        &token,
        "--json",
    ]);
    assert_eq!(code(&out), 0, "{out:?}");
    assert_eq!(json(&out)["state"], "issued");
    service
        .consume_token::<NoReplay, (), Error, _>(&TOKEN, &token, async { Ok(()) })
        .await
        .expect("the issued token is consumed once");
    let out = idem(&["tokens", "issue", "--store", url, "--ttl", "soon"]);
    assert_eq!(code(&out), 2, "{out:?}");
    recoverable(url, &service, &store).await;
}

/// A call marked `recover` whose caller went away: listed by `idem recoverable` and shown
/// by `idem inspect`, then parked with why. A store without a recovery index says so.
async fn recoverable(url: &str, service: &Idem, store: &std::sync::Arc<dyn idem_runtime::Store>) {
    let ns = service.namespace();
    let Some(recovery) = store.recovery() else {
        let out = idem(&["recoverable", "--store", url, "--namespace", ns]);
        assert_eq!(code(&out), 2, "{out:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("no recovery index"),
            "{out:?}"
        );
        return;
    };
    let key = service.record_key(&CHARGE, "charge:9");
    let args = bytes::Bytes::from_static(&[0x91, 0x09]);
    let req = ClaimRequest::new(ClaimKind::Dedup, Owner::next(), Duration::from_secs(60))
        .with_recover(Some(Recover::new(args, Duration::from_secs(600))));
    store.claim(&key, &req).await.unwrap();
    assert!(recovery.abandon(&key, req.owner).await.unwrap());
    let out = idem(&["recoverable", "--store", url, "--namespace", ns, "--json"]);
    assert_eq!(code(&out), 0, "{out:?}");
    let v = json(&out);
    assert_eq!(v["total"], 1, "{v}");
    assert_eq!(v["calls"][0]["function"], "app::charge", "{v}");
    assert_eq!(v["calls"][0]["state"], "recoverable", "{v}");
    assert_eq!(v["calls"][0]["digest"], key.digest_hex(), "{v}");
    assert!(recovery.park(&key, "gave up").await.unwrap());
    let pasted = key.to_string();
    let out = idem(&[
        "inspect",
        "--store",
        url,
        "--function",
        &pasted,
        "--key",
        "charge:9",
        "--json",
    ]);
    assert_eq!(code(&out), 0, "{out:?}");
    let v = json(&out);
    assert_eq!(v["recovery"]["state"], "parked", "{v}");
    assert_eq!(v["recovery"]["parked"], "gave up", "{v}");
    let out = idem(&["recoverable", "--store", url, "--namespace", ns]);
    assert_eq!(code(&out), 0, "{out:?}");
    assert!(stdout(&out).contains("parked"), "{}", stdout(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis() {
    operate(
        &std::env::var("IDEM_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into()),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres() {
    operate(
        &std::env::var("IDEM_TEST_PG_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into()),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_sqlite() {
    let path = std::env::temp_dir().join(format!("{}.db", unique("idem-cli")));
    operate(&format!("sqlite://{}?mode=rwc", path.display())).await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}

#[test]
fn usage_errors_and_an_unreachable_store_have_their_exit_codes() {
    let out = idem(&[
        "inspect",
        "--store",
        "memory",
        "--function",
        "app::charge",
        "--key",
        "k",
    ]);
    assert_eq!(code(&out), 2, "no namespace: {out:?}");
    let out = idem(&["frobnicate"]);
    assert_eq!(code(&out), 2, "{out:?}");
    // Nothing listens on port 1: the store error names the cause, exit 3.
    let out = idem(&["stats", "--store", "postgres://postgres@127.0.0.1:1/test"]);
    assert_eq!(code(&out), 3, "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("127.0.0.1:1"), "names the server: {err}");
    assert!(err.contains("refused"), "names the cause: {err}");
}
