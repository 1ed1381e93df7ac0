//! One-time tokens: issue, then consume exactly once.
//!
#![doc = include_str!("guide/token.md")]

use std::fmt::Write as _;
use std::time::Duration;

use crate::observe::{self, Op};
use crate::{Error, Idem};

/// Issues a token valid for `ttl` in `idem`'s namespace: 128 bits from the OS RNG as 32
/// lowercase hex digits. Only its digest is stored.
pub(crate) async fn issue(idem: &Idem, ttl: Duration) -> Result<String, Error> {
    loop {
        let mut raw = [0u8; 16];
        getrandom::fill(&mut raw)
            .map_err(|e| Error::store(format!("the OS random number generator failed: {e}")))?;
        let mut token = String::with_capacity(32);
        for b in raw {
            let _ = write!(token, "{b:02x}");
        }
        let key = idem.token_key(&token);
        // A collision of 128 random bits does not happen in practice; if the store says
        // the slot is taken anyway, draw again rather than hand out a shared token.
        let store = idem.store();
        let issued = store.issue(&key, ttl);
        if observe::store_call(store.local().is_some(), Op::Issue, issued).await? {
            return Ok(token);
        }
    }
}
