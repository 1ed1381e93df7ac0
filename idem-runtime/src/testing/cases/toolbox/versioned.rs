//! Conformance cases of versioned values and optimistic retries.

use super::*;

static BALANCE: Optimistic = Optimistic::new("conformance::balance")
    .retry(Retry::new(500).backoff(Duration::from_millis(1), Duration::from_millis(20)));

/// Load, compare-and-set from absent (0), a stale version is a conflict and writes
/// nothing, a fresh one succeeds and bumps the version by one.
pub async fn versioned_compare_and_set(store: Arc<dyn Store>) {
    let idem = idem(&store);
    assert_eq!(idem.load::<String>(&BALANCE, "a").await.unwrap(), None);
    assert_eq!(
        idem.compare_and_set(&BALANCE, "a", 0, "one".to_string())
            .await
            .unwrap(),
        1
    );
    let r = idem
        .compare_and_set(&BALANCE, "a", 0, "again".to_string())
        .await;
    assert!(matches!(r, Err(Error::Conflict { .. })), "{r:?}");
    let r = idem
        .compare_and_set(&BALANCE, "a", 7, "future".to_string())
        .await;
    assert!(matches!(r, Err(Error::Conflict { .. })), "{r:?}");
    let v = idem.load::<String>(&BALANCE, "a").await.unwrap().unwrap();
    assert_eq!((v.value.as_str(), v.version), ("one", 1));
    assert_eq!(
        idem.compare_and_set(&BALANCE, "a", 1, "two".to_string())
            .await
            .unwrap(),
        2
    );
    let v = idem.load::<String>(&BALANCE, "a").await.unwrap().unwrap();
    assert_eq!((v.value.as_str(), v.version), ("two", 2));
    // Raw store: a version other than 0 on an absent key is a conflict too.
    let key = idem.versioned_key(&BALANCE, "b");
    assert_eq!(
        store
            .versioned()
            .expect("the store offers versioned")
            .compare_and_set(&key, 3, Bytes::from_static(b"x"), None)
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        store
            .versioned()
            .expect("the store offers versioned")
            .load_versioned(&key)
            .await
            .unwrap(),
        None
    );
    // Versioned values and claim records under one key do not see each other.
    static SAME: Options = Options::dedup("conformance::balance");
    let replayed: u8 = idem
        .dedup(&SAME, "a", async { Ok::<_, Error>(9) })
        .await
        .unwrap();
    assert_eq!(replayed, 9);
    assert_eq!(
        idem.load::<String>(&BALANCE, "a")
            .await
            .unwrap()
            .unwrap()
            .version,
        2
    );
}

/// A value written with a ttl disappears after it; versions then restart from absent.
pub async fn versioned_ttl_expiry(store: Arc<dyn Store>) {
    static SHORT: Optimistic =
        Optimistic::new("conformance::short").ttl(Duration::from_millis(300));
    let idem = idem(&store);
    assert_eq!(idem.compare_and_set(&SHORT, "k", 0, 1u32).await.unwrap(), 1);
    assert_eq!(idem.compare_and_set(&SHORT, "k", 1, 2u32).await.unwrap(), 2);
    tokio::time::sleep(ms(900)).await;
    assert_eq!(idem.load::<u32>(&SHORT, "k").await.unwrap(), None);
    assert_eq!(idem.compare_and_set(&SHORT, "k", 0, 3u32).await.unwrap(), 1);
}

/// 50 tasks each add 1 to one balance through the retry helper, with a yield between
/// the read and the write so that they really race: the balance ends at exactly 50.
pub async fn optimistic_balance_50_tasks(store: Arc<dyn Store>) {
    let idem = idem(&store);
    let conflicts = Arc::new(AtomicUsize::new(0));
    let start = Arc::new(Barrier::new(50));
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let (idem, conflicts, start) = (idem.clone(), conflicts.clone(), start.clone());
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            retry_on_conflict(BALANCE.retry_policy(), || async {
                let cur = idem.load::<u64>(&BALANCE, "acct").await?;
                let (cents, version) = cur.map_or((0, 0), |v| (v.value, v.version));
                tokio::task::yield_now().await;
                let r = idem
                    .compare_and_set(&BALANCE, "acct", version, cents + 1)
                    .await;
                if matches!(r, Err(Error::Conflict { .. })) {
                    conflicts.fetch_add(1, Ordering::Relaxed);
                }
                r
            })
            .await
        }));
    }
    for t in tasks {
        t.await
            .unwrap()
            .expect("every add lands within its attempts");
    }
    let v = idem.load::<u64>(&BALANCE, "acct").await.unwrap().unwrap();
    assert_eq!(
        (v.value, v.version),
        (50, 50),
        "conflicts seen: {}",
        conflicts.load(Ordering::Relaxed)
    );
    // `update` is the same loop with the family's policy.
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let idem = idem.clone();
        tasks.push(tokio::spawn(async move {
            idem.update(&BALANCE, "acct", |c: Option<u64>| {
                Ok::<_, Error>(c.unwrap_or(0) + 1)
            })
            .await
        }));
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    let v = idem.load::<u64>(&BALANCE, "acct").await.unwrap().unwrap();
    assert_eq!((v.value, v.version), (100, 100));
}
