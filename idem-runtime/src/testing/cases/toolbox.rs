//! Conformance cases of the toolbox primitives: versioned values, state-machine moves
//! and Bloom bitmaps. Run them with `toolbox_conformance_tests!`; a store that does not
//! implement these primitives yet still passes `conformance_tests!`.

use std::collections::HashMap;
use std::sync::Mutex;

use super::*;
use crate::store::{Settle, TransitionOutcome, TransitionRequest};
use crate::{BloomFilter, Optimistic, Retry, StateMachine, Step, Verdict, retry_on_conflict};

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

fn order_machine(wait: Duration, lease: Duration) -> StateMachine {
    StateMachine::builder("conformance::order")
        .states(["created", "paid", "shipped", "delivered", "cancelled"])
        .initial("created")
        .allow("created", ["paid", "cancelled"])
        .allow("paid", ["shipped", "cancelled"])
        .allow("shipped", ["delivered"])
        .terminal(["delivered", "cancelled"])
        .wait(wait)
        .lease(lease)
        .build()
        .unwrap()
}

/// Allowed moves happen, "already there" is success without effect, anything else is
/// `InvalidTransition` naming the current state, and terminal states stay terminal.
pub async fn state_machine_moves(store: Arc<dyn Store>) {
    let idem = idem(&store);
    let m = order_machine(Duration::from_secs(10), Duration::from_secs(30));
    assert_eq!(idem.state(&m, "o").await.unwrap(), None);
    let r = idem.transition(&m, "o", "paid").await;
    assert!(
        matches!(r, Err(Error::InvalidTransition { from: None, ref to }) if to == "paid"),
        "{r:?}"
    );
    assert_eq!(
        idem.transition(&m, "o", "created").await.unwrap(),
        Step::Performed {
            from: None,
            value: ()
        }
    );
    assert_eq!(
        idem.transition(&m, "o", "created").await.unwrap(),
        Step::AlreadyThere
    );
    let r = idem.transition(&m, "o", "shipped").await;
    assert!(
        matches!(r, Err(Error::InvalidTransition { from: Some(ref f), ref to }) if f == "created" && to == "shipped"),
        "{r:?}"
    );
    assert_eq!(
        idem.transition(&m, "o", "paid").await.unwrap(),
        Step::Performed {
            from: Some("created".into()),
            value: ()
        }
    );
    assert!(
        idem.transition(&m, "o", "cancelled")
            .await
            .unwrap()
            .performed()
    );
    assert_eq!(
        idem.state(&m, "o").await.unwrap().as_deref(),
        Some("cancelled")
    );
    for to in ["created", "paid", "shipped", "delivered"] {
        let r = idem.transition(&m, "o", to).await;
        assert!(
            matches!(r, Err(Error::InvalidTransition { .. })),
            "out of a terminal state to {to}: {r:?}"
        );
    }
    assert_eq!(
        idem.transition(&m, "o", "cancelled").await.unwrap(),
        Step::AlreadyThere
    );
    assert!(matches!(
        idem.transition(&m, "o", "lost").await,
        Err(Error::Config(_))
    ));
    // Other keys are untouched.
    assert_eq!(idem.state(&m, "other").await.unwrap(), None);
}

/// 64 tasks race through created → paid → shipped → delivered on one key, each move
/// with a body: every move is performed exactly once and every body runs exactly once;
/// then 64 plain movers race on a fresh key and exactly one performs.
pub async fn state_machine_concurrent_movers(store: Arc<dyn Store>) {
    let idem = idem(&store);
    let m = Arc::new(order_machine(
        Duration::from_secs(30),
        Duration::from_secs(30),
    ));
    let runs: Arc<Mutex<HashMap<&'static str, usize>>> = Arc::default();
    let performed: Arc<Mutex<HashMap<&'static str, usize>>> = Arc::default();
    let start = Arc::new(Barrier::new(64));
    let mut tasks = Vec::new();
    for _ in 0..64 {
        let (idem, m, runs, performed, start) = (
            idem.clone(),
            m.clone(),
            runs.clone(),
            performed.clone(),
            start.clone(),
        );
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            for to in ["created", "paid", "shipped", "delivered"] {
                let runs = runs.clone();
                let step = idem
                    .transition_with(&m, "order-1", to, async move {
                        *runs.lock().unwrap().entry(to).or_default() += 1;
                        tokio::time::sleep(ms(5)).await;
                        Ok::<_, Error>(to)
                    })
                    .await;
                match step {
                    Ok(Step::Performed { value, .. }) => {
                        assert_eq!(value, to);
                        *performed.lock().unwrap().entry(to).or_default() += 1;
                    }
                    Ok(Step::AlreadyThere) => {}
                    // A later move already happened: this one's moment has passed.
                    Err(Error::InvalidTransition { from: Some(_), .. }) => {}
                    Err(e) => panic!("move to {to}: {e:?}"),
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let expected: HashMap<&str, usize> = ["created", "paid", "shipped", "delivered"]
        .into_iter()
        .map(|s| (s, 1))
        .collect();
    assert_eq!(*runs.lock().unwrap(), expected, "bodies");
    assert_eq!(*performed.lock().unwrap(), expected, "moves");
    assert_eq!(
        idem.state(&m, "order-1").await.unwrap().as_deref(),
        Some("delivered")
    );

    let wins = Arc::new(AtomicUsize::new(0));
    let start = Arc::new(Barrier::new(64));
    let mut tasks = Vec::new();
    for _ in 0..64 {
        let (idem, m, wins, start) = (idem.clone(), m.clone(), wins.clone(), start.clone());
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            if idem
                .transition(&m, "order-2", "created")
                .await
                .unwrap()
                .performed()
            {
                wins.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(wins.load(Ordering::SeqCst), 1);
}

/// While a body holds a move, other moves wait (`wait = 0`: `InProgress`); a body `Err`
/// leaves the state unchanged and a retry performs the move; a cancelled call frees the
/// key at once, long before its lease would end.
pub async fn state_machine_body_failure_and_cancel(store: Arc<dyn Store>) {
    let idem = idem(&store);
    let m = Arc::new(order_machine(
        Duration::from_secs(10),
        Duration::from_secs(120),
    ));
    let nowait = order_machine(Duration::ZERO, Duration::from_secs(120));
    idem.transition(&m, "o", "created").await.unwrap();
    idem.transition(&m, "o", "paid").await.unwrap();

    let r = idem
        .transition_with(&m, "o", "shipped", async {
            Err::<(), _>(Error::Config("carrier down".into()))
        })
        .await;
    assert!(matches!(r, Err(Error::Config(_))), "{r:?}");
    assert_eq!(idem.state(&m, "o").await.unwrap().as_deref(), Some("paid"));

    let started = Arc::new(Notify::new());
    let holder = {
        let (idem, m, started) = (idem.clone(), m.clone(), started.clone());
        tokio::spawn(async move {
            idem.transition_with(&m, "o", "shipped", async move {
                started.notify_one();
                std::future::pending::<()>().await;
                Ok::<_, Error>(())
            })
            .await
        })
    };
    started.notified().await;
    let r = idem.transition(&nowait, "o", "cancelled").await;
    assert!(
        matches!(r, Err(Error::InProgress { .. })),
        "a held move must block others: {r:?}"
    );
    assert_eq!(
        idem.state(&m, "o").await.unwrap().as_deref(),
        Some("paid"),
        "held, not moved"
    );
    holder.abort();
    assert!(holder.await.unwrap_err().is_cancelled());
    let step = idem
        .transition_with(&m, "o", "shipped", async { Ok::<_, Error>(7) })
        .await
        .unwrap();
    assert_eq!(
        step,
        Step::Performed {
            from: Some("paid".into()),
            value: 7
        }
    );
    let again = idem
        .transition_with(&m, "o", "shipped", async { Ok::<_, Error>(8) })
        .await
        .unwrap();
    assert_eq!(again, Step::AlreadyThere, "shipped twice");
    let r = idem
        .transition_with(&m, "o", "cancelled", async { Ok::<_, Error>(()) })
        .await;
    assert!(matches!(r, Err(Error::InvalidTransition { .. })), "{r:?}");
}

/// A holder that vanished (a crash) blocks the key until its lease ends, then the move is
/// performed by the next caller; the vanished owner can no longer commit over it.
pub async fn state_machine_crashed_hold_taken_over(store: Arc<dyn Store>) {
    let idem = idem(&store);
    let m = order_machine(Duration::from_secs(10), Duration::from_secs(30));
    let nowait = order_machine(Duration::ZERO, Duration::from_secs(30));
    idem.transition(&m, "o", "created").await.unwrap();
    let key = idem.state_key(&m, "o");
    let crashed = Owner::next();
    let from = ["created"];
    let req = TransitionRequest::new(&from, false, "paid").hold(crashed, ms(700));
    assert_eq!(
        store
            .states()
            .expect("the store offers states")
            .transition(&key, &req)
            .await
            .unwrap(),
        TransitionOutcome::Held {
            from: Some("created".into())
        }
    );
    match store
        .states()
        .expect("the store offers states")
        .transition(&key, &TransitionRequest::new(&from, false, "paid"))
        .await
        .unwrap()
    {
        TransitionOutcome::Pending { to, .. } => assert_eq!(to, "paid"),
        o => panic!("expected Pending, got {o:?}"),
    }
    let r = idem.transition(&nowait, "o", "paid").await;
    assert!(
        matches!(r, Err(Error::InProgress { .. })),
        "taken over before the lease ended: {r:?}"
    );
    let runs = AtomicUsize::new(0);
    let step = idem
        .transition_with(&m, "o", "paid", async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Error>(())
        })
        .await
        .unwrap();
    assert!(step.performed());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert!(
        !store
            .states()
            .expect("the store offers states")
            .settle_transition(&key, crashed, Settle::Commit { ttl: None })
            .await
            .unwrap()
    );
    assert!(
        !store
            .states()
            .expect("the store offers states")
            .settle_transition(&key, crashed, Settle::Abort)
            .await
            .unwrap()
    );
    assert_eq!(idem.state(&m, "o").await.unwrap().as_deref(), Some("paid"));
}

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
    static SHORT: Options = Options::dedup("conformance::short_records")
        .ttl(Duration::from_millis(400))
        .wait(Duration::from_secs(10));
    let idem = idem(&store);
    let f = BloomFilter::new(&idem, "conformance::late", 1000, 0.01).unwrap();
    let told = |v: Verdict| async move { Ok::<_, Error>(v == Verdict::New) };
    let prompt = idem.dedup_filtered(&SHORT, &f, "a", told).await.unwrap();
    assert_eq!(
        (prompt.ran, prompt.value, prompt.verdict),
        (true, true, Verdict::New)
    );

    // A twin holds the key (it got ahead of us) and vanishes: its lease ends at 700 ms.
    let key = idem.key(&SHORT, format_args!("b"));
    let twin = ClaimRequest::new(ClaimKind::Dedup, Owner::next(), ms(700));
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
