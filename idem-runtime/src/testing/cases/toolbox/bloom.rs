//! Conformance cases of Bloom bitmaps and dedup behind a Bloom pre-filter.

use super::*;

/// Insert answers "maybe seen" only once every bit is set; contains agrees; two filters
/// do not share bits; 50 concurrent inserts of one new id: exactly one hears "new".
pub async fn bloom_insert_and_contains(store: Arc<dyn Store>) {
    let idem = idem(&store);
    let a = BloomFilter::new(&idem, "conformance::a", 1000, 0.01).unwrap();
    let b = BloomFilter::new(&idem, "conformance::b", 1000, 0.01).unwrap();
    assert!(!a.contains("x").await.unwrap(), "empty filter");
    assert!(!a.insert("x").await.unwrap());
    assert!(a.insert("x").await.unwrap());
    assert!(a.contains("x").await.unwrap());
    assert!(!b.contains("x").await.unwrap(), "filters share bits");
    let raw = *a.key();
    assert!(
        !store
            .blooms()
            .expect("the store offers blooms")
            .bloom_insert(&raw, &[0, 63, 64, a.size_bits() - 1], a.size_bits(), None)
            .await
            .unwrap()
    );
    assert!(
        store
            .blooms()
            .expect("the store offers blooms")
            .bloom_contains(&raw, &[0, 63, 64, a.size_bits() - 1], a.size_bits())
            .await
            .unwrap()
    );
    assert!(
        !store
            .blooms()
            .expect("the store offers blooms")
            .bloom_contains(&raw, &[0, 1], a.size_bits())
            .await
            .unwrap()
    );
    assert!(
        store
            .blooms()
            .expect("the store offers blooms")
            .bloom_insert(&raw, &[63, 0], a.size_bits(), None)
            .await
            .unwrap()
    );

    let a = Arc::new(a);
    let fresh = Arc::new(AtomicUsize::new(0));
    let start = Arc::new(Barrier::new(50));
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let (a, fresh, start) = (a.clone(), fresh.clone(), start.clone());
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            if !a.insert("contended").await.unwrap() {
                fresh.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(fresh.load(Ordering::SeqCst), 1);
}

/// A filter with a ttl disappears as a whole `ttl` after its first insert; later inserts
/// do not push that back.
pub async fn bloom_ttl_is_not_refreshed(store: Arc<dyn Store>) {
    let idem = idem(&store);
    let f = BloomFilter::new(&idem, "conformance::ttl", 1000, 0.01)
        .unwrap()
        .ttl(ms(2000));
    assert!(!f.insert("a").await.unwrap());
    tokio::time::sleep(ms(1000)).await;
    assert!(!f.insert("b").await.unwrap());
    assert!(f.contains("a").await.unwrap());
    // Past the first insert's ttl (2.0 s), before a ttl refreshed by "b" would end (3.0 s).
    tokio::time::sleep(ms(1500)).await;
    assert!(
        !f.contains("b").await.unwrap(),
        "an insert pushed the filter's expiry back"
    );
    assert!(
        !f.insert("a").await.unwrap(),
        "an expired filter starts empty"
    );
}

/// Through the store: fill a filter to its capacity (10,000 at 1%), probe ids never
/// inserted, and the false-positive rate is 1% within ±50%: 1,000,000 probes on the
/// in-process memory store, 100,000 (one round trip each, ~1,000 expected hits, so the
/// ±50% band is ±15 standard deviations) on stores over the network.
pub async fn bloom_false_positive_rate(store: Arc<dyn Store>) {
    let idem = idem(&store);
    let f = Arc::new(BloomFilter::new(&idem, "conformance::fp", 10_000, 0.01).unwrap());
    const TASKS: u64 = 16;
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let f = f.clone();
        tasks.push(tokio::spawn(async move {
            for i in (t..10_000).step_by(TASKS as usize) {
                // The id is digested before the await: `Arguments` is not `Send`.
                let insert = f.insert(format_args!("in-{i}"));
                insert.await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let probes: u64 = if store.name() == "memory" {
        1_000_000
    } else {
        100_000
    };
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let f = f.clone();
        tasks.push(tokio::spawn(async move {
            let mut hits = 0u64;
            for i in (t..probes).step_by(TASKS as usize) {
                let probe = f.contains(format_args!("out-{i}"));
                hits += u64::from(probe.await.unwrap());
            }
            hits
        }));
    }
    let mut hits = 0;
    for t in tasks {
        hits += t.await.unwrap();
    }
    let rate = hits as f64 / probes as f64;
    println!(
        "{}: measured false-positive rate {rate} over {probes} probes at configured 0.01",
        store.name()
    );
    assert!(
        (0.005..=0.015).contains(&rate),
        "configured 0.01, measured {rate}"
    );
    for i in 0..1000 {
        assert!(
            f.contains(format_args!("in-{i}")).await.unwrap(),
            "false negative"
        );
    }
}

/// An overfull filter (capacity 50, fed 2,000 ids) says "maybe" to most new ids, yet no
/// new id is ever treated as a duplicate: every body runs exactly once, and a second pass
/// replays every value without running anything.
pub async fn bloom_dedup_never_drops_new_ids(store: Arc<dyn Store>) {
    static HANDLE: Options = Options::dedup("conformance::consume");
    let idem = idem(&store);
    let f = BloomFilter::new(&idem, "conformance::overfull", 50, 0.1).unwrap();
    let runs = &AtomicUsize::new(0);
    let mut maybe_but_new = 0;
    for i in 0..2000u32 {
        let r = idem
            .dedup_filtered(&HANDLE, &f, format_args!("msg-{i}"), |v| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Error>((i, v == Verdict::Maybe))
            })
            .await
            .unwrap();
        assert!(
            r.ran,
            "new id {i} was skipped as a duplicate ({:?})",
            r.verdict
        );
        assert_eq!(
            r.value,
            (i, r.verdict == Verdict::Maybe),
            "the body saw another verdict"
        );
        maybe_but_new += usize::from(r.verdict == Verdict::Maybe);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 2000);
    assert!(
        maybe_but_new > 0,
        "the overfull filter never said maybe: the case proves nothing"
    );
    for i in 0..2000u32 {
        let r = idem
            .dedup_filtered(&HANDLE, &f, format_args!("msg-{i}"), |_| async {
                Ok::<_, Error>((u32::MAX, false))
            })
            .await
            .unwrap();
        assert_eq!((r.value.0, r.ran, r.verdict), (i, false, Verdict::Maybe));
    }
    assert_eq!(runs.load(Ordering::SeqCst), 2000);
}

/// A body reached long after the filter's "new" (here: it waited for a twin's claim that
/// vanished) is told "maybe": by then the twin could have run and its record expired, so
/// "new" no longer proves that nobody processed the id. A prompt body is told "new".
pub async fn bloom_new_verdict_expires_with_the_records(store: Arc<dyn Store>) {
    // "Prompt" is within half the ttl of the filter's answer: a full second, so a slow
    // database on a loaded machine still answers the prompt claim in time.
    static SHORT: Options = Options::dedup("conformance::short_records")
        .ttl(Duration::from_millis(2000))
        .wait(Duration::from_secs(10));
    let idem = idem(&store);
    let f = BloomFilter::new(&idem, "conformance::late", 1000, 0.01).unwrap();
    let told = |v: Verdict| async move { Ok::<_, Error>(v == Verdict::New) };
    let prompt = idem.dedup_filtered(&SHORT, &f, "a", told).await.unwrap();
    assert_eq!(
        (prompt.ran, prompt.value, prompt.verdict),
        (true, true, Verdict::New)
    );

    // A twin holds the key (it got ahead of us) and vanishes: its lease ends at 1.5 s,
    // past half the ttl.
    let key = idem.key(&SHORT, format_args!("b"));
    let twin = ClaimRequest::new(ClaimKind::Dedup, Owner::next(), ms(1500));
    assert!(matches!(
        store.claim(&key, &twin).await.unwrap(),
        ClaimOutcome::Claimed { .. }
    ));
    let late = idem.dedup_filtered(&SHORT, &f, "b", told).await.unwrap();
    assert!(late.ran, "the key was free again after the twin's lease");
    assert!(
        !late.value,
        "the body was told New although a twin may have run"
    );
    assert_eq!(late.verdict, Verdict::Maybe);
}
