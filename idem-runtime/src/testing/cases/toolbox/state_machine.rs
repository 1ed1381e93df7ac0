//! Conformance cases of state-machine moves: transitions, concurrent movers, failing
//! bodies and crashed holders.

use super::*;

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
        Moved::Performed {
            from: None,
            value: ()
        }
    );
    assert_eq!(
        idem.transition(&m, "o", "created").await.unwrap(),
        Moved::AlreadyThere
    );
    let r = idem.transition(&m, "o", "shipped").await;
    assert!(
        matches!(r, Err(Error::InvalidTransition { from: Some(ref f), ref to }) if f == "created" && to == "shipped"),
        "{r:?}"
    );
    assert_eq!(
        idem.transition(&m, "o", "paid").await.unwrap(),
        Moved::Performed {
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
        Moved::AlreadyThere
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
                    Ok(Moved::Performed { value, .. }) => {
                        assert_eq!(value, to);
                        *performed.lock().unwrap().entry(to).or_default() += 1;
                    }
                    Ok(Moved::AlreadyThere) => {}
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
        Moved::Performed {
            from: Some("paid".into()),
            value: 7
        }
    );
    let again = idem
        .transition_with(&m, "o", "shipped", async { Ok::<_, Error>(8) })
        .await
        .unwrap();
    assert_eq!(again, Moved::AlreadyThere, "shipped twice");
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
