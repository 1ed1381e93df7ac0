//! The one error type of idem.

use crate::Key;

/// A boxed error from a store backend, kept as the `source` of [`Error::Store`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can go wrong in idem.
///
/// Variants that concern one record carry a [`Key`]: the namespace, the function and a
/// digest of the rendered key. Raw key material (an email, a card id) never appears in an
/// error message, a log line or the store.
///
/// A function under `#[idempotent]` returns its own error type `E`, which must implement
/// `From<idem_runtime::Error>`; these values reach the caller through that conversion.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Another call holds this key and did not finish within `wait`.
    #[error("{key} is in progress in another call")]
    InProgress {
        /// The record concerned.
        key: Key,
    },
    /// The lock is held by another owner and was not released within `wait`.
    #[error("{key} is locked by another owner")]
    Locked {
        /// The record concerned.
        key: Key,
    },
    /// The key already completed and the function rejects duplicates
    /// (`on_duplicate = "reject"`, the default for tokens).
    #[error("{key} already completed; duplicate rejected")]
    Duplicate {
        /// The record concerned.
        key: Key,
    },
    /// The token was never issued, has expired, or is not a token of this namespace.
    #[error("token is unknown or expired ({key})")]
    TokenInvalid {
        /// The record concerned (a digest of the token, never the token).
        key: Key,
    },
    /// The same key was used with different arguments (see `fingerprint = [...]`).
    #[error("{key} was first used with a different payload")]
    PayloadMismatch {
        /// The record concerned.
        key: Key,
    },
    /// The claim was taken over by another owner while the body ran (the lease ended,
    /// for example after a long pause).
    #[error("the lease on {key} was lost while the body ran")]
    LeaseLost {
        /// The record concerned.
        key: Key,
    },
    /// A compare-and-set lost a race: the version changed since it was read.
    #[error("{key} was changed concurrently (version conflict)")]
    Conflict {
        /// The record concerned.
        key: Key,
    },
    /// A state-machine move that the transition table does not allow.
    #[error("transition from {} to {to} is not allowed", from.as_deref().unwrap_or("(none)"))]
    InvalidTransition {
        /// The state the record is in (`None`: no state yet, shown as `(none)`).
        from: Option<String>,
        /// The state asked for.
        to: String,
    },
    /// A state-machine move on the application's own table
    /// (`StateColumn`, with an SQL feature) named a row that
    /// does not exist. The id is not shown: it may be raw key material.
    #[error("no row of {table} has that id")]
    NoSuchRow {
        /// The table, as given to `stored_in`.
        table: String,
    },
    /// The store failed, timed out or is unreachable. The body did not run without a claim.
    #[error("store error: {0}")]
    Store(#[source] BoxError),
    /// A value could not be serialized, or a stored value no longer deserializes into the
    /// function's type (for example after a change of the type).
    #[error("codec error on {key}: {message}")]
    Codec {
        /// The record concerned.
        key: Key,
        /// What the serializer said.
        message: String,
    },
    /// A record in the store is damaged (failed its checksum or has an unknown layout).
    /// It is never replayed.
    #[error("record {key} is corrupt: {reason}")]
    Corrupt {
        /// The record concerned.
        key: Key,
        /// What is wrong with it.
        reason: String,
    },
    /// [`init`](crate::init) was called a second time.
    #[error("idem_runtime::init was already called; the process-wide runtime is set once")]
    AlreadyInitialized,
    /// The configuration is invalid (a zero lease, a malformed URL, ...).
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The store does not implement this operation.
    #[error("this store does not support {0}")]
    Unsupported(&'static str),
    /// [`step`](crate::step) was called where no claim is held: outside an idempotent
    /// call, in a lock's body (which runs on every call, so it keeps no journal), in a
    /// transactional-mode body (its claim is uncommitted until the body's writes commit
    /// with it, so a journal written there would roll back with a failed attempt), or in
    /// a task spawned from the body. A step never runs unjournaled.
    #[error(
        "step {step:?} runs outside a claimed body: call it inside an #[idempotent] dedup \
         or token body, Idem::dedup, or a handler of idem-http or idem-consumer (not in a \
         lock's body, a transactional-mode body, nor a task spawned from the body)"
    )]
    StepOutsideClaim {
        /// The step's name.
        step: String,
    },
    /// One call used the same step name twice: each step needs its own name (in a loop,
    /// `&format!("mail:{i}")`).
    #[error("step {step:?} is used twice in one call of {key}; give each step its own name")]
    StepReused {
        /// The record whose body ran the step.
        key: Key,
        /// The step's name.
        step: String,
    },
}

impl Error {
    /// Wraps a backend error as [`Error::Store`].
    pub fn store(err: impl Into<BoxError>) -> Self {
        Error::Store(err.into())
    }

    /// The record this error concerns, if any.
    pub fn key(&self) -> Option<&Key> {
        match self {
            Error::InProgress { key }
            | Error::Locked { key }
            | Error::Duplicate { key }
            | Error::TokenInvalid { key }
            | Error::PayloadMismatch { key }
            | Error::LeaseLost { key }
            | Error::Conflict { key }
            | Error::Codec { key, .. }
            | Error::StepReused { key, .. }
            | Error::Corrupt { key, .. } => Some(key),
            _ => None,
        }
    }

    /// True for errors a caller may retry later with the same key and arguments
    /// (contention and store trouble), false for verdicts (duplicate, mismatch, invalid).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Error::InProgress { .. }
                | Error::Locked { .. }
                | Error::Store(_)
                | Error::Conflict { .. }
                | Error::LeaseLost { .. }
        )
    }
}
