//! Conformance cases of claims and leases: cancellation, crashed holders, heartbeats,
//! stale owners and corrupt records.

use super::*;

/// A dropped (cancelled) call gives its claim back at once, long before its lease
/// would end: the next call claims and runs.
pub async fn cancellation_releases_claim(store: Arc<dyn Store>) {
    static LONG: Options = Options::dedup("conformance::cancel")
        .lease(Duration::from_secs(120))
        .wait(Duration::from_secs(10));
    let idem = idem(&store);
    let started = Arc::new(Notify::new());
    let task = {
        let (idem, started) = (idem.clone(), started.clone());
        tokio::spawn(async move {
            idem.dedup(&LONG, "k", async move {
                started.notify_one();
                std::future::pending::<()>().await;
                Ok::<_, Error>(1u8)
            })
            .await
        })
    };
    started.notified().await;
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    let r: u8 = idem
        .dedup(&LONG, "k", async { Ok::<_, Error>(2) })
        .await
        .unwrap();
    assert_eq!(r, 2, "the cancelled call's claim was not released");
}

/// A holder that vanished without releasing (a crash) blocks the key until its lease
/// ends, not before, and not forever.
pub async fn crashed_holder_taken_over_after_lease(store: Arc<dyn Store>) {
    static NOWAIT: Options = Options::dedup("conformance::dedup").wait(Duration::ZERO);
    static WAIT: Options = Options::dedup("conformance::dedup").wait(Duration::from_secs(10));
    let idem = idem(&store);
    let key = idem.key(&DEDUP, format_args!("k"));
    let crashed = ClaimRequest::new(ClaimKind::Dedup, Owner::next(), ms(700));
    assert!(matches!(
        store.claim(&key, &crashed).await.unwrap(),
        ClaimOutcome::Claimed { .. }
    ));
    let r: Result<u8, Error> = idem.dedup(&NOWAIT, "k", async { Ok(1) }).await;
    assert!(
        matches!(r, Err(Error::InProgress { .. })),
        "taken over before the lease ended"
    );
    let r: u8 = idem
        .dedup(&WAIT, "k", async { Ok::<_, Error>(2) })
        .await
        .unwrap();
    assert_eq!(r, 2);
    assert!(
        !store
            .complete(&key, crashed.owner, Bytes::from_static(b"x"), ms(1000))
            .await
            .unwrap()
    );
}

/// A body running for several leases keeps its claim (the heartbeat renews it).
pub async fn heartbeat_keeps_long_body_claimed(store: Arc<dyn Store>) {
    static SHORT_LEASE: Options =
        Options::dedup("conformance::hb").lease(Duration::from_millis(300));
    static PEEK: Options = Options::dedup("conformance::hb").wait(Duration::ZERO);
    let idem = idem(&store);
    let runs = Arc::new(AtomicUsize::new(0));
    let holder = {
        let (idem, runs) = (idem.clone(), runs.clone());
        tokio::spawn(async move {
            idem.dedup(&SHORT_LEASE, "k", async move {
                runs.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(ms(1500)).await;
                Ok::<_, Error>(1u8)
            })
            .await
        })
    };
    for _ in 0..6 {
        tokio::time::sleep(ms(200)).await;
        let r: Result<u8, Error> = idem.dedup(&PEEK, "k", async { Ok(9) }).await;
        if runs.load(Ordering::SeqCst) == 1 && !holder.is_finished() {
            assert!(matches!(r, Err(Error::InProgress { .. })), "{r:?}");
        }
    }
    assert_eq!(holder.await.unwrap().unwrap(), 1);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(idem.stats().lease_lost, 0);
}

/// After its lease ended and another owner claimed, the old owner can neither
/// complete, release nor renew: the new holder's record is untouched.
pub async fn stale_owner_cannot_complete_release_or_renew(store: Arc<dyn Store>) {
    let idem = idem(&store);
    for kind in [ClaimKind::Dedup, ClaimKind::Lock] {
        static LOCK: Options = Options::lock("conformance::stale");
        let key = idem.key(&LOCK, format_args!("{kind:?}"));
        let old = ClaimRequest::new(kind, Owner::next(), ms(300));
        let ClaimOutcome::Claimed { fence: f1, .. } = store.claim(&key, &old).await.unwrap() else {
            panic!("first claim")
        };
        tokio::time::sleep(ms(700)).await;
        let new = ClaimRequest::new(kind, Owner::next(), ms(30_000));
        let ClaimOutcome::Claimed { fence: f2, .. } = store.claim(&key, &new).await.unwrap() else {
            panic!("claim after the lease ended")
        };
        if kind == ClaimKind::Lock {
            assert!(f2 > f1, "fences must increase: {f1} then {f2}");
        }
        assert!(!store.release(&key, old.owner).await.unwrap());
        assert!(!store.renew(&key, old.owner, ms(30_000)).await.unwrap());
        assert!(
            !store
                .complete(&key, old.owner, Bytes::from_static(b"stale"), ms(30_000))
                .await
                .unwrap()
        );
        assert!(matches!(
            store
                .claim(&key, &ClaimRequest::new(kind, Owner::next(), ms(1000)))
                .await
                .unwrap(),
            ClaimOutcome::Busy { .. }
        ));
        assert!(store.renew(&key, new.owner, ms(30_000)).await.unwrap());
        assert!(store.release(&key, new.owner).await.unwrap());
        assert!(
            !store.release(&key, new.owner).await.unwrap(),
            "released twice"
        );
    }
}

/// Bytes that are not a valid record are `Error::Corrupt`, never replayed.
pub async fn corrupt_record_is_an_error(store: Arc<dyn Store>) {
    let idem = idem(&store);
    let key = idem.key(&DEDUP, format_args!("k"));
    let req = ClaimRequest::new(ClaimKind::Dedup, Owner::next(), ms(5000));
    assert!(matches!(
        store.claim(&key, &req).await.unwrap(),
        ClaimOutcome::Claimed { .. }
    ));
    assert!(
        store
            .complete(
                &key,
                req.owner,
                Bytes::from_static(b"\x00garbage\xff"),
                ms(30_000)
            )
            .await
            .unwrap()
    );
    let runs = AtomicUsize::new(0);
    let r: Result<u64, Error> = idem
        .dedup(&DEDUP, "k", async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok(1)
        })
        .await;
    assert!(matches!(r, Err(Error::Corrupt { .. })), "{r:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}
