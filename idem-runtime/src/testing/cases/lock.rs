//! Conformance cases of the lock strategy: exclusion and fencing tokens.

use super::*;

/// 40 contenders: never two holders at once, and fences strictly increase in the
/// order the lock was held.
pub async fn lock_excludes_and_fences_increase(store: Arc<dyn Store>) {
    static LOCK: Options = Options::lock("conformance::lock").wait(Duration::from_secs(30));
    let idem = idem(&store);
    let inside = Arc::new(AtomicBool::new(false));
    let order = Arc::new(std::sync::Mutex::new(Vec::<u64>::new()));
    let mut tasks = Vec::new();
    for _ in 0..40 {
        let (idem, inside, order) = (idem.clone(), inside.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            idem.lock(&LOCK, "stock", async move {
                assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                let f = crate::fence().expect("fence inside a lock body");
                order.lock().unwrap().push(f);
                tokio::time::sleep(ms(5)).await;
                inside.store(false, Ordering::SeqCst);
                Ok::<_, Error>(())
            })
            .await
        }));
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    let order = order.lock().unwrap();
    assert_eq!(order.len(), 40);
    assert!(
        order.windows(2).all(|w| w[0] < w[1]),
        "fences not increasing: {order:?}"
    );
}

/// A held lock with `wait = 0` is `Error::Locked`.
pub async fn lock_wait_zero_is_locked(store: Arc<dyn Store>) {
    static LOCK: Options = Options::lock("conformance::lock0");
    static NOWAIT: Options = Options::lock("conformance::lock0").wait(Duration::ZERO);
    let idem = idem(&store);
    let started = Arc::new(Notify::new());
    let finish = Arc::new(Notify::new());
    let holder = {
        let (idem, started, finish) = (idem.clone(), started.clone(), finish.clone());
        tokio::spawn(async move {
            idem.lock(&LOCK, "k", async move {
                started.notify_one();
                finish.notified().await;
                Ok::<_, Error>(())
            })
            .await
        })
    };
    started.notified().await;
    let r = idem.lock(&NOWAIT, "k", async { Ok::<_, Error>(()) }).await;
    assert!(matches!(r, Err(Error::Locked { .. })), "{r:?}");
    finish.notify_one();
    holder.await.unwrap().unwrap();
    idem.lock(&NOWAIT, "k", async { Ok::<_, Error>(()) })
        .await
        .unwrap();
}
