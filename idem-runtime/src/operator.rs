//! `Idem`'s methods for operators: seeing and steering single records
//! ([`Idem::inspect`], [`Idem::forget`]) and finishing abandoned ones
//! ([`Idem::recoverer`]). What a store reports about its records is in
//! [`store`](crate::store).

use std::fmt;

use crate::recover::Recoverer;
use crate::store::{JournalEntry, RecordInfo, StepInfo};
use crate::{Error, Idem, Key, Options};

impl Idem {
    /// The record of `key` under `opts` in this runtime's namespace, read in one atomic
    /// step: its state, owner, lease and ttl left, whether a fingerprint is stored, the
    /// value's size, and the fence of a held lock. `None`: no live record (never
    /// written, released, or expired by the store's clock).
    ///
    /// On a store with a step journal, [`RecordInfo::steps`] lists the record's durable
    /// steps (read right after the record, in a second step): names, when each was
    /// written, value sizes, and intents without results. A released record's journal,
    /// which outlives it, is read with [`Idem::steps`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), idem_runtime::Error> {
    /// use idem_runtime::{Idem, Options};
    /// use idem_runtime::inspect::RecordState;
    /// static CHARGE: Options = Options::dedup("shop::charge");
    /// let idem = Idem::builder().namespace("shop").build();
    /// assert!(idem.inspect(&CHARGE, "order-42").await?.is_none());
    /// idem.dedup(&CHARGE, "order-42", async { Ok::<_, idem_runtime::Error>(100u64) }).await?;
    /// let info = idem.inspect(&CHARGE, "order-42").await?.expect("completed");
    /// assert_eq!(info.state, RecordState::Completed);
    /// assert!(info.value_size.is_some());
    /// # Ok(()) }
    /// ```
    pub async fn inspect(
        &self,
        opts: &Options,
        key: impl fmt::Display,
    ) -> Result<Option<RecordInfo>, Error> {
        let key = self.record_key(opts, key);
        let Some(mut info) = self.store().inspect(&key).await? else {
            return Ok(None);
        };
        if let Some(journal) = self.store().journal() {
            info.steps = journal
                .read_journal(&key)
                .await?
                .iter()
                .map(JournalEntry::info)
                .collect();
        }
        Ok(Some(info))
    }

    /// The step journal (durable steps) of `key` under `opts`, whether or not its record
    /// is live: after a release or an expired lease the journal is kept for the next
    /// attempt, and this is where an operator sees it. Empty on a store without a
    /// journal, and once the call completed.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), idem_runtime::Error> {
    /// use idem_runtime::{Error, Idem, Options, step};
    /// static CHECKOUT: Options = Options::dedup("shop::checkout");
    /// let idem = Idem::builder().namespace("shop").build();
    /// let failed: Result<(), Error> = idem
    ///     .dedup(&CHECKOUT, "order-42", async {
    ///         step("charge", |_| async { Ok::<_, Error>(1250u64) }).await?;
    ///         Err(Error::Config("stock service down".into()))
    ///     })
    ///     .await;
    /// assert!(failed.is_err());
    /// let steps = idem.steps(&CHECKOUT, "order-42").await?;
    /// assert_eq!((steps[0].name.as_str(), steps[0].done), ("charge", true));
    /// # Ok(()) }
    /// ```
    pub async fn steps(
        &self,
        opts: &Options,
        key: impl fmt::Display,
    ) -> Result<Vec<StepInfo>, Error> {
        let key = self.record_key(opts, key);
        match self.store().journal() {
            Some(journal) => Ok(journal
                .read_journal(&key)
                .await?
                .iter()
                .map(JournalEntry::info)
                .collect()),
            None => Ok(Vec::new()),
        }
    }

    /// Removes the record of `key` under `opts`, whoever holds it, in one atomic step,
    /// and returns whether there was one. Logged at `warn`.
    ///
    /// Forgetting a completed record makes the next call run the body again. Forgetting
    /// one in progress lets the next caller run at once, while the old holder may still
    /// be running: its completion is then refused (counted as a lost lease), so its
    /// result is not recorded. Safe when the holder is known to be gone (crashed, or
    /// stuck past any use), or when running the body twice is harmless.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), idem_runtime::Error> {
    /// use idem_runtime::{Idem, Options};
    /// static CHARGE: Options = Options::dedup("shop::charge");
    /// let idem = Idem::builder().namespace("shop").build();
    /// idem.dedup(&CHARGE, "order-42", async { Ok::<_, idem_runtime::Error>(1u64) }).await?;
    /// assert!(idem.forget(&CHARGE, "order-42").await?);
    /// let again: u64 = idem.dedup(&CHARGE, "order-42", async { Ok::<_, idem_runtime::Error>(2) }).await?;
    /// assert_eq!(again, 2); // ran again
    /// # Ok(()) }
    /// ```
    pub async fn forget(&self, opts: &Options, key: impl fmt::Display) -> Result<bool, Error> {
        let key = self.record_key(opts, key);
        let forgotten = self.store().forget(&key).await?;
        tracing::warn!(%key, forgotten, "idem: record forgotten by an operator");
        Ok(forgotten)
    }

    /// The record a call with the rendered `key` under `opts` uses: [`Idem::key`], or
    /// for token options the token's record (tokens of a namespace share one scope, see
    /// [`Key::token`](crate::Key::token)). On a shared store this is the same key in
    /// every process, so an operator's tool finds the record a service wrote from the
    /// function path a log line prints and the key the customer gave.
    ///
    /// ```
    /// use idem_runtime::{Idem, Options};
    /// static CHARGE: Options = Options::dedup("app::charge");
    /// let idem = Idem::builder().namespace("shop").build();
    /// let key = idem.record_key(&CHARGE, "charge:42");
    /// assert!(key.to_string().starts_with("shop/app::charge#"));
    /// ```
    pub fn record_key(&self, opts: &Options, key: impl fmt::Display) -> Key {
        match opts.strategy() {
            crate::options::Strategy::Token => self.token_key(&key.to_string()),
            _ => self.key(opts, format_args!("{key}")),
        }
    }
}

/// Operating: recovery.
impl Idem {
    /// A recoverer for this runtime's namespace, knowing every function marked
    /// `recover` in the binary. See [`crate::recover`].
    pub fn recoverer(&self) -> Recoverer {
        crate::recover::Recoverer::new(self.clone())
    }
}
