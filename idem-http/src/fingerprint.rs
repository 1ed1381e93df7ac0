//! The fingerprint of a request: what makes two requests under one key "the same
//! request".

use http::header::CONTENT_TYPE;
use http::request;
use idem_runtime::Fingerprint;

/// What makes two requests under one key "the same request": method, path, query,
/// Content-Type and a digest of the body, each length-framed.
pub(crate) fn fingerprint(parts: &request::Parts, body: &[u8]) -> Fingerprint {
    let content_type = parts.headers.get(CONTENT_TYPE);
    let fields: [&[u8]; 5] = [
        parts.method.as_str().as_bytes(),
        parts.uri.path().as_bytes(),
        parts.uri.query().unwrap_or_default().as_bytes(),
        content_type.map_or(&b""[..], |v| v.as_bytes()),
        body,
    ];
    digest(fields)
}

/// Requests up to this many framed bytes are hashed in one call from a stack copy.
const INLINE_FINGERPRINT: usize = 256;

/// BLAKE3 of the length-framed fields. Most requests are small, and for them the
/// hasher's cost per `update` call outweighs hashing the bytes, so they are framed into
/// a stack buffer and hashed at once; larger ones stream. The bytes hashed are the same
/// either way, and so is the fingerprint.
fn digest(fields: [&[u8]; 5]) -> Fingerprint {
    let framed: usize = fields.iter().map(|f| 8 + f.len()).sum();
    let hash = if framed <= INLINE_FINGERPRINT {
        let mut buf = [0u8; INLINE_FINGERPRINT];
        let mut at = 0;
        for f in fields {
            buf[at..at + 8].copy_from_slice(&(f.len() as u64).to_le_bytes());
            buf[at + 8..at + 8 + f.len()].copy_from_slice(f);
            at += 8 + f.len();
        }
        blake3::hash(&buf[..at])
    } else {
        let mut h = blake3::Hasher::new();
        for f in fields {
            h.update(&(f.len() as u64).to_le_bytes());
            h.update(f);
        }
        h.finalize()
    };
    let mut out = [0u8; 16];
    out.copy_from_slice(&hash.as_bytes()[..16]);
    Fingerprint(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The framed stream, hashed without the stack copy: what every fingerprint must be.
    fn streamed(fields: [&[u8]; 5]) -> Fingerprint {
        let mut h = blake3::Hasher::new();
        for f in fields {
            h.update(&(f.len() as u64).to_le_bytes());
            h.update(f);
        }
        let mut out = [0u8; 16];
        out.copy_from_slice(&h.finalize().as_bytes()[..16]);
        Fingerprint(out)
    }

    #[test]
    fn small_and_large_requests_fingerprint_alike() {
        // Bodies on both sides of the inline limit, so both paths are checked.
        for len in [0, 1, 100, 190, 191, 192, 193, 256, 1000] {
            let body = vec![b'x'; len];
            let fields: [&[u8]; 5] = [b"POST", b"/payments", b"a=1", b"application/json", &body];
            assert_eq!(digest(fields), streamed(fields), "body of {len} bytes");
        }
    }

    #[test]
    fn fields_are_framed() {
        // Moving bytes from one field to the next changes the fingerprint.
        let a = digest([b"POST", b"/a", b"", b"", b"b"]);
        let b = digest([b"POST", b"/ab", b"", b"", b""]);
        assert_ne!(a, b);
    }
}
