//! Record identity: namespace, function and a digest of the rendered key.

use std::fmt::{self, Write as _};
use std::sync::OnceLock;

use siphasher::sip128::{Hasher128, SipHasher13};
use std::hash::Hasher as _;

/// The scope under which tokens live: a token is valid for every token-strategy function
/// of its namespace, so its record does not name a function.
pub(crate) const TOKEN_SCOPE: &str = "token";

/// Longest input digested in one call from the stack; longer keys stream into a hasher.
const INLINE: usize = 192;

/// The identity of one record in a store.
///
/// Made of the runtime's namespace, the function's path (its *scope*) and a 128-bit
/// digest of namespace, scope and the rendered key: BLAKE3 for stores that processes
/// share (the same in every process), SipHash under a per-process random key for a
/// store whose records never leave the process ([`Store::local`](crate::Store::local)),
/// where it is several times cheaper. Stores address records by it;
/// the rendered key itself is never kept, so raw key material (emails, card ids) does not
/// reach the store or the logs. A cryptographic digest, unlike a fast hash, cannot be
/// steered into collisions by whoever controls the key's text (a client-sent
/// idempotency key, say), and neither can a keyed hash whose key that writer never sees,
/// so one caller can never be replayed another caller's result.
///
/// `Copy`: namespaces are interned once per distinct name (see [`Key::intern`]), so a key is
/// two static strings and 16 bytes, and passing one around touches no shared counter.
/// `Display` prints `namespace/scope#<first 16 hex digits>`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Key {
    namespace: &'static str,
    scope: &'static str,
    digest: [u8; 16],
}

impl Key {
    /// Renders `key` (usually `format_args!(...)`) straight into the digest, without
    /// allocating the string. `namespace` is a literal or a name from [`Key::intern`].
    pub fn new(namespace: &'static str, scope: &'static str, key: fmt::Arguments<'_>) -> Key {
        // Writing into the digest cannot fail; a `Display` impl that returns `Err` only
        // truncates what it contributed, which still yields a deterministic digest.
        KeyWriter::key(Digest::Portable, None, namespace, scope, |w| {
            let _ = w.write_fmt(key);
        })
    }

    /// Whether this is a one-time token's record (see [`Key::token`]).
    pub fn is_token(&self) -> bool {
        self.scope == TOKEN_SCOPE
    }

    /// The namespace of the runtime that made the key.
    pub fn namespace(&self) -> &'static str {
        self.namespace
    }

    /// The key of `scope` in `namespace` with digest `digest`, as a store's index names
    /// it (a recoverer rebuilds the keys it finds).
    pub(crate) fn from_parts(
        namespace: &'static str,
        scope: &'static str,
        digest: [u8; 16],
    ) -> Key {
        Key {
            namespace,
            scope,
            digest,
        }
    }

    /// The function path, or the scope all tokens share (see [`Key::is_token`]).
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

/// Which 128-bit digest names records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Digest {
    /// BLAKE3: the same in every process, for stores that processes share.
    Portable,
    /// SipHash-1-3 under a key drawn at random once per process, for stores whose records
    /// never leave it. Whoever writes the keys cannot steer two into one digest without
    /// knowing the hash key (SipHash is a keyed pseudo-random function, which is what
    /// Rust's `HashMap` relies on against collision flooding), and it costs a fraction
    /// of BLAKE3 on short inputs.
    Local,
}

/// The per-process SipHash key of [`Digest::Local`].
fn local_key() -> (u64, u64) {
    static KEY: OnceLock<(u64, u64)> = OnceLock::new();
    *KEY.get_or_init(|| {
        let mut raw = [0u8; 16];
        // Without OS randomness fall back to std's per-process random hasher keys, which
        // are drawn the same way or from the clock, as `HashMap`'s are.
        if getrandom::fill(&mut raw).is_err() {
            use std::hash::{BuildHasher, Hasher};
            let state = std::collections::hash_map::RandomState::new();
            for (i, half) in raw.chunks_mut(8).enumerate() {
                let mut h = state.build_hasher();
                h.write_usize(i);
                half.copy_from_slice(&h.finish().to_le_bytes());
            }
        }
        let (a, b) = raw.split_at(8);
        (
            u64::from_le_bytes(a.try_into().unwrap_or_default()),
            u64::from_le_bytes(b.try_into().unwrap_or_default()),
        )
    })
}

/// The local digest of (namespace, scope), which starts every local digest of that
/// function's keys in place of the names themselves.
pub(crate) fn local_prefix(namespace: &str, scope: &str) -> [u8; 16] {
    let mut w = DigestWriter::empty(Digest::Local);
    w.frame(namespace, scope);
    w.finish()
}

/// What the attribute's expansion writes a rendered key into, part by part (see
/// [`parts`]). Not a public API.
#[doc(hidden)]
pub struct KeyWriter(DigestWriter);

impl KeyWriter {
    /// Literal text of the template.
    #[inline]
    pub fn text(&mut self, text: &str) {
        self.0.push(text.as_bytes());
    }

    /// Writes a key with `render`, in place: the writer is a few hundred bytes, and
    /// moving it around costs as much as the hashing. `prefix`: the local digest of
    /// (namespace, scope) when the caller already has it (see `Options`); otherwise the
    /// writer starts from the names themselves.
    #[inline]
    pub(crate) fn key(
        digest: Digest,
        prefix: Option<[u8; 16]>,
        namespace: &'static str,
        scope: &'static str,
        render: impl FnOnce(&mut KeyWriter),
    ) -> Key {
        let mut w = KeyWriter(DigestWriter::empty(digest));
        match prefix {
            Some(prefix) => w.0.push(&prefix),
            None => w.0.begin(namespace, scope),
        }
        render(&mut w);
        Key {
            namespace,
            scope,
            digest: w.0.finish(),
        }
    }
}

impl fmt::Write for KeyWriter {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.text(s);
        Ok(())
    }
}

/// How the expansion writes one `{placeholder}` of a key: integers and strings straight
/// into the digest, anything else through `Display`. Both give the bytes `Display`
/// gives, so a key's digest does not depend on which path wrote it.
///
/// `(&&Part(v)).kind()` is [`Fast`] when `v: FastPart` and [`Slow`] otherwise (method
/// lookup tries the receiver `&&Part` before dereferencing it to `&Part`); `Slow::put`
/// asks for `Display`, so a part that has neither is reported as "not `Display`".
#[doc(hidden)]
pub(crate) mod parts {
    use std::fmt::{self, Write as _};

    use super::KeyWriter;

    pub struct Part<'a, T: ?Sized>(pub &'a T);
    pub struct Fast;
    pub struct Slow;

    pub trait ViaFast {
        #[inline]
        fn kind(&self) -> Fast {
            Fast
        }
    }
    impl<T: FastPart + ?Sized> ViaFast for &Part<'_, T> {}

    pub trait ViaDisplay {
        #[inline]
        fn kind(&self) -> Slow {
            Slow
        }
    }
    impl<T: ?Sized> ViaDisplay for Part<'_, T> {}

    impl Fast {
        #[inline]
        pub fn put<T: FastPart + ?Sized>(self, w: &mut KeyWriter, v: &T) {
            v.put(w);
        }
    }

    impl Slow {
        #[inline]
        pub fn put<T: fmt::Display + ?Sized>(self, w: &mut KeyWriter, v: &T) {
            // Writing into the digest cannot fail (see `Key::new`).
            let _ = write!(w, "{v}");
        }
    }

    /// Types whose `Display` is written without the formatting machinery.
    pub trait FastPart {
        fn put(&self, w: &mut KeyWriter);
    }

    macro_rules! integers {
        ($($t:ty)*) => {$(
            impl FastPart for $t {
                #[inline]
                fn put(&self, w: &mut KeyWriter) {
                    w.text(itoa::Buffer::new().format(*self));
                }
            }
        )*};
    }
    integers!(u8 u16 u32 u64 u128 usize i8 i16 i32 i64 i128 isize);

    impl FastPart for str {
        #[inline]
        fn put(&self, w: &mut KeyWriter) {
            w.text(self);
        }
    }

    impl FastPart for String {
        #[inline]
        fn put(&self, w: &mut KeyWriter) {
            w.text(self);
        }
    }

    impl<T: FastPart + ?Sized> FastPart for &T {
        #[inline]
        fn put(&self, w: &mut KeyWriter) {
            (**self).put(w);
        }
    }
}

/// Feeds the digest: small inputs collect in a stack buffer and are hashed in one call
/// (BLAKE3's fastest path, with no 2 KiB hasher state to set up); larger ones stream
/// into a hasher. Both give the same digest for the same bytes.
pub(crate) struct DigestWriter {
    buf: [u8; INLINE],
    len: usize,
    digest: Digest,
    /// Boxed: the BLAKE3 hasher state is 2 KiB, and most keys never need it.
    spill: Option<Spill>,
}

enum Spill {
    Portable(Box<blake3::Hasher>),
    Local(SipHasher13),
}

impl DigestWriter {
    #[inline]
    fn empty(digest: Digest) -> Self {
        DigestWriter {
            buf: [0; INLINE],
            len: 0,
            digest,
            spill: None,
        }
    }

    /// Starts with what names the function: the framing of namespace and scope for the
    /// portable digest, the digest of that framing for the local one (fixed-size, so
    /// what follows cannot shift into it).
    fn begin(&mut self, namespace: &'static str, scope: &'static str) {
        match self.digest {
            Digest::Portable => self.frame(namespace, scope),
            Digest::Local => self.push(&local_prefix(namespace, scope)),
        }
    }

    fn frame(&mut self, namespace: &str, scope: &str) {
        // Length prefixes keep ("a:b", "c") and ("a", "b:c") apart.
        self.push(&(namespace.len() as u64).to_le_bytes());
        self.push(namespace.as_bytes());
        self.push(&(scope.len() as u64).to_le_bytes());
        self.push(scope.as_bytes());
    }

    #[inline]
    fn push(&mut self, bytes: &[u8]) {
        let end = self.len + bytes.len();
        if end <= INLINE && self.spill.is_none() {
            self.buf[self.len..end].copy_from_slice(bytes);
            self.len = end;
        } else {
            self.push_spilled(bytes);
        }
    }

    #[cold]
    fn push_spilled(&mut self, bytes: &[u8]) {
        let buffered = &self.buf[..self.len];
        let spill = self.spill.get_or_insert_with(|| match self.digest {
            Digest::Portable => {
                let mut h = Box::new(blake3::Hasher::new());
                h.update(buffered);
                Spill::Portable(h)
            }
            Digest::Local => {
                let (k0, k1) = local_key();
                let mut h = SipHasher13::new_with_keys(k0, k1);
                h.write(buffered);
                Spill::Local(h)
            }
        });
        match spill {
            Spill::Portable(h) => {
                h.update(bytes);
            }
            Spill::Local(h) => h.write(bytes),
        }
    }

    #[inline]
    fn finish(&self) -> [u8; 16] {
        match (&self.spill, self.digest) {
            (Some(Spill::Portable(h)), _) => truncate(h.finalize()),
            (Some(Spill::Local(h)), _) => h.finish128().as_bytes(),
            (None, Digest::Portable) => truncate(blake3::hash(&self.buf[..self.len])),
            (None, Digest::Local) => {
                let (k0, k1) = local_key();
                let mut h = SipHasher13::new_with_keys(k0, k1);
                h.write(&self.buf[..self.len]);
                h.finish128().as_bytes()
            }
        }
    }
}

fn truncate(hash: blake3::Hash) -> [u8; 16] {
    let mut digest = [0u8; 16];
    digest.copy_from_slice(&hash.as_bytes()[..16]);
    digest
}

/// A downstream idempotency key from a BLAKE3 output: `idem-` and 32 lowercase hex
/// digits of its first 128 bits (the call's and each step's, each under its own
/// derivation context).
pub(crate) fn downstream(out: blake3::Hash) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(37);
    s.push_str("idem-");
    for &b in &out.as_bytes()[..16] {
        s.push(char::from(HEX[usize::from(b >> 4)]));
        s.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    s
}
