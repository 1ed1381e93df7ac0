//! What operators do with records on SQL: read one, free one, count them by function
//! and state (`idem stats`, one `GROUP BY`). The statements live with each dialect.

use std::time::Duration;

use super::record::{
    COMPLETED, FREE, IN_PROGRESS, ISSUED, KIND_DEDUP, KIND_LOCK, KIND_TOKEN, corrupt, sql_err,
};
use crate::store::{ClaimKind, Owner};
use crate::store::{RecordCount, RecordInfo, RecordState};
use crate::{Error, Key};

/// A row as the inspect statement reads it, by the database's clock.
pub(super) struct Inspected {
    pub(super) kind: i16,
    pub(super) state: i16,
    pub(super) owner: Option<Vec<u8>>,
    pub(super) fence: i64,
    pub(super) has_fingerprint: i64,
    pub(super) value_len: Option<i64>,
    pub(super) ttl_left_us: i64,
    pub(super) lease_left_us: Option<i64>,
}

impl Inspected {
    /// Reads the inspect statement's row, on whichever database it came from: the
    /// dialects differ in the statement, not in the columns it returns.
    pub(super) fn from_row<R>(key: &Key, row: &R) -> Result<Self, Error>
    where
        R: sqlx::Row,
        &'static str: sqlx::ColumnIndex<R>,
        i16: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
        i64: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
        Vec<u8>: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    {
        let get = || -> Result<Inspected, sqlx::Error> {
            Ok(Inspected {
                kind: row.try_get("kind")?,
                state: row.try_get("state")?,
                owner: row.try_get("owner")?,
                fence: row.try_get("fence")?,
                has_fingerprint: row.try_get("has_fingerprint")?,
                value_len: row.try_get("value_len")?,
                ttl_left_us: row.try_get("ttl_left_us")?,
                lease_left_us: row.try_get("lease_left_us")?,
            })
        };
        get().map_err(|e| sql_err(Some(key), e))
    }
}

fn left(us: i64) -> Duration {
    Duration::from_micros(u64::try_from(us).unwrap_or(0))
}

impl Inspected {
    pub(super) fn into_info(self, key: &Key) -> Result<RecordInfo, Error> {
        let state = match self.state {
            IN_PROGRESS => RecordState::InProgress,
            COMPLETED => RecordState::Completed,
            ISSUED => RecordState::Issued,
            other => return Err(corrupt(key, &format!("unknown state {other}"))),
        };
        let kind = match self.kind {
            KIND_DEDUP => ClaimKind::Dedup,
            KIND_LOCK => ClaimKind::Lock,
            KIND_TOKEN => ClaimKind::Token,
            other => return Err(corrupt(key, &format!("unknown kind {other}"))),
        };
        let mut info = RecordInfo::new(state);
        info.kind = Some(kind);
        info.ttl_left = Some(left(self.ttl_left_us));
        info.fingerprint = self.has_fingerprint != 0;
        if state == RecordState::InProgress {
            let owner: [u8; 16] = self
                .owner
                .ok_or_else(|| corrupt(key, "in progress without an owner"))?
                .try_into()
                .map_err(|_| corrupt(key, "owner is not 16 bytes"))?;
            info.owner = Some(Owner(u128::from_be_bytes(owner)));
            info.lease_left = Some(left(self.lease_left_us.unwrap_or(self.ttl_left_us)));
            if kind == ClaimKind::Lock {
                info.fence = u64::try_from(self.fence).ok();
            }
        }
        if state == RecordState::Completed {
            info.value_size = self.value_len.and_then(|n| usize::try_from(n).ok());
        }
        Ok(info)
    }
}

/// Rows of the count statement, with states by name.
pub(super) fn counts(rows: Vec<(String, String, i16, i64)>) -> Vec<RecordCount> {
    rows.into_iter()
        .filter(|r| r.2 != FREE)
        .map(|(ns, scope, state, n)| {
            let state = match state {
                IN_PROGRESS => "in_progress",
                COMPLETED => "completed",
                ISSUED => "issued",
                _ => "corrupt",
            };
            RecordCount::new(ns, scope, state, u64::try_from(n).unwrap_or(0))
        })
        .collect()
}
