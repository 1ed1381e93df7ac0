//! Conformance cases of durable steps and the step journal (`Store::journal`).
//!
//! A store without a journal (`Store::journal` answers `None`) skips these cases, and
//! says so on stderr: run the tests with `--nocapture` to see it.

use super::*;
use crate::{StepCtx, Verified, step};

static STEPS: Options = Options::dedup("conformance::steps").wait(Duration::from_secs(20));

/// Whether `store` keeps no step journal; then the case is skipped, loudly.
pub(super) fn no_journal(store: &Arc<dyn Store>, case: &str) -> bool {
    if store.journal().is_some() {
        return false;
    }
    eprintln!(
        "conformance: SKIPPED steps::{case}: the {} store keeps no step journal \
         (Store::journal answers None)",
        store.name()
    );
    true
}

/// A step that counts its runs and returns the count it saw.
async fn counted(name: &str, runs: &AtomicUsize) -> Result<usize, Error> {
    step(name, |_| async {
        Ok::<_, Error>(runs.fetch_add(1, Ordering::SeqCst) + 1)
    })
    .await
}

/// After an `Err`, a retry replays the finished steps (with their values) and runs only
/// the rest; the completed call drops the journal.
pub async fn steps_resume_after_err(store: Arc<dyn Store>) {
    if no_journal(&store, "steps_resume_after_err") {
        return;
    }
    let idem = idem(&store);
    let runs: [AtomicUsize; 3] = Default::default();
    let fail = AtomicBool::new(true);
    let body = || async {
        let a = counted("a", &runs[0]).await?;
        let b = counted("b", &runs[1]).await?;
        if fail.swap(false, Ordering::SeqCst) {
            return Err(Error::Config("the third effect failed".into()));
        }
        let c = counted("c", &runs[2]).await?;
        Ok::<_, Error>((a, b, c))
    };
    let first = idem.dedup(&STEPS, "order-1", body()).await;
    assert!(first.is_err());
    // The released record is gone, its journal is not; operators see it.
    assert!(idem.inspect(&STEPS, "order-1").await.unwrap().is_none());
    let mut kept = idem.steps(&STEPS, "order-1").await.unwrap();
    kept.sort_by(|x, y| x.name.cmp(&y.name));
    let names: Vec<(&str, bool)> = kept.iter().map(|s| (s.name.as_str(), s.done)).collect();
    assert_eq!(names, [("a", true), ("b", true)]);
    assert!(kept.iter().all(|s| s.value_size.is_some_and(|n| n > 0)));
    let second = idem.dedup(&STEPS, "order-1", body()).await.unwrap();
    assert_eq!(second, (1, 1, 1), "the finished steps' values are replayed");
    let counts: Vec<usize> = runs.iter().map(|r| r.load(Ordering::SeqCst)).collect();
    assert_eq!(counts, [1, 1, 1], "a finished step ran again");
    let key = idem.key(&STEPS, format_args!("order-1"));
    let left = store.journal().unwrap().read_journal(&key).await.unwrap();
    assert!(left.is_empty(), "the completion keeps a journal: {left:?}");
    // A failed step is not journaled: it runs again.
    let tries = AtomicUsize::new(0);
    let body = || async {
        let n = step("flaky", |_| async {
            match tries.fetch_add(1, Ordering::SeqCst) {
                0 => Err(Error::Config("declined".into())),
                n => Ok(n),
            }
        })
        .await?;
        Ok::<_, Error>(n)
    };
    assert!(idem.dedup(&STEPS, "order-2", body()).await.is_err());
    assert_eq!(idem.dedup(&STEPS, "order-2", body()).await.unwrap(), 1);
}

/// After the body's future was dropped mid-way, a retry runs only the steps not yet done.
pub async fn steps_resume_after_a_dropped_future(store: Arc<dyn Store>) {
    if no_journal(&store, "steps_resume_after_a_dropped_future") {
        return;
    }
    let idem = idem(&store);
    let runs: Arc<[AtomicUsize; 2]> = Arc::default();
    let reached = Arc::new(Notify::new());
    let task = {
        let (idem, runs, reached) = (idem.clone(), runs.clone(), reached.clone());
        tokio::spawn(async move {
            idem.dedup(&STEPS, "order-1", async move {
                counted("a", &runs[0]).await?;
                reached.notify_one();
                std::future::pending::<()>().await;
                counted("b", &runs[1]).await?;
                Ok::<_, Error>(())
            })
            .await
        })
    };
    reached.notified().await;
    let info = idem
        .inspect(&STEPS, "order-1")
        .await
        .unwrap()
        .expect("held");
    assert_eq!(info.state, crate::inspect::RecordState::InProgress);
    let names: Vec<&str> = info.steps.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["a"], "inspect lists the journal of a held record");
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    let (a, b) = idem
        .dedup(&STEPS, "order-1", async {
            let a = counted("a", &runs[0]).await?;
            let b = counted("b", &runs[1]).await?;
            Ok::<_, Error>((a, b))
        })
        .await
        .unwrap();
    assert_eq!((a, b), (1, 1));
    assert_eq!(
        runs[0].load(Ordering::SeqCst),
        1,
        "the finished step ran again"
    );
}

/// A holder that died past its lease left a journal: the claim that takes the record
/// over gets it and the body resumes; a stale owner cannot write the journal any more.
pub async fn steps_survive_an_expired_lease(store: Arc<dyn Store>) {
    if no_journal(&store, "steps_survive_an_expired_lease") {
        return;
    }
    let idem = idem(&store);
    let key = idem.key(&STEPS, format_args!("order-1"));
    let dead = ClaimRequest::new(ClaimKind::Dedup, Owner::next(), ms(400));
    assert!(matches!(
        store.claim(&key, &dead).await.unwrap(),
        ClaimOutcome::Claimed { .. }
    ));
    let journal = store.journal().unwrap();
    let value = crate::codec::encode_step(&key, &41u32).unwrap();
    assert!(
        journal
            .write_step(&key, dead.owner, "a", Some(value), ms(60_000))
            .await
            .unwrap()
    );
    // Not the holder: refused.
    assert!(
        !journal
            .write_step(&key, Owner::next(), "b", None, ms(60_000))
            .await
            .unwrap()
    );
    let ran = AtomicUsize::new(0);
    let (a, b): (u32, u32) = idem
        .dedup(&STEPS, "order-1", async {
            let a = step("a", |_| async {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Error>(0u32)
            })
            .await?;
            let b = step("b", |_| async { Ok::<_, Error>(a + 1) }).await?;
            Ok::<_, Error>((a, b))
        })
        .await
        .unwrap();
    assert_eq!((a, b, ran.load(Ordering::SeqCst)), (41, 42, 0));
    assert!(
        !journal
            .write_step(&key, dead.owner, "c", None, ms(60_000))
            .await
            .unwrap(),
        "the dead owner wrote the journal after its record completed"
    );
}

/// 50 concurrent duplicates, whose first holder fails after two steps: every step's
/// effect happens once (the failed step twice: once failing, once succeeding).
pub async fn steps_50_duplicates_run_each_step_once(store: Arc<dyn Store>) {
    if no_journal(&store, "steps_50_duplicates_run_each_step_once") {
        return;
    }
    let idem = idem(&store);
    let runs: Arc<[AtomicUsize; 3]> = Arc::default();
    let failed = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(50));
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let (idem, runs, failed, start) =
            (idem.clone(), runs.clone(), failed.clone(), start.clone());
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            idem.dedup(&STEPS, "order-1", async move {
                let a = counted("a", &runs[0]).await?;
                tokio::time::sleep(ms(20)).await;
                let b = step("b", |_| async {
                    if !failed.swap(true, Ordering::SeqCst) {
                        return Err(Error::Config("first try of b fails".into()));
                    }
                    Ok(runs[1].fetch_add(1, Ordering::SeqCst) + 1)
                })
                .await?;
                let c = counted("c", &runs[2]).await?;
                Ok::<_, Error>((a, b, c))
            })
            .await
        }));
    }
    let mut ok = 0;
    for t in tasks {
        if let Ok(v) = t.await.unwrap() {
            assert_eq!(v, (1, 1, 1));
            ok += 1;
        }
    }
    assert!(ok >= 49, "only {ok} of 50 callers got the value");
    let counts: Vec<usize> = runs.iter().map(|r| r.load(Ordering::SeqCst)).collect();
    assert_eq!(counts, [1, 1, 1], "a step's effect happened more than once");
}

/// `StepCtx::key()` is the same on every attempt, differs per step and per key, is
/// printable ASCII of at most 255 characters and carries no raw key material.
pub async fn step_key_is_stable_across_attempts(store: Arc<dyn Store>) {
    if no_journal(&store, "step_key_is_stable_across_attempts") {
        return;
    }
    let idem = idem(&store);
    let seen = std::sync::Mutex::new(Vec::<(String, String)>::new());
    let attempt = |key: &'static str| {
        let seen = &seen;
        idem.dedup(&STEPS, key, async move {
            for name in ["charge", "mail"] {
                let _: Result<(), Error> = step(name, |s: StepCtx| async move {
                    seen.lock()
                        .unwrap()
                        .push((format!("{key}/{name}"), s.key().to_owned()));
                    Err(Error::Config("downstream down".into()))
                })
                .await;
            }
            Err::<(), _>(Error::Config("retry later".into()))
        })
    };
    for _ in 0..3 {
        let _ = attempt("customer@example.com").await;
        let _ = attempt("other@example.com").await;
    }
    let seen = seen.into_inner().unwrap();
    assert_eq!(seen.len(), 12);
    let mut by_step =
        std::collections::BTreeMap::<String, std::collections::BTreeSet<String>>::new();
    for (step, key) in &seen {
        assert!(key.len() <= 255 && !key.is_empty());
        assert!(
            key.bytes().all(|b| b.is_ascii_graphic()),
            "not printable: {key:?}"
        );
        assert!(!key.contains("example"), "raw key material in {key:?}");
        by_step.entry(step.clone()).or_default().insert(key.clone());
    }
    assert!(
        by_step.values().all(|keys| keys.len() == 1),
        "unstable: {by_step:?}"
    );
    let distinct: std::collections::BTreeSet<_> = by_step.values().flatten().collect();
    assert_eq!(
        distinct.len(),
        4,
        "two (key, step) pairs share a key: {by_step:?}"
    );
}

/// A verified step whose attempt was cut off after its intent was journaled: the next
/// attempt asks `verify`; `Some(v)` is the value without running, `None` runs it.
pub async fn verified_step_with_intent_asks_verify(store: Arc<dyn Store>) {
    if no_journal(&store, "verified_step_with_intent_asks_verify") {
        return;
    }
    let idem = idem(&store);
    for (key, found) in [("shipped", Some(7u32)), ("lost", None)] {
        let runs = Arc::new(AtomicUsize::new(0));
        let verified = Arc::new(AtomicUsize::new(0));
        let ship = move |runs: Arc<AtomicUsize>, verified: Arc<AtomicUsize>, hang: bool| async move {
            Verified::new("ship")
                .verify(|_| async move {
                    verified.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Error>(found)
                })
                .run(|_| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    if hang {
                        std::future::pending::<()>().await;
                    }
                    Ok::<_, Error>(9u32)
                })
                .await
        };
        let task = {
            let (idem, runs, verified) = (idem.clone(), runs.clone(), verified.clone());
            tokio::spawn(async move {
                idem.dedup(&STEPS, key, async move { ship(runs, verified, true).await })
                    .await
            })
        };
        for _ in 0..500 {
            if runs.load(Ordering::SeqCst) == 1 {
                break;
            }
            tokio::time::sleep(ms(5)).await;
        }
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "the first attempt never ran"
        );
        task.abort();
        assert!(task.await.unwrap_err().is_cancelled());
        let rkey = idem.key(&STEPS, format_args!("{key}"));
        let journal = store.journal().unwrap().read_journal(&rkey).await.unwrap();
        assert!(
            journal
                .iter()
                .any(|e| e.name == "ship" && e.value.is_none()),
            "no intent journaled: {journal:?}"
        );
        let listed = idem.steps(&STEPS, key).await.unwrap();
        assert!(
            listed
                .iter()
                .any(|s| s.name == "ship" && !s.done && s.value_size.is_none()),
            "the intent is not listed: {listed:?}"
        );
        let v = idem
            .dedup(&STEPS, key, ship(runs.clone(), verified.clone(), false))
            .await
            .unwrap();
        assert_eq!(verified.load(Ordering::SeqCst), 1, "verify was not asked");
        match found {
            Some(f) => {
                assert_eq!(v, f);
                assert_eq!(runs.load(Ordering::SeqCst), 1, "ran although verified");
            }
            None => {
                assert_eq!(v, 9);
                assert_eq!(runs.load(Ordering::SeqCst), 2);
            }
        }
    }
}

/// A step outside a claimed body (no call, a lock's body, a spawned task) is an error
/// and does not run; a step name used twice in one call is an error.
pub async fn step_misuse_is_an_error(store: Arc<dyn Store>) {
    if no_journal(&store, "step_misuse_is_an_error") {
        return;
    }
    static LOCK: Options = Options::lock("conformance::steps_lock");
    let idem = idem(&store);
    let ran = Arc::new(AtomicUsize::new(0));
    let run = |ran: Arc<AtomicUsize>| async move {
        step("a", |_| async move {
            ran.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Error>(1u8)
        })
        .await
    };
    let outside = run(ran.clone()).await;
    assert!(
        matches!(outside, Err(Error::StepOutsideClaim { .. })),
        "{outside:?}"
    );
    let in_lock = idem.lock(&LOCK, "k", run(ran.clone())).await;
    assert!(
        matches!(in_lock, Err(Error::StepOutsideClaim { .. })),
        "{in_lock:?}"
    );
    let spawned = idem
        .dedup(&STEPS, "spawned", async {
            let r = tokio::spawn(run(ran.clone())).await.unwrap();
            Ok::<_, Error>(matches!(r, Err(Error::StepOutsideClaim { .. })))
        })
        .await
        .unwrap();
    assert!(
        spawned,
        "a step in a task spawned from the body is not refused"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 0, "a step ran outside a claim");
    let twice = idem
        .dedup(&STEPS, "twice", async {
            run(ran.clone()).await?;
            run(ran.clone()).await
        })
        .await;
    assert!(matches!(twice, Err(Error::StepReused { .. })), "{twice:?}");
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    // A step that failed may be tried again in the same call, under its own name and
    // so with the same downstream key; once it succeeded, the name is used.
    let tries = AtomicUsize::new(0);
    let keys = std::sync::Mutex::new(Vec::new());
    let retried = idem
        .dedup(&STEPS, "retried", async {
            let mut last = None;
            for _ in 0..3 {
                let (keys, tries) = (&keys, &tries);
                let r = step("charge", |s: StepCtx| async move {
                    keys.lock().unwrap().push(s.key().to_owned());
                    match tries.fetch_add(1, Ordering::SeqCst) {
                        0 => Err(Error::Config("declined".into())),
                        n => Ok(n),
                    }
                })
                .await;
                if let Ok(n) = r {
                    last = Some(n);
                    break;
                }
            }
            let again = step("charge", |_| async { Ok::<_, Error>(9) }).await;
            Ok::<_, Error>((last, matches!(again, Err(Error::StepReused { .. }))))
        })
        .await
        .unwrap();
    assert_eq!(retried, (Some(1), true));
    let keys = keys.into_inner().unwrap();
    assert_eq!(keys.len(), 2);
    assert_eq!(keys[0], keys[1], "a retried step keeps its downstream key");
}

/// A token's consumption runs steps too: an `Err` gives the token back with its journal,
/// and the next consumption replays the finished step.
pub async fn steps_resume_a_returned_token(store: Arc<dyn Store>) {
    if no_journal(&store, "steps_resume_a_returned_token") {
        return;
    }
    static TOKEN: Options = Options::token("conformance::steps_token");
    let idem = idem(&store);
    let token = idem.issue_token(Duration::from_secs(60)).await.unwrap();
    let runs: [AtomicUsize; 2] = Default::default();
    let fail = AtomicBool::new(true);
    let body = || async {
        let a = counted("a", &runs[0]).await?;
        if fail.swap(false, Ordering::SeqCst) {
            return Err(Error::Config("declined".into()));
        }
        let b = counted("b", &runs[1]).await?;
        Ok::<_, Error>((a, b))
    };
    let first = idem
        .consume_token::<ReplayOk, _, _, _>(&TOKEN, &token, body())
        .await;
    assert!(first.is_err());
    let second = idem
        .consume_token::<ReplayOk, _, _, _>(&TOKEN, &token, body())
        .await
        .unwrap();
    assert_eq!(second, (1, 1));
    let counts: Vec<usize> = runs.iter().map(|r| r.load(Ordering::SeqCst)).collect();
    assert_eq!(counts, [1, 1], "a finished step ran again");
}

/// Forgetting a key drops its journal, whether the record is held, released or gone: the
/// next call runs every step afresh, with no stale entries from before.
pub async fn forget_drops_the_journal(store: Arc<dyn Store>) {
    if no_journal(&store, "forget_drops_the_journal") {
        return;
    }
    let idem = idem(&store);
    let runs: [AtomicUsize; 2] = Default::default();
    let fail = AtomicBool::new(true);
    let body = || async {
        let a = counted("a", &runs[0]).await?;
        if fail.swap(false, Ordering::SeqCst) {
            return Err(Error::Config("b failed".into()));
        }
        let b = counted("b", &runs[1]).await?;
        Ok::<_, Error>((a, b))
    };
    // Released with a journal: forget finds no record, and still drops the journal.
    assert!(idem.dedup(&STEPS, "forgotten", body()).await.is_err());
    assert_eq!(idem.steps(&STEPS, "forgotten").await.unwrap().len(), 1);
    assert!(
        !idem.forget(&STEPS, "forgotten").await.unwrap(),
        "no record was live"
    );
    assert!(idem.steps(&STEPS, "forgotten").await.unwrap().is_empty());
    assert_eq!(
        idem.dedup(&STEPS, "forgotten", body()).await.unwrap(),
        (2, 1)
    );
    // Held with a journal: forget removes both.
    let key = idem.key(&STEPS, format_args!("held"));
    let owner = Owner::next();
    let req = ClaimRequest::new(ClaimKind::Dedup, owner, Duration::from_secs(30));
    assert!(matches!(
        store.claim(&key, &req).await.unwrap(),
        ClaimOutcome::Claimed { .. }
    ));
    let journal = store.journal().unwrap();
    let written = journal
        .write_step(
            &key,
            owner,
            "a",
            Some(Bytes::from_static(b"1")),
            Duration::from_secs(30),
        )
        .await
        .unwrap();
    assert!(written);
    assert!(idem.forget(&STEPS, "held").await.unwrap());
    assert!(journal.read_journal(&key).await.unwrap().is_empty());
    assert!(
        !journal
            .write_step(&key, owner, "b", None, Duration::from_secs(30))
            .await
            .unwrap(),
        "the forgotten holder can no longer journal"
    );
    let req = ClaimRequest::new(ClaimKind::Dedup, Owner::next(), Duration::from_secs(30));
    assert!(
        matches!(
            store.claim(&key, &req).await.unwrap(),
            ClaimOutcome::Claimed { .. }
        ),
        "a claim after forget starts afresh, with no journal"
    );
}
