//! `#[idempotent(idem = ...)]`: a function names the runtime it uses, as a service that
//! keeps its runtime in its state does (axum's `State`), with no `init` and no scope.
//! This binary never calls `init`, so the only runtimes are the ones the tests name.

use std::sync::atomic::{AtomicUsize, Ordering};

use idem_runtime::{Error, Idem, MemoryStore, Options, idempotent};

fn runtime() -> Idem {
    Idem::builder()
        .store(MemoryStore::new())
        .namespace("given-tests")
        .build()
}

/// The record's options, as the attribute names them (module path and function).
static CHARGE: Options = Options::dedup(concat!(module_path!(), "::charge"));

struct Payments {
    idem: Idem,
    runs: AtomicUsize,
}

impl Payments {
    fn new() -> Self {
        Payments {
            idem: runtime(),
            runs: AtomicUsize::new(0),
        }
    }

    #[idempotent(key = "charge:{order}", idem = self.idem)]
    async fn charge(&self, order: u64, cents: u64) -> Result<u64, Error> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        Ok(cents)
    }
}

#[tokio::test]
async fn a_method_uses_the_runtime_of_its_state() -> Result<(), Error> {
    let payments = Payments::new();
    assert_eq!(payments.charge(7, 100).await?, 100);
    assert_eq!(payments.charge(7, 999).await?, 100, "replayed");
    assert_eq!(payments.runs.load(Ordering::SeqCst), 1);
    // The record is in that runtime's store.
    let record = payments.idem.inspect(&CHARGE, "charge:7").await?;
    assert!(record.is_some(), "the given runtime holds the record");
    Ok(())
}

#[tokio::test]
async fn two_runtimes_do_not_share_records() -> Result<(), Error> {
    let (a, b) = (Payments::new(), Payments::new());
    assert_eq!(a.charge(8, 100).await?, 100);
    assert_eq!(b.charge(8, 200).await?, 200, "b has no record of a's call");
    assert_eq!(a.charge(8, 300).await?, 100);
    assert_eq!(b.charge(8, 400).await?, 200);
    assert_eq!(a.runs.load(Ordering::SeqCst), 1);
    assert_eq!(b.runs.load(Ordering::SeqCst), 1);
    Ok(())
}

#[tokio::test]
async fn the_named_runtime_wins_over_an_enclosing_scope() -> Result<(), Error> {
    let payments = Payments::new();
    let other = runtime();
    other.scope(payments.charge(9, 100)).await?;
    assert!(payments.idem.inspect(&CHARGE, "charge:9").await?.is_some());
    assert!(other.inspect(&CHARGE, "charge:9").await?.is_none());
    Ok(())
}

static SHIPS: AtomicUsize = AtomicUsize::new(0);

struct AppState {
    idem: Idem,
}

/// A free function given the state, as an axum handler is: a reference expression.
#[idempotent(key = "ship:{order}", idem = &state.idem)]
async fn ship(state: &AppState, order: u64) -> Result<u64, Error> {
    SHIPS.fetch_add(1, Ordering::SeqCst);
    Ok(order * 10)
}

/// An owned `Idem` works too: here a clone, made from a parameter the body also uses.
#[idempotent(key = "label:{order}", idem = idem.clone())]
async fn label(idem: Idem, order: u64) -> Result<String, Error> {
    Ok(format!("{}:{order}", idem.namespace()))
}

#[tokio::test]
async fn a_free_function_takes_a_reference_or_an_owned_runtime() -> Result<(), Error> {
    let state = AppState { idem: runtime() };
    assert_eq!(ship(&state, 4).await?, 40);
    assert_eq!(ship(&state, 4).await?, 40);
    assert_eq!(SHIPS.load(Ordering::SeqCst), 1);
    let ships = Options::dedup(concat!(module_path!(), "::ship"));
    assert!(state.idem.inspect(&ships, "ship:4").await?.is_some());

    let idem = runtime();
    assert_eq!(label(idem.clone(), 5).await?, "given-tests:5");
    let labels = Options::dedup(concat!(module_path!(), "::label"));
    assert!(idem.inspect(&labels, "label:5").await?.is_some());
    Ok(())
}
