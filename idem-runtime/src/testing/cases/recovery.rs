//! Recovery: an abandoned recoverable call is finished by a recoverer, each finished
//! step replayed, each call run by one recoverer; an `Err` is not recovered, an unknown
//! function is left alone, and the last attempt parks the call.

use super::*;
use crate::recover::Sweep;
use crate::step;
use crate::store::{Recover, RecoverableCall};

static RECOVER: Options = Options::dedup("conformance::recovery").wait(Duration::from_secs(20));

/// Whether the store keeps no recovery index (then every case here is skipped, loudly).
fn no_recovery(store: &Arc<dyn Store>, case: &str) -> bool {
    let none = store.recovery().is_none();
    if none {
        eprintln!("{case}: skipped, {} keeps no recovery index", store.name());
    }
    none
}

#[allow(clippy::manual_async_fn)] // `Send + 'static` spelled out: a recoverer spawns it
/// A three-step order: charge, reserve, mail, each counted in `effects`; `stop` is
/// notified once the charge has returned, so a caller can drop the call right there.
fn order(
    effects: Arc<[AtomicUsize; 3]>,
    stop: Option<Arc<Notify>>,
) -> impl Future<Output = Result<usize, Error>> + Send + 'static {
    async move {
        let charge = step("charge", |_| async {
            let n = effects[0].fetch_add(1, Ordering::SeqCst) + 1;
            if let Some(s) = &stop {
                s.notify_one();
            }
            Ok::<_, Error>(n)
        })
        .await?;
        if stop.is_some() {
            // A point where the caller can drop the call, the charge made and journaled.
            tokio::task::yield_now().await;
        }
        step("reserve", |_| async {
            Ok::<_, Error>(effects[1].fetch_add(1, Ordering::SeqCst))
        })
        .await?;
        step("mail", |_| async {
            Ok::<_, Error>(effects[2].fetch_add(1, Ordering::SeqCst))
        })
        .await?;
        Ok(charge)
    }
}

/// A recoverer of `idem` that knows the order function, on `effects`.
fn recoverer(idem: &Idem, effects: &Arc<[AtomicUsize; 3]>) -> crate::recover::Recoverer {
    let (idem2, effects) = (idem.clone(), effects.clone());
    idem.recoverer()
        .backoff(ms(1))
        .register(&RECOVER, move |id: String, _ctx| {
            let (idem, effects) = (idem2.clone(), effects.clone());
            async move {
                idem.dedup_recoverable(&RECOVER, &id, &id, order(effects, None))
                    .await
            }
        })
}

/// Drops the call of order `id` right after its charge returned.
async fn drop_after_charge(idem: &Idem, id: &str, effects: &Arc<[AtomicUsize; 3]>) {
    let stop = Arc::new(Notify::new());
    {
        let call =
            idem.dedup_recoverable(&RECOVER, id, id, order(effects.clone(), Some(stop.clone())));
        tokio::pin!(call);
        tokio::select! {
            biased;
            _ = &mut call => panic!("the call ended before it was dropped"),
            _ = stop.notified() => {}
        }
    }
    // A remote store gives the claim back on a task of its own: wait until it has.
    let key = idem.key(&RECOVER, format_args!("{id}"));
    for _ in 0..500 {
        let calls = recoverable(idem).await;
        if calls
            .iter()
            .any(|c| c.digest == *key.digest() && c.abandoned)
        {
            return;
        }
        tokio::time::sleep(ms(10)).await;
    }
    panic!("the dropped call of {id} was never given back");
}

/// The namespace's recoverable calls.
async fn recoverable(idem: &Idem) -> Vec<RecoverableCall> {
    let index = idem.store().recovery().unwrap();
    index.list(Some(idem.namespace()), 1000).await.unwrap()
}

fn counts(effects: &[AtomicUsize; 3]) -> [usize; 3] {
    std::array::from_fn(|i| effects[i].load(Ordering::SeqCst))
}

/// Sweeps until nothing is due (bounded), summing what the sweeps did.
async fn sweep_until_quiet(make: impl Fn() -> crate::recover::Recoverer) -> Sweep {
    let mut total = Sweep::default();
    for _ in 0..50 {
        let s = make().sweep().await.unwrap();
        total.found += s.found;
        total.recovered += s.recovered;
        total.failed += s.failed;
        total.parked += s.parked;
        total.unknown += s.unknown;
        if s.found == s.unknown {
            break;
        }
    }
    total
}

/// A call dropped after its first step is finished by a recoverer: the charge is
/// replayed from the journal, the other steps run once, and a later caller gets the
/// result without running anything.
pub async fn recovery_finishes_a_dropped_call(store: Arc<dyn Store>) {
    if no_recovery(&store, "recovery_finishes_a_dropped_call") {
        return;
    }
    let idem = idem(&store);
    let effects: Arc<[AtomicUsize; 3]> = Arc::default();
    drop_after_charge(&idem, "o-1", &effects).await;
    let listed = recoverable(&idem).await;
    assert_eq!(
        listed.len(),
        1,
        "the abandoned call is not listed: {listed:?}"
    );
    assert_eq!(listed[0].steps, 1, "the charge is journaled: {listed:?}");
    assert!(
        listed[0].abandoned && listed[0].parked.is_none(),
        "{listed:?}"
    );
    let key = idem.key(&RECOVER, format_args!("o-1"));
    let mut one = idem.store().recovery().unwrap().call(&key).await.unwrap();
    // How long it has been due moves on between the two reads.
    if let Some(one) = &mut one {
        one.overdue = listed[0].overdue;
    }
    assert_eq!(
        one.as_ref(),
        listed.first(),
        "one call's state differs from the list's"
    );
    let swept = sweep_until_quiet(|| recoverer(&idem, &effects)).await;
    assert_eq!(swept.recovered, 1, "{swept:?}");
    assert_eq!(
        counts(&effects),
        [1, 1, 1],
        "a step ran twice, or not at all"
    );
    let replayed = idem
        .dedup_recoverable(&RECOVER, "o-1", "o-1", order(effects.clone(), None))
        .await
        .unwrap();
    assert_eq!(replayed, 1);
    assert_eq!(
        counts(&effects),
        [1, 1, 1],
        "the caller after recovery ran a step"
    );
    let left = recoverable(&idem).await;
    assert!(
        left.is_empty(),
        "a completed call is still listed: {left:?}"
    );
    let gone = idem.store().recovery().unwrap().call(&key).await.unwrap();
    assert!(gone.is_none(), "{gone:?}");
}

/// A call whose owner vanished (its claim made with the arguments, then never
/// renewed, completed nor released: a killed process) is recovered once its lease ran
/// out by the store's clock, and not before.
pub async fn recovery_takes_over_an_expired_lease(store: Arc<dyn Store>) {
    if no_recovery(&store, "recovery_takes_over_an_expired_lease") {
        return;
    }
    let idem = idem(&store);
    let effects: Arc<[AtomicUsize; 3]> = Arc::default();
    let key = idem.key(&RECOVER, format_args!("o-2"));
    let args = crate::recover::encode_args(&key, "o-2").unwrap();
    let req = ClaimRequest::new(ClaimKind::Dedup, Owner::next(), ms(1000))
        .with_recover(Some(Recover::new(args, Duration::from_secs(60))));
    let claimed = idem.store().claim(&key, &req).await.unwrap();
    assert!(
        matches!(claimed, ClaimOutcome::Claimed { .. }),
        "{claimed:?}"
    );
    // Held (its lease runs): not taken. One round trip, well inside the lease.
    let early = idem
        .store()
        .recovery()
        .unwrap()
        .take(&key, ms(1))
        .await
        .unwrap();
    assert!(early.is_none(), "a live claim was taken: {early:?}");
    tokio::time::sleep(ms(1200)).await;
    let swept = sweep_until_quiet(|| recoverer(&idem, &effects)).await;
    assert_eq!(swept.recovered, 1, "{swept:?}");
    assert_eq!(counts(&effects), [1, 1, 1]);
}

/// Many abandoned calls and four recoverers sweeping at once: each call runs to its
/// end exactly once.
pub async fn two_recoverers_never_run_one_call_twice(store: Arc<dyn Store>) {
    if no_recovery(&store, "two_recoverers_never_run_one_call_twice") {
        return;
    }
    let idem = idem(&store);
    let calls: Vec<Arc<[AtomicUsize; 3]>> = (0..24).map(|_| Arc::default()).collect();
    for (i, effects) in calls.iter().enumerate() {
        drop_after_charge(&idem, &format!("o-{i}"), effects).await;
    }
    // One recoverer per call's counters would not share; instead each recoverer knows
    // every order through one function that picks the counters by id.
    let (owner, shared) = (idem.clone(), calls.clone());
    let make = move || {
        let (idem2, calls) = (owner.clone(), shared.clone());
        owner.recoverer().backoff(ms(1)).concurrency(8).register(
            &RECOVER,
            move |id: String, _ctx| {
                let (idem, calls) = (idem2.clone(), calls.clone());
                async move {
                    let i: usize = id[2..].parse().unwrap();
                    idem.dedup_recoverable(&RECOVER, &id, &id, order(calls[i].clone(), None))
                        .await
                }
            },
        )
    };
    let sweeps: Vec<_> = (0..4)
        .map(|_| tokio::spawn(sweep_until_quiet(make.clone())))
        .collect();
    let mut recovered = 0;
    for s in sweeps {
        recovered += s.await.unwrap().recovered;
    }
    assert!(recovered >= 24, "recovered {recovered} of 24");
    for (i, effects) in calls.iter().enumerate() {
        assert_eq!(
            counts(effects),
            [1, 1, 1],
            "order {i} ran a step twice or not at all"
        );
    }
}

/// A call whose body returned `Err` is not recovered: its caller got the error.
pub async fn an_err_is_not_recovered(store: Arc<dyn Store>) {
    if no_recovery(&store, "an_err_is_not_recovered") {
        return;
    }
    let idem = idem(&store);
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    let failed: Result<(), Error> = idem
        .dedup_recoverable(&RECOVER, "o-err", "o-err", async move {
            r.fetch_add(1, Ordering::SeqCst);
            Err(Error::Unsupported("declined"))
        })
        .await;
    assert!(failed.is_err());
    let effects: Arc<[AtomicUsize; 3]> = Arc::default();
    let swept = recoverer(&idem, &effects).sweep().await.unwrap();
    assert_eq!(swept.found, 0, "a failed call was found due: {swept:?}");
    assert_eq!(counts(&effects), [0, 0, 0]);
    let listed = recoverable(&idem).await;
    assert!(listed.is_empty(), "{listed:?}");
}

/// A due call of a function the recoverer does not know is counted and left, and a
/// recoverer that knows it finishes it.
pub async fn an_unknown_function_is_left_alone(store: Arc<dyn Store>) {
    if no_recovery(&store, "an_unknown_function_is_left_alone") {
        return;
    }
    let idem = idem(&store);
    let effects: Arc<[AtomicUsize; 3]> = Arc::default();
    drop_after_charge(&idem, "o-3", &effects).await;
    let blind = idem.recoverer().sweep().await.unwrap();
    assert_eq!((blind.found, blind.unknown), (1, 1), "{blind:?}");
    let listed: Vec<RecoverableCall> = recoverable(&idem).await;
    assert_eq!(listed.len(), 1);
    assert_eq!(
        listed[0].attempts, 0,
        "an unknown function's call was taken"
    );
    let swept = sweep_until_quiet(|| recoverer(&idem, &effects)).await;
    assert_eq!(swept.recovered, 1, "{swept:?}");
    assert_eq!(counts(&effects), [1, 1, 1]);
}

/// Attempts that die are bounded: after the last, the call is parked, listed with why,
/// and never taken again. Arguments that no longer decode park the call at once.
pub async fn the_last_attempt_parks_the_call(store: Arc<dyn Store>) {
    if no_recovery(&store, "the_last_attempt_parks_the_call") {
        return;
    }
    let idem = idem(&store);
    let effects: Arc<[AtomicUsize; 3]> = Arc::default();
    drop_after_charge(&idem, "o-4", &effects).await;
    // Every attempt is dropped once its body started, as a recoverer's process dying
    // would; its claim is then abandoned (on a remote store, in the background).
    let dying = || {
        let idem2 = idem.clone();
        idem.recoverer().backoff(ms(1)).max_attempts(2).register(
            &RECOVER,
            move |id: String, _ctx| {
                let idem = idem2.clone();
                async move {
                    let started = Arc::new(Notify::new());
                    let body_started = started.clone();
                    let call = idem.dedup_recoverable(&RECOVER, &id, &id, async move {
                        body_started.notify_one();
                        std::future::pending::<Result<usize, Error>>().await
                    });
                    tokio::select! {
                        out = call => out,
                        _ = started.notified() => Err(Error::Unsupported("dropped")),
                    }
                }
            },
        )
    };
    let mut parked = 0;
    for _ in 0..200 {
        parked += dying().sweep().await.unwrap().parked;
        if parked > 0 {
            break;
        }
        tokio::time::sleep(ms(10)).await;
    }
    assert_eq!(parked, 1, "the call was not parked after its last attempt");
    let listed = recoverable(&idem).await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert!(listed[0].parked.is_some(), "{listed:?}");
    assert_eq!(listed[0].attempts, 3, "{listed:?}");
    let after = recoverer(&idem, &effects).sweep().await.unwrap();
    assert_eq!(after.found, 0, "a parked call was found due: {after:?}");

    // Arguments that do not decode into the function's parameters.
    let key = idem.key(&RECOVER, format_args!("o-5"));
    let args = crate::recover::encode_args(&key, &(5u8, 6u8)).unwrap();
    let req = ClaimRequest::new(ClaimKind::Dedup, Owner::next(), ms(100))
        .with_recover(Some(Recover::new(args, Duration::from_secs(60))));
    idem.store().claim(&key, &req).await.unwrap();
    assert!(
        idem.store()
            .recovery()
            .unwrap()
            .abandon(&key, req.owner)
            .await
            .unwrap()
    );
    let swept = recoverer(&idem, &effects).sweep().await.unwrap();
    assert_eq!(swept.parked, 1, "{swept:?}");
    let listed = recoverable(&idem).await;
    let bad = listed.iter().find(|c| c.digest == *key.digest()).unwrap();
    assert!(bad.parked.as_deref().unwrap().contains("decode"), "{bad:?}");
}
