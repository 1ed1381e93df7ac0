//! Cancellation on the memory store is synchronous: the claim is free the moment the
//! future is dropped, even for a caller that will not wait at all.
#![allow(clippy::unwrap_used)]

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Waker};
use std::time::Duration;

use idem_runtime::{Error, Idem, MemoryStore, Options};

static LONG: Options = Options::dedup("cancel::long").lease(Duration::from_secs(3600));
static NOWAIT: Options = Options::dedup("cancel::long").wait(Duration::ZERO);

#[tokio::test]
async fn dropped_call_frees_its_key_at_once() {
    let idem = Idem::builder().store(MemoryStore::new()).build();
    {
        let mut call = pin!(idem.dedup(&LONG, "k", async {
            std::future::pending::<()>().await;
            Ok::<u8, Error>(1)
        }));
        // One poll: the claim is taken and the body is now pending.
        let mut cx = Context::from_waker(Waker::noop());
        assert!(call.as_mut().poll(&mut cx).is_pending());
        let busy: Result<u8, Error> = idem.dedup(&NOWAIT, "k", async { Ok(2) }).await;
        assert!(matches!(busy, Err(Error::InProgress { .. })), "{busy:?}");
    } // dropped here, mid-body
    let r: u8 = idem
        .dedup(&NOWAIT, "k", async { Ok::<_, Error>(3) })
        .await
        .unwrap();
    assert_eq!(r, 3, "the key was not free right after the drop");
}

#[tokio::test]
async fn panicking_body_frees_its_key() {
    let idem = Idem::builder().store(MemoryStore::new()).build();
    let task = {
        let idem = idem.clone();
        tokio::spawn(async move {
            idem.dedup(&LONG, "k", async {
                if true {
                    panic!("the body panicked");
                }
                Ok::<u8, Error>(1)
            })
            .await
        })
    };
    assert!(task.await.unwrap_err().is_panic());
    let r: u8 = idem
        .dedup(&NOWAIT, "k", async { Ok::<_, Error>(4) })
        .await
        .unwrap();
    assert_eq!(r, 4);
}
