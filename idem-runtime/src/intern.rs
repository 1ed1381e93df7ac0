//! `'static` copies of the names a [`Key`](crate::Key) carries, kept once per process.
//!
//! A key is `Copy` because its namespace and scope are `&'static str`: passing one around
//! touches no reference count. Names known only at run time (a namespace from the
//! configuration, a function path an operator typed) are copied once into a process-wide
//! table and never freed. The table deduplicates, so the same name interned again costs
//! nothing, and it is bounded, so a program that makes names from unbounded input (a
//! namespace per tenant, say) gets an error instead of growing without limit. Tenant ids
//! belong in the key, which is digested and costs nothing to keep.

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};

use crate::Error;
use crate::key::{Digest, Key, KeyWriter, TOKEN_SCOPE};

/// Keys and names for names known only at run time.
impl Key {
    /// The key for an already rendered string, in any namespace (interned on first use).
    ///
    /// # Panics
    ///
    /// If `namespace` is new and the process already keeps as many names as
    /// [`Key::intern`] allows.
    pub fn from_str(namespace: &str, scope: &'static str, key: &str) -> Key {
        let namespace = Self::intern(namespace).unwrap_or_else(|e| panic!("{e}"));
        KeyWriter::key(Digest::Portable, None, namespace, scope, |w| w.text(key))
    }

    /// The record key of the one-time token `token` in `namespace`, as a shared store
    /// (one whose records processes share) names it. Tokens of a namespace share one
    /// scope, since a token is valid for every token-strategy function.
    ///
    /// # Panics
    ///
    /// As [`Key::from_str`].
    pub fn token(namespace: &str, token: &str) -> Key {
        Self::from_str(namespace, TOKEN_SCOPE, token)
    }

    /// A `'static` copy of a namespace or function name known only at run time, for
    /// [`Key::new`], [`Options::dedup`](crate::Options::dedup) and
    /// [`Optimistic::new`](crate::toolbox::Optimistic::new), which keep names as `&'static str` so
    /// that keys stay `Copy`.
    ///
    /// Equal names share one copy, kept for the life of the process: interning a name
    /// again costs nothing new. The process keeps at most 4096 distinct names (1 MiB of
    /// text); past that, a new name is [`Error::Config`]. Make names from
    /// configuration, not from request data: a tenant id belongs in the key.
    ///
    /// ```
    /// use idem_runtime::Key;
    /// let a = Key::intern(&format!("shop-{}", 1)).unwrap();
    /// let b = Key::intern("shop-1").unwrap();
    /// assert!(std::ptr::eq(a, b));
    /// ```
    pub fn intern(name: &str) -> Result<&'static str, Error> {
        intern(name)
    }
}

/// Most distinct names the process-wide table keeps.
pub(crate) const MAX_NAMES: usize = 4096;
/// Most bytes of name text the process-wide table keeps (1 MiB).
pub(crate) const MAX_BYTES: usize = 1 << 20;

/// A set of leaked names with a limit on how many, and on their total length.
pub(crate) struct Interner {
    table: Mutex<Table>,
    max_names: usize,
    max_bytes: usize,
}

#[derive(Default)]
struct Table {
    names: HashSet<&'static str>,
    /// Total length of `names`.
    bytes: usize,
}

impl Interner {
    pub(crate) fn new(max_names: usize, max_bytes: usize) -> Self {
        Interner {
            table: Mutex::default(),
            max_names,
            max_bytes,
        }
    }

    /// The one `'static` copy of `name`: the same address for equal names.
    pub(crate) fn intern(&self, name: &str) -> Result<&'static str, Error> {
        // A panic elsewhere while holding the lock leaves the set consistent (an insert
        // either happened or not), so a poisoned lock is still safe to use.
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = table.names.get(name) {
            return Ok(s);
        }
        if table.names.len() >= self.max_names || table.bytes + name.len() > self.max_bytes {
            return Err(Error::Config(format!(
                "more than {} distinct namespaces and function names ({} bytes) in one \
                 process; each is kept for the life of the process, so make them from \
                 configuration, not from request data (put a tenant id in the key instead)",
                self.max_names, self.max_bytes
            )));
        }
        let s: &'static str = Box::leak(name.to_owned().into_boxed_str());
        table.bytes += s.len();
        table.names.insert(s);
        Ok(s)
    }

    /// How many names are kept, and their total length.
    #[cfg(test)]
    fn usage(&self) -> (usize, usize) {
        let table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        (table.names.len(), table.bytes)
    }
}

/// The process-wide table (see the module docs), limited to [`MAX_NAMES`] names and
/// [`MAX_BYTES`] bytes.
pub(crate) fn intern(name: &str) -> Result<&'static str, Error> {
    static TABLE: OnceLock<Interner> = OnceLock::new();
    TABLE
        .get_or_init(|| Interner::new(MAX_NAMES, MAX_BYTES))
        .intern(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_name_twice_is_one_copy() {
        let table = Interner::new(4, 64);
        let a = table.intern("shop").unwrap();
        let b = table.intern(&String::from("shop")).unwrap();
        assert!(std::ptr::eq(a, b));
        assert_eq!(table.usage(), (1, 4));
    }

    #[test]
    fn past_the_name_limit_new_names_fail_and_known_ones_still_resolve() {
        let table = Interner::new(2, 64);
        let a = table.intern("a").unwrap();
        table.intern("b").unwrap();
        assert!(matches!(table.intern("c"), Err(Error::Config(_))));
        assert_eq!(table.usage(), (2, 2));
        assert!(std::ptr::eq(table.intern("a").unwrap(), a));
    }

    #[test]
    fn past_the_byte_limit_new_names_fail() {
        let table = Interner::new(10, 8);
        table.intern("12345").unwrap();
        assert!(matches!(table.intern("6789"), Err(Error::Config(_))));
        table.intern("678").unwrap();
        assert_eq!(table.usage(), (2, 8));
    }

    #[test]
    fn the_process_table_dedups() {
        let a = intern("intern-test-namespace").unwrap();
        let b = intern("intern-test-namespace").unwrap();
        assert!(std::ptr::eq(a, b));
    }
}
