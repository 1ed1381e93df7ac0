//! Reading what Redis answers: completed records and the claim script's replies, and
//! anything else as [`Error::Corrupt`].

use std::time::Duration;

use bytes::Bytes;
use redis::Value;

use super::record::corrupt;
use crate::store::ClaimOutcome;
use crate::{Error, Fingerprint, Key};

/// A 1/0 script answer (or its corrupt-record report).
pub(super) fn bool_reply(key: &Key, v: Value) -> Result<bool, Error> {
    match v {
        Value::Int(n) => Ok(n == 1),
        Value::Array(items) => Err(corrupt_from(key, &items)),
        other => Err(corrupt(key, format!("unexpected reply {other:?}"))),
    }
}

pub(super) fn corrupt_from(key: &Key, items: &[Value]) -> Error {
    match items {
        [Value::Int(0), Value::BulkString(b)] => corrupt(key, String::from_utf8_lossy(b)),
        _ => corrupt(key, format!("unexpected reply {items:?}")),
    }
}

pub(super) fn fingerprint(key: &Key, v: Option<&Value>) -> Result<Option<Fingerprint>, Error> {
    match v {
        None | Some(Value::Nil) => Ok(None),
        Some(Value::BulkString(b)) => <[u8; 16]>::try_from(b.as_slice())
            .map(|a| Some(Fingerprint(a)))
            .map_err(|_| corrupt(key, "fingerprint of the wrong size")),
        Some(other) => Err(corrupt(key, format!("unexpected fingerprint {other:?}"))),
    }
}

/// A completed record (`c-<value>` or `cf<fingerprint><value>`) as a claim's answer. The
/// value is a view into the reply's buffer, not a copy.
pub(super) fn parse_completed(key: &Key, record: Vec<u8>) -> Result<ClaimOutcome, Error> {
    let (fingerprint, at) = match record.get(..2) {
        Some(b"c-") => (None, 2),
        Some(b"cf") if record.len() >= 18 => {
            let mut f = [0u8; 16];
            f.copy_from_slice(&record[2..18]);
            (Some(Fingerprint(f)), 18)
        }
        _ => return Err(corrupt(key, "malformed completed record")),
    };
    Ok(ClaimOutcome::Completed {
        value: Bytes::from(record).slice(at..),
        fingerprint,
    })
}

/// The claim script's answer: a bare integer (the fence) for a claim, else `{tag, ...}`.
pub(super) fn parse_claim(key: &Key, reply: Value) -> Result<ClaimOutcome, Error> {
    let items = match reply {
        Value::Int(fence) => {
            return Ok(ClaimOutcome::claimed(u64::try_from(fence).unwrap_or(0)));
        }
        Value::Array(items) => items,
        other => return Err(corrupt(key, format!("unexpected reply {other:?}"))),
    };
    let mut items = items.into_iter();
    let tag = items.next();
    let a = items.next();
    let b = items.next();
    match (tag, a) {
        (Some(Value::Int(2)), Some(Value::Int(ms))) => Ok(ClaimOutcome::Busy {
            retry_in: Duration::from_millis(u64::try_from(ms).unwrap_or(0)),
            fingerprint: fingerprint(key, b.as_ref())?,
        }),
        (Some(Value::Int(3)), Some(Value::BulkString(record))) => parse_completed(key, record),
        (Some(Value::Int(4)), None) => Ok(ClaimOutcome::Missing),
        (Some(Value::Int(5)), Some(fp)) => match fingerprint(key, Some(&fp))? {
            Some(fingerprint) => Ok(ClaimOutcome::OtherPayload { fingerprint }),
            None => Err(corrupt(key, "another payload without its fingerprint")),
        },
        (Some(Value::Int(1)), Some(journal)) => super::journal::claimed_with(key, journal),
        (Some(Value::Int(0)), Some(Value::BulkString(why))) => {
            Err(corrupt(key, String::from_utf8_lossy(&why)))
        }
        (tag, a) => Err(corrupt(key, format!("unexpected reply {tag:?} {a:?}"))),
    }
}
