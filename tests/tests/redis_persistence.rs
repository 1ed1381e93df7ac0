//! What a Redis restart keeps, per persistence setting: the rows of the failure model
//! (docs/failure-model.md) for a server killed with `kill -9` and started again on the
//! same data directory.
//!
//! Each test completes a batch of keys, kills and restarts a private server, and calls
//! the same keys again: a kept record replays (the body does not run), a forgotten one
//! runs the body a second time.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/redis_harness.rs"]
mod harness;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use harness::RedisServer;
use idem_runtime::{Error, Idem, Options, RedisStore};

static PAY: Options = Options::dedup("redis_persistence::pay").wait(Duration::ZERO);

const KEYS: u64 = 200;

/// Body runs per key, counted outside idem.
#[derive(Clone, Default)]
struct Ledger(Arc<Mutex<HashMap<u64, u32>>>);

impl Ledger {
    fn runs(&self, k: u64) -> u32 {
        self.0.lock().unwrap().get(&k).copied().unwrap_or(0)
    }
}

fn idem(server: &RedisServer, ns: &str) -> Idem {
    let store = RedisStore::builder()
        .timeout(Duration::from_secs(2))
        .connect(&server.url())
        .unwrap();
    Idem::builder().store(store).namespace(ns).build()
}

/// Calls keys `range` once each (many at a time); every call must succeed. A store error
/// right after a restart (a connection that died with the old process) is retried. The
/// claim of such a call may still have landed with its answer lost: the runtime then
/// releases it in the background, so until that release lands the retry may find the
/// key in progress, and is retried too. Either way the body did not run.
async fn pay(idem: &Idem, ledger: &Ledger, range: std::ops::Range<u64>) {
    let mut tasks = Vec::new();
    for k in range {
        let (idem, ledger) = (idem.clone(), ledger.clone());
        tasks.push(tokio::spawn(async move {
            // Whether a call of this key failed with a store error (see above).
            let mut uncertain = false;
            for _ in 0..50 {
                let l = ledger.clone();
                let r: Result<u64, Error> = idem
                    .dedup(&PAY, format!("order-{k}"), async move {
                        *l.0.lock().unwrap().entry(k).or_default() += 1;
                        Ok(k * 100)
                    })
                    .await;
                match r {
                    Ok(v) => {
                        assert_eq!(v, k * 100, "key {k} replayed another key's value");
                        return;
                    }
                    Err(Error::Store(_)) => {
                        uncertain = true;
                        tokio::time::sleep(Duration::from_millis(50)).await
                    }
                    Err(Error::InProgress { .. }) if uncertain => {
                        tokio::time::sleep(Duration::from_millis(50)).await
                    }
                    Err(e) => panic!("key {k}: {e}"),
                }
            }
            panic!("key {k}: the store did not come back");
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

/// Runs the batch `0..KEYS`, then `restart`, then the same batch again; returns the keys
/// whose body ran again.
async fn ran_again(
    server: &mut RedisServer,
    ns: &str,
    restart: impl FnOnce(&mut RedisServer),
) -> Vec<u64> {
    let idem = idem(server, ns);
    let ledger = Ledger::default();
    pay(&idem, &ledger, 0..KEYS).await;
    assert!((0..KEYS).all(|k| ledger.runs(k) == 1));
    tokio::task::block_in_place(|| restart(server));
    pay(&idem, &ledger, 0..KEYS).await;
    (0..KEYS).filter(|k| ledger.runs(*k) > 1).collect()
}

/// AOF with `appendfsync always`: every acknowledged completion is on disk before the
/// reply, so a `kill -9` loses none of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn aof_always_keeps_every_completed_record_across_kill_9() {
    let mut server = RedisServer::start_durable();
    let again = ran_again(&mut server, "aof-always", RedisServer::restart).await;
    assert!(again.is_empty(), "ran again after the restart: {again:?}");
}

/// AOF with `appendfsync everysec`: Redis writes the file before it answers and only
/// the fsync is once a second, so a crash of the process alone (not of the machine)
/// loses nothing either.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn aof_everysec_keeps_every_completed_record_across_a_process_crash() {
    let mut server = RedisServer::start_with(
        harness::free_port(false),
        &[
            "--save",
            "",
            "--appendonly",
            "yes",
            "--appendfsync",
            "everysec",
        ],
    );
    let again = ran_again(&mut server, "aof-everysec", |server| {
        written_to_the_aof(server);
        server.restart();
    })
    .await;
    assert!(again.is_empty(), "ran again after the restart: {again:?}");
}

/// Waits (at most 10 s) until Redis has written its AOF buffer to the file. With
/// `everysec`, while an fsync runs longer than usual (a busy disk), Redis holds back the
/// write(2) of the acknowledged commands for up to 2 s (`aof_delayed_fsync` counts it),
/// and a crash then loses them: the failure model says so. This test shows the other
/// half, that what Redis has written survives a crash of the process.
fn written_to_the_aof(server: &RedisServer) {
    for _ in 0..200 {
        let info = server.cli(&["info", "persistence"]);
        if info.lines().any(|l| l.trim() == "aof_buffer_length:0") {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("Redis did not write its AOF buffer within 10 s");
}

/// No persistence (`--save "" --appendonly no`, the setting of the machine's shared
/// server): a restart forgets every record, so every completed key runs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_persistence_forgets_every_record_on_restart() {
    let mut server = RedisServer::start();
    let again = ran_again(&mut server, "none", RedisServer::restart).await;
    assert_eq!(
        again.len() as u64,
        KEYS,
        "kept across a restart without persistence"
    );
}

/// RDB snapshots only: what was completed before the last snapshot is kept, what came
/// after it is forgotten by a `kill -9` and runs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rdb_keeps_records_up_to_the_last_snapshot_only() {
    let mut server = RedisServer::start_with(
        harness::free_port(false),
        // A schedule that never fires during the test: only the explicit SAVE counts.
        &["--save", "3600 1000000", "--appendonly", "no"],
    );
    let idem = idem(&server, "rdb");
    let ledger = Ledger::default();
    pay(&idem, &ledger, 0..KEYS).await;
    assert!(server.cli(&["SAVE"]).contains("OK"));
    pay(&idem, &ledger, KEYS..2 * KEYS).await;
    tokio::task::block_in_place(|| server.restart());
    pay(&idem, &ledger, 0..2 * KEYS).await;
    let before: Vec<u64> = (0..KEYS).filter(|k| ledger.runs(*k) != 1).collect();
    let after: Vec<u64> = (KEYS..2 * KEYS).filter(|k| ledger.runs(*k) != 2).collect();
    assert!(before.is_empty(), "snapshotted keys ran again: {before:?}");
    assert!(
        after.is_empty(),
        "keys after the snapshot were kept: {after:?}"
    );
}
