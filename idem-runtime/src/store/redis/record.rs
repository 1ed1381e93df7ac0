//! What the store writes: the in-progress record's bytes, hex names, durations in
//! milliseconds, and script calls.

use std::time::Duration;

use redis::{Cmd, Script};

use crate::store::{ClaimKind, ClaimRequest, Owner};
use crate::{Error, Key};

pub(super) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Leases and ttls in whole milliseconds, rounded up: Redis treats `PEXPIRE 0` as "delete
/// now", and a 0.5 ms lease should not be a zero one.
pub(super) fn ceil_millis(d: Duration) -> u64 {
    let ms = millis(d);
    if Duration::from_millis(ms) < d {
        ms.saturating_add(1)
    } else {
        ms.max(1)
    }
}

/// `EVALSHA <sha> <nkeys>`, to which the caller appends keys and arguments. Built
/// directly rather than through `redis::ScriptInvocation`, which copies every key and
/// argument once more on each call.
pub(super) fn evalsha(script: &Script, nkeys: usize) -> Cmd {
    let mut cmd = Cmd::with_capacity(10, 256);
    cmd.arg("EVALSHA").arg(script.get_hash()).arg(nkeys);
    cmd
}

/// 16 bytes as 32 lowercase hex digits, without a heap allocation.
pub(super) struct Hex32([u8; 32]);

impl Hex32 {
    pub(super) fn as_str(&self) -> &str {
        // Only ASCII hex digits are ever written.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

pub(super) fn hex32(bytes: &[u8; 16]) -> Hex32 {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; 32];
    for (i, b) in bytes.iter().enumerate() {
        out[2 * i] = HEX[usize::from(b >> 4)];
        out[2 * i + 1] = HEX[usize::from(b & 15)];
    }
    Hex32(out)
}

/// The owner as 32 lowercase hex digits, without a heap allocation (toolbox records).
pub(super) fn owner_hex(o: Owner) -> [u8; 32] {
    hex32(&o.0.to_be_bytes()).0
}

/// The longest in-progress record the client writes: state, waited flag, kind, owner,
/// fingerprint (a token claim's deadlines are appended by the claim script).
pub(super) const CLAIM_MAX: usize = 3 + 16 + 16;

/// The in-progress record for `req`: `p`, `-` (nobody waited yet), the kind, the owner's
/// 16 bytes and the fingerprint's 16 if any. Returned with its length, on the stack.
pub(super) fn in_progress(req: &ClaimRequest) -> ([u8; CLAIM_MAX], usize) {
    let mut b = [0u8; CLAIM_MAX];
    b[0] = b'p';
    b[1] = b'-';
    b[2] = match req.kind {
        ClaimKind::Dedup => b'd',
        ClaimKind::Lock => b'l',
        ClaimKind::Token => b't',
    };
    b[3..19].copy_from_slice(&req.owner.0.to_be_bytes());
    match &req.fingerprint {
        Some(f) => {
            b[19..35].copy_from_slice(&f.0);
            (b, 35)
        }
        None => (b, 19),
    }
}

/// A record (or a reply about one) that does not have the shape idem writes.
pub(super) fn corrupt(key: &Key, reason: impl Into<String>) -> Error {
    Error::Corrupt {
        key: *key,
        reason: reason.into(),
    }
}
