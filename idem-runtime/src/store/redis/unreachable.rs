//! Why Redis cannot be reached: which server (or Cluster, or Sentinel service), and what
//! went wrong (refused, name lookup, authentication, TLS, no answer, no reachable node,
//! no primary), instead of a bare client error that names neither.
//!
//! The error is the one [`Unreachable`] of every store; this module names Redis's
//! targets and classifies its client's errors. Only connecting is explained here: once a connection is made, a failing command is
//! reported as the client gives it. Addresses are shown without the URL's user or
//! password.

use std::time::Duration;

use redis::{ErrorKind, RedisError};

use crate::store::{Cause, Unreachable};

/// What a store connects to, for messages.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    kind: Kind,
    /// `host:port`, comma-separated when several.
    servers: String,
    /// Connected through TLS (`rediss://`).
    tls: bool,
}

#[derive(Debug, Clone)]
enum Kind {
    Single,
    #[cfg_attr(not(feature = "redis-cluster"), allow(dead_code))]
    Cluster,
    #[cfg_attr(not(feature = "redis-sentinel"), allow(dead_code))]
    Sentinel(String),
}

impl Target {
    /// The standalone server of `url`.
    pub(crate) fn single(url: &str) -> Target {
        Target {
            kind: Kind::Single,
            servers: server_of(url),
            tls: url.starts_with("rediss:"),
        }
    }

    /// A server known only through its pool: named by the pub/sub URL if one was given.
    pub(crate) fn pool(url: Option<&str>) -> Target {
        Target {
            kind: Kind::Single,
            servers: url.map_or_else(|| "the pool's server".to_owned(), server_of),
            tls: false,
        }
    }

    /// The Cluster reached through `urls`.
    #[cfg_attr(not(feature = "redis-cluster"), allow(dead_code))]
    pub(crate) fn cluster<S: AsRef<str>>(urls: &[S]) -> Target {
        Target {
            kind: Kind::Cluster,
            servers: join(urls),
            tls: urls.iter().any(|u| u.as_ref().starts_with("rediss:")),
        }
    }

    /// The primary of `service` as the sentinels at `urls` name it.
    #[cfg_attr(not(feature = "redis-sentinel"), allow(dead_code))]
    pub(crate) fn sentinel<S: AsRef<str>>(urls: &[S], service: &str) -> Target {
        Target {
            kind: Kind::Sentinel(service.to_owned()),
            servers: join(urls),
            tls: false,
        }
    }

    /// Why connecting failed with `e`.
    pub(crate) fn unreachable(&self, e: &RedisError) -> Unreachable {
        let cause = match (&self.kind, classify(e)) {
            // The cluster client folds every node's failure into one I/O error.
            (Kind::Cluster, _) if e.to_string().contains("initial connections") => Cause::NoNode,
            (Kind::Cluster, Cause::Other) => Cause::NoNode,
            (Kind::Sentinel(_), Cause::Other) => Cause::NoPrimary,
            (_, cause) => cause,
        };
        if cause == Cause::Timeout {
            return self.no_answer(e.to_string());
        }
        self.fails(cause, e.to_string())
    }

    /// No connection within `within`.
    pub(crate) fn timed_out(&self, within: Duration) -> Unreachable {
        self.no_answer(format!("no connection within {within:?}"))
    }

    /// No connection in time, as `detail` says.
    pub(crate) fn no_answer(&self, mut detail: String) -> Unreachable {
        if self.tls {
            // A plain server reads the TLS hello as a command and never answers it.
            detail.push_str("; a server that does not speak TLS never answers the handshake");
        }
        self.fails(Cause::Timeout, detail)
    }

    /// A failure of the pool itself (closed, misconfigured): named, with its message.
    pub(crate) fn other(&self, detail: String) -> Unreachable {
        self.fails(Cause::Other, detail)
    }

    fn fails(&self, cause: Cause, detail: String) -> Unreachable {
        let target = match &self.kind {
            Kind::Single => format!("Redis at {}", self.servers),
            Kind::Cluster => format!("the Redis Cluster at {}", self.servers),
            Kind::Sentinel(service) => format!(
                "the primary of Redis service {service:?} through the sentinels at {}",
                self.servers
            ),
        };
        Unreachable::new("Redis", target, self.servers.clone(), cause, detail)
    }
}

/// The cause of a failed connection attempt.
fn classify(e: &RedisError) -> Cause {
    let text = e.to_string().to_ascii_lowercase();
    let has = |words: &[&str]| words.iter().any(|w| text.contains(w));
    match e.kind() {
        ErrorKind::AuthenticationFailed => return Cause::Auth,
        ErrorKind::MasterNameNotFoundBySentinel | ErrorKind::NoValidReplicasFoundBySentinel => {
            return Cause::NoPrimary;
        }
        ErrorKind::Server(_) if matches!(e.code(), Some("WRONGPASS" | "NOAUTH")) => {
            return Cause::Auth;
        }
        _ => {}
    }
    if e.is_connection_refusal() || has(&["connection refused"]) {
        Cause::Refused
    } else if has(&[
        "lookup address",
        "name or service not known",
        "nodename nor servname",
        "no address",
        "resolve",
        "name resolution",
    ]) {
        Cause::Dns
    } else if has(&[
        "tls",
        "certificate",
        "handshake",
        "invalidcontenttype",
        "corrupt message",
    ]) {
        Cause::Tls
    } else if e.is_timeout() || has(&["timed out", "timeout"]) {
        Cause::Timeout
    } else if has(&[
        "wrongpass",
        "noauth",
        "invalid password",
        "invalid username",
    ]) {
        Cause::Auth
    } else {
        Cause::Other
    }
}

fn join<S: AsRef<str>>(urls: &[S]) -> String {
    if urls.is_empty() {
        return "the pool's nodes".to_owned();
    }
    urls.iter()
        .map(|u| server_of(u.as_ref()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `host:port` of a URL (or of a bare `host:port`), without user or password.
pub(crate) fn server_of(url: &str) -> String {
    // The credentials end at the last `@`, whatever they contain, so they go first.
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    rest.split(['/', '?']).next().unwrap_or(rest).to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_are_named_without_credentials() {
        assert_eq!(
            server_of("redis://:secret@10.0.0.5:6379/2"),
            "10.0.0.5:6379"
        );
        assert_eq!(
            server_of("rediss://app:p%40ss@cache.internal:6380"),
            "cache.internal:6380"
        );
        assert_eq!(server_of("redis://127.0.0.1:6379"), "127.0.0.1:6379");
        assert_eq!(server_of("10.0.0.1:26379"), "10.0.0.1:26379");
        // A password with `/` or `@` in it still stays out of the name.
        assert_eq!(server_of("redis://u:a/b@h:1/0"), "h:1");
        let t = Target::cluster(&["redis://:pw@h1:7000", "redis://:pw@h2:7001"]);
        assert_eq!(t.servers, "h1:7000, h2:7001");
    }

    #[test]
    fn causes_are_classified() {
        let refused = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(classify(&refused), Cause::Refused);
        let dns = RedisError::from(std::io::Error::other(
            "failed to lookup address information: Name or service not known",
        ));
        assert_eq!(classify(&dns), Cause::Dns);
        let auth = RedisError::from((
            ErrorKind::AuthenticationFailed,
            "Password authentication failed",
        ));
        assert_eq!(classify(&auth), Cause::Auth);
        let no_master = RedisError::from((
            ErrorKind::MasterNameNotFoundBySentinel,
            "Master with given name not found in sentinel",
        ));
        assert_eq!(classify(&no_master), Cause::NoPrimary);
        let cluster = RedisError::from((
            ErrorKind::Io,
            "Failed to create initial connections",
            "Connection refused (os error 111)".to_owned(),
        ));
        assert_eq!(
            Target::cluster(&["h:1"]).unreachable(&cluster).cause(),
            Cause::NoNode
        );
    }
}
