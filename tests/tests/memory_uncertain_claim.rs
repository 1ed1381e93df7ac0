//! A claim that the server applied but whose answer was lost (a timeout, a cut
//! connection), or a completion that failed once, must not keep the key busy for a whole
//! lease.
#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use idem_runtime::store::{BoxFuture, ClaimOutcome, ClaimRequest, Owner};
use idem_runtime::{Error, Idem, Key, MemoryStore, Options, Store};

/// A memory store with two injectable faults, each firing once: the first claim is
/// applied but answered with a store error (a lost answer), and the first completion
/// fails outright (a busy database, say).
struct Flaky {
    inner: MemoryStore,
    lose_claim_answer: AtomicBool,
    fail_complete: AtomicBool,
}

impl Flaky {
    fn new(lose_claim_answer: bool, fail_complete: bool) -> Self {
        Flaky {
            inner: MemoryStore::new(),
            lose_claim_answer: AtomicBool::new(lose_claim_answer),
            fail_complete: AtomicBool::new(fail_complete),
        }
    }
}

impl Store for Flaky {
    fn claim<'a>(
        &'a self,
        key: &'a Key,
        req: &'a ClaimRequest,
    ) -> BoxFuture<'a, Result<ClaimOutcome, Error>> {
        Box::pin(async move {
            let outcome = self.inner.claim(key, req).await?;
            if self.lose_claim_answer.swap(false, Ordering::SeqCst) {
                return Err(Error::store("timed out waiting for the answer"));
            }
            Ok(outcome)
        })
    }
    fn complete<'a>(
        &'a self,
        key: &'a Key,
        owner: Owner,
        value: Bytes,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        if self.fail_complete.swap(false, Ordering::SeqCst) {
            return Box::pin(std::future::ready(Err(Error::store("database is locked"))));
        }
        self.inner.complete(key, owner, value, ttl)
    }
    fn release<'a>(&'a self, key: &'a Key, owner: Owner) -> BoxFuture<'a, Result<bool, Error>> {
        self.inner.release(key, owner)
    }
    fn renew<'a>(
        &'a self,
        key: &'a Key,
        owner: Owner,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        self.inner.renew(key, owner, lease)
    }
    fn issue<'a>(&'a self, key: &'a Key, ttl: Duration) -> BoxFuture<'a, Result<bool, Error>> {
        self.inner.issue(key, ttl)
    }
}

#[tokio::test]
async fn a_lost_claim_answer_does_not_block_the_key_for_a_lease() {
    static OPTS: Options = Options::dedup("uncertain::charge")
        .lease(Duration::from_secs(3600))
        .wait(Duration::ZERO);
    for lock in [false, true] {
        let idem = Idem::builder().store(Flaky::new(true, false)).build();
        let first: Result<u8, Error> = if lock {
            static LOCK: Options = Options::lock("uncertain::lock")
                .lease(Duration::from_secs(3600))
                .wait(Duration::ZERO);
            let r = idem.lock(&LOCK, "k", async { Ok(1) }).await;
            assert!(matches!(r, Err(Error::Store(_))), "{r:?}");
            idem.lock(&LOCK, "k", async { Ok(2) }).await
        } else {
            let r = idem.dedup(&OPTS, "k", async { Ok(1) }).await;
            assert!(matches!(r, Err(Error::Store(_))), "{r:?}");
            idem.dedup(&OPTS, "k", async { Ok(2) }).await
        };
        assert_eq!(
            first.unwrap(),
            2,
            "the key stayed claimed by the lost answer"
        );
    }
}

#[tokio::test]
async fn a_failed_completion_is_recorded_in_the_background() {
    static OPTS: Options = Options::dedup("uncertain::complete")
        .lease(Duration::from_secs(3600))
        .wait(Duration::from_secs(10));
    let idem = Idem::builder().store(Flaky::new(false, true)).build();
    let first: u8 = idem
        .dedup(&OPTS, "k", async { Ok::<_, Error>(1) })
        .await
        .unwrap();
    assert_eq!(
        first, 1,
        "the caller gets its result although recording failed"
    );
    assert_eq!(idem.stats().store_failures, 1);
    // Waits for the claim (the lease is an hour), then replays the value recorded by
    // the background retry: the body does not run again.
    let again: u8 = idem
        .dedup(&OPTS, "k", async { Ok::<_, Error>(2) })
        .await
        .unwrap();
    assert_eq!(again, 1);
}
