//! Step journals (durable steps) on SQL: kept in the record's own row, in the `steps`
//! and `steps_expires_us` columns (migration 3).
//!
//! Why in the row and not in a table of their own: a claim that takes over a released
//! or expired record returns the journal from the very row version it locked, in the
//! same statement (`RETURNING`). A separate table would be read from the statement's
//! snapshot, taken *before* the claim waited for the row lock, and could miss a step
//! its previous holder journaled in between. A step write is one `UPDATE` of that row,
//! owner-checked under the same lock, so of a step write and a takeover one strictly
//! precedes the other.
//!
//! `steps` is a byte string of entries appended in order; a later entry of a name
//! replaces an earlier one (a verified step's result after its intent). Each entry is
//! the database's clock when it was written (16 ASCII digits of microseconds since the
//! Unix epoch, put in by the statement) and then the part idem sends:
//!
//! ```text
//! 'd' (done) or 'i' (intent) | name length: u16 BE | name | value length: u32 BE | value
//! ```
//!
//! A write to a journal whose `steps_expires_us` has passed starts it afresh, so a dead
//! journal's entries never come back.

use std::time::Duration;

use bytes::Bytes;

use super::{BoxFuture, SqlStore};
use crate::store::journal::from_unix_ms;
use crate::store::{Journal, JournalEntry, JournalStore, Owner};
use crate::{Error, Key};

/// A journal that does not parse: the record is damaged. (Built here, not by `record`,
/// which calls [`parse`] when a claim returns a journal.)
fn corrupt(key: &Key, reason: &str) -> Error {
    Error::Corrupt {
        key: *key,
        reason: reason.to_owned(),
    }
}

/// The part of an entry idem sends: everything after the database's timestamp.
pub(super) fn entry(key: &Key, name: &str, value: Option<&[u8]>) -> Result<Vec<u8>, Error> {
    let name_len = u16::try_from(name.len()).map_err(|_| {
        Error::Config(format!(
            "step name of {} bytes; at most 65535 are journaled",
            name.len()
        ))
    })?;
    let value_len = u32::try_from(value.map_or(0, <[u8]>::len))
        .map_err(|_| corrupt(key, "a step value over 4 GiB cannot be journaled"))?;
    let mut out = Vec::with_capacity(7 + name.len() + value_len as usize);
    out.push(if value.is_some() { b'd' } else { b'i' });
    out.extend_from_slice(&name_len.to_be_bytes());
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(&value_len.to_be_bytes());
    out.extend_from_slice(value.unwrap_or_default());
    Ok(out)
}

/// The live journal a row's `steps` column holds (`None`: none, or expired).
pub(super) fn parse(key: &Key, steps: Option<&[u8]>) -> Result<Journal, Error> {
    let mut journal: Journal = Vec::new();
    let Some(mut rest) = steps else {
        return Ok(journal);
    };
    let bad = || corrupt(key, "malformed step journal");
    while !rest.is_empty() {
        let (at, tail) = rest.split_at_checked(16).ok_or_else(bad)?;
        let at_us: u64 = std::str::from_utf8(at)
            .ok()
            .and_then(|d| d.parse().ok())
            .ok_or_else(bad)?;
        let (&kind, tail) = tail.split_first().ok_or_else(bad)?;
        let (len, tail) = tail.split_at_checked(2).ok_or_else(bad)?;
        let len = usize::from(u16::from_be_bytes([len[0], len[1]]));
        let (name, tail) = tail.split_at_checked(len).ok_or_else(bad)?;
        let name = std::str::from_utf8(name).map_err(|_| bad())?;
        let (len, tail) = tail.split_at_checked(4).ok_or_else(bad)?;
        let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
        let (value, tail) = tail.split_at_checked(len).ok_or_else(bad)?;
        let value = match kind {
            b'd' => Some(Bytes::copy_from_slice(value)),
            b'i' => None,
            _ => return Err(bad()),
        };
        let entry = JournalEntry::new(name, value, from_unix_ms(at_us / 1000));
        match journal.iter_mut().find(|e| e.name == name) {
            Some(old) => *old = entry,
            None => journal.push(entry),
        }
        rest = tail;
    }
    Ok(journal)
}

impl JournalStore for SqlStore {
    fn write_step<'a>(
        &'a self,
        key: &'a Key,
        owner: Owner,
        name: &'a str,
        value: Option<Bytes>,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            let entry = entry(key, name, value.as_deref())?;
            self.bounded(self.dialect.write_step(key, owner, &entry, ttl))
                .await
        })
    }

    fn read_journal<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Journal, Error>> {
        Box::pin(async move {
            let steps = self.bounded(self.dialect.read_journal(key)).await?;
            parse(key, steps.as_deref())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> Key {
        Key::new("ns", "f", format_args!("k"))
    }

    fn stamped(at_us: u64, entry: &[u8]) -> Vec<u8> {
        let mut out = format!("{at_us:016}").into_bytes();
        out.extend_from_slice(entry);
        out
    }

    #[test]
    fn entries_round_trip_and_a_later_entry_of_a_name_wins() {
        let k = key();
        let mut steps = stamped(1_000_000, &entry(&k, "ship", None).unwrap());
        steps.extend(stamped(
            2_000,
            &entry(&k, "charge", Some(b"\0ch_1\xff")).unwrap(),
        ));
        steps.extend(stamped(3_000_000, &entry(&k, "ship", Some(b"")).unwrap()));
        let journal = parse(&k, Some(&steps)).unwrap();
        assert_eq!(journal.len(), 2);
        assert_eq!(journal[0].name, "ship");
        assert_eq!(journal[0].value.as_deref(), Some(&b""[..]));
        assert_eq!(journal[0].at, from_unix_ms(3_000));
        assert_eq!(journal[1].value.as_deref(), Some(&b"\0ch_1\xff"[..]));
        assert!(parse(&k, None).unwrap().is_empty());
    }

    #[test]
    fn a_damaged_journal_is_corrupt_not_a_panic() {
        let k = key();
        let whole = stamped(5, &entry(&k, "a", Some(b"xyz")).unwrap());
        for cut in 1..whole.len() {
            assert!(
                matches!(parse(&k, Some(&whole[..cut])), Err(Error::Corrupt { .. })),
                "cut at {cut}"
            );
        }
        let mut bad_kind = whole.clone();
        bad_kind[16] = b'x';
        assert!(matches!(
            parse(&k, Some(&bad_kind)),
            Err(Error::Corrupt { .. })
        ));
    }
}
