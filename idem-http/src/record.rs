//! What a completed key stores: the response's status, its allow-listed headers and its
//! body bytes, as they were (never re-encoded), in a checksummed envelope.
//!
//! Layout: `b"ih"`, a layout version, a kind (a response, or "completed without a
//! replayable body", each optionally flagged as carrying the request's fingerprint), a
//! CRC-32 of everything after it, then the fingerprint (16 bytes) if flagged, the
//! status (u16), the header count (u16), each header as name and value with u16
//! lengths, and the body.
//!
//! The fingerprint is kept in token mode, whose claim takes no fingerprint: the layer
//! compares it itself before replaying, so a used token sent with another request is
//! 422, as a reused key is.

use std::collections::VecDeque;
use std::pin::Pin;

use bytes::{BufMut, Bytes, BytesMut};
use http::header::{HeaderName, HeaderValue};
use http::{StatusCode, response};
use http_body::Body;
use idem_runtime::{Codec, Error, Fingerprint, Key};

const MAGIC: &[u8; 2] = b"ih";
const VERSION: u8 = 1;
const KIND_RESPONSE: u8 = 0;
const KIND_NOT_REPLAYABLE: u8 = 1;
/// Set on a kind whose record carries the request's fingerprint.
const WITH_REQUEST: u8 = 0x10;
/// Magic, version, kind, CRC-32.
const HEADER: usize = 8;

/// A response as stored and replayed.
#[derive(Debug, Clone)]
pub(crate) struct Stored {
    pub(crate) status: StatusCode,
    pub(crate) headers: Vec<(HeaderName, HeaderValue)>,
    pub(crate) body: Bytes,
    /// The fingerprint of the request that ran (token mode only).
    pub(crate) request: Option<Fingerprint>,
}

/// What one run of the handler (or a replay) gives the layer.
pub(crate) enum Ran<B: Body> {
    /// The handler's response, buffered; `stored` is what is kept of it.
    Fresh {
        parts: response::Parts,
        stored: Stored,
    },
    /// A response over `max_response_bytes` (or whose body failed while being read):
    /// the key completes without a replayable body; the caller still gets all of it.
    Spilled {
        parts: response::Parts,
        prefix: VecDeque<Bytes>,
        rest: Option<Pin<Box<B>>>,
        error: Option<B::Error>,
        request: Option<Fingerprint>,
    },
    /// A stored response, read back.
    Replayed(Stored),
    /// A key that completed without a replayable body, read back (with the fingerprint
    /// of the request that ran, in token mode).
    NotReplayable(Option<Fingerprint>),
}

/// Why a run ended without a stored result; each releases the key.
pub(crate) enum Failed<R, E> {
    /// idem refused or failed (in flight, mismatch, store down, ...).
    Idem(Error),
    /// The handler's response is of a status that is not stored (5xx, 408, 429 by
    /// default): passed on as it is.
    NotStored(R),
    /// The inner service failed.
    Inner(E),
}

impl<R, E> From<Error> for Failed<R, E> {
    fn from(e: Error) -> Self {
        Failed::Idem(e)
    }
}

/// The codec of the layer's records.
pub(crate) struct ResponseCodec;

impl<B: Body, R, E> Codec<Ran<B>, Failed<R, E>> for ResponseCodec {
    fn encode(_: &Key, result: &Result<Ran<B>, Failed<R, E>>) -> Result<Option<Bytes>, Error> {
        Ok(match result {
            Ok(Ran::Fresh { stored, .. } | Ran::Replayed(stored)) => Some(encode(stored)),
            Ok(Ran::Spilled { request, .. } | Ran::NotReplayable(request)) => {
                Some(seal(frame(KIND_NOT_REPLAYABLE, *request, 0)))
            }
            Err(_) => None,
        })
    }

    fn decode(key: &Key, bytes: &[u8]) -> Result<Result<Ran<B>, Failed<R, E>>, Error> {
        // Checked before copying, so a damaged record costs no allocation.
        let kind = check(key, bytes)?;
        read(key, kind, &Bytes::copy_from_slice(bytes)).map(Ok)
    }

    fn decode_shared(key: &Key, bytes: &Bytes) -> Result<Result<Ran<B>, Failed<R, E>>, Error> {
        decode(key, bytes).map(Ok)
    }
}

fn encode(stored: &Stored) -> Bytes {
    // Header names and values are bounded far below 64 KiB by every HTTP server; one
    // that is not is left out rather than stored truncated.
    let kept = || {
        stored
            .headers
            .iter()
            .filter(|(n, v)| {
                n.as_str().len() <= usize::from(u16::MAX) && v.len() <= usize::from(u16::MAX)
            })
            .take(usize::from(u16::MAX))
    };
    let size = 4
        + stored.body.len()
        + kept()
            .map(|(n, v)| 4 + n.as_str().len() + v.len())
            .sum::<usize>();
    let mut buf = frame(KIND_RESPONSE, stored.request, size);
    buf.put_u16(stored.status.as_u16());
    buf.put_u16(kept().count() as u16);
    for (name, value) in kept() {
        buf.put_u16(name.as_str().len() as u16);
        buf.put_slice(name.as_str().as_bytes());
        buf.put_u16(value.len() as u16);
        buf.put_slice(value.as_bytes());
    }
    buf.put_slice(&stored.body);
    seal(buf)
}

/// A record buffer with room for `payload` bytes after the envelope (and the request's
/// fingerprint, if given), whose checksum [`seal`] fills in once the payload is written
/// (one buffer, no copy).
fn frame(kind: u8, request: Option<Fingerprint>, payload: usize) -> BytesMut {
    let mut buf = BytesMut::with_capacity(HEADER + 16 + payload);
    buf.put_slice(MAGIC);
    buf.put_u8(VERSION);
    buf.put_u8(if request.is_some() {
        kind | WITH_REQUEST
    } else {
        kind
    });
    buf.put_u32_le(0);
    if let Some(Fingerprint(fp)) = request {
        buf.put_slice(&fp);
    }
    buf
}

fn seal(mut buf: BytesMut) -> Bytes {
    let crc = checksum(buf[3], &buf[HEADER..]);
    buf[4..HEADER].copy_from_slice(&crc.to_le_bytes());
    buf.freeze()
}

fn checksum(kind: u8, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&[VERSION, kind]);
    h.update(payload);
    h.finalize()
}

/// Checks the envelope of a record: its magic, version and checksum.
fn check(key: &Key, bytes: &[u8]) -> Result<u8, Error> {
    if bytes.len() < HEADER || &bytes[..2] != MAGIC {
        return Err(corrupt(key, "not an HTTP response record"));
    }
    if bytes[2] != VERSION {
        return Err(corrupt(key, "unknown HTTP record layout version"));
    }
    let kind = bytes[3];
    let crc = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
    if checksum(kind, &bytes[HEADER..]) != crc {
        return Err(corrupt(key, "checksum mismatch"));
    }
    Ok(kind)
}

fn corrupt(key: &Key, reason: &str) -> Error {
    Error::Corrupt {
        key: *key,
        reason: reason.to_owned(),
    }
}

/// Reads a record back. Header values and the body share the record's buffer.
fn decode<B: Body>(key: &Key, record: &Bytes) -> Result<Ran<B>, Error> {
    read(key, check(key, record)?, record)
}

/// Reads a record whose envelope [`check`] passed, as `kind`.
fn read<B: Body>(key: &Key, kind: u8, record: &Bytes) -> Result<Ran<B>, Error> {
    let mut r = Reader { record, at: HEADER };
    let request = if kind & WITH_REQUEST != 0 {
        let fp = r
            .raw(16)
            .ok_or_else(|| corrupt(key, "truncated request fingerprint"))?;
        let mut out = [0u8; 16];
        out.copy_from_slice(fp);
        Some(Fingerprint(out))
    } else {
        None
    };
    match kind & !WITH_REQUEST {
        KIND_NOT_REPLAYABLE => return Ok(Ran::NotReplayable(request)),
        KIND_RESPONSE => {}
        _ => return Err(corrupt(key, "unknown HTTP record kind")),
    }
    parse(r, request).ok_or_else(|| corrupt(key, "truncated or malformed response record"))
}

fn parse<B: Body>(mut r: Reader<'_>, request: Option<Fingerprint>) -> Option<Ran<B>> {
    let status = StatusCode::from_u16(r.u16()?).ok()?;
    let count = r.u16()?;
    let mut headers = Vec::with_capacity(usize::from(count));
    for _ in 0..count {
        let n = usize::from(r.u16()?);
        let name = HeaderName::from_bytes(r.raw(n)?).ok()?;
        let n = usize::from(r.u16()?);
        let value = HeaderValue::from_maybe_shared(r.shared(n)?).ok()?;
        headers.push((name, value));
    }
    Some(Ran::Replayed(Stored {
        status,
        headers,
        body: r.record.slice(r.at..),
        request,
    }))
}

struct Reader<'a> {
    record: &'a Bytes,
    at: usize,
}

impl<'a> Reader<'a> {
    fn raw(&mut self, n: usize) -> Option<&'a [u8]> {
        let record: &'a [u8] = self.record;
        let part = record.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(part)
    }

    /// The next `n` bytes, sharing the record's buffer.
    fn shared(&mut self, n: usize) -> Option<Bytes> {
        let start = self.at;
        self.raw(n)?;
        Some(self.record.slice(start..self.at))
    }

    fn u16(&mut self) -> Option<u16> {
        self.raw(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> Key {
        Key::from_str("t", "http", "k")
    }

    type Empty = http_body_util::Empty<Bytes>;
    type R = Result<Ran<Empty>, Failed<(), ()>>;

    fn stored() -> Stored {
        Stored {
            status: StatusCode::CREATED,
            headers: vec![
                (
                    http::header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                ),
                (
                    http::header::LOCATION,
                    HeaderValue::from_static("/payments/7"),
                ),
            ],
            body: Bytes::from_static(b"{\"id\":7}"),
            request: None,
        }
    }

    #[test]
    fn round_trips_bytes_as_they_were() {
        let k = key();
        let bytes = <ResponseCodec as Codec<Ran<Empty>, Failed<(), ()>>>::encode(
            &k,
            &Ok(Ran::Replayed(stored())),
        )
        .unwrap()
        .unwrap();
        let back: R = <ResponseCodec as Codec<_, _>>::decode(&k, &bytes).unwrap();
        let Ok(Ran::Replayed(s)) = back else {
            panic!("not a replay")
        };
        assert_eq!(s.status, StatusCode::CREATED);
        assert_eq!(s.headers, stored().headers);
        assert_eq!(s.body, stored().body);
    }

    #[test]
    fn a_shared_record_is_replayed_without_copying_its_body() {
        let k = key();
        let record = encode(&stored());
        let back: R = <ResponseCodec as Codec<_, _>>::decode_shared(&k, &record).unwrap();
        let Ok(Ran::Replayed(s)) = back else {
            panic!("not a replay")
        };
        assert_eq!(s.body, stored().body);
        assert_eq!(s.headers, stored().headers);
        let within = record.as_ptr_range();
        assert!(
            within.contains(&s.body.as_ptr()),
            "the body is a slice of the record"
        );
    }

    #[test]
    fn any_flipped_bit_is_corrupt() {
        let k = key();
        let good = encode(&stored());
        for i in 0..good.len() {
            for bit in 0..8 {
                let mut bad = good.to_vec();
                bad[i] ^= 1 << bit;
                assert!(
                    matches!(
                        decode::<Empty>(&k, &Bytes::from(bad.clone())),
                        Err(Error::Corrupt { .. })
                    ),
                    "byte {i} bit {bit}"
                );
            }
        }
        for garbage in [
            &b""[..],
            b"ih",
            b"ih\x01\x00\x00\x00\x00\x00\x01",
            b"\x00garbage",
        ] {
            assert!(matches!(
                decode::<Empty>(&k, &Bytes::copy_from_slice(garbage)),
                Err(Error::Corrupt { .. })
            ));
        }
    }

    #[test]
    fn the_request_fingerprint_round_trips() {
        let k = key();
        let fp = Some(Fingerprint([7; 16]));
        let with = Stored {
            request: fp,
            ..stored()
        };
        let Ok(Ran::Replayed(s)) = decode::<Empty>(&k, &encode(&with)) else {
            panic!("not a replay")
        };
        assert_eq!((s.request, s.body), (fp, stored().body));
        let marker = seal(frame(KIND_NOT_REPLAYABLE, fp, 0));
        assert!(matches!(decode::<Empty>(&k, &marker), Ok(Ran::NotReplayable(f)) if f == fp));
        // A flagged record too short for its fingerprint is damaged, not replayed.
        let short = seal(frame(KIND_NOT_REPLAYABLE | WITH_REQUEST, None, 0));
        assert!(matches!(
            decode::<Empty>(&k, &short),
            Err(Error::Corrupt { .. })
        ));
    }

    #[test]
    fn marker_reads_back_as_not_replayable() {
        let k = key();
        let bytes = <ResponseCodec as Codec<Ran<Empty>, Failed<(), ()>>>::encode(
            &k,
            &Ok(Ran::NotReplayable(None)),
        )
        .unwrap()
        .unwrap();
        assert!(matches!(
            decode::<Empty>(&k, &bytes),
            Ok(Ran::NotReplayable(None))
        ));
        let released = <ResponseCodec as Codec<Ran<Empty>, Failed<(), ()>>>::encode(
            &k,
            &Err(Failed::NotStored(())),
        );
        assert!(released.unwrap().is_none());
    }
}
