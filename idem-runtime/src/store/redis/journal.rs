//! Step journals (durable steps): a hash beside each record, read with the claim and
//! written by an owner-checked script (see the layout in the module docs).

use std::sync::LazyLock;
use std::time::Duration;

use bytes::Bytes;
use redis::{Cmd, ErrorKind, RedisError, Script, Value};

use super::RedisStore;
use super::connect::is_transport_error;
use super::record::corrupt;
use super::record::{ceil_millis, evalsha};
use super::replicas::Wait;
use crate::store::journal::from_unix_ms;
use crate::store::{BoxFuture, ClaimOutcome, Journal, JournalEntry, JournalStore, Owner};
use crate::{Error, Key};

/// The suffix of a record's journal name (after the hash tag: one slot with the record).
pub(super) const STEPS: &str = ":steps";

static STEP: LazyLock<Script> =
    LazyLock::new(|| Script::new(concat!(include_str!("held.lua"), include_str!("step.lua"))));

/// A claim's answer once the record is taken: `Resumed` if `journal` (an `HGETALL`
/// reply) has entries, else `Claimed`.
pub(super) fn claimed_with(key: &Key, journal: Value) -> Result<ClaimOutcome, Error> {
    let journal = parse_journal(key, journal)?;
    if journal.is_empty() {
        Ok(ClaimOutcome::Claimed { fence: 0 })
    } else {
        Ok(ClaimOutcome::Resumed { journal })
    }
}

/// An `HGETALL` reply (flat pairs, or a RESP3 map) as journal entries.
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
        .map(|pair| match pair {
            (Value::BulkString(name), Value::BulkString(entry)) => entry_of(key, name, entry),
            other => Err(corrupt(key, format!("unexpected journal entry {other:?}"))),
        })
        .collect()
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
    /// `cmd` (a dedup claim's `SET`), then `HGETALL steps`, then `WAIT` if asked, in one
    /// pipeline and one round trip; bounded and retried like [`exec_with`](Self::exec_with).
    /// An error reply to `cmd` is the error; otherwise the three replies.
    pub(super) async fn claim_pipelined(
        &self,
        cmd: &Cmd,
        steps: &str,
        wait: Option<&Wait>,
    ) -> Result<Result<(Value, Value, Option<Value>), RedisError>, Error> {
        use redis::aio::ConnectionLike as _;
        let inner = &*self.inner;
        let bound = inner.timeout + wait.map_or(Duration::ZERO, |w| w.timeout);
        let deadline = tokio::time::Instant::now() + bound;
        let mut lease = match inner.conns.ready() {
            Ok(lease) => lease,
            Err(slot) => Box::pin(tokio::time::timeout_at(deadline, inner.conns.connect(slot)))
                .await
                .map_err(|_| Error::store(inner.conns.target().timed_out(bound)))??,
        };
        let mut pipe = redis::Pipeline::with_capacity(3);
        pipe.add_command(cmd.clone());
        pipe.cmd("HGETALL").arg(steps);
        if let Some(w) = wait {
            pipe.add_command(w.cmd());
        }
        let n = pipe.len();
        let run = lease.conn.req_packed_commands(&pipe, 0, n);
        match tokio::time::timeout_at(deadline, run).await {
            Ok(Ok(replies)) => {
                let mut replies = replies.into_iter();
                Ok(match (replies.next(), replies.next()) {
                    (Some(Value::ServerError(e)), _) => Err(e.into()),
                    (Some(set), Some(journal)) => Ok((set, journal, replies.next())),
                    _ => Err(RedisError::from((
                        ErrorKind::Client,
                        "no reply to a pipelined claim",
                    ))),
                })
            }
            Ok(Err(e)) => {
                if is_transport_error(&e) || e.code() == Some("READONLY") {
                    inner.conns.retire(&lease);
                    return Err(Error::store(e));
                }
                Ok(Err(e))
            }
            Err(_) => {
                inner.conns.retire(&lease);
                Err(Error::store(format!(
                    "redis did not answer within {bound:?}"
                )))
            }
        }
    }

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
