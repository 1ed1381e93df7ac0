//! Unit tests of the parts that need no server: URL handling, record encoding, reply
//! parsing.

use std::time::Duration;

use bytes::Bytes;
use redis::Value;

use super::record::{ceil_millis, hex32, in_progress};
use super::reply::{parse_claim, parse_completed};
use crate::store::{ClaimKind, ClaimOutcome, ClaimRequest, Owner};
use crate::{Error, Fingerprint, Key};

/// `rediss://` builds a store (provider installed, no panic); a call against a server
/// that does not speak TLS is a store error.
#[cfg(feature = "tls")]
#[test]
fn tls_url_connects_lazily_and_fails_cleanly() {
    use super::RedisStore;
    use crate::store::Store;

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = RedisStore::builder()
        .timeout(Duration::from_millis(300))
        .connect("rediss://127.0.0.1:1")
        .unwrap();
    let key = Key::from_str("t", "s", "k");
    let r = rt.block_on(store.issue(&key, Duration::from_secs(1)));
    assert!(matches!(r, Err(Error::Store(_))), "{r:?}");
}

#[test]
fn lease_rounds_up_and_never_reaches_zero() {
    assert_eq!(ceil_millis(Duration::ZERO), 1);
    assert_eq!(ceil_millis(Duration::from_micros(1)), 1);
    assert_eq!(ceil_millis(Duration::from_micros(1500)), 2);
    assert_eq!(ceil_millis(Duration::from_millis(30)), 30);
}

#[test]
fn garbage_replies_are_corrupt_not_panics() {
    let key = Key::from_str("t", "s", "k");
    for v in [
        Value::Nil,
        Value::Okay,
        Value::Array(vec![]),
        Value::Array(vec![Value::Int(3)]),
        Value::Array(vec![Value::Int(3), Value::Nil]),
        Value::Array(vec![Value::Int(9), Value::Int(1)]),
        Value::Array(vec![Value::Int(1), Value::Int(1)]),
        Value::Array(vec![
            Value::Int(2),
            Value::Int(5),
            Value::BulkString(vec![1, 2, 3]),
        ]),
        // Another payload's answer always names a whole fingerprint.
        Value::Array(vec![Value::Int(5)]),
        Value::Array(vec![Value::Int(5), Value::Nil]),
        Value::Array(vec![Value::Int(5), Value::BulkString(vec![1; 15])]),
    ] {
        assert!(
            matches!(parse_claim(&key, v.clone()), Err(Error::Corrupt { .. })),
            "{v:?}"
        );
    }
    let ok = parse_claim(
        &key,
        Value::Array(vec![Value::Int(3), Value::BulkString(b"c-x".to_vec())]),
    )
    .unwrap();
    assert_eq!(
        ok,
        ClaimOutcome::Completed {
            value: Bytes::from_static(b"x"),
            fingerprint: None
        }
    );
}

#[test]
fn completed_records_parse_or_are_corrupt() {
    let key = Key::from_str("t", "s", "k");
    let mut with_fp = b"cf".to_vec();
    with_fp.extend_from_slice(&[7u8; 16]);
    with_fp.extend_from_slice(b"value");
    assert_eq!(
        parse_completed(&key, with_fp).unwrap(),
        ClaimOutcome::Completed {
            value: Bytes::from_static(b"value"),
            fingerprint: Some(Fingerprint([7; 16]))
        }
    );
    assert_eq!(
        parse_completed(&key, b"c-".to_vec()).unwrap(),
        ClaimOutcome::Completed {
            value: Bytes::new(),
            fingerprint: None
        }
    );
    for bad in [&b""[..], b"c", b"cx", b"cfshort", b"p-d", b"\xff"] {
        assert!(
            matches!(
                parse_completed(&key, bad.to_vec()),
                Err(Error::Corrupt { .. })
            ),
            "{bad:?}"
        );
    }
}

#[test]
fn in_progress_records_have_their_fixed_layout() {
    let owner = Owner(0x0102_0304_0506_0708_090a_0b0c_0d0e_0f10);
    let req = ClaimRequest::new(ClaimKind::Lock, owner, Duration::from_secs(1));
    let (b, n) = in_progress(&req);
    assert_eq!(n, 19);
    assert_eq!(&b[..3], b"p-l");
    assert_eq!(&b[3..19], &owner.0.to_be_bytes());
    let req = ClaimRequest::new(ClaimKind::Dedup, owner, Duration::from_secs(1))
        .with_fingerprint(Some(Fingerprint([9; 16])));
    let (b, n) = in_progress(&req);
    assert_eq!((n, &b[..3], &b[19..35]), (35, &b"p-d"[..], &[9u8; 16][..]));
    assert_eq!(
        hex32(&[0xab; 16]).as_str(),
        "abababababababababababababababab"
    );
}

/// The claim script's "another payload" answer, and a resumed journal whose fingerprint
/// field (the byte 0xFF, never a step name) is no step.
#[test]
fn another_payload_and_the_journal_fingerprint_parse() {
    let key = Key::from_str("t", "s", "k");
    let other = Value::Array(vec![Value::Int(5), Value::BulkString(vec![4; 16])]);
    assert_eq!(
        parse_claim(&key, other).unwrap(),
        ClaimOutcome::OtherPayload {
            fingerprint: Fingerprint([4; 16])
        }
    );
    let journal = Value::Array(vec![
        Value::BulkString(vec![0xff]),
        Value::BulkString(vec![4; 16]),
        Value::BulkString(b"charge".to_vec()),
        Value::BulkString(b"d000000000000042v".to_vec()),
    ]);
    match parse_claim(&key, Value::Array(vec![Value::Int(1), journal])).unwrap() {
        ClaimOutcome::Claimed {
            journal: Some(journal),
            ..
        } => {
            assert_eq!(journal.len(), 1);
            assert_eq!(journal[0].name, "charge");
            assert_eq!(journal[0].value.as_deref(), Some(&b"v"[..]));
        }
        other => panic!("not resumed: {other:?}"),
    }
    // Only the fingerprint field: nothing to resume.
    let journal = Value::Array(vec![
        Value::BulkString(vec![0xff]),
        Value::BulkString(vec![4; 16]),
    ]);
    assert_eq!(
        parse_claim(&key, Value::Array(vec![Value::Int(1), journal])).unwrap(),
        ClaimOutcome::claimed(0)
    );
}
