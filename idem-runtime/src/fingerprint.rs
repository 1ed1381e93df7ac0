//! Payload fingerprints: a digest of a call's arguments, stored with its record so that
//! a key reused with other arguments is caught instead of replayed.

use std::fmt;

use serde::Serialize;

use crate::{Error, Key};

/// Streams serialized arguments into a hasher.
struct HashWriter(blake3::Hasher);

impl std::io::Write for HashWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A digest of a call's arguments, stored with the record so that reusing a key with a
/// different payload is caught ([`Error::PayloadMismatch`]) instead of replaying a result
/// that belongs to other arguments.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint(pub [u8; 16]);

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint(")?;
        for b in &self.0[..8] {
            write!(f, "{b:02x}")?;
        }
        write!(f, ")")
    }
}

/// A stored fingerprint that differs from the caller's is a payload mismatch. A record
/// without one (written before fingerprints were added) is accepted.
pub(crate) fn check_fingerprint(
    key: &Key,
    ours: Option<Fingerprint>,
    theirs: Option<Fingerprint>,
) -> Result<(), Error> {
    match (ours, theirs) {
        (Some(a), Some(b)) if a != b => Err(Error::PayloadMismatch { key: *key }),
        _ => Ok(()),
    }
}

/// Builds a [`Fingerprint`] from serializable arguments, in order.
///
/// Arguments are hashed through their JSON form, so structs hash by field values. A
/// `HashMap` argument hashes in its iteration order, which differs between processes:
/// use a `BTreeMap` for arguments that are fingerprinted.
///
/// ```
/// use idem_runtime::codec::FingerprintBuilder;
/// let mut a = FingerprintBuilder::new();
/// a.add(&42u64).unwrap();
/// a.add("eur").unwrap();
/// let mut b = FingerprintBuilder::new();
/// b.add(&42u64).unwrap();
/// b.add("usd").unwrap();
/// assert_ne!(a.finish(), b.finish());
/// ```
pub struct FingerprintBuilder(HashWriter);

impl Default for FingerprintBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl FingerprintBuilder {
    /// An empty builder.
    pub fn new() -> Self {
        FingerprintBuilder(HashWriter(blake3::Hasher::new()))
    }

    /// Adds one argument.
    pub fn add<S: Serialize + ?Sized>(&mut self, value: &S) -> Result<(), Error> {
        serde_json::to_writer(&mut self.0, value).map_err(|e| {
            Error::Config(format!("a fingerprinted argument does not serialize: {e}"))
        })?;
        // A separator that JSON never emits keeps (["a","b"]) apart from (["a"],"b").
        self.0.0.update(&[0xff]);
        Ok(())
    }

    /// The digest of everything added.
    pub fn finish(&self) -> Fingerprint {
        let mut out = [0u8; 16];
        self.0.0.finalize_xof().fill(&mut out);
        Fingerprint(out)
    }
}
