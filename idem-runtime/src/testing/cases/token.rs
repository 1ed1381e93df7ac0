//! Conformance cases of one-time tokens: issue, consume once, expiry.

use super::*;

static TOKEN: Options = Options::token("conformance::redeem");

/// 50 concurrent consumers of one token: one runs, the rest are rejected.
pub async fn token_consumed_once(store: Arc<dyn Store>) {
    let idem = idem(&store);
    let token = idem.issue_token(Duration::from_secs(60)).await.unwrap();
    assert!(token.len() >= 32, "at least 128 bits");
    let runs = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let (idem, runs, token) = (idem.clone(), runs.clone(), token.clone());
        tasks.push(tokio::spawn(async move {
            idem.consume_token::<NoReplay, _, _, _>(&TOKEN, &token, async move {
                runs.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(ms(20)).await;
                Ok::<_, Error>(())
            })
            .await
        }));
    }
    let mut ok = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(()) => ok += 1,
            Err(Error::Duplicate { .. }) => {}
            Err(e) => panic!("unexpected {e:?}"),
        }
    }
    assert_eq!((ok, runs.load(Ordering::SeqCst)), (1, 1));
}

/// Unknown, garbage and expired tokens are `TokenInvalid`; tokens are namespaced.
pub async fn token_invalid_and_expiry(store: Arc<dyn Store>) {
    let idem = idem(&store);
    for bad in [
        "",
        "not-a-token",
        "00000000000000000000000000000000",
        &"x".repeat(10_000),
    ] {
        let r = idem
            .consume_token::<NoReplay, _, _, _>(&TOKEN, bad, async { Ok::<_, Error>(()) })
            .await;
        assert!(matches!(r, Err(Error::TokenInvalid { .. })), "{r:?}");
    }
    let other = super::idem(&store);
    let token = other.issue_token(Duration::from_secs(60)).await.unwrap();
    let r = idem
        .consume_token::<NoReplay, _, _, _>(&TOKEN, &token, async { Ok::<_, Error>(()) })
        .await;
    assert!(
        matches!(r, Err(Error::TokenInvalid { .. })),
        "another namespace's token"
    );
    let token = idem.issue_token(ms(300)).await.unwrap();
    tokio::time::sleep(ms(900)).await;
    let r = idem
        .consume_token::<NoReplay, _, _, _>(&TOKEN, &token, async { Ok::<_, Error>(()) })
        .await;
    assert!(
        matches!(r, Err(Error::TokenInvalid { .. })),
        "expired token: {r:?}"
    );
}

/// A body `Err` returns the token to `Issued`: it can be consumed again, once.
pub async fn token_err_returns_token(store: Arc<dyn Store>) {
    let idem = idem(&store);
    let token = idem.issue_token(Duration::from_secs(60)).await.unwrap();
    let r = idem
        .consume_token::<NoReplay, (), _, _>(&TOKEN, &token, async {
            Err(Error::Config("declined".into()))
        })
        .await;
    assert!(matches!(r, Err(Error::Config(_))));
    let r: Result<u32, Error> = idem
        .consume_token::<ReplayOk, _, _, _>(&TOKEN, &token, async { Ok(7) })
        .await;
    assert_eq!(r.unwrap(), 7);
    static REPLAY: Options =
        Options::token("conformance::redeem").on_duplicate(crate::OnDuplicate::Replay);
    let r: Result<u32, Error> = idem
        .consume_token::<ReplayOk, _, _, _>(&REPLAY, &token, async { Ok(8) })
        .await;
    assert_eq!(
        r.unwrap(),
        7,
        "replay mode returns the first consumption's value"
    );
    let r: Result<u32, Error> = idem
        .consume_token::<ReplayOk, _, _, _>(&TOKEN, &token, async { Ok(9) })
        .await;
    assert!(matches!(r, Err(Error::Duplicate { .. })));
}

/// `issue` never overwrites an existing record; fingerprints come back with records.
pub async fn issue_refuses_existing(store: Arc<dyn Store>) {
    let ns: Arc<str> = Arc::from(format!("conformance-issue-{}", Owner::next().0));
    let key = Key::token(&ns, "t");
    assert!(store.issue(&key, Duration::from_secs(60)).await.unwrap());
    assert!(!store.issue(&key, Duration::from_secs(60)).await.unwrap());
    let fp = Some(Fingerprint([7; 16]));
    let req = ClaimRequest::new(ClaimKind::Token, Owner::next(), ms(5000)).with_fingerprint(fp);
    assert!(matches!(
        store.claim(&key, &req).await.unwrap(),
        ClaimOutcome::Claimed { .. }
    ));
    assert!(!store.issue(&key, Duration::from_secs(60)).await.unwrap());
    let other = ClaimRequest::new(ClaimKind::Token, Owner::next(), ms(5000));
    match store.claim(&key, &other).await.unwrap() {
        ClaimOutcome::Busy { fingerprint, .. } => assert_eq!(fingerprint, fp),
        o => panic!("expected Busy, got {o:?}"),
    }
    let value = Bytes::from_static(b"done");
    assert!(
        store
            .complete(&key, req.owner, value.clone(), Duration::from_secs(60))
            .await
            .unwrap()
    );
    match store.claim(&key, &other).await.unwrap() {
        ClaimOutcome::Completed {
            value: v,
            fingerprint,
        } => {
            assert_eq!((v, fingerprint), (value, fp));
        }
        o => panic!("expected Completed, got {o:?}"),
    }
    let missing = Key::token(&ns, "never-issued");
    assert_eq!(
        store.claim(&missing, &other).await.unwrap(),
        ClaimOutcome::Missing
    );
}
