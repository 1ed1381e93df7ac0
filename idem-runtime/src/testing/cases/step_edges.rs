//! Conformance cases of durable steps at their edges, tried as a hostile caller would:
//! another payload after a release, a call dropped while a step's journal write is in
//! flight, in-call retries, a holder that lost its claim.

use super::*;
use crate::{Verified, step};

static EDGES: Options = Options::dedup("conformance::step_edges").wait(Duration::from_secs(20));

fn fp(n: u64) -> Option<Fingerprint> {
    let mut b = crate::codec::FingerprintBuilder::new();
    b.add(&n).unwrap();
    Some(b.finish())
}

/// A journal records effects made for one payload. Order o1 charges 100 cents, then its
/// mail fails and the key is released; another payload under the same key (999 cents)
/// must be refused, not handed o1's charge. The original payload then resumes with its
/// charge run once; a claim without a fingerprint is accepted (as for completed
/// records); `forget` clears the journal, and the other payload runs afresh.
pub async fn another_payload_never_resumes_a_journal(store: Arc<dyn Store>) {
    if super::steps::no_journal(&store, "another_payload_never_resumes_a_journal") {
        return;
    }
    let idem = idem(&store);
    let charges = std::sync::Mutex::new(Vec::<u64>::new());
    let mail_fails = AtomicBool::new(true);
    let checkout = |cents: u64| {
        let (charges, mail_fails) = (&charges, &mail_fails);
        idem.dedup_with::<ReplayOk, _, _, _>(&EDGES, "order-1", fp(cents), async move {
            let charged: u64 = step("charge", |_| async move {
                charges.lock().unwrap().push(cents);
                Ok::<_, Error>(cents)
            })
            .await?;
            step("mail", |_| async move {
                if mail_fails.swap(false, Ordering::SeqCst) {
                    return Err(Error::Config("mail server down".into()));
                }
                Ok::<_, Error>(())
            })
            .await?;
            Ok::<_, Error>(format!("charged {charged} cents; asked for {cents}"))
        })
    };
    assert!(checkout(100).await.is_err(), "the mail step failed");
    for _ in 0..2 {
        let other = checkout(999).await;
        assert!(
            matches!(other, Err(Error::PayloadMismatch { .. })),
            "another payload resumed the first one's journal: {other:?}"
        );
    }
    assert_eq!(
        *charges.lock().unwrap(),
        [100],
        "the other payload ran a step"
    );
    assert_eq!(
        checkout(100).await.unwrap(),
        "charged 100 cents; asked for 100"
    );
    assert_eq!(*charges.lock().unwrap(), [100], "the charge ran twice");

    // The same after a lease that ran out: the journal still belongs to its payload.
    let key = idem.key(&EDGES, format_args!("order-2"));
    let dead = ClaimRequest::new(ClaimKind::Dedup, Owner::next(), ms(300)).with_fingerprint(fp(1));
    assert!(matches!(
        store.claim(&key, &dead).await.unwrap(),
        ClaimOutcome::Claimed { .. }
    ));
    let value = crate::codec::encode_step(&key, &1u64).unwrap();
    let journal = store.journal().unwrap();
    assert!(
        journal
            .write_step(&key, dead.owner, "charge", Some(value), ms(60_000))
            .await
            .unwrap()
    );
    tokio::time::sleep(ms(600)).await;
    let other =
        ClaimRequest::new(ClaimKind::Dedup, Owner::next(), ms(30_000)).with_fingerprint(fp(2));
    let answer = store.claim(&key, &other).await.unwrap();
    assert!(
        matches!(answer, ClaimOutcome::OtherPayload { fingerprint } if Some(fingerprint) == fp(1)),
        "a claim of another payload took over the journal: {answer:?}"
    );
    // Nothing was claimed: the original payload takes the record, with its journal.
    let same =
        ClaimRequest::new(ClaimKind::Dedup, Owner::next(), ms(30_000)).with_fingerprint(fp(1));
    let answer = store.claim(&key, &same).await.unwrap();
    assert!(
        matches!(&answer, ClaimOutcome::Claimed { journal: Some(journal), .. } if journal.len() == 1),
        "the original payload did not resume: {answer:?}"
    );
    assert!(store.release(&key, same.owner).await.unwrap());
    // A claim without a fingerprint is accepted, and keeps the journal's payload.
    let blind = ClaimRequest::new(ClaimKind::Dedup, Owner::next(), ms(30_000));
    assert!(matches!(
        store.claim(&key, &blind).await.unwrap(),
        ClaimOutcome::Claimed {
            journal: Some(_),
            ..
        }
    ));
    assert!(
        journal
            .write_step(&key, blind.owner, "mail", None, ms(60_000))
            .await
            .unwrap()
    );
    assert!(store.release(&key, blind.owner).await.unwrap());
    let answer = store.claim(&key, &other).await.unwrap();
    assert!(
        matches!(answer, ClaimOutcome::OtherPayload { .. }),
        "a write without a fingerprint cleared the journal's payload: {answer:?}"
    );

    // Forgotten, the journal is gone and the other payload runs afresh.
    idem.forget(&EDGES, "order-1").await.unwrap();
    assert_eq!(
        checkout(999).await.unwrap(),
        "charged 999 cents; asked for 999"
    );
    assert_eq!(*charges.lock().unwrap(), [100, 999]);
}

/// A two-step body whose steps count their effects per key, for the drop sweeps.
fn two_steps(
    runs: &Arc<[AtomicUsize; 2]>,
    returned: Option<Arc<Notify>>,
) -> impl Future<Output = Result<(usize, usize), Error>> + Send + 'static {
    let runs = runs.clone();
    async move {
        let a = step("a", |_| async {
            let n = runs[0].fetch_add(1, Ordering::SeqCst) + 1;
            if let Some(r) = &returned {
                // The closure has returned once this is seen: its effect happened.
                r.notify_one();
            }
            Ok::<_, Error>(n)
        })
        .await?;
        let b = step("b", |_| async {
            Ok::<_, Error>(runs[1].fetch_add(1, Ordering::SeqCst) + 1)
        })
        .await?;
        Ok((a, b))
    }
}

/// The call is dropped right after a step's closure returned, while its journal write is
/// in flight: a `Notify` inside the closure and a biased `select!`, then a pause swept
/// over 0–500 µs. The retry comes at once, and must replay the finished step: the
/// write finishes in the background, and the release the drop makes waits for it.
pub async fn dropped_while_a_step_is_journaled_never_reruns_it(store: Arc<dyn Store>) {
    if super::steps::no_journal(&store, "dropped_while_a_step_is_journaled_never_reruns_it") {
        return;
    }
    let idem = idem(&store);
    let mut reran = Vec::new();
    for (i, pause_us) in (0..=500u64).step_by(20).enumerate() {
        for round in 0..3 {
            let key = format!("order-{i}-{round}");
            let runs: Arc<[AtomicUsize; 2]> = Arc::default();
            let returned = Arc::new(Notify::new());
            {
                let call = idem.dedup(&EDGES, &key, two_steps(&runs, Some(returned.clone())));
                tokio::pin!(call);
                tokio::select! {
                    biased;
                    _ = &mut call => {}
                    _ = async {
                        returned.notified().await;
                        if pause_us > 0 {
                            tokio::time::sleep(Duration::from_micros(pause_us)).await;
                        }
                    } => {}
                }
            }
            let (a, _) = idem
                .dedup(&EDGES, &key, two_steps(&runs, None))
                .await
                .unwrap();
            assert_eq!(a, 1, "the retry did not replay the first attempt's value");
            if runs[0].load(Ordering::SeqCst) != 1 {
                reran.push((pause_us, round));
            }
        }
    }
    assert!(
        reran.is_empty(),
        "a finished step ran again after a drop at {reran:?} (µs, round)"
    );
}

/// A plain `timeout` over a two-step call, swept over 0–4 ms, then a retry: no step's
/// effect ever happens twice, and no key is left stuck.
pub async fn timeout_sweep_over_steps_never_reruns_one(store: Arc<dyn Store>) {
    if super::steps::no_journal(&store, "timeout_sweep_over_steps_never_reruns_one") {
        return;
    }
    let idem = idem(&store);
    let mut doubled = Vec::new();
    for i in 0..=400u64 {
        let key = format!("order-{i}");
        let runs: Arc<[AtomicUsize; 2]> = Arc::default();
        let limit = Duration::from_micros(i * 10);
        let _ = tokio::time::timeout(limit, idem.dedup(&EDGES, &key, two_steps(&runs, None))).await;
        let got = idem
            .dedup(&EDGES, &key, two_steps(&runs, None))
            .await
            .unwrap();
        assert_eq!(got, (1, 1), "the retry did not end with the first values");
        let counts: Vec<usize> = runs.iter().map(|r| r.load(Ordering::SeqCst)).collect();
        if counts != [1, 1] {
            doubled.push((limit, counts));
        }
    }
    assert!(doubled.is_empty(), "a step ran twice: {doubled:?}");
}

/// Up to three tries of `attempt` within one call, as a body retrying a failed step does.
async fn three_tries<T, F, Fut>(attempt: F) -> Result<T, Error>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<T, Error>>,
{
    let mut last = None;
    for _ in 0..3 {
        match attempt().await {
            Ok(v) => return Ok(v),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap())
}

/// A `Verified` step retried within the same call asks `verify` before it runs again:
/// when `f` failed after its effect landed (the carrier timed out after accepting), and
/// when an earlier attempt left an intent and this call's `verify` failed once.
pub async fn verified_retried_in_call_asks_verify(store: Arc<dyn Store>) {
    if super::steps::no_journal(&store, "verified_retried_in_call_asks_verify") {
        return;
    }
    let idem = idem(&store);
    // The carrier: what shipped, by downstream key.
    let shipped = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let verified = Arc::new(AtomicUsize::new(0));
    let ship = |fail_after: bool, verify_fails: usize| {
        let (shipped, verified) = (shipped.clone(), verified.clone());
        let verify_fails = Arc::new(AtomicUsize::new(verify_fails));
        move || {
            let (shipped, verified, verify_fails) =
                (shipped.clone(), verified.clone(), verify_fails.clone());
            let shipped2 = shipped.clone();
            Verified::new("ship")
                .verify(move |s| async move {
                    verified.fetch_add(1, Ordering::SeqCst);
                    if verify_fails
                        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                        .is_ok()
                    {
                        return Err(Error::Config("carrier lookup timed out".into()));
                    }
                    let found = shipped.lock().unwrap().iter().any(|k| k == s.key());
                    Ok::<_, Error>(found.then_some(7u32))
                })
                .run(move |s| async move {
                    shipped2.lock().unwrap().push(s.key().to_owned());
                    if fail_after {
                        return Err(Error::Config("the carrier accepted, then timed out".into()));
                    }
                    Ok::<_, Error>(7u32)
                })
        }
    };
    // `f` fails after its effect landed; the body retries at once.
    let attempt = ship(true, 0);
    let v = idem
        .dedup(&EDGES, "parcel-1", three_tries(attempt))
        .await
        .unwrap();
    assert_eq!(v, 7);
    assert_eq!(
        shipped.lock().unwrap().len(),
        1,
        "the effect ran twice in one call"
    );
    assert_eq!(verified.load(Ordering::SeqCst), 1, "verify was not asked");

    // An earlier attempt left an intent; this call's `verify` fails once, then the body
    // tries again.
    shipped.lock().unwrap().clear();
    verified.store(0, Ordering::SeqCst);
    let key = idem.key(&EDGES, format_args!("parcel-2"));
    let dead = ClaimRequest::new(ClaimKind::Dedup, Owner::next(), ms(30_000));
    assert!(matches!(
        store.claim(&key, &dead).await.unwrap(),
        ClaimOutcome::Claimed { .. }
    ));
    let journal = store.journal().unwrap();
    assert!(
        journal
            .write_step(&key, dead.owner, "ship", None, ms(60_000))
            .await
            .unwrap()
    );
    assert!(store.release(&key, dead.owner).await.unwrap());
    let attempt = ship(false, 1);
    let v = idem
        .dedup(&EDGES, "parcel-2", three_tries(attempt))
        .await
        .unwrap();
    assert_eq!(v, 7);
    assert_eq!(
        verified.load(Ordering::SeqCst),
        2,
        "the retry did not ask verify"
    );
    assert_eq!(
        shipped.lock().unwrap().len(),
        1,
        "the effect ran more than once"
    );
}

/// A holder that stalls past its lease (its thread blocked, as a paused process is) while
/// a twin takes the key over: once it wakes, it runs no later step. Stalled inside a
/// step's closure, its write is refused and the next step is `LeaseLost`; stalled between
/// steps, its own clock refuses the next step without asking the store.
pub async fn stale_holder_runs_no_later_step(store: Arc<dyn Store>) {
    if super::steps::no_journal(&store, "stale_holder_runs_no_later_step") {
        return;
    }
    static SHORT: Options = Options::dedup("conformance::step_edges_short")
        .lease(Duration::from_millis(400))
        .wait(Duration::from_secs(20));
    let idem = idem(&store);
    for stall_inside in [true, false] {
        let key = format!("order-{stall_inside}");
        let runs: Arc<[AtomicUsize; 2]> = Arc::default();
        let stalled = Arc::new(Notify::new());
        let body = |stall: bool| {
            let (runs, stalled) = (runs.clone(), stalled.clone());
            async move {
                let pause = || {
                    stalled.notify_one();
                    // Blocks the thread (the heartbeat cannot renew), as a paused
                    // process would; the twin runs on another worker.
                    #[allow(clippy::disallowed_methods)]
                    std::thread::sleep(ms(1_500));
                };
                step("s1", |_| async {
                    runs[0].fetch_add(1, Ordering::SeqCst);
                    if stall && stall_inside {
                        pause();
                    }
                    Ok::<_, Error>(())
                })
                .await?;
                if stall && !stall_inside {
                    pause();
                }
                step("s2", |_| async {
                    runs[1].fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Error>(())
                })
                .await?;
                Ok::<_, Error>(())
            }
        };
        let stale = {
            let (idem, key, body) = (idem.clone(), key.clone(), body(true));
            tokio::spawn(async move { idem.dedup(&SHORT, &key, body).await })
        };
        stalled.notified().await;
        idem.dedup(&SHORT, &key, body(false)).await.unwrap();
        let stale = stale.await.unwrap();
        assert!(
            matches!(stale, Err(Error::LeaseLost { .. })),
            "the stale holder went on (stalled inside a step: {stall_inside}): {stale:?}"
        );
        assert_eq!(
            runs[1].load(Ordering::SeqCst),
            1,
            "the stale holder ran its next step (stalled inside a step: {stall_inside})"
        );
        // Only the step in flight when it lost the claim may have run twice.
        let s1 = runs[0].load(Ordering::SeqCst);
        assert_eq!(s1, if stall_inside { 2 } else { 1 });
    }
}

/// In-call retries behave as documented: a step dropped by a `select!` in the body
/// before it was journaled may be tried again under its name; an outer step tried again
/// after its inner step succeeded replays the inner one; a value that does not
/// round-trip is a codec error naming the step, and nothing is journaled.
pub async fn in_call_retries_replay_or_run_once(store: Arc<dyn Store>) {
    if super::steps::no_journal(&store, "in_call_retries_replay_or_run_once") {
        return;
    }
    let idem = idem(&store);
    let runs: Arc<[AtomicUsize; 3]> = Arc::default();
    let (r, ro) = (runs.clone(), runs.clone());
    let out = idem
        .dedup(&EDGES, "retries", async move {
            // Dropped before its closure returned: tried again under its name.
            tokio::select! {
                biased;
                _ = step("slow", |_| async {
                    r[0].fetch_add(1, Ordering::SeqCst);
                    std::future::pending::<Result<u8, Error>>().await
                }) => unreachable!("the step never returns"),
                _ = std::future::ready(()) => {}
            }
            let slow = step("slow", |_| async {
                r[0].fetch_add(1, Ordering::SeqCst);
                Ok::<_, Error>(5u8)
            })
            .await?;
            // An outer step fails after its inner step succeeded; tried again, the inner
            // one replays.
            let mut outer = None;
            for attempt in 0..2 {
                let ro = ro.clone();
                let res = step("outer", |_| async move {
                    let inner = step("inner", |_| async {
                        Ok::<_, Error>(ro[1].fetch_add(1, Ordering::SeqCst) + 1)
                    })
                    .await?;
                    ro[2].fetch_add(1, Ordering::SeqCst);
                    if attempt == 0 {
                        return Err(Error::Config("outer failed".into()));
                    }
                    Ok::<_, Error>(inner)
                })
                .await;
                if let Ok(v) = res {
                    outer = Some(v);
                }
            }
            Ok::<_, Error>((slow, outer))
        })
        .await
        .unwrap();
    assert_eq!(out, (5, Some(1)));
    let counts: Vec<usize> = runs.iter().map(|r| r.load(Ordering::SeqCst)).collect();
    // The dropped try of `slow` had started its effect; the retry ran it again.
    assert_eq!(counts, [2, 1, 2], "slow, inner, outer");

    #[derive(serde::Serialize, serde::Deserialize)]
    struct Lossy {
        #[serde(skip_serializing)]
        #[allow(dead_code)]
        id: u64,
    }
    let lossy = idem
        .dedup(&EDGES, "lossy", async {
            step("lossy", |_| async { Ok::<_, Error>(Lossy { id: 1 }) }).await?;
            Ok::<_, Error>(())
        })
        .await;
    match lossy {
        Err(Error::Codec { message, .. }) => {
            assert!(
                message.contains("\"lossy\""),
                "the error names no step: {message}"
            )
        }
        other => panic!("a value that does not round-trip was accepted: {other:?}"),
    }
    assert!(
        idem.steps(&EDGES, "lossy").await.unwrap().is_empty(),
        "an unreadable value was journaled"
    );
}

/// A journal outlives the work it protects: a body slower than its ttl that then fails
/// still leaves its journal to the retry.
pub async fn journal_outlives_a_slow_failure(store: Arc<dyn Store>) {
    if super::steps::no_journal(&store, "journal_outlives_a_slow_failure") {
        return;
    }
    static BRIEF: Options = Options::dedup("conformance::step_edges_brief")
        .ttl(Duration::from_millis(200))
        .lease(Duration::from_secs(5));
    let idem = idem(&store);
    let runs: Arc<[AtomicUsize; 2]> = Arc::default();
    let first = idem
        .dedup(&BRIEF, "slow", async {
            step("a", |_| async {
                Ok::<_, Error>(runs[0].fetch_add(1, Ordering::SeqCst))
            })
            .await?;
            tokio::time::sleep(ms(700)).await;
            Err::<(), _>(Error::Config("failed after its ttl".into()))
        })
        .await;
    assert!(first.is_err());
    idem.dedup(&BRIEF, "slow", async {
        step("a", |_| async {
            Ok::<_, Error>(runs[0].fetch_add(1, Ordering::SeqCst))
        })
        .await?;
        Ok::<_, Error>(())
    })
    .await
    .unwrap();
    assert_eq!(
        runs[0].load(Ordering::SeqCst),
        1,
        "the journal expired under a slow body"
    );
}
