//! The toolbox beside the three strategies: Bloom pre-filters, optimistic (versioned)
//! values and state machines, each with its guide in [`strategy`](crate::strategy), and
//! `Idem`'s methods for them (their flows live beside their types in `strategy/`).

use std::fmt;
use std::future::Future;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::{Error, Idem, Key, Options};

pub use crate::strategy::bloom::{BloomFilter, BloomStats, Filtered, Verdict};
pub use crate::strategy::optimistic::{
    IsConflict, Optimistic, Retry, Versioned, retry_on_conflict,
};
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite")))
)]
pub use crate::strategy::state_machine::StateColumn;
#[allow(deprecated)]
pub use crate::strategy::state_machine::Step;
pub use crate::strategy::state_machine::{Moved, StateMachine, StateMachineBuilder};

/// The toolbox: Bloom-filtered dedup, state machines and versioned values.
impl Idem {
    /// Dedup of a message id (or any key) with `filter` as a pre-filter: the semantics of
    /// [`Idem::dedup`] (the body runs once per key while its record lives; later calls
    /// replay its value), plus the filter's [`Verdict`], given to the body and returned.
    ///
    /// Steps: one atomic insert into the filter, then the exact dedup record, which alone
    /// decides whether the body runs; so a false positive never drops a new message. If
    /// the filter's store fails, the call goes on as a `Maybe`. Cost: one filter step
    /// more than [`Idem::dedup`] (none with an in-process filter).
    ///
    /// Where it saves work: when the body runs, its exact record was absent, which for a
    /// long-lived stream does not prove the message new: its record may have expired (a
    /// late redelivery). A body that must not apply a message twice then checks its own
    /// data (a ledger, the orders table) before acting. The verdict tells it when that
    /// check can be skipped: `New` means the filter never saw the id in its lifetime,
    /// which can be much longer than the records' ttl. Only `Maybe` needs the check.
    ///
    /// `New` also rules out a twin delivery that got ahead: a twin that inserted after
    /// this call (and heard "maybe") may claim first and run, but its record then lives
    /// at least `ttl` past this call's insert. So a body that starts within half the
    /// record `ttl` of the filter's answer is told `New`; one that starts later (it waited
    /// that long for the key) is told `Maybe`, and the returned verdict says so too.
    /// `New` is only as wide as the filter: a filter in one process' memory has seen
    /// only that process' ids.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), idem_runtime::Error> {
    /// use idem_runtime::{Error, Idem, Options};
    /// use idem_runtime::toolbox::{BloomFilter, Verdict};
    /// static HANDLE: Options = Options::dedup("billing::on_event");
    /// let idem = Idem::builder().build();
    /// let seen = BloomFilter::new(&idem, "billing::events", 100_000, 0.01)?;
    /// let apply = |verdict: Verdict| async move {
    ///     if verdict == Verdict::Maybe {
    ///         // look the event up in the ledger before applying it
    ///     }
    ///     Ok::<_, Error>(1)
    /// };
    /// let first = idem.dedup_filtered(&HANDLE, &seen, "evt-7", apply).await?;
    /// let again = idem.dedup_filtered(&HANDLE, &seen, "evt-7", apply).await?;
    /// assert_eq!((first.ran, first.verdict), (true, Verdict::New));
    /// assert_eq!((again.value, again.ran, again.verdict), (1, false, Verdict::Maybe));
    /// # Ok(()) }
    /// ```
    pub fn dedup_filtered<'a, T, E, B, F>(
        &'a self,
        opts: &'a Options,
        filter: &'a BloomFilter,
        key: impl fmt::Display,
        body: B,
    ) -> impl Future<Output = Result<Filtered<T>, E>> + 'a
    where
        T: Serialize + DeserializeOwned + 'a,
        E: From<Error> + 'a,
        B: FnOnce(Verdict) -> F + 'a,
        F: Future<Output = Result<T, E>> + 'a,
    {
        crate::strategy::bloom::dedup_filtered(self, opts, filter, key, body)
    }

    /// The record key of `key` under `machine`.
    ///
    /// ```
    /// use idem_runtime::Idem;
    /// use idem_runtime::toolbox::StateMachine;
    /// let m = StateMachine::builder("shop::order").states(["new"]).initial("new").build().unwrap();
    /// let idem = Idem::builder().build();
    /// assert_eq!(idem.state_key(&m, 1), idem.state_key(&m, "1"));
    /// ```
    pub fn state_key(&self, machine: &StateMachine, key: impl fmt::Display) -> Key {
        // Dedup options only lend their scope (the name) to the key.
        self.key(&Options::dedup(machine.name()), format_args!("{key}"))
    }

    /// The state of `key` (`None`: no state yet). A move held by a running body is not
    /// visible: the state is the one before it until the body succeeds.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), idem_runtime::Error> {
    /// use idem_runtime::Idem;
    /// use idem_runtime::toolbox::StateMachine;
    /// let ticket = StateMachine::builder("help::ticket")
    ///     .states(["open", "closed"])
    ///     .initial("open")
    ///     .allow("open", ["closed"])
    ///     .build()?;
    /// let idem = Idem::builder().build();
    /// assert_eq!(idem.state(&ticket, 7).await?, None);
    /// idem.transition(&ticket, 7, "open").await?;
    /// assert_eq!(idem.state(&ticket, 7).await?.as_deref(), Some("open"));
    /// # Ok(()) }
    /// ```
    pub async fn state(
        &self,
        machine: &StateMachine,
        key: impl fmt::Display,
    ) -> Result<Option<String>, Error> {
        crate::strategy::state_machine::state(self, machine, key).await
    }

    /// Moves `key` to `to` in one atomic store step:
    ///
    /// - allowed by the table from the current state → moved: [`Moved::Performed`];
    /// - already at `to` → [`Moved::AlreadyThere`], nothing written;
    /// - otherwise [`Error::InvalidTransition`] with the current state.
    ///
    /// While another caller's body holds a move on the key ([`Idem::transition_with`]),
    /// the call waits up to the machine's `wait` for it to settle, then decides against
    /// the state it left ([`Error::InProgress`] if it did not settle in time).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), idem_runtime::Error> {
    /// use idem_runtime::{Error, Idem};
    /// use idem_runtime::toolbox::{StateMachine, Moved};
    /// let order = StateMachine::builder("shop::order")
    ///     .states(["created", "paid", "cancelled"])
    ///     .initial("created")
    ///     .allow("created", ["paid", "cancelled"])
    ///     .terminal(["paid", "cancelled"])
    ///     .build()?;
    /// let idem = Idem::builder().build();
    /// assert!(idem.transition(&order, "o-1", "created").await?.performed());
    /// assert!(idem.transition(&order, "o-1", "paid").await?.performed());
    /// assert_eq!(idem.transition(&order, "o-1", "paid").await?, Moved::AlreadyThere);
    /// let late = idem.transition(&order, "o-1", "cancelled").await;
    /// assert!(matches!(late, Err(Error::InvalidTransition { from: Some(ref f), .. }) if f == "paid"));
    /// # Ok(()) }
    /// ```
    pub fn transition<'a>(
        &'a self,
        machine: &'a StateMachine,
        key: impl fmt::Display,
        to: &'a str,
    ) -> impl Future<Output = Result<Moved, Error>> + Send + 'a {
        crate::strategy::state_machine::transition(self, machine, key, to)
    }

    /// Moves `key` to `to` and runs `body` as that move: the body runs only for the
    /// caller that performs the move, and the move is recorded only if the body returns
    /// `Ok`. A key already at `to` gives [`Moved::AlreadyThere`] without running the body;
    /// a move the table does not allow from the current state is
    /// [`Error::InvalidTransition`], also without running it.
    ///
    /// How the body and the move are tied: the move is first *held* on the state record
    /// (one atomic step that checks the table, like [`Idem::transition`]); while held,
    /// every other move on the key waits, so nothing can move the key under the body.
    /// The hold has a lease, renewed while the body runs. Then:
    ///
    /// - body `Ok` → the move is committed: the key enters `to`;
    /// - body `Err`, or the call is dropped (cancelled) → the hold is dropped at once:
    ///   the key stays where it was and a retry can perform the move;
    /// - the process dies mid-body → the hold ends with its lease and the key is still
    ///   where it was, so the move is not lost: the next caller performs it, running the
    ///   body again. A body whose effect happened just before the crash therefore runs
    ///   twice; make its effect idempotent downstream (e.g. a dedup key on the shipment)
    ///   if that matters. Without a crash (or a pause longer than the lease), the body
    ///   runs at most once per move.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), idem_runtime::Error> {
    /// use idem_runtime::{Error, Idem};
    /// use idem_runtime::toolbox::{StateMachine, Moved};
    /// let order = StateMachine::builder("shop::order")
    ///     .states(["paid", "shipped"])
    ///     .initial("paid")
    ///     .allow("paid", ["shipped"])
    ///     .build()?;
    /// let idem = Idem::builder().build();
    /// idem.transition(&order, "o-9", "paid").await?;
    /// let ship = || async { Ok::<_, Error>("parcel-1") }; // talks to the carrier
    /// let first = idem.transition_with(&order, "o-9", "shipped", ship()).await?;
    /// let again = idem.transition_with(&order, "o-9", "shipped", ship()).await?;
    /// assert_eq!(first.value(), Some("parcel-1"));
    /// assert_eq!(again, Moved::AlreadyThere); // not shipped twice
    /// # Ok(()) }
    /// ```
    pub fn transition_with<'a, T, E, F>(
        &'a self,
        machine: &'a StateMachine,
        key: impl fmt::Display,
        to: &'a str,
        body: F,
    ) -> impl Future<Output = Result<Moved<T>, E>> + 'a
    where
        E: From<Error> + 'a,
        F: Future<Output = Result<T, E>> + 'a,
        T: 'a,
    {
        let key = self.state_key(machine, key);
        crate::strategy::state_machine::run_move(self, machine, key, to, body)
    }

    /// The record key of the value `key` of `family`.
    ///
    /// ```
    /// use idem_runtime::Idem;
    /// use idem_runtime::toolbox::Optimistic;
    /// static BALANCE: Optimistic = Optimistic::new("bank::balance");
    /// let idem = Idem::builder().namespace("bank").build();
    /// let key = idem.versioned_key(&BALANCE, "acct-7");
    /// assert_eq!((key.namespace(), key.scope()), ("bank", "bank::balance"));
    /// ```
    pub fn versioned_key(&self, family: &Optimistic, key: impl fmt::Display) -> Key {
        // Dedup options only lend their scope (the name) to the key.
        self.key(&Options::dedup(family.name()), format_args!("{key}"))
    }

    /// Reads a versioned value (one store round trip). `None`: never written (or expired);
    /// write it with expected version 0.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), idem_runtime::Error> {
    /// use idem_runtime::Idem;
    /// use idem_runtime::toolbox::{Optimistic, Versioned};
    /// static PROFILE: Optimistic = Optimistic::new("users::nickname");
    /// let idem = Idem::builder().build();
    /// assert_eq!(idem.load::<String>(&PROFILE, "u1").await?, None);
    /// idem.compare_and_set(&PROFILE, "u1", 0, "ada".to_string()).await?;
    /// let v = idem.load::<String>(&PROFILE, "u1").await?;
    /// assert_eq!(v, Some(Versioned { value: "ada".to_string(), version: 1 }));
    /// # Ok(()) }
    /// ```
    pub async fn load<T: Serialize + DeserializeOwned>(
        &self,
        family: &Optimistic,
        key: impl fmt::Display,
    ) -> Result<Option<Versioned<T>>, Error> {
        crate::strategy::optimistic::load(self, family, key).await
    }

    /// Writes `value` if the stored version still is `expected` (0: not written yet), in
    /// one atomic store step, and returns the new version. Otherwise nothing is written
    /// and the result is [`Error::Conflict`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), idem_runtime::Error> {
    /// use idem_runtime::{Error, Idem};
    /// use idem_runtime::toolbox::Optimistic;
    /// static STOCK: Optimistic = Optimistic::new("shop::stock");
    /// let idem = Idem::builder().build();
    /// assert_eq!(idem.compare_and_set(&STOCK, "sku-1", 0, 10u32).await?, 1);
    /// assert_eq!(idem.compare_and_set(&STOCK, "sku-1", 1, 9u32).await?, 2);
    /// let lost = idem.compare_and_set(&STOCK, "sku-1", 1, 9u32).await; // stale version
    /// assert!(matches!(lost, Err(Error::Conflict { .. })));
    /// # Ok(()) }
    /// ```
    pub async fn compare_and_set<T: Serialize + DeserializeOwned>(
        &self,
        family: &Optimistic,
        key: impl fmt::Display,
        expected: u64,
        value: T,
    ) -> Result<u64, Error> {
        crate::strategy::optimistic::compare_and_set(self, family, key, expected, value).await
    }

    /// The last step of an optimistic update on **your own** table: maps the rows
    /// affected by `UPDATE t SET ..., version = version + 1 WHERE id = ? AND version = ?`
    /// to `Ok` (one row: the version was still the one read) or [`Error::Conflict`]
    /// (no row: someone wrote in between), so [`retry_on_conflict`] re-runs the
    /// read-compute-write. `family` and `key` only name the row in the error.
    ///
    /// The recipe, with any SQL client:
    ///
    /// ```text
    /// SELECT balance, version FROM accounts WHERE id = $1;            -- read
    /// -- compute the new balance in Rust
    /// UPDATE accounts SET balance = $2, version = version + 1
    ///  WHERE id = $1 AND version = $3;                                -- write if unchanged
    /// ```
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), idem_runtime::Error> {
    /// use idem_runtime::{Error, Idem, retry_on_conflict};
    /// use idem_runtime::toolbox::{Optimistic, Retry};
    /// static ACCOUNTS: Optimistic = Optimistic::new("bank::accounts");
    /// let idem = Idem::builder().build();
    /// let mut lost_once = false; // stands in for the database
    /// retry_on_conflict(&Retry::DEFAULT, || {
    ///     // ... SELECT, compute, UPDATE ... WHERE version = ? ...
    ///     let rows_affected = if lost_once { 1 } else { lost_once = true; 0 };
    ///     let checked = idem.expect_updated(&ACCOUNTS, "acct-1", rows_affected);
    ///     async move { checked }
    /// })
    /// .await?;
    /// assert!(lost_once);
    /// # Ok(()) }
    /// ```
    pub fn expect_updated(
        &self,
        family: &Optimistic,
        key: impl fmt::Display,
        rows_affected: u64,
    ) -> Result<(), Error> {
        if rows_affected == 1 {
            return Ok(());
        }
        if rows_affected > 1 {
            return Err(Error::Config(format!(
                "a versioned update changed {rows_affected} rows: its WHERE must name one row by its key"
            )));
        }
        Err(Error::Conflict {
            key: self.versioned_key(family, key),
        })
    }

    /// Read-modify-write with retries: loads the value (`None` if absent), computes the
    /// new one with `f`, writes it with compare-and-set, and on a conflict does it all
    /// again, per `family`'s [`Retry`]. Returns what was written.
    ///
    /// `f` may run several times (once per attempt), so it must be a pure function of
    /// its input; it may refuse with an `Err` (e.g. "sold out"), which ends the update
    /// without writing.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), idem_runtime::Error> {
    /// use idem_runtime::{Error, Idem};
    /// use idem_runtime::toolbox::Optimistic;
    /// static BALANCE: Optimistic = Optimistic::new("bank::balance");
    /// let idem = Idem::builder().build();
    /// let v = idem
    ///     .update(&BALANCE, "acct-7", |cents: Option<i64>| Ok::<_, Error>(cents.unwrap_or(0) + 250))
    ///     .await?;
    /// assert_eq!((v.value, v.version), (250, 1));
    /// # Ok(()) }
    /// ```
    pub async fn update<T, E, F>(
        &self,
        family: &Optimistic,
        key: impl fmt::Display,
        f: F,
    ) -> Result<Versioned<T>, E>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        F: FnMut(Option<T>) -> Result<T, E>,
    {
        crate::strategy::optimistic::update(self, family, key, f).await
    }
}
