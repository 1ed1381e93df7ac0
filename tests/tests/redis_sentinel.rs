//! Redis behind Sentinel on private servers (a primary, one replica, three sentinels,
//! quorum 2, down after 1 s): calls through a failover made by `kill -9` of the
//! primary, what `wait_for_replicas` keeps, and what a failover without it loses.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/redis_harness.rs"]
mod harness;
#[path = "support/sentinel_harness.rs"]
mod sentinel;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use idem_runtime::store::redis::NotReplicated;
use idem_runtime::store::{ClaimKind, ClaimOutcome, ClaimRequest, Owner};
use idem_runtime::{Error, Idem, Key, Options, RedisStore, Store};
use sentinel::SentinelSet;

static PAY: Options = Options::dedup("redis_sentinel::pay").wait(Duration::ZERO);

const TIMEOUT: Duration = Duration::from_millis(500);
const FAILOVER: Duration = Duration::from_secs(30);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn key(i: u64) -> Key {
    Key::from_str("sentinel", "pay", &format!("k{i}"))
}

fn claim_req() -> (Owner, ClaimRequest) {
    let owner = Owner::next();
    (
        owner,
        ClaimRequest::new(ClaimKind::Dedup, owner, Duration::from_secs(60)),
    )
}

/// Claims and completes `key(i)` through the store's own primitives; true if the store
/// confirmed both (the completion is then acknowledged).
async fn claim_and_complete(store: &RedisStore, i: u64) -> Result<bool, Error> {
    let (owner, req) = claim_req();
    match store.claim(&key(i), &req).await? {
        ClaimOutcome::Claimed { .. } => {}
        other => panic!("key {i}: fresh key answered {other:?}"),
    }
    store
        .complete(
            &key(i),
            owner,
            Bytes::from(i.to_string()),
            Duration::from_secs(600),
        )
        .await
}

/// Whether `key(i)` is still completed (a claim replays it) on the store's current primary.
async fn still_completed(store: &RedisStore, i: u64) -> bool {
    let (_, req) = claim_req();
    for _ in 0..50 {
        match store.claim(&key(i), &req).await {
            Ok(ClaimOutcome::Completed { value, .. }) => {
                assert_eq!(
                    value,
                    Bytes::from(i.to_string()),
                    "key {i} replayed another value"
                );
                return true;
            }
            Ok(ClaimOutcome::Claimed { .. }) => return false,
            Ok(other) => panic!("key {i}: {other:?}"),
            Err(Error::Store(_)) => tokio::time::sleep(ms(100)).await,
            Err(e) => panic!("key {i}: {e}"),
        }
    }
    panic!("key {i}: the store did not answer after the failover");
}

fn is_not_replicated(e: &Error) -> bool {
    matches!(e, Error::Store(source) if source.downcast_ref::<NotReplicated>().is_some())
}

/// One call: its key, whether its body ran, whether it succeeded, how long it took.
type Call = (u64, bool, bool, Duration);

/// Calls keep going while the primary is killed and a replica promoted: each call that
/// fails gets `Error::Store` (and its body did not run), and calls reach the new primary
/// afterwards through the same store, without rebuilding anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn calls_through_sentinel_reach_the_new_primary_after_a_failover() {
    let mut set = SentinelSet::start();
    let store = RedisStore::builder()
        .timeout(TIMEOUT)
        .connect(&set.url())
        .unwrap();
    let idem = Idem::builder().store(store).namespace("failover").build();
    let stop = Arc::new(AtomicBool::new(false));
    let next = Arc::new(AtomicU64::new(0));
    let calls: Arc<Mutex<Vec<Call>>> = Arc::default();
    let mut workers = Vec::new();
    for _ in 0..8 {
        let (idem, stop, next, calls) = (idem.clone(), stop.clone(), next.clone(), calls.clone());
        workers.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let k = next.fetch_add(1, Ordering::SeqCst);
                let ran = Arc::new(AtomicBool::new(false));
                let r = ran.clone();
                let t = Instant::now();
                let out: Result<u64, Error> = idem
                    .dedup(&PAY, format!("k{k}"), async move {
                        r.store(true, Ordering::SeqCst);
                        Ok(k)
                    })
                    .await;
                let took = t.elapsed();
                let ok = match out {
                    Ok(v) => {
                        assert_eq!(v, k);
                        true
                    }
                    Err(Error::Store(_)) => false,
                    Err(e) => panic!("key {k}: not a store error: {e}"),
                };
                calls
                    .lock()
                    .unwrap()
                    .push((k, ran.load(Ordering::SeqCst), ok, took));
                if !ok {
                    tokio::time::sleep(ms(20)).await;
                }
            }
        }));
    }
    tokio::time::sleep(ms(500)).await;
    let killed_at = Instant::now();
    let old = tokio::task::block_in_place(|| set.kill_primary());
    tokio::task::block_in_place(|| set.wait_failover(old, FAILOVER));
    let promoted = killed_at.elapsed();
    let before = calls.lock().unwrap().len();
    tokio::time::sleep(ms(1500)).await;
    stop.store(true, Ordering::SeqCst);
    for w in workers {
        w.await.unwrap();
    }
    let calls = calls.lock().unwrap();
    let failed: Vec<_> = calls.iter().filter(|c| !c.2).collect();
    for (k, ran, _, _) in &failed {
        assert!(
            !ran,
            "key {k}: the body ran but the call failed with a store error"
        );
    }
    let after_ok = calls[before..].iter().filter(|c| c.2).count();
    assert!(after_ok > 0, "no call succeeded after the failover");
    let slowest = failed.iter().map(|c| c.3).max().unwrap_or_default();
    println!(
        "failover: promoted after {promoted:?}; {} calls, {} failed with Error::Store \
         (slowest failure {slowest:?}, store timeout {TIMEOUT:?}), {after_ok} succeeded after it",
        calls.len(),
        failed.len()
    );
}

/// With `wait_for_replicas(1, …)` every completion the store confirmed is on the replica
/// before the call returns, so none is lost when the primary is killed: each replays
/// after the failover. While the new primary has no replica, writes fail with
/// `NotReplicated` instead of succeeding silently; once the old primary is back as a
/// replica they succeed again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_wait_for_replicas_no_confirmed_completion_is_lost_in_a_failover() {
    let mut set = SentinelSet::start();
    let store = RedisStore::builder()
        .timeout(TIMEOUT)
        .wait_for_replicas(1, ms(1000))
        .connect(&set.url())
        .unwrap();
    let confirmed: Arc<Mutex<HashSet<u64>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let next = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    for _ in 0..8 {
        let (store, confirmed, stop, next) =
            (store.clone(), confirmed.clone(), stop.clone(), next.clone());
        workers.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let i = next.fetch_add(1, Ordering::SeqCst);
                match claim_and_complete(&store, i).await {
                    Ok(true) => {
                        confirmed.lock().unwrap().insert(i);
                    }
                    Ok(false) => panic!("key {i}: completion lost its own claim"),
                    Err(Error::Store(_)) => tokio::time::sleep(ms(20)).await,
                    Err(e) => panic!("key {i}: {e}"),
                }
            }
        }));
    }
    tokio::time::sleep(ms(700)).await;
    let old = tokio::task::block_in_place(|| set.kill_primary());
    let new = tokio::task::block_in_place(|| set.wait_failover(old, FAILOVER));
    stop.store(true, Ordering::SeqCst);
    for w in workers {
        w.await.unwrap();
    }
    // The new primary has no replica yet: a write is refused, never silently accepted.
    assert_eq!(set.replicas_in_sync(new), 0);
    let (_, req) = claim_req();
    let mut refused = None;
    let mut last = None;
    for _ in 0..50 {
        match store.claim(&key(u64::MAX), &req).await {
            Err(e) if is_not_replicated(&e) => {
                refused = Some(e);
                break;
            }
            Err(e @ Error::Store(_)) => {
                last = Some(e);
                tokio::time::sleep(ms(100)).await
            }
            other => panic!("a claim without a replica answered {other:?}"),
        }
    }
    let refused = refused.unwrap_or_else(|| panic!("the new primary never answered: {last:?}"));
    println!("without a replica: {refused}");
    assert!(matches!(
        store.issue(&key(u64::MAX - 1), Duration::from_secs(60)).await,
        Err(e) if is_not_replicated(&e)
    ));
    // The old primary comes back as a replica: every confirmed completion is there.
    tokio::task::block_in_place(|| set.rejoin(old, FAILOVER));
    let confirmed = confirmed.lock().unwrap().clone();
    assert!(
        confirmed.len() > 10,
        "too few confirmed completions: {}",
        confirmed.len()
    );
    let mut lost = Vec::new();
    for &i in &confirmed {
        if !still_completed(&store, i).await {
            lost.push(i);
        }
    }
    assert!(
        lost.is_empty(),
        "confirmed completions lost in the failover: {lost:?}"
    );
    assert!(claim_and_complete(&store, u64::MAX - 2).await.unwrap());
    println!(
        "wait_for_replicas(1): {} confirmed completions, all kept",
        confirmed.len()
    );
}

/// Without `wait_for_replicas` a completion is confirmed by the primary alone. The
/// replica is held back (its link to the primary blackholed) while a batch completes:
/// a failover then loses exactly that batch, which runs again, and keeps everything the
/// replica had received. The same writes with `wait_for_replicas(1, …)` are refused with
/// `NotReplicated`, never confirmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_wait_a_failover_loses_exactly_what_the_replica_had_not_received() {
    let mut set = SentinelSet::start_with_proxy();
    let store = RedisStore::builder()
        .timeout(TIMEOUT)
        .connect(&set.url())
        .unwrap();
    let waiting = RedisStore::builder()
        .timeout(TIMEOUT)
        .wait_for_replicas(1, ms(300))
        .connect(&set.url())
        .unwrap();
    for i in 0..100 {
        assert!(claim_and_complete(&store, i).await.unwrap());
    }
    let p = set.primary().unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    while set.replicas_in_sync(p) == 0 {
        assert!(Instant::now() < until, "the replica did not catch up");
        std::thread::sleep(ms(50));
    }
    set.link.as_ref().unwrap().blackhole();
    for i in 100..200 {
        assert!(claim_and_complete(&store, i).await.unwrap());
    }
    // With the wait, the same kind of write is refused while the replica cannot confirm.
    let (_, req) = claim_req();
    let e = waiting.claim(&key(1000), &req).await.unwrap_err();
    assert!(is_not_replicated(&e), "{e}");
    let (owner, req) = claim_req();
    let _ = waiting.claim(&key(1001), &req).await;
    let e = waiting
        .complete(
            &key(1001),
            owner,
            Bytes::from_static(b"x"),
            Duration::from_secs(60),
        )
        .await
        .unwrap_err();
    assert!(is_not_replicated(&e), "{e}");

    let old = tokio::task::block_in_place(|| set.kill_primary());
    tokio::task::block_in_place(|| set.wait_failover(old, FAILOVER));
    let mut kept_before = 0;
    for i in 0..100 {
        kept_before += usize::from(still_completed(&store, i).await);
    }
    let mut kept_after = 0;
    for i in 100..200 {
        kept_after += usize::from(still_completed(&store, i).await);
    }
    println!(
        "no wait: replicated before the cut {kept_before}/100 kept; confirmed by the primary \
         alone {kept_after}/100 kept"
    );
    assert_eq!(kept_before, 100, "replicated completions were lost");
    assert_eq!(
        kept_after, 0,
        "completions the replica never received survived"
    );
}
