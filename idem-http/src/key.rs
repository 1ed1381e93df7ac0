//! The `Idempotency-Key` header: one Structured Field string (`"abc"`), or the same key
//! bare (`abc`), which is one and the same key.

use std::sync::Arc;

use http::HeaderMap;
use http::header::HeaderName;

/// The header's name.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// The Standard Webhooks event id header, the key in
/// [`IdempotencyLayer::webhooks`](crate::IdempotencyLayer::webhooks) mode.
pub const WEBHOOK_ID: HeaderName = HeaderName::from_static("webhook-id");

/// The header set on every replayed response.
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// The longest key accepted, in characters (all printable ASCII, so also in bytes).
pub const MAX_KEY_LEN: usize = 255;

/// The idempotency key of a request, as the client sent it (unquoted).
///
/// The layer puts it in the request's extensions before the handler runs, so a handler
/// can record it (with the `axum` feature it is also an extractor):
///
/// ```
/// use idem_http::IdempotencyKey;
/// let mut headers = http::HeaderMap::new();
/// headers.insert("idempotency-key", "\"order-42\"".parse().unwrap());
/// let key = IdempotencyKey::from_headers(&headers).unwrap().unwrap();
/// assert_eq!(key.as_str(), "order-42");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
// Shared, because the layer hands a copy to the handler through the request's
// extensions and keeps one for the store.
pub struct IdempotencyKey(Arc<str>);

/// Why a header is not a usable key (each is answered 400).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyError {
    /// The header was sent more than once, or holds a list of several keys.
    Several,
    /// Empty, or longer than [`MAX_KEY_LEN`].
    Length,
    /// Not a Structured Field string nor a bare key of printable ASCII characters.
    Malformed,
}

impl std::fmt::Display for KeyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KeyError::Several => "send exactly one Idempotency-Key, holding one key",
            KeyError::Length => "the Idempotency-Key must be 1 to 255 characters long",
            KeyError::Malformed => {
                "the Idempotency-Key must be a Structured Field string (\"...\") or a bare \
                 key of printable ASCII characters"
            }
        })
    }
}

impl std::error::Error for KeyError {}

impl IdempotencyKey {
    /// The key in `headers`: `Ok(None)` when there is none, an error when it is
    /// malformed or there are several.
    pub fn from_headers(headers: &HeaderMap) -> Result<Option<IdempotencyKey>, KeyError> {
        IdempotencyKey::from_header(headers, &IDEMPOTENCY_KEY)
    }

    /// The key in header `name` (webhook mode reads the sender's event id this way).
    pub(crate) fn from_header(
        headers: &HeaderMap,
        name: &HeaderName,
    ) -> Result<Option<IdempotencyKey>, KeyError> {
        let mut values = headers.get_all(name).iter();
        let Some(value) = values.next() else {
            return Ok(None);
        };
        if values.next().is_some() {
            return Err(KeyError::Several);
        }
        IdempotencyKey::parse(value.as_bytes()).map(Some)
    }

    /// Parses one header value: a Structured Field string (RFC 8941 `sf-string`, with
    /// `\"` and `\\` escapes) or a bare key of visible ASCII characters without `"`,
    /// `,` or `;`, surrounded by optional spaces. `"abc"` and `abc` are the same key.
    /// Parameters (`"abc";p=1`, `abc;p=1`) are refused either way.
    ///
    /// ```
    /// use idem_http::{IdempotencyKey, KeyError};
    /// assert_eq!(IdempotencyKey::parse(b"\"a\\\"b\"").unwrap().as_str(), "a\"b");
    /// assert_eq!(IdempotencyKey::parse(b" abc ").unwrap(), IdempotencyKey::parse(b"\"abc\"").unwrap());
    /// assert_eq!(IdempotencyKey::parse(b"\"a\", \"b\""), Err(KeyError::Several));
    /// assert_eq!(IdempotencyKey::parse(b"\"\""), Err(KeyError::Length));
    /// assert_eq!(IdempotencyKey::parse("caf\u{e9}".as_bytes()), Err(KeyError::Malformed));
    /// ```
    pub fn parse(raw: &[u8]) -> Result<IdempotencyKey, KeyError> {
        let raw = trim(raw);
        // A quoted key is unescaped on the stack: the only allocation is the key's own.
        let mut unescaped = [0u8; MAX_KEY_LEN];
        let key = match raw.first() {
            Some(b'"') => sf_string(raw, &mut unescaped)?,
            _ => bare(raw)?,
        };
        if key.is_empty() || key.len() > MAX_KEY_LEN {
            return Err(KeyError::Length);
        }
        Ok(IdempotencyKey(Arc::from(key)))
    }

    /// The key, unquoted.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The key, unquoted.
    pub fn into_string(self) -> String {
        self.0.to_string()
    }
}

impl std::fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn trim(mut raw: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = raw {
        raw = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = raw {
        raw = rest;
    }
    raw
}

/// Unescapes the Structured Field string at the start of `raw` into `out`.
fn sf_string<'a>(raw: &[u8], out: &'a mut [u8; MAX_KEY_LEN]) -> Result<&'a str, KeyError> {
    let mut len = 0;
    let mut i = 1;
    loop {
        let c = match raw.get(i) {
            None => return Err(KeyError::Malformed),
            Some(b'\\') => match raw.get(i + 1) {
                Some(c @ (b'"' | b'\\')) => {
                    i += 2;
                    *c
                }
                _ => return Err(KeyError::Malformed),
            },
            Some(b'"') => {
                i += 1;
                break;
            }
            Some(c @ 0x20..=0x7e) => {
                i += 1;
                *c
            }
            Some(_) => return Err(KeyError::Malformed),
        };
        if len == MAX_KEY_LEN {
            return Err(KeyError::Length);
        }
        out[len] = c;
        len += 1;
    }
    match trim(&raw[i..]) {
        [] => {}
        [b',', ..] => return Err(KeyError::Several),
        // Parameters (`"abc";p=1`) or trailing garbage: not a plain string.
        _ => return Err(KeyError::Malformed),
    }
    // Only printable ASCII was written.
    std::str::from_utf8(&out[..len]).map_err(|_| KeyError::Malformed)
}

fn bare(raw: &[u8]) -> Result<&str, KeyError> {
    if raw.contains(&b',') {
        return Err(KeyError::Several);
    }
    if raw.len() > MAX_KEY_LEN {
        return Err(KeyError::Length);
    }
    // `;` starts Structured Field parameters, which a quoted key may not carry either:
    // `k1;a=1` is refused as `"k1";a=1` is, rather than read as another key.
    if !raw
        .iter()
        .all(|c| matches!(c, 0x21..=0x7e) && *c != b'"' && *c != b';')
    {
        return Err(KeyError::Malformed);
    }
    std::str::from_utf8(raw).map_err(|_| KeyError::Malformed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoted_and_bare_are_one_key() {
        assert_eq!(
            IdempotencyKey::parse(b"abc").unwrap(),
            IdempotencyKey::parse(b"\"abc\"").unwrap()
        );
        assert_eq!(IdempotencyKey::parse(b"\"a b\"").unwrap().as_str(), "a b");
    }

    #[test]
    fn garbage_is_rejected() {
        let long = "k".repeat(256);
        let quoted_long = format!("\"{long}\"");
        for (raw, want) in [
            (&b""[..], KeyError::Length),
            (b"   ", KeyError::Length),
            (b"\"\"", KeyError::Length),
            (long.as_bytes(), KeyError::Length),
            (quoted_long.as_bytes(), KeyError::Length),
            (b"a,b", KeyError::Several),
            (b"\"a\",\"b\"", KeyError::Several),
            (b"\"a\" , b", KeyError::Several),
            (b"\"abc", KeyError::Malformed),
            (b"\"a\\nb\"", KeyError::Malformed),
            (b"\"abc\";p=1", KeyError::Malformed),
            (b"abc;p=1", KeyError::Malformed),
            (b"abc;", KeyError::Malformed),
            (b"a b", KeyError::Malformed),
            (b"a\"b", KeyError::Malformed),
            (b"\xc3\xa9", KeyError::Malformed),
            (b"\"\xc3\xa9\"", KeyError::Malformed),
            (b"a\x7fb", KeyError::Malformed),
        ] {
            assert_eq!(
                IdempotencyKey::parse(raw),
                Err(want),
                "{:?}",
                String::from_utf8_lossy(raw)
            );
        }
        assert_eq!(
            IdempotencyKey::parse(&[b'k'; 255]).unwrap().as_str().len(),
            255
        );
    }
}
