//! An option left out of `#[idempotent]` takes the runtime's default: the macro keeps no
//! copy of `DEFAULT_TTL` or `DEFAULT_LEASE`, so a record written through the attribute
//! lives exactly as long as one written through `Options::dedup`. Read from the store's
//! own record (what it reports it will keep), not from elapsed time; the bounds leave
//! an hour of slack on the ttl and half the lease, so a slow machine cannot fail them.

use std::time::Duration;

use idem_runtime::inspect::RecordState;
use idem_runtime::options::{DEFAULT_LEASE, DEFAULT_TTL};
use idem_runtime::{Error, Idem, MemoryStore, Options, idempotent};

static PLAIN: Options = Options::dedup(concat!(module_path!(), "::plain"));

#[idempotent(key = "plain:{n}", idem = idem)]
async fn plain(idem: &Idem, n: u64) -> Result<u64, Error> {
    // While the body runs, its claim's lease is the runtime's default.
    let info = idem
        .inspect(&PLAIN, format_args!("plain:{n}"))
        .await?
        .expect("the claim is there while the body runs");
    assert_eq!(info.state, RecordState::InProgress);
    let lease = info.lease_left.expect("an in-progress claim has a lease");
    assert!(
        lease <= DEFAULT_LEASE && lease > DEFAULT_LEASE / 2,
        "lease {lease:?}, default {DEFAULT_LEASE:?}"
    );
    Ok(n)
}

#[tokio::test]
async fn a_record_without_options_lives_by_the_runtime_defaults() -> Result<(), Error> {
    let idem = Idem::builder()
        .store(MemoryStore::new())
        .namespace("defaults-tests")
        .build();
    assert_eq!(plain(&idem, 1).await?, 1);
    let info = idem
        .inspect(&PLAIN, "plain:1")
        .await?
        .expect("the completed record");
    assert_eq!(info.state, RecordState::Completed);
    let ttl = info.ttl_left.expect("a completed record has a ttl");
    assert!(
        ttl <= DEFAULT_TTL && ttl > DEFAULT_TTL - Duration::from_secs(3600),
        "ttl {ttl:?}, default {DEFAULT_TTL:?}"
    );
    Ok(())
}
