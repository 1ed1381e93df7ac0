// The names that left the crate root for its modules, kept at their old paths for one
// release (included into lib.rs, so they are the root's own items, not re-exports). A
// trait cannot be aliased, so `RecordCounts`, for store authors, moved without one: it is
// at `idem_runtime::inspect::RecordCounts` (and `store::`).

/// Moved to [`codec::CloneReplay`]; the old path is kept for one release.
#[deprecated(since = "0.1.0", note = "moved to `idem_runtime::codec::CloneReplay`")]
pub type CloneReplay<T> = crate::codec::CloneReplay<T>;
/// Moved to [`codec::ReplayOk`]; the old path is kept for one release.
#[deprecated(since = "0.1.0", note = "moved to `idem_runtime::codec::ReplayOk`")]
pub type ReplayOk = crate::codec::ReplayOk;
/// Moved to [`codec::ReplayResult`]; the old path is kept for one release.
#[deprecated(since = "0.1.0", note = "moved to `idem_runtime::codec::ReplayResult`")]
pub type ReplayResult = crate::codec::ReplayResult;
/// Moved to [`codec::NoReplay`]; the old path is kept for one release.
#[deprecated(since = "0.1.0", note = "moved to `idem_runtime::codec::NoReplay`")]
pub type NoReplay = crate::codec::NoReplay;
/// Moved to [`codec::NoReplayResult`]; the old path is kept for one release.
#[deprecated(since = "0.1.0", note = "moved to `idem_runtime::codec::NoReplayResult`")]
pub type NoReplayResult = crate::codec::NoReplayResult;
/// Moved to [`codec::FingerprintBuilder`]; the old path is kept for one release.
#[deprecated(since = "0.1.0", note = "moved to `idem_runtime::codec::FingerprintBuilder`")]
pub type FingerprintBuilder = crate::codec::FingerprintBuilder;
/// Moved to [`store::BoxError`]; the old path is kept for one release.
#[deprecated(since = "0.1.0", note = "moved to `idem_runtime::store::BoxError`")]
pub type BoxError = crate::store::BoxError;
/// Moved to [`options::Strategy`]; the old path is kept for one release.
#[deprecated(since = "0.1.0", note = "moved to `idem_runtime::options::Strategy`")]
pub type Strategy = crate::options::Strategy;
/// Moved to [`inspect::Stats`]; the old path is kept for one release.
#[deprecated(since = "0.1.0", note = "moved to `idem_runtime::inspect::Stats`")]
pub type Stats = crate::inspect::Stats;
/// Moved to [`inspect::RecordCount`]; the old path is kept for one release.
#[deprecated(since = "0.1.0", note = "moved to `idem_runtime::inspect::RecordCount`")]
pub type RecordCount = crate::inspect::RecordCount;
/// Moved to [`inspect::RecordInfo`]; the old path is kept for one release.
#[deprecated(since = "0.1.0", note = "moved to `idem_runtime::inspect::RecordInfo`")]
pub type RecordInfo = crate::inspect::RecordInfo;
/// Moved to [`inspect::RecordState`]; the old path is kept for one release.
#[deprecated(since = "0.1.0", note = "moved to `idem_runtime::inspect::RecordState`")]
pub type RecordState = crate::inspect::RecordState;
/// Moved to [`inspect::StepInfo`]; the old path is kept for one release.
#[deprecated(since = "0.1.0", note = "moved to `idem_runtime::inspect::StepInfo`")]
pub type StepInfo = crate::inspect::StepInfo;
/// Moved to [`toolbox::BloomFilter`]; the old path is kept for one release.
#[deprecated(since = "0.1.0", note = "moved to `idem_runtime::toolbox::BloomFilter`")]
pub type BloomFilter = crate::toolbox::BloomFilter;
/// Moved to [`toolbox::BloomStats`]; the old path is kept for one release.
#[deprecated(since = "0.1.0", note = "moved to `idem_runtime::toolbox::BloomStats`")]
pub type BloomStats = crate::toolbox::BloomStats;
/// Moved to [`toolbox::Filtered`]; the old path is kept for one release.
#[deprecated(since = "0.1.0", note = "moved to `idem_runtime::toolbox::Filtered`")]
pub type Filtered<T> = crate::toolbox::Filtered<T>;
/// Moved to [`toolbox::Verdict`]; the old path is kept for one release.
#[deprecated(since = "0.1.0", note = "moved to `idem_runtime::toolbox::Verdict`")]
pub type Verdict = crate::toolbox::Verdict;
/// Moved to [`toolbox::Optimistic`]; the old path is kept for one release.
#[deprecated(since = "0.1.0", note = "moved to `idem_runtime::toolbox::Optimistic`")]
pub type Optimistic = crate::toolbox::Optimistic;
/// Moved to [`toolbox::Retry`]; the old path is kept for one release.
#[deprecated(since = "0.1.0", note = "moved to `idem_runtime::toolbox::Retry`")]
pub type Retry = crate::toolbox::Retry;
/// Moved to [`toolbox::Versioned`]; the old path is kept for one release.
#[deprecated(since = "0.1.0", note = "moved to `idem_runtime::toolbox::Versioned`")]
pub type Versioned<T> = crate::toolbox::Versioned<T>;
/// Moved to [`toolbox::StateMachine`]; the old path is kept for one release.
#[deprecated(since = "0.1.0", note = "moved to `idem_runtime::toolbox::StateMachine`")]
pub type StateMachine = crate::toolbox::StateMachine;
/// Moved to [`toolbox::StateMachineBuilder`]; the old path is kept for one release.
#[deprecated(since = "0.1.0", note = "moved to `idem_runtime::toolbox::StateMachineBuilder`")]
pub type StateMachineBuilder = crate::toolbox::StateMachineBuilder;
/// Renamed [`toolbox::Moved`]; the old path is kept for one release.
#[deprecated(since = "0.1.0", note = "renamed `idem_runtime::toolbox::Moved`")]
pub type Step<T = ()> = crate::toolbox::Moved<T>;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
/// Moved to `toolbox::StateColumn`; the old path is kept for one release.
#[deprecated(since = "0.1.0", note = "moved to `idem_runtime::toolbox::StateColumn`")]
pub type StateColumn = crate::toolbox::StateColumn;
/// Renamed [`IdemBuilder`]; the old path is kept for one release.
#[deprecated(since = "0.1.0", note = "renamed `idem_runtime::IdemBuilder`")]
pub type Builder = crate::IdemBuilder;
/// Moved to [`options::DEFAULT_TTL`]; the old path is kept for one release.
#[deprecated(since = "0.1.0", note = "moved to `idem_runtime::options::DEFAULT_TTL`")]
pub const DEFAULT_TTL: std::time::Duration = crate::options::DEFAULT_TTL;
/// Moved to [`options::DEFAULT_LEASE`]; the old path is kept for one release.
#[deprecated(since = "0.1.0", note = "moved to `idem_runtime::options::DEFAULT_LEASE`")]
pub const DEFAULT_LEASE: std::time::Duration = crate::options::DEFAULT_LEASE;
/// Moved to [`options::DEFAULT_WAIT`]; the old path is kept for one release.
#[deprecated(since = "0.1.0", note = "moved to `idem_runtime::options::DEFAULT_WAIT`")]
pub const DEFAULT_WAIT: std::time::Duration = crate::options::DEFAULT_WAIT;
/// Moved to [`options::MIN_LEASE`]; the old path is kept for one release.
#[deprecated(since = "0.1.0", note = "moved to `idem_runtime::options::MIN_LEASE`")]
pub const MIN_LEASE: std::time::Duration = crate::options::MIN_LEASE;
/// Moved to [`options::DEFAULT_NAMESPACE`]; the old path is kept for one release.
#[deprecated(since = "0.1.0", note = "moved to `idem_runtime::options::DEFAULT_NAMESPACE`")]
pub const DEFAULT_NAMESPACE: &str = crate::options::DEFAULT_NAMESPACE;
/// Issues a one-time token on the current runtime: the one `issue_token` is now
/// [`Idem::issue_token`] (`idem_runtime::current().issue_token(ttl)` for this).
#[deprecated(since = "0.1.0", note = "use `Idem::issue_token` (`current().issue_token(ttl)`)")]
pub async fn issue_token(ttl: std::time::Duration) -> Result<String, Error> {
    current().issue_token(ttl).await
}
