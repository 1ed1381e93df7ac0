//! Conformance cases of the operator primitives: [`Store::inspect`], [`Store::forget`]
//! and, where a store offers it, [`RecordCounts::count_records`](crate::store::RecordCounts::count_records).

use super::*;
use crate::inspect::{RecordCount, RecordState};

static INSPECT: Options = Options::dedup("conformance::inspect");
static INSPECT_LOCK: Options = Options::lock("conformance::inspect-lock");

fn within(left: Option<Duration>, most: Duration) -> bool {
    left.is_some_and(|d| !d.is_zero() && d <= most)
}

/// Inspect reports each state with its owner, lease and ttl left, fingerprint, value
/// size and a lock's fence, and nothing for an absent or expired record.
pub async fn inspect_reports_each_state(store: Arc<dyn Store>) {
    let idem = idem(&store);
    let key = idem.key(&INSPECT, format_args!("k"));
    assert_eq!(store.inspect(&key).await.unwrap(), None, "absent");

    let fp = Some(Fingerprint([7; 16]));
    let req = ClaimRequest::new(ClaimKind::Dedup, Owner::next(), ms(20_000)).with_fingerprint(fp);
    assert!(matches!(
        store.claim(&key, &req).await.unwrap(),
        ClaimOutcome::Claimed { .. }
    ));
    let info = store.inspect(&key).await.unwrap().expect("in progress");
    assert_eq!(info.state, RecordState::InProgress);
    assert_eq!(info.owner, Some(req.owner));
    assert!(within(info.lease_left, ms(20_000)), "{info:?}");
    assert!(within(info.ttl_left, ms(20_000)), "{info:?}");
    assert!(info.fingerprint, "{info:?}");
    assert_eq!(info.value_size, None);
    assert!(
        matches!(info.kind, None | Some(ClaimKind::Dedup)),
        "{info:?}"
    );

    let value = Bytes::from_static(b"twelve bytes");
    assert!(
        store
            .complete(&key, req.owner, value.clone(), ms(60_000))
            .await
            .unwrap()
    );
    let info = store.inspect(&key).await.unwrap().expect("completed");
    assert_eq!(info.state, RecordState::Completed);
    assert_eq!(info.owner, None);
    assert_eq!(info.lease_left, None);
    assert!(within(info.ttl_left, ms(60_000)), "{info:?}");
    assert!(info.fingerprint);
    assert_eq!(info.value_size, Some(value.len()));
    assert_eq!(info.fence, None);
    // Reading changed nothing: the value still replays.
    let again = ClaimRequest::new(ClaimKind::Dedup, Owner::next(), ms(20_000)).with_fingerprint(fp);
    match store.claim(&key, &again).await.unwrap() {
        ClaimOutcome::Completed { value: v, .. } => assert_eq!(v, value),
        other => panic!("expected the completed value, got {other:?}"),
    }

    let lock = idem.key(&INSPECT_LOCK, format_args!("stock"));
    let holder = ClaimRequest::new(ClaimKind::Lock, Owner::next(), ms(20_000));
    let ClaimOutcome::Claimed { fence, .. } = store.claim(&lock, &holder).await.unwrap() else {
        panic!("lock claim")
    };
    let info = store.inspect(&lock).await.unwrap().expect("held lock");
    assert_eq!(info.state, RecordState::InProgress);
    assert_eq!(info.owner, Some(holder.owner));
    assert_eq!(info.fence, Some(fence), "{info:?}");
    assert!(!info.fingerprint);
    assert!(store.release(&lock, holder.owner).await.unwrap());
    assert_eq!(store.inspect(&lock).await.unwrap(), None, "released lock");

    let token = Key::token(idem.namespace(), "a-token");
    assert!(store.issue(&token, ms(60_000)).await.unwrap());
    let info = store.inspect(&token).await.unwrap().expect("issued");
    assert_eq!(info.state, RecordState::Issued);
    assert_eq!(info.owner, None);
    assert!(within(info.ttl_left, ms(60_000)), "{info:?}");

    let short = idem.key(&INSPECT, format_args!("short"));
    let req = ClaimRequest::new(ClaimKind::Dedup, Owner::next(), ms(200));
    store.claim(&short, &req).await.unwrap();
    tokio::time::sleep(ms(600)).await;
    assert_eq!(store.inspect(&short).await.unwrap(), None, "lease ended");
}

/// Forget removes a completed record (the next call runs), an issued token (it no
/// longer consumes) and nothing when there is nothing.
pub async fn forget_removes_whatever_the_state(store: Arc<dyn Store>) {
    let idem = idem(&store);
    let first: u64 = idem
        .dedup(&INSPECT, "k", async { Ok::<_, Error>(1) })
        .await
        .unwrap();
    assert!(idem.forget(&INSPECT, "k").await.unwrap());
    assert!(idem.inspect(&INSPECT, "k").await.unwrap().is_none());
    let again: u64 = idem
        .dedup(&INSPECT, "k", async { Ok::<_, Error>(2) })
        .await
        .unwrap();
    assert_eq!((first, again), (1, 2), "the body ran again");
    assert!(!idem.forget(&INSPECT, "never").await.unwrap());

    static TOKEN: Options = Options::token("conformance::inspect-token");
    let token = idem.issue_token(ms(60_000)).await.unwrap();
    assert!(idem.forget(&TOKEN, &token).await.unwrap());
    let r = idem
        .consume_token::<NoReplay, (), Error, _>(&TOKEN, &token, async { Ok(()) })
        .await;
    assert!(matches!(r, Err(Error::TokenInvalid { .. })), "{r:?}");
}

/// Forgetting an in-progress key lets the next caller run at once; the old holder's
/// completion is then refused as a lost lease and the new result stands.
pub async fn forget_in_progress_makes_the_old_completion_a_lost_lease(store: Arc<dyn Store>) {
    let idem = idem(&store);
    let started = Arc::new(Notify::new());
    let finish = Arc::new(Notify::new());
    let holder = {
        let (idem, started, finish) = (idem.clone(), started.clone(), finish.clone());
        tokio::spawn(async move {
            idem.dedup(&INSPECT, "stuck", async move {
                started.notify_one();
                finish.notified().await;
                Ok::<_, Error>(1u64)
            })
            .await
        })
    };
    started.notified().await;
    let info = idem
        .inspect(&INSPECT, "stuck")
        .await
        .unwrap()
        .expect("held");
    assert_eq!(info.state, RecordState::InProgress);
    assert!(idem.forget(&INSPECT, "stuck").await.unwrap());

    let second: u64 = idem
        .dedup(&INSPECT, "stuck", async { Ok::<_, Error>(2) })
        .await
        .unwrap();
    assert_eq!(second, 2, "the next caller ran");
    finish.notify_one();
    assert_eq!(
        holder.await.unwrap().unwrap(),
        1,
        "the old holder gets its result"
    );
    assert_eq!(idem.stats().lease_lost, 1);
    let replay: u64 = idem
        .dedup(&INSPECT, "stuck", async { Ok::<_, Error>(3) })
        .await
        .unwrap();
    assert_eq!(replay, 2, "the new result stands");

    // A held lock: the next holder gets a greater fence; the old unlock is refused.
    let old = ClaimRequest::new(ClaimKind::Lock, Owner::next(), ms(20_000));
    let lock = idem.key(&INSPECT_LOCK, format_args!("stock"));
    let ClaimOutcome::Claimed { fence: f1, .. } = store.claim(&lock, &old).await.unwrap() else {
        panic!("lock claim")
    };
    assert!(store.forget(&lock).await.unwrap());
    let new = ClaimRequest::new(ClaimKind::Lock, Owner::next(), ms(20_000));
    let ClaimOutcome::Claimed { fence: f2, .. } = store.claim(&lock, &new).await.unwrap() else {
        panic!("lock claim after forget")
    };
    assert!(
        f2 > f1,
        "fences must keep growing across a forget: {f1} then {f2}"
    );
    assert!(!store.release(&lock, old.owner).await.unwrap());
    assert!(store.release(&lock, new.owner).await.unwrap());
}

/// A waiter on a forgotten key is not left waiting for the old holder: it takes the
/// key (or the new result) well before its wait runs out.
pub async fn forget_wakes_waiters(store: Arc<dyn Store>) {
    static WAITING: Options = Options::dedup("conformance::inspect").wait(Duration::from_secs(20));
    let idem = idem(&store);
    let key = idem.key(&INSPECT, format_args!("w"));
    let req = ClaimRequest::new(ClaimKind::Dedup, Owner::next(), ms(20_000));
    store.claim(&key, &req).await.unwrap();
    let waiter = {
        let idem = idem.clone();
        tokio::spawn(async move {
            idem.dedup(&WAITING, "w", async { Ok::<_, Error>(5u64) })
                .await
        })
    };
    tokio::time::sleep(ms(200)).await;
    assert!(store.forget(&key).await.unwrap());
    // Far less than the 20 s lease or wait: the waiter was not left polling the old holder.
    let got = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("waiter still waiting after the forget")
        .unwrap();
    assert_eq!(got.unwrap(), 5);
}

/// Stores that count records (shared stores, for `idem stats`) count live records by
/// namespace, function and state. A store without the capability says so.
pub async fn count_records_by_function_and_state(store: Arc<dyn Store>) {
    let idem = idem(&store);
    let ns = idem.namespace();
    let Some(counts) = store.record_counts() else {
        return;
    };
    assert_eq!(
        counts.count_records(Some(ns)).await.unwrap(),
        vec![],
        "fresh namespace"
    );
    for k in ["a", "b"] {
        let _: u64 = idem
            .dedup(&INSPECT, k, async { Ok::<_, Error>(1) })
            .await
            .unwrap();
    }
    let held = idem.key(&INSPECT_LOCK, format_args!("held"));
    store
        .claim(
            &held,
            &ClaimRequest::new(ClaimKind::Lock, Owner::next(), ms(20_000)),
        )
        .await
        .unwrap();
    idem.issue_token(ms(60_000)).await.unwrap();
    let mut rows = counts.count_records(Some(ns)).await.unwrap();
    rows.sort();
    let mut want = vec![
        RecordCount::new(ns, INSPECT.name(), "completed", 2),
        RecordCount::new(ns, INSPECT_LOCK.name(), "in_progress", 1),
        RecordCount::new(ns, crate::key::TOKEN_SCOPE, "issued", 1),
    ];
    want.sort();
    assert_eq!(rows, want);
}
