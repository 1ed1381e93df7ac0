//! Step journals (durable steps) on SQL: one row per step in `idem_steps` (migration 4),
//! and on the record's row what a claim must decide atomically: whether the journal
//! lives (`steps_expires_us`), the payload it was written for (`steps_fp`), and a write
//! counter (`steps_n`, `steps_base`).
//!
//! A step write costs the size of that step: it inserts (or replaces) its own row and
//! never reads or rewrites the others. It is one atomic, owner-checked operation
//! (PostgreSQL: one statement; MySQL and SQLite: one transaction) that first updates the
//! record's row, under that row's lock: it bumps `steps_n` and the new entry takes it as
//! its `seq`, so of a step write and a takeover one strictly precedes the other.
//!
//! An entry is live while the journal lives and its `seq` is above the row's
//! `steps_base`. A write to a dead journal (expired, or never written) starts it afresh
//! by moving `steps_base` up to the counter, so a dead journal's entries never come back
//! whether or not they were deleted yet; completion and `forget` do the same in their
//! one statement. A record row inserted anew starts its counter at the database's clock
//! in µs, above any entry a purged earlier row of the key may have left. Dead entries
//! are deleted by those statements (PostgreSQL, in the same statement), right after
//! them (MySQL, SQLite), or by the purge.
//!
//! The claim that takes a record over reads the live entries in a second statement,
//! only when the row it took has a live journal (the resume path): the claim itself
//! ordered the takeover after the old holder's last step write, which had committed,
//! so the read sees it. Reading them inside the claim statement would not: PostgreSQL
//! takes a statement's snapshot before it waits for the row lock.
//!
//! An entry is the database's clock when it was written (`at_us`) and the part idem
//! sends:
//!
//! ```text
//! 'd' (done) or 'i' (intent) | name length: u16 BE | name | value length: u32 BE | value
//! ```
//!
//! Rows are keyed by the record and 16 bytes of BLAKE3 of the step name (any name fits
//! an index). A journal written by version 3 (all entries in one value of the record's
//! row) is carried over by migration 4 as one row under the name id `X'00'`, holding
//! that value as it was: entries each stamped by 16 ASCII digits of microseconds.

use std::time::Duration;

use bytes::Bytes;

use super::{BoxFuture, SqlStore};
use crate::store::journal::from_unix_ms;
use crate::store::{Journal, JournalEntry, JournalStore, Owner};
use crate::{Error, Key};

/// The name id of a journal carried over from version 3 (see the module docs): one byte,
/// so it never equals a name's 16-byte hash.
pub(super) const LEGACY: &[u8] = &[0];

/// One live entry row, as the journal's read returns them (in `seq` order).
#[derive(Debug)]
pub(super) struct StepRow {
    pub(super) name_id: Vec<u8>,
    pub(super) at_us: i64,
    pub(super) entry: Vec<u8>,
}

/// The key of a step's row beside the record's id: a name of any length fits an index.
pub(super) fn name_id(name: &str) -> [u8; 16] {
    let hash = blake3::hash(name.as_bytes());
    let mut id = [0u8; 16];
    id.copy_from_slice(&hash.as_bytes()[..16]);
    id
}

/// A journal that does not parse: the record is damaged. (Built here, not by `record`,
/// which calls [`parse_rows`] when a claim resumes a journal.)
fn corrupt(key: &Key, reason: &str) -> Error {
    Error::Corrupt {
        key: *key,
        reason: reason.to_owned(),
    }
}

/// The part of an entry idem sends: everything but the database's timestamp.
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

/// Splits one entry (see [`entry`]) off the front of `bytes`: the entry and the rest.
fn one_entry<'b>(
    key: &Key,
    bytes: &'b [u8],
    at_us: u64,
) -> Result<(JournalEntry, &'b [u8]), Error> {
    let bad = || corrupt(key, "malformed step journal");
    let (&kind, tail) = bytes.split_first().ok_or_else(bad)?;
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
    Ok((
        JournalEntry::new(name, value, from_unix_ms(at_us / 1000)),
        tail,
    ))
}

/// Adds `entry` to `journal`: a later entry of a name replaces the earlier one in place.
fn merge(journal: &mut Journal, entry: JournalEntry) {
    match journal.iter_mut().find(|e| e.name == entry.name) {
        Some(old) => *old = entry,
        None => journal.push(entry),
    }
}

/// A version-3 journal value: entries, each after 16 ASCII digits of microseconds.
fn parse_legacy(key: &Key, mut rest: &[u8], journal: &mut Journal) -> Result<(), Error> {
    let bad = || corrupt(key, "malformed step journal");
    while !rest.is_empty() {
        let (at, tail) = rest.split_at_checked(16).ok_or_else(bad)?;
        let at_us: u64 = std::str::from_utf8(at)
            .ok()
            .and_then(|d| d.parse().ok())
            .ok_or_else(bad)?;
        let (entry, tail) = one_entry(key, tail, at_us)?;
        merge(journal, entry);
        rest = tail;
    }
    Ok(())
}

/// The journal the live rows of a record hold, in the order of their last write.
pub(super) fn parse_rows(key: &Key, rows: &[StepRow]) -> Result<Journal, Error> {
    let mut journal: Journal = Vec::with_capacity(rows.len());
    for row in rows {
        if row.name_id == LEGACY {
            parse_legacy(key, &row.entry, &mut journal)?;
            continue;
        }
        let at_us = u64::try_from(row.at_us).map_err(|_| corrupt(key, "negative step time"))?;
        let (entry, rest) = one_entry(key, &row.entry, at_us)?;
        if !rest.is_empty() || name_id(&entry.name)[..] != row.name_id[..] {
            return Err(corrupt(key, "malformed step journal"));
        }
        merge(&mut journal, entry);
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
            let step = Step {
                name,
                name_id: name_id(name),
                entry: &entry,
                ttl,
            };
            let written = self
                .bounded(self.dialect.write_step(self, key, owner, &step))
                .await?;
            if written {
                self.journaled.note(key);
            }
            Ok(written)
        })
    }

    fn read_journal<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Journal, Error>> {
        Box::pin(async move {
            let rows = self.bounded(self.dialect.read_journal(key)).await?;
            parse_rows(key, &rows)
        })
    }

    fn in_tx(&self) -> Option<&dyn crate::store::TxJournalStore> {
        Some(self)
    }
}

/// A step write, as the dialects take it.
pub(super) struct Step<'a> {
    /// The step's name, for errors (MySQL's packet limit).
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    pub(super) name: &'a str,
    pub(super) name_id: [u8; 16],
    /// See [`entry`].
    pub(super) entry: &'a [u8],
    /// The journal expires this long after the write.
    pub(super) ttl: Duration,
}

/// Keys this process journaled a step for (or resumed a journal of), so that on MySQL and
/// SQLite, whose completion drops the journal in its one `UPDATE` without deleting its
/// rows, the rows are deleted right after (PostgreSQL deletes them in the statement).
/// Bounded: a key it forgets leaves its dead rows to the purge.
#[derive(Default)]
pub(super) struct Journaled(std::sync::Mutex<std::collections::HashSet<[u8; 16]>>);

const JOURNALED_MAX: usize = 4096;

impl Journaled {
    pub(super) fn note(&self, key: &Key) {
        let mut set = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if set.len() >= JOURNALED_MAX {
            set.clear();
        }
        set.insert(*key.digest());
    }

    /// Whether `key` was noted; forgets it.
    pub(super) fn take(&self, key: &Key) -> bool {
        let mut set = self.0.lock().unwrap_or_else(|p| p.into_inner());
        !set.is_empty() && set.remove(key.digest())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> Key {
        Key::new("ns", "f", format_args!("k"))
    }

    fn row(name: &str, at_us: i64, value: Option<&[u8]>) -> StepRow {
        StepRow {
            name_id: name_id(name).to_vec(),
            at_us,
            entry: entry(&key(), name, value).unwrap(),
        }
    }

    fn stamped(at_us: u64, entry: &[u8]) -> Vec<u8> {
        let mut out = format!("{at_us:016}").into_bytes();
        out.extend_from_slice(entry);
        out
    }

    #[test]
    fn rows_round_trip_and_a_later_entry_of_a_name_wins() {
        let k = key();
        let rows = [
            row("ship", 1_000_000, None),
            row("charge", 2_000, Some(b"\0ch_1\xff")),
            row("ship", 3_000_000, Some(b"")),
        ];
        let journal = parse_rows(&k, &rows).unwrap();
        assert_eq!(journal.len(), 2);
        assert_eq!(journal[0].name, "ship");
        assert_eq!(journal[0].value.as_deref(), Some(&b""[..]));
        assert_eq!(journal[0].at, from_unix_ms(3_000));
        assert_eq!(journal[1].value.as_deref(), Some(&b"\0ch_1\xff"[..]));
        assert!(parse_rows(&k, &[]).unwrap().is_empty());
    }

    /// A version-3 journal carried over as one row, then steps written since.
    #[test]
    fn a_carried_over_journal_reads_first() {
        let k = key();
        let mut old = stamped(1_000_000, &entry(&k, "charge", Some(b"old")).unwrap());
        old.extend(stamped(2_000_000, &entry(&k, "mail", None).unwrap()));
        let rows = [
            StepRow {
                name_id: LEGACY.to_vec(),
                at_us: 0,
                entry: old,
            },
            row("mail", 3_000_000, Some(b"sent")),
        ];
        let journal = parse_rows(&k, &rows).unwrap();
        assert_eq!(journal.len(), 2);
        assert_eq!(journal[0].value.as_deref(), Some(&b"old"[..]));
        assert_eq!(journal[1].value.as_deref(), Some(&b"sent"[..]));
    }

    #[test]
    fn a_damaged_journal_is_corrupt_not_a_panic() {
        let k = key();
        let whole = row("a", 5, Some(b"xyz"));
        for cut in 0..whole.entry.len() {
            let cut = StepRow {
                entry: whole.entry[..cut].to_vec(),
                name_id: whole.name_id.clone(),
                at_us: 5,
            };
            assert!(
                matches!(parse_rows(&k, &[cut]), Err(Error::Corrupt { .. })),
                "cut"
            );
        }
        let mut bad_kind = row("a", 5, Some(b"xyz"));
        bad_kind.entry[0] = b'x';
        assert!(matches!(
            parse_rows(&k, &[bad_kind]),
            Err(Error::Corrupt { .. })
        ));
        // An entry under another name's row.
        let mut moved = row("a", 5, Some(b"xyz"));
        moved.name_id = name_id("b").to_vec();
        assert!(matches!(
            parse_rows(&k, &[moved]),
            Err(Error::Corrupt { .. })
        ));
        let legacy = stamped(5, &entry(&k, "a", Some(b"xyz")).unwrap());
        for cut in 1..legacy.len() {
            let row = StepRow {
                name_id: LEGACY.to_vec(),
                at_us: 0,
                entry: legacy[..cut].to_vec(),
            };
            assert!(matches!(parse_rows(&k, &[row]), Err(Error::Corrupt { .. })));
        }
    }
}
