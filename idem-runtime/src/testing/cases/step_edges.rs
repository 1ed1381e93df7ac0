//! Conformance cases of durable steps at their edges, tried as a hostile caller would:
//! another payload after a release, a call dropped while a step's journal write is in
//! flight, in-call retries, a holder that lost its claim.

use super::*;
use crate::step;

static EDGES: Options = Options::dedup("conformance::step_edges").wait(Duration::from_secs(20));

fn fp(n: u64) -> Option<Fingerprint> {
    let mut b = crate::FingerprintBuilder::new();
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
        matches!(&answer, ClaimOutcome::Resumed { journal } if journal.len() == 1),
        "the original payload did not resume: {answer:?}"
    );
    assert!(store.release(&key, same.owner).await.unwrap());
    // A claim without a fingerprint is accepted, and keeps the journal's payload.
    let blind = ClaimRequest::new(ClaimKind::Dedup, Owner::next(), ms(30_000));
    assert!(matches!(
        store.claim(&key, &blind).await.unwrap(),
        ClaimOutcome::Resumed { .. }
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
