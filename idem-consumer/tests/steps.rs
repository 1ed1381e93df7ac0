//! Durable steps in a consumer's handler: a redelivery after a failed handler replays
//! the steps that finished and runs only the rest. No broker: toy deliveries on the
//! in-memory store.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idem_consumer::{Consumer, Message, Outcome};
use idem_runtime::store::BoxError;
use idem_runtime::{Error, Idem, MemoryStore, Options, StepCtx, step};

mod common;
use common::{Toy, toy};

#[tokio::test]
async fn a_redelivery_runs_only_the_steps_not_yet_done() {
    let idem = Idem::builder().store(MemoryStore::new()).build();
    static CREDIT: Options = Options::dedup("ledger::credit_in_steps");
    let (debits, credits, keys) = (
        Arc::new(AtomicU32::new(0)),
        Arc::new(AtomicU32::new(0)),
        Arc::new(std::sync::Mutex::new(Vec::new())),
    );
    let (d, c, k) = (debits.clone(), credits.clone(), keys.clone());
    let consumer = Consumer::builder(idem, CREDIT.clone())
        .max_attempts(5)
        .backoff(Duration::from_millis(1), Duration::from_millis(1))
        .handler(move |_msg: Message| {
            let (d, c, k) = (d.clone(), c.clone(), k.clone());
            async move {
                let debit: u32 = step("debit", |s: StepCtx| async move {
                    k.lock().unwrap().push(s.key().to_owned());
                    Ok::<_, Error>(d.fetch_add(1, Ordering::SeqCst) + 1)
                })
                .await?;
                // The credit fails on the first delivery only.
                step("credit", |_| async move {
                    match c.fetch_add(1, Ordering::SeqCst) {
                        0 => Err(Error::Config("the ledger is down".into())),
                        _ => Ok(()),
                    }
                })
                .await?;
                assert_eq!(debit, 1, "the debit's value is replayed, not rerun");
                Ok::<(), BoxError>(())
            }
        });
    assert_eq!(consumer.process(toy("m-1")).await, Outcome::Retry);
    let redelivered = Toy {
        attempt: 2,
        ..toy("m-1")
    };
    assert_eq!(consumer.process(redelivered).await, Outcome::Processed);
    assert_eq!(debits.load(Ordering::SeqCst), 1, "the debit ran once");
    assert_eq!(
        credits.load(Ordering::SeqCst),
        2,
        "the credit failed, then ran"
    );
    let again = Toy {
        attempt: 3,
        ..toy("m-1")
    };
    assert_eq!(consumer.process(again).await, Outcome::Duplicate);
    assert_eq!(debits.load(Ordering::SeqCst), 1);
    assert_eq!(keys.lock().unwrap().len(), 1);
}
