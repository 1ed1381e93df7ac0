//! Whose key is it: the caller's scope that a client's key lives in.
//!
//! Two callers who pick the same key (`order-7` is an easy pick) must never see each
//! other's responses. By default a request's credentials (its `Authorization` header,
//! and the session cookie the layer is told about) name its scope, so another caller
//! with the same key and body gets a record of its own.

use std::fmt;
use std::sync::Arc;

use http::header::{AUTHORIZATION, COOKIE};
use http::request;

pub(crate) type ScopeFn = dyn Fn(&request::Parts) -> Option<String> + Send + Sync;

/// How the layer names a caller's scope.
#[derive(Clone)]
pub(crate) enum Scope {
    /// The request's credentials: every `Authorization` header, and the value of the
    /// session cookie of this name, if one is set. No credentials: the shared scope.
    Credentials { cookie: Option<Arc<str>> },
    /// The application's own naming (an API key, a tenant, a user).
    Custom(Arc<ScopeFn>),
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
            Scope::Unscoped => f.write_str("Unscoped"),
        }
    }
}

/// One request's scope.
pub(crate) enum Caller {
    Shared,
    Named(String),
    /// A digest of the credentials: they are secrets, and their length is the caller's.
    Credentials([u8; 16]),
}

impl Scope {
    pub(crate) fn of(&self, parts: &request::Parts) -> Caller {
        match self {
            Scope::Unscoped => Caller::Shared,
            Scope::Custom(f) => f(parts).map_or(Caller::Shared, Caller::Named),
            Scope::Credentials { cookie } => credentials(parts, cookie.as_deref()),
        }
    }
}

/// BLAKE3 of the framed credentials; nothing to hash (the common case of an API
/// without authentication) costs nothing.
fn credentials(parts: &request::Parts, cookie: Option<&str>) -> Caller {
    let auth = parts.headers.get_all(AUTHORIZATION);
    let session = cookie.and_then(|name| session(parts, name));
    if auth.iter().next().is_none() && session.is_none() {
        return Caller::Shared;
    }
    let mut h = blake3::Hasher::new();
    for value in auth {
        h.update(b"a");
        h.update(&(value.len() as u64).to_le_bytes());
        h.update(value.as_bytes());
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
        match self.0 {
            Caller::Named(scope) => write!(f, "s{}:{scope}:{}", scope.len(), self.1),
            Caller::Shared => write!(f, "n:{}", self.1),
            Caller::Credentials(d) => {
                f.write_str("c:")?;
                for b in d {
                    write!(f, "{b:02x}")?;
                }
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
}
