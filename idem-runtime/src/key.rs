//! Record identity: namespace, function and a digest of the rendered key.

use std::fmt::{self, Write as _};
use std::sync::Arc;

use serde::Serialize;

use crate::Error;

/// The scope under which tokens live: a token is valid for every token-strategy function
/// of its namespace, so its record does not name a function.
pub const TOKEN_SCOPE: &str = "token";

/// The identity of one record in a store.
///
/// Made of the runtime's namespace, the function's path (its *scope*) and a 128-bit
/// BLAKE3 digest of namespace, scope and the rendered key. Stores address records by it;
/// the rendered key itself is never kept, so raw key material (emails, card ids) does not
/// reach the store or the logs. A cryptographic digest, unlike a fast hash, cannot be
/// steered into collisions by whoever controls the key's text (a client-sent
/// idempotency key, say), so one caller can never be replayed another caller's result.
///
/// Cheap to clone. `Display` prints `namespace/scope#<first 16 hex digits>`.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Key {
    namespace: Arc<str>,
    scope: &'static str,
    digest: [u8; 16],
}

impl Key {
    /// Renders `key` (usually `format_args!(...)`) straight into the digest, without
    /// building the string.
    pub fn new(namespace: &Arc<str>, scope: &'static str, key: fmt::Arguments<'_>) -> Key {
        let mut w = HashWriter(Self::hasher(namespace, scope));
        // Writing into a hasher cannot fail; a `Display` impl that returns `Err` only
        // truncates what it contributed, which still yields a deterministic digest.
        let _ = w.write_fmt(key);
        Self::finish(namespace, scope, w.0)
    }

    /// The key for an already rendered string.
    pub fn from_str(namespace: &Arc<str>, scope: &'static str, key: &str) -> Key {
        let mut h = Self::hasher(namespace, scope);
        h.update(key.as_bytes());
        Self::finish(namespace, scope, h)
    }

    fn hasher(namespace: &str, scope: &str) -> blake3::Hasher {
        let mut h = blake3::Hasher::new();
        // Length prefixes keep ("a:b", "c") and ("a", "b:c") apart.
        h.update(&(namespace.len() as u64).to_le_bytes());
        h.update(namespace.as_bytes());
        h.update(&(scope.len() as u64).to_le_bytes());
        h.update(scope.as_bytes());
        h
    }

    fn finish(namespace: &Arc<str>, scope: &'static str, h: blake3::Hasher) -> Key {
        let mut digest = [0u8; 16];
        h.finalize_xof().fill(&mut digest);
        Key {
            namespace: namespace.clone(),
            scope,
            digest,
        }
    }

    /// The namespace of the runtime that made the key.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The function path, or [`TOKEN_SCOPE`] for tokens.
    pub fn scope(&self) -> &'static str {
        self.scope
    }

    /// The 128-bit digest.
    pub fn digest(&self) -> &[u8; 16] {
        &self.digest
    }

    /// The digest as 32 lowercase hex digits.
    pub fn digest_hex(&self) -> String {
        let mut s = String::with_capacity(32);
        for b in &self.digest {
            let _ = write!(s, "{b:02x}");
        }
        s
    }

    /// A readable, unique string for backends that address records by name:
    /// `{prefix}{namespace}:{scope}:{digest_hex}`.
    pub fn storage_name(&self, prefix: &str) -> String {
        let mut s =
            String::with_capacity(prefix.len() + self.namespace.len() + self.scope.len() + 34);
        s.push_str(prefix);
        s.push_str(&self.namespace);
        s.push(':');
        s.push_str(self.scope);
        s.push(':');
        for b in &self.digest {
            let _ = write!(s, "{b:02x}");
        }
        s
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}#", self.namespace, self.scope)?;
        for b in &self.digest[..8] {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

struct HashWriter(blake3::Hasher);

impl fmt::Write for HashWriter {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.0.update(s.as_bytes());
        Ok(())
    }
}

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

/// Builds a [`Fingerprint`] from serializable arguments, in order.
///
/// Arguments are hashed through their JSON form, so structs hash by field values. A
/// `HashMap` argument hashes in its iteration order, which differs between processes:
/// use a `BTreeMap` for arguments that are fingerprinted.
///
/// ```
/// use idem_runtime::FingerprintBuilder;
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
