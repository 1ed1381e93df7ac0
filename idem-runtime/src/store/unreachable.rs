//! Why a store cannot be reached, the same for every backend: which server (or Cluster,
//! or Sentinel service), and what went wrong (refused, name lookup, authentication, TLS,
//! no answer, no reachable node, no primary), instead of a bare client error that names
//! neither. Addresses are shown without the URL's user or password.

use std::fmt;

/// Why a connection could not be made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Cause {
    /// Nothing listens there (the server is down, or the host or port is wrong).
    Refused,
    /// The host name does not resolve.
    Dns,
    /// The server rejected the user or password.
    Auth,
    /// The server has no such database (SQL).
    NoDatabase,
    /// The TLS handshake failed (a plain server behind `rediss://`, or a certificate
    /// the client does not trust).
    Tls,
    /// The server did not answer in time.
    Timeout,
    /// No node of the Redis Cluster could be reached.
    NoNode,
    /// The sentinels name no reachable primary for the service (or know no such
    /// service).
    NoPrimary,
    /// Anything else (see the message).
    Other,
}

impl Cause {
    fn describe(self) -> &'static str {
        match self {
            Cause::Refused => "connection refused (is the server running and listening there?)",
            Cause::Dns => "the host name does not resolve",
            Cause::Auth => "authentication failed (user or password)",
            Cause::NoDatabase => "the database does not exist",
            Cause::Tls => "the TLS handshake failed",
            Cause::Timeout => "no answer in time",
            Cause::NoNode => "no node of the cluster is reachable",
            Cause::NoPrimary => "the sentinels name no reachable primary for the service",
            Cause::Other => "the connection failed",
        }
    }
}

/// A store idem could not connect to: the source of [`Error::Store`](crate::Error::Store)
/// when that is why a call failed, whichever the backend.
///
/// ```
/// # use idem_runtime::store::{Cause, Unreachable};
/// fn explain(e: &idem_runtime::Error) -> Option<Cause> {
///     let idem_runtime::Error::Store(source) = e else { return None };
///     source.downcast_ref::<Unreachable>().map(Unreachable::cause)
/// }
/// # let _ = explain;
/// ```
#[derive(Debug, Clone)]
pub struct Unreachable {
    backend: &'static str,
    /// What the message says could not be reached ("Redis at host:port", ...).
    target: String,
    server: String,
    cause: Cause,
    detail: String,
}

impl Unreachable {
    /// `backend`'s `server` (`host:port`, the nodes or sentinels, or a file), named in
    /// messages as `target`; `detail` is the client's own message.
    #[cfg_attr(
        not(any(feature = "redis", feature = "postgres", feature = "mysql")),
        allow(dead_code)
    )]
    pub(crate) fn new(
        backend: &'static str,
        target: String,
        server: String,
        cause: Cause,
        detail: String,
    ) -> Unreachable {
        Unreachable {
            backend,
            target,
            server,
            cause,
            detail,
        }
    }

    /// `Redis`, `PostgreSQL`, `MySQL` or `SQLite`.
    pub fn backend(&self) -> &'static str {
        self.backend
    }
    /// `host:port`, the Cluster's nodes or the sentinels, or the database file.
    pub fn server(&self) -> &str {
        &self.server
    }
    /// Why.
    pub fn cause(&self) -> Cause {
        self.cause
    }
}

impl fmt::Display for Unreachable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cannot connect to {}: {} ({})",
            self.target,
            self.cause.describe(),
            self.detail
        )
    }
}

impl std::error::Error for Unreachable {}
