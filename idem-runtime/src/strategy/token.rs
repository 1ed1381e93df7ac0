//! One-time tokens: issue, then consume exactly once.
//!
#![doc = include_str!("guide/token.md")]

use std::fmt::Write as _;
use std::time::Duration;

use crate::Options;
use crate::codec::Codec;
use crate::observe::{self, Op};
use crate::store::ClaimKind;
use crate::{Error, Idem};
use std::future::Future;

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

impl Idem {
    /// Issues a one-time token valid for `ttl`: at least 128 random bits from the OS
    /// RNG. Consume it with a `strategy = "token"` function (or [`Idem::consume_token`]);
    /// it is valid for every token-strategy function of this namespace.
    pub async fn issue_token(&self, ttl: Duration) -> Result<String, Error> {
        issue(self, ttl).await
    }

    /// Consumes `token` (from [`Idem::issue_token`]) by running `body` once. A second
    /// consumption is rejected (or replayed, with a replaying codec); an unknown or
    /// expired token is [`Error::TokenInvalid`]; an `Err` from the body (not cached)
    /// returns the token to its issued state, so it can be used again.
    pub async fn consume_token<C, T, E, F>(
        &self,
        opts: &Options,
        token: &str,
        body: F,
    ) -> Result<T, E>
    where
        C: Codec<T, E>,
        E: From<Error>,
        F: Future<Output = Result<T, E>>,
    {
        let key = self.token_key(token);
        super::dedup::run::<C, T, E, F>(self, opts, ClaimKind::Token, key, None, None, None, body)
            .await
    }
}
