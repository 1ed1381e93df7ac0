//! Whose key is it: the caller's scope that a client's key lives in.
//!
//! Two callers who pick the same key (`order-7` is an easy pick) must never see each
//! other's responses. By default a request's credentials (its `Authorization` header,
//! and the session cookie the layer is told about) name its scope, so another caller
//! with the same key and body gets a record of its own.
//!
//! Credentials change while their user stays: an OAuth client refreshes its access
//! token between a timeout and its retry, and the retry under the new token is another
//! scope, so it runs again. The scope that holds across a refresh is the user the
//! application's own authentication established ([`Scope::Extension`]).

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use http::header::{AUTHORIZATION, COOKIE};
use http::request;

pub(crate) type ScopeFn = dyn Fn(&request::Parts) -> Option<String> + Send + Sync;
pub(crate) type DigestFn = dyn Fn(&request::Parts) -> Option<[u8; 16]> + Send + Sync;

/// How the layer names a caller's scope.
#[derive(Clone)]
pub(crate) enum Scope {
    /// The request's credentials: every `Authorization` header (normalised), and the
    /// value of the session cookie of this name, if one is set. No credentials: the
    /// shared scope.
    Credentials { cookie: Option<Arc<str>> },
    /// The application's own naming (an API key, a tenant, a user).
    Custom(Arc<ScopeFn>),
    /// A value an authentication layer put in the request's extensions (the user),
    /// digested through its `Hash`; the `&str` is its type's name, for `Debug`.
    Extension(Arc<DigestFn>, &'static str),
    /// One key space for all callers, asked for by name.
    Unscoped,
}

impl fmt::Debug for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scope::Credentials { cookie } => f
                .debug_struct("Credentials")
                .field("cookie", cookie)
                .finish(),
            Scope::Custom(_) => f.write_str("Custom"),
            Scope::Extension(_, ty) => f.debug_tuple("Extension").field(ty).finish(),
            Scope::Unscoped => f.write_str("Unscoped"),
        }
    }
}

/// One request's scope.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Caller {
    Shared,
    Named(String),
    /// A digest of the credentials: they are secrets, and their length is the caller's.
    Credentials([u8; 16]),
    /// A digest of the user an authentication layer established.
    User([u8; 16]),
}

impl Scope {
    /// The scope of a request whose key is `T` in its extensions.
    pub(crate) fn extension<T: Hash + Send + Sync + 'static>() -> Scope {
        Scope::Extension(
            Arc::new(|parts: &request::Parts| parts.extensions.get::<T>().map(digest_of)),
            std::any::type_name::<T>(),
        )
    }

    pub(crate) fn of(&self, parts: &request::Parts) -> Caller {
        match self {
            Scope::Unscoped => Caller::Shared,
            Scope::Custom(f) => f(parts).map_or(Caller::Shared, Caller::Named),
            Scope::Extension(f, _) => f(parts).map_or(Caller::Shared, Caller::User),
            Scope::Credentials { cookie } => credentials(parts, cookie.as_deref()),
        }
    }
}

/// A 128-bit BLAKE3 digest of a value's `Hash`, the same in every process of one build
/// (std's `DefaultHasher` promises no such thing), so replicas sharing a store agree on
/// a user's scope.
pub(crate) fn digest_of<T: Hash + ?Sized>(value: &T) -> [u8; 16] {
    struct Blake(blake3::Hasher);
    impl Hasher for Blake {
        fn write(&mut self, bytes: &[u8]) {
            self.0.update(bytes);
        }
        fn finish(&self) -> u64 {
            let h = self.0.finalize();
            let mut b = [0u8; 8];
            b.copy_from_slice(&h.as_bytes()[..8]);
            u64::from_le_bytes(b)
        }
    }
    let mut h = Blake(blake3::Hasher::new());
    value.hash(&mut h);
    let mut out = [0u8; 16];
    out.copy_from_slice(&h.0.finalize().as_bytes()[..16]);
    out
}

/// BLAKE3 of the framed, normalised credentials; nothing to hash (the common case of
/// an API without authentication) costs nothing.
fn credentials(parts: &request::Parts, cookie: Option<&str>) -> Caller {
    let auth = parts.headers.get_all(AUTHORIZATION);
    let session = cookie.and_then(|name| session(parts, name));
    if auth.iter().next().is_none() && session.is_none() {
        return Caller::Shared;
    }
    let mut h = blake3::Hasher::new();
    let mut normal = Vec::new();
    for value in auth {
        normalise(value.as_bytes(), &mut normal);
        h.update(b"a");
        h.update(&(normal.len() as u64).to_le_bytes());
        h.update(&normal);
    }
    if let Some(value) = session {
        h.update(b"c");
        h.update(&(value.len() as u64).to_le_bytes());
        h.update(value);
    }
    let mut out = [0u8; 16];
    out.copy_from_slice(&h.finalize().as_bytes()[..16]);
    Caller::Credentials(out)
}

/// An `Authorization` value as one caller sends it however it spells it: the scheme is
/// case-insensitive (RFC 9110 11.1), so it is written `Capitalised` (the way `Bearer`
/// and `Basic` are usually sent, whose digests thus stay what they were), and runs of
/// spaces and tabs fold into one space, none at either end. The credentials after the
/// scheme are case-sensitive and kept as they are.
fn normalise(value: &[u8], out: &mut Vec<u8>) {
    out.clear();
    let mut words = value
        .split(|b| *b == b' ' || *b == b'\t')
        .filter(|w| !w.is_empty());
    if let Some(scheme) = words.next() {
        for (i, b) in scheme.iter().enumerate() {
            out.push(if i == 0 {
                b.to_ascii_uppercase()
            } else {
                b.to_ascii_lowercase()
            });
        }
    }
    for word in words {
        out.push(b' ');
        out.extend_from_slice(word);
    }
}

/// The value of cookie `name` in the request's `Cookie` headers (RFC 6265:
/// `name=value` pairs separated by `;`).
fn session<'a>(parts: &'a request::Parts, name: &str) -> Option<&'a [u8]> {
    parts.headers.get_all(COOKIE).iter().find_map(|v| {
        v.as_bytes().split(|b| *b == b';').find_map(|pair| {
            let pair = pair.trim_ascii();
            let at = pair.iter().position(|b| *b == b'=')?;
            (pair[..at].trim_ascii() == name.as_bytes()).then(|| pair[at + 1..].trim_ascii())
        })
    })
}

/// A client's key within its caller's scope, framed so that no pair of scope and key
/// renders like another. (Unscoped and named keys render as they did before
/// credentials took part, so their records stay valid.)
pub(crate) struct Scoped<'a>(pub(crate) &'a Caller, pub(crate) &'a str);

impl fmt::Display for Scoped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let digest = |f: &mut fmt::Formatter<'_>, tag: &str, d: &[u8; 16]| {
            f.write_str(tag)?;
            for b in d {
                write!(f, "{b:02x}")?;
            }
            Ok(())
        };
        match self.0 {
            Caller::Named(scope) => write!(f, "s{}:{scope}:{}", scope.len(), self.1),
            Caller::Shared => write!(f, "n:{}", self.1),
            Caller::Credentials(d) => {
                digest(f, "c:", d)?;
                write!(f, ":{}", self.1)
            }
            Caller::User(d) => {
                digest(f, "u:", d)?;
                write!(f, ":{}", self.1)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(headers: &[(&str, &str)]) -> request::Parts {
        let mut b = http::Request::post("/");
        for (n, v) in headers {
            b = b.header(*n, *v);
        }
        b.body(()).unwrap().into_parts().0
    }

    fn render(scope: &Scope, headers: &[(&str, &str)]) -> String {
        Scoped(&scope.of(&parts(headers)), "k").to_string()
    }

    #[test]
    fn credentials_name_the_scope() {
        let s = Scope::Credentials {
            cookie: Some(Arc::from("sid")),
        };
        let anon = render(&s, &[]);
        assert_eq!(anon, "n:k");
        let alice = render(&s, &[("authorization", "Bearer alice")]);
        let mallory = render(&s, &[("authorization", "Bearer mallory")]);
        assert_ne!(alice, mallory);
        assert_ne!(alice, anon);
        assert!(!alice.contains("alice"), "credentials are digested");
        let a = render(&s, &[("cookie", "theme=dark; sid=a1")]);
        let b = render(&s, &[("cookie", "sid=b2;theme=dark")]);
        let other_cookie = render(&s, &[("cookie", "theme=dark")]);
        assert_ne!(a, b);
        assert_eq!(other_cookie, anon, "only the session cookie counts");
        assert_eq!(a, render(&s, &[("cookie", "sid=a1")]));
        assert_eq!(render(&Scope::Unscoped, &[("authorization", "x")]), anon);
    }

    #[test]
    fn one_caller_however_its_scheme_and_spaces_are_written() {
        let s = Scope::Credentials { cookie: None };
        let alice = render(&s, &[("authorization", "Bearer alice")]);
        for same in [
            "bearer alice",
            "BEARER alice",
            "Bearer  alice",
            " Bearer\talice ",
        ] {
            assert_eq!(render(&s, &[("authorization", same)]), alice, "{same:?}");
        }
        // The credentials themselves stay case-sensitive.
        assert_ne!(render(&s, &[("authorization", "Bearer ALICE")]), alice);
        assert_ne!(render(&s, &[("authorization", "Basic alice")]), alice);
    }

    #[test]
    fn the_user_names_the_scope_across_token_refreshes() {
        #[derive(Clone, Hash)]
        struct User(String);
        let s = Scope::extension::<User>();
        let as_user = |user: &str, auth: &str| {
            let mut p = parts(&[("authorization", auth)]);
            p.extensions.insert(User(user.into()));
            Scoped(&s.of(&p), "k").to_string()
        };
        let first = as_user("carol", "Bearer carol.session1");
        assert_eq!(first, as_user("carol", "Bearer carol.session2"));
        assert_ne!(first, as_user("dave", "Bearer carol.session1"));
        assert!(first.starts_with("u:") && !first.contains("carol"));
        // No user: the shared scope of anonymous callers.
        assert_eq!(render(&s, &[("authorization", "Bearer x")]), "n:k");
        // Another scope kind never renders like a user's.
        let creds = render(
            &Scope::Credentials { cookie: None },
            &[("authorization", "Bearer carol.session1")],
        );
        assert_ne!(first[2..], creds[2..]);
    }
}
