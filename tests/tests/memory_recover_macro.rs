//! `#[idempotent(recover, context = [...])]` end to end: a call of a marked function,
//! dropped after its first step, is finished by a recoverer that found the function by
//! itself (no registration), decoded its recorded arguments (owned, `&T`, `&str`) and
//! gave it its context by type; the step already done is replayed, not run again. A
//! recoverer whose context lacks a type leaves the call to one that has it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use idem_runtime::{Error, Idem, MemoryStore, idempotent, step};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
struct Order {
    id: u64,
    cents: u64,
}

/// What the steps did, counted from outside: a dependency, so it is context.
#[derive(Default)]
struct Effects {
    charged: AtomicUsize,
    mailed: AtomicUsize,
    /// Notified once the charge has returned, for the test to drop the call there.
    charged_now: Notify,
    /// The note the mail was sent with.
    note: std::sync::Mutex<String>,
}

#[idempotent(key = "order:{order.id}", recover, context = [effects])]
async fn checkout(
    order: &Order,
    note: &str,
    effects: Arc<Effects>,
    attempt: u32,
) -> Result<u64, Error> {
    let _ = attempt;
    let charged = step("charge", |_| async {
        effects.charged.fetch_add(1, Ordering::SeqCst);
        effects.charged_now.notify_one();
        Ok::<_, Error>(order.cents)
    })
    .await?;
    // Where the test drops the call: the charge made and journaled.
    tokio::task::yield_now().await;
    step("mail", |_| async {
        effects.mailed.fetch_add(1, Ordering::SeqCst);
        *effects.note.lock().unwrap() = note.to_owned();
        Ok::<_, Error>(())
    })
    .await?;
    Ok(charged)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_marked_function_is_found_decoded_given_its_context_and_finished() {
    let idem = Idem::builder()
        .store(MemoryStore::new())
        .namespace("recover-macro")
        .build();
    let effects = Arc::new(Effects::default());
    let order = Order { id: 7, cents: 500 };
    {
        let call = idem.scope(checkout(&order, "thanks", effects.clone(), 1));
        tokio::pin!(call);
        tokio::select! {
            biased;
            _ = &mut call => panic!("the call ended before it was dropped"),
            _ = effects.charged_now.notified() => {}
        }
    }
    assert_eq!(effects.charged.load(Ordering::SeqCst), 1);
    assert_eq!(effects.mailed.load(Ordering::SeqCst), 0);

    // Without an `Arc<Effects>` in its context, this process does not know the function.
    let blind = idem.recoverer().sweep().await.unwrap();
    assert_eq!(
        (blind.found, blind.unknown, blind.recovered),
        (1, 1, 0),
        "{blind:?}"
    );

    let swept = idem
        .recoverer()
        .provide(effects.clone())
        .sweep()
        .await
        .unwrap();
    assert_eq!(swept.recovered, 1, "{swept:?}");
    assert_eq!(
        effects.charged.load(Ordering::SeqCst),
        1,
        "the charge ran again"
    );
    assert_eq!(effects.mailed.load(Ordering::SeqCst), 1);
    assert_eq!(*effects.note.lock().unwrap(), "thanks", "the &str argument");

    // A caller now gets the stored result; nothing runs.
    let again = idem
        .scope(checkout(&order, "thanks", effects.clone(), 2))
        .await
        .unwrap();
    assert_eq!(again, 500);
    assert_eq!(effects.charged.load(Ordering::SeqCst), 1);
    assert_eq!(effects.mailed.load(Ordering::SeqCst), 1);
}
