//! Step journals (durable steps): a hash beside each record, read by the claim that
//! resumes it and written by an owner-checked script (see the layout in the module docs).

use std::sync::LazyLock;
use std::time::Duration;

use bytes::Bytes;
use redis::{Cmd, Script, Value};

use super::RedisStore;
use super::record::corrupt;
use super::record::{ceil_millis, evalsha};
use crate::store::journal::from_unix_ms;
use crate::store::{BoxFuture, ClaimOutcome, Journal, JournalEntry, JournalStore, Owner};
use crate::{Error, Key};

/// The suffix of a record's journal name (after the hash tag: one slot with the record).
pub(super) const STEPS: &str = ":steps";

/// The journal's field that keeps the fingerprint it was written under (see `step.lua`):
/// the single byte 0xFF, never valid UTF-8, so never a step name.
const FINGERPRINT_FIELD: &[u8] = b"\xff";

static STEP: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("scripts/held.lua"),
        include_str!("scripts/step.lua")
    ))
});

/// A claim's answer once the record is taken, with `journal` (an `HGETALL` reply).
pub(super) fn claimed_with(key: &Key, journal: Value) -> Result<ClaimOutcome, Error> {
    Ok(ClaimOutcome::resuming(parse_journal(key, journal)?))
}

/// An `HGETALL` reply (flat pairs, or a RESP3 map) as journal entries, without the
/// journal's fingerprint.
fn parse_journal(key: &Key, reply: Value) -> Result<Journal, Error> {
    let pairs: Vec<(Value, Value)> = match reply {
        Value::Nil => return Ok(Vec::new()),
        Value::Array(items) => {
            let mut out = Vec::with_capacity(items.len() / 2);
            let mut items = items.into_iter();
            while let (Some(k), Some(v)) = (items.next(), items.next()) {
                out.push((k, v));
            }
            out
        }
        Value::Map(pairs) => pairs,
        other => return Err(corrupt(key, format!("unexpected journal {other:?}"))),
    };
    pairs
        .into_iter()
        .filter(|(name, _)| !matches!(name, Value::BulkString(n) if reserved(n)))
        .map(|pair| match pair {
            (Value::BulkString(name), Value::BulkString(entry)) => entry_of(key, name, entry),
            other => Err(corrupt(key, format!("unexpected journal entry {other:?}"))),
        })
        .collect()
}

/// A journal field that is no step: one byte from 0xFC up, never valid UTF-8 (the
/// fingerprint, and a recoverable call's arguments, attempts and parking error).
fn reserved(name: &[u8]) -> bool {
    matches!(name, [b] if *b >= 0xFC) || name == FINGERPRINT_FIELD
}

/// `d` or `i`, 15 decimal digits of ms, the value.
fn entry_of(key: &Key, name: Vec<u8>, entry: Vec<u8>) -> Result<JournalEntry, Error> {
    let name = String::from_utf8(name).map_err(|_| corrupt(key, "step name is not UTF-8"))?;
    let at = entry
        .get(1..16)
        .and_then(|d| std::str::from_utf8(d).ok())
        .and_then(|d| d.parse::<u64>().ok())
        .ok_or_else(|| corrupt(key, "malformed journal entry"))?;
    let value = match entry.first() {
        Some(b'd') => Some(Bytes::from(entry).slice(16..)),
        Some(b'i') => None,
        _ => return Err(corrupt(key, "malformed journal entry")),
    };
    Ok(JournalEntry::new(name, value, from_unix_ms(at)))
}

impl RedisStore {
    async fn write_step_script(
        &self,
        key: &Key,
        owner: Owner,
        name: &str,
        value: Option<Bytes>,
        ttl: Duration,
    ) -> Result<bool, Error> {
        let names = self.name_with(key, STEPS);
        let mut cmd = evalsha(&STEP, 2);
        cmd.arg(&names[..names.len() - STEPS.len()])
            .arg(&names)
            .arg(&owner.0.to_be_bytes()[..])
            .arg(name)
            .arg(if value.is_some() { "d" } else { "i" })
            .arg(value.as_deref().unwrap_or_default())
            .arg(ceil_millis(ttl));
        self.eval_bool_acked(key, &STEP, cmd).await
    }

    async fn read_journal_cmd(&self, key: &Key) -> Result<Journal, Error> {
        let mut cmd = Cmd::new();
        cmd.arg("HGETALL").arg(self.name_with(key, STEPS));
        let v = self.exec(None, &cmd).await?.map_err(Error::store)?;
        parse_journal(key, v)
    }
}

impl JournalStore for RedisStore {
    fn write_step<'a>(
        &'a self,
        key: &'a Key,
        owner: Owner,
        name: &'a str,
        value: Option<Bytes>,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.write_step_script(key, owner, name, value, ttl))
    }

    fn read_journal<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Journal, Error>> {
        Box::pin(self.read_journal_cmd(key))
    }
}
