//! Standard Webhooks signatures: `webhook-signature` holds `v1,<base64>` entries, each an
//! HMAC-SHA256 of `{webhook-id}.{webhook-timestamp}.{body}` under the endpoint's secret.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, KeyInit, Mac};
use http::HeaderMap;
use http::header::HeaderName;
use sha2::Sha256;

/// The Standard Webhooks timestamp header (Unix seconds).
pub(crate) const WEBHOOK_TIMESTAMP: HeaderName = HeaderName::from_static("webhook-timestamp");
/// The Standard Webhooks signature header.
pub(crate) const WEBHOOK_SIGNATURE: HeaderName = HeaderName::from_static("webhook-signature");

/// Why a signing secret was refused by
/// [`IdempotencyLayer::signing_secret`](crate::IdempotencyLayer::signing_secret).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SecretError {
    /// The secret does not start with `whsec_`.
    Prefix,
    /// What follows `whsec_` is not standard base64, or decodes to nothing.
    Base64,
}

impl fmt::Display for SecretError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SecretError::Prefix => "a Standard Webhooks secret starts with \"whsec_\"",
            SecretError::Base64 => {
                "a Standard Webhooks secret is \"whsec_\" then the key in standard base64"
            }
        })
    }
}

impl std::error::Error for SecretError {}

/// The decoded key of a `whsec_` secret. Its bytes are never printed.
#[derive(Clone)]
pub(crate) struct Secret(Vec<u8>);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    pub(crate) fn parse(secret: &str) -> Result<Secret, SecretError> {
        let b64 = secret.strip_prefix("whsec_").ok_or(SecretError::Prefix)?;
        match STANDARD.decode(b64) {
            Ok(key) if !key.is_empty() => Ok(Secret(key)),
            _ => Err(SecretError::Base64),
        }
    }

    /// Whether the request is signed with this secret within `tolerance` of now.
    pub(crate) fn verify(
        &self,
        headers: &HeaderMap,
        id: &[u8],
        body: &[u8],
        tolerance: Duration,
    ) -> bool {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let one = |name: &HeaderName| {
            let mut all = headers.get_all(name).iter();
            match (all.next(), all.next()) {
                (Some(v), None) => Some(v.as_bytes()),
                _ => None,
            }
        };
        match (one(&WEBHOOK_TIMESTAMP), one(&WEBHOOK_SIGNATURE)) {
            (Some(ts), Some(sig)) => self.verify_at(now, id, ts, sig, body, tolerance),
            _ => false,
        }
    }

    /// The check itself, against a given clock (`now` in Unix seconds).
    pub(crate) fn verify_at(
        &self,
        now: u64,
        id: &[u8],
        timestamp: &[u8],
        signatures: &[u8],
        body: &[u8],
        tolerance: Duration,
    ) -> bool {
        // A timestamp too far off either way: a replayed capture or a skewed sender.
        let Some(ts) = std::str::from_utf8(timestamp)
            .ok()
            .and_then(|t| t.trim().parse::<u64>().ok())
        else {
            return false;
        };
        if now.abs_diff(ts) > tolerance.as_secs() {
            return false;
        }
        let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(&self.0) else {
            return false;
        };
        mac.update(id);
        mac.update(b".");
        mac.update(timestamp);
        mac.update(b".");
        mac.update(body);
        // Several entries while a sender rotates its secret: any one valid is enough.
        signatures
            .split(|b| *b == b' ')
            .filter_map(|entry| entry.strip_prefix(b"v1,"))
            .filter_map(|b64| STANDARD.decode(b64).ok())
            // `verify_slice` compares in constant time.
            .any(|sig| mac.clone().verify_slice(&sig).is_ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIVE_MIN: Duration = Duration::from_secs(300);

    /// The test vector published with the Standard Webhooks reference libraries.
    #[test]
    fn standard_webhooks_vector() {
        let secret = Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let id = b"msg_p5jXN8AQM9LWM0D4loKWxJek";
        let ts = b"1614265330";
        let body = br#"{"test": 2432232314}"#;
        let sig = b"v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";
        assert!(secret.verify_at(1614265330, id, ts, sig, body, FIVE_MIN));
        // Among other entries, as while a sender rotates its secret.
        let many = b"v1,Zm9v v2,abc v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";
        assert!(secret.verify_at(1614265330, id, ts, many, body, FIVE_MIN));
        // Any change to what is signed fails.
        assert!(!secret.verify_at(
            1614265330,
            id,
            ts,
            sig,
            br#"{"test": 2432232315}"#,
            FIVE_MIN
        ));
        assert!(!secret.verify_at(1614265330, b"msg_other", ts, sig, body, FIVE_MIN));
        // Stale and future timestamps fail, even with a good signature.
        assert!(!secret.verify_at(1614265330 + 301, id, ts, sig, body, FIVE_MIN));
        assert!(!secret.verify_at(1614265330 - 301, id, ts, sig, body, FIVE_MIN));
        assert!(secret.verify_at(1614265330 + 300, id, ts, sig, body, FIVE_MIN));
    }

    #[test]
    fn secrets_are_checked_at_configuration() {
        assert_eq!(
            Secret::parse("MfKQ9r8GKYqrTwjU").unwrap_err(),
            SecretError::Prefix
        );
        assert_eq!(
            Secret::parse("whsec_not base64!").unwrap_err(),
            SecretError::Base64
        );
        assert_eq!(Secret::parse("whsec_").unwrap_err(), SecretError::Base64);
    }
}
