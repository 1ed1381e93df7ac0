//! The claim record as stored (state and kind codes, microsecond times, owner bytes),
//! how the row a claim statement returns is decided, and how database errors map to
//! idem's; shared by every backend.

use std::time::Duration;

use bytes::Bytes;

use crate::store::{ClaimKind, ClaimOutcome, ClaimRequest, Owner};
use crate::{Error, Fingerprint, Key};

/// Record states, as stored in the `state` column.
pub(super) const FREE: i16 = 0;
pub(super) const ISSUED: i16 = 1;
pub(super) const IN_PROGRESS: i16 = 2;
pub(super) const COMPLETED: i16 = 3;

/// Record kinds, as stored in the `kind` column.
pub(super) const KIND_DEDUP: i16 = 0;
pub(super) const KIND_LOCK: i16 = 1;
pub(super) const KIND_TOKEN: i16 = 2;

/// How long a released lock keeps its row (and so its fence counter). Past that the fence
/// continues from the database clock, which has moved on by then.
pub(super) const LOCK_RETENTION: Duration = Duration::from_secs(3600);

/// Every duration is capped so that `now + d` never overflows a BIGINT of microseconds.
pub(super) const MAX_DURATION_US: i64 = 100 * 365 * 24 * 3600 * 1_000_000;

/// A claim statement that found the row taken over between its read and its write
/// (a race with another claimer) is run again, at most this many times.
pub(super) const CLAIM_ATTEMPTS: usize = 16;

/// When a claim gave up waiting for a row lock (a transactional-mode twin's open
/// transaction), how soon to look again.
pub(super) const LOCK_WAIT_RETRY: Duration = Duration::from_millis(10);

/// How often a waiter re-checks a busy key when no in-process completion wakes it first
/// (the twin runs in another process; SQL has no cheap cross-process push).
pub(super) const CROSS_PROCESS_POLL: Duration = Duration::from_millis(50);

pub(super) fn us(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).map_or(MAX_DURATION_US, |v| v.min(MAX_DURATION_US))
}

pub(super) fn from_us(v: i64) -> Duration {
    Duration::from_micros(u64::try_from(v).unwrap_or(0))
}

pub(super) fn owner_bytes(owner: Owner) -> [u8; 16] {
    owner.0.to_be_bytes()
}

pub(super) fn kind_code(kind: ClaimKind) -> i16 {
    match kind {
        ClaimKind::Dedup => KIND_DEDUP,
        ClaimKind::Lock => KIND_LOCK,
        ClaimKind::Token => KIND_TOKEN,
    }
}

/// A row as a claim statement saw it, by the database's clock.
#[derive(Debug, Default)]
pub(super) struct Snapshot {
    /// The statement took the key for the caller.
    pub(super) claimed: bool,
    pub(super) state: i16,
    pub(super) fence: i64,
    pub(super) fingerprint: Option<Vec<u8>>,
    pub(super) value: Option<Vec<u8>>,
    /// `expires_us - now`: the record exists while this is positive.
    pub(super) remaining_us: i64,
    /// `lease_us - now` for an in-progress record.
    pub(super) lease_left_us: Option<i64>,
    /// The row has a live step journal (`steps_expires_us` ahead).
    pub(super) journal_live: bool,
    /// The payload a live journal was written for (`steps_fp`).
    pub(super) journal_fp: Option<Vec<u8>>,
    /// A claimed row's live journal, read after the claim when `journal_live` (see the
    /// `journal` module).
    pub(super) journal: Option<Vec<super::journal::StepRow>>,
}

impl Snapshot {
    /// Whether the claim took a row whose live journal it must read to resume.
    pub(super) fn resumes(&self, kind: ClaimKind) -> bool {
        self.claimed && self.journal_live && kind != ClaimKind::Lock
    }
}

/// Turns what a claim statement saw into an outcome. `None` means the row looked takeable
/// but the statement did not take it: another claimer won the race in between, so the
/// statement is run again. The conditions mirror the SQL `WHERE` clauses of the dialects
/// and [`MemoryStore`](crate::MemoryStore)'s rules.
pub(super) fn decide(
    key: &Key,
    req: &ClaimRequest,
    snap: Option<Snapshot>,
) -> Result<Option<ClaimOutcome>, Error> {
    let kind = req.kind;
    let Some(mut s) = snap else {
        return Ok(match kind {
            ClaimKind::Token => Some(ClaimOutcome::Missing),
            _ => None,
        });
    };
    if s.claimed {
        return Ok(Some(match kind {
            ClaimKind::Lock => ClaimOutcome::claimed(
                u64::try_from(s.fence).map_err(|_| corrupt(key, "negative fence"))?,
            ),
            // A dedup or token claim that took a record with a live journal resumes it.
            _ => {
                let rows = s.journal.as_deref().unwrap_or_default();
                ClaimOutcome::resuming(super::journal::parse_rows(key, rows)?)
            }
        }));
    }
    if !(FREE..=COMPLETED).contains(&s.state) {
        return Err(corrupt(key, &format!("unknown state {}", s.state)));
    }
    let fingerprint = match s.fingerprint.take() {
        None => None,
        Some(b) => Some(Fingerprint(
            b.try_into()
                .map_err(|_| corrupt(key, "fingerprint is not 16 bytes"))?,
        )),
    };
    // A record the claim could take, whose live journal another payload wrote: the
    // statement refused it (see `ClaimOutcome::OtherPayload`).
    if kind != ClaimKind::Lock
        && takeable(kind, &s)
        && let (Some(ours), Some(theirs)) = (&req.fingerprint, &s.journal_fp)
        && ours.0[..] != theirs[..]
    {
        let theirs = Fingerprint(
            theirs[..]
                .try_into()
                .map_err(|_| corrupt(key, "journal fingerprint is not 16 bytes"))?,
        );
        return Ok(Some(ClaimOutcome::OtherPayload {
            fingerprint: theirs,
        }));
    }
    if s.remaining_us <= 0 || s.state == FREE {
        return Ok(match kind {
            ClaimKind::Token => Some(ClaimOutcome::Missing),
            _ => None,
        });
    }
    Ok(match s.state {
        COMPLETED => Some(ClaimOutcome::Completed {
            value: Bytes::from(
                s.value
                    .ok_or_else(|| corrupt(key, "completed record without a value"))?,
            ),
            fingerprint,
        }),
        IN_PROGRESS => {
            let lease_left = s.lease_left_us.unwrap_or(s.remaining_us);
            if lease_left > 0 || kind != ClaimKind::Token {
                Some(ClaimOutcome::Busy {
                    retry_in: from_us(lease_left),
                    fingerprint,
                })
            } else {
                // A token claim whose lease ended: takeable, so a race was lost.
                None
            }
        }
        // ISSUED: only a token claim takes it; a dedup or lock key never holds a token
        // (their scopes differ), so it is treated as held until it expires, as in memory.
        _ => match kind {
            ClaimKind::Token => None,
            _ => Some(ClaimOutcome::Busy {
                retry_in: from_us(s.remaining_us),
                fingerprint,
            }),
        },
    })
}

/// Whether a row, as a claim statement saw it, may be taken by a claim of `kind` (the
/// statements' `WHERE`, but for the journal's payload).
pub(super) fn takeable(kind: ClaimKind, s: &Snapshot) -> bool {
    let live = s.remaining_us > 0;
    match kind {
        ClaimKind::Token => {
            live && (s.state == ISSUED
                || (s.state == IN_PROGRESS && s.lease_left_us.is_some_and(|l| l <= 0)))
        }
        _ => s.state == FREE || !live,
    }
}

pub(super) fn corrupt(key: &Key, reason: &str) -> Error {
    Error::Corrupt {
        key: *key,
        reason: reason.to_owned(),
    }
}

/// Maps a sqlx error: a value that does not decode means the row is damaged (or the
/// table was altered); anything else is the store failing.
pub(super) fn sql_err(key: Option<&Key>, e: sqlx::Error) -> Error {
    match (key, &e) {
        (Some(key), sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_)) => Error::Corrupt {
            key: *key,
            reason: format!("a column does not decode: {e}"),
        },
        _ => Error::store(e),
    }
}

/// A lock wait that ran out (PostgreSQL `lock_timeout`, InnoDB lock wait timeout,
/// SQLite busy): a twin's transaction holds the key.
pub(super) fn is_lock_wait(e: &Error) -> bool {
    let Error::Store(source) = e else {
        return false;
    };
    let Some(sqlx::Error::Database(db)) = source.downcast_ref::<sqlx::Error>() else {
        return false;
    };
    let code = db.code();
    matches!(code.as_deref(), Some("55P03" | "5" | "517" | "261"))
        || db.message().contains("Lock wait timeout")
}
