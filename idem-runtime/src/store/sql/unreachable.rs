//! Why a database cannot be reached: which server, and what went wrong (refused, name
//! lookup, authentication, TLS, no answer), instead of a bare "pool timed out".
//!
//! sqlx's pool retries a refused connection until its acquire timeout and then reports
//! only `PoolTimedOut`. So a store call that has no answer after [`PROBE_AFTER`] opens
//! one connection of its own beside the pool: if that fails for a reason that waiting
//! will not fix, the call fails at once with [`Unreachable`] naming the server and the
//! cause; if it connects, the database is up but busy, and the call keeps waiting.
//!
//! The calls of one store share that probe ([`ProbeGate`]): a busy database makes
//! hundreds of calls slow at once, and a connection of their own each would fill the
//! server's connection limit (MariaDB allows 151 by default) exactly when it is busiest.

use std::future::Future;
use std::time::Duration;

use crate::Error;
#[cfg(any(feature = "postgres", feature = "mysql"))]
use crate::store::Cause;
use crate::store::Unreachable;

/// How long a store call waits for the pool before looking at the server itself.
pub(super) const PROBE_AFTER: Duration = Duration::from_millis(300);

/// How long a probe's answer stands for the other calls of its store.
const PROBE_FRESH: Duration = Duration::from_secs(1);

/// One probe at a time per store, its answer shared: the first slow call connects,
/// the calls arriving meanwhile wait for its answer, and the answer stands for
/// [`PROBE_FRESH`]. So a store adds at most one connection beside its pool, however many
/// of its calls are slow. A call that ends while it probes (answered, or dropped)
/// leaves no answer, and the next one probes.
#[derive(Default)]
pub(super) struct ProbeGate {
    last: tokio::sync::Mutex<Option<(tokio::time::Instant, Result<(), Unreachable>)>>,
}

impl ProbeGate {
    /// The fresh answer, or `probe`'s.
    pub(super) async fn probe<P>(&self, probe: impl FnOnce() -> P) -> Result<(), Unreachable>
    where
        P: Future<Output = Result<(), Unreachable>>,
    {
        let mut last = self.last.lock().await;
        if let Some((at, answer)) = &*last
            && at.elapsed() < PROBE_FRESH
        {
            return answer.clone();
        }
        let answer = probe().await;
        *last = Some((tokio::time::Instant::now(), answer.clone()));
        answer
    }
}

/// The cause of a failed connection attempt, if it is one waiting will not fix.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn classify(e: &sqlx::Error) -> Option<Cause> {
    let text = e.to_string().to_ascii_lowercase();
    match e {
        sqlx::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
            Some(Cause::Refused)
        }
        sqlx::Error::Io(_) if text.contains("lookup") || text.contains("resolve") => {
            Some(Cause::Dns)
        }
        sqlx::Error::Io(_) => Some(Cause::Other),
        sqlx::Error::Tls(_) => Some(Cause::Tls),
        sqlx::Error::Database(db) => match db.code().as_deref() {
            // PostgreSQL invalid_password / invalid_authorization_specification;
            // MySQL access denied.
            Some("28P01" | "28000" | "1045" | "1698") => Some(Cause::Auth),
            // PostgreSQL invalid_catalog_name; MySQL unknown database.
            Some("3D000" | "1049") => Some(Cause::NoDatabase),
            // The server is starting up or full: waiting may fix it.
            Some("57P03" | "53300" | "1040") => None,
            _ => Some(Cause::Other),
        },
        sqlx::Error::Configuration(_) => Some(Cause::Other),
        _ => None,
    }
}

/// One connection attempt with `options`, outside the pool, bounded by `within`.
/// `Err` names the server and the cause when it failed for a reason waiting will not
/// fix; a server that is up (or merely slow) is `Ok`.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(super) async fn probe<O>(
    options: &O,
    backend: &'static str,
    server: String,
    within: Duration,
) -> Result<(), Unreachable>
where
    O: sqlx::ConnectOptions,
    O::Connection: Sized,
{
    let unreachable = |cause, detail: String| {
        Unreachable::new(
            backend,
            format!("{backend} at {server}"),
            server.clone(),
            cause,
            detail,
        )
    };
    match tokio::time::timeout(within, options.connect()).await {
        Ok(Ok(conn)) => {
            let _ = sqlx::Connection::close(conn).await;
            Ok(())
        }
        Ok(Err(e)) => match classify(&e) {
            Some(cause) => Err(unreachable(cause, e.to_string())),
            None => Ok(()),
        },
        Err(_) => Err(unreachable(
            Cause::Timeout,
            format!("no connection within {within:?}"),
        )),
    }
}

/// Runs a store call bounded by `timeout`. If it has no answer after [`PROBE_AFTER`],
/// `probe` looks at the server beside it; a definitive failure ends the call at once
/// with that cause. A call that runs out of time says whether the server was reachable.
pub(super) async fn bounded<T, P>(
    timeout: Duration,
    backend: &'static str,
    call: impl Future<Output = Result<T, Error>>,
    probe: impl FnOnce(Duration) -> P,
) -> Result<T, Error>
where
    P: Future<Output = Result<(), Unreachable>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut call = std::pin::pin!(call);
    if let Ok(r) = tokio::time::timeout(PROBE_AFTER.min(timeout), call.as_mut()).await {
        return r;
    }
    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
    let probe = probe(left);
    tokio::select! {
        r = tokio::time::timeout_at(deadline, call.as_mut()) => match r {
            Ok(r) => r,
            Err(_) => Err(Error::store(format!(
                "{backend} store call timed out after {timeout:?} (the server accepts \
                 connections: it is busy, or a row is locked)"
            ))),
        },
        Err(unreachable) = probe => Err(Error::store(unreachable)),
    }
}

/// `host:port` of a URL, without user or password, for messages.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(super) fn server_of(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    rest.split(['/', '?']).next().unwrap_or(rest).to_owned()
}

// Probing is for servers; a SQLite file has nothing of it to test.
#[cfg(all(test, any(feature = "postgres", feature = "mysql")))]
mod tests {
    use super::*;

    #[test]
    fn servers_are_named_without_credentials() {
        assert_eq!(
            server_of("postgres://u:secret@db.internal:5432/shop"),
            "db.internal:5432"
        );
        assert_eq!(
            server_of("mysql://root@127.0.0.1:3306/test?ssl-mode=disabled"),
            "127.0.0.1:3306"
        );
        assert_eq!(server_of("postgres://localhost/test"), "localhost");
    }

    #[test]
    fn causes_are_classified() {
        let refused = sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(classify(&refused), Some(Cause::Refused));
        let dns = sqlx::Error::Io(std::io::Error::other(
            "failed to lookup address information: Name or service not known",
        ));
        assert_eq!(classify(&dns), Some(Cause::Dns));
        assert_eq!(classify(&sqlx::Error::PoolTimedOut), None);
    }

    #[cfg(feature = "postgres")]
    #[tokio::test]
    async fn a_refused_server_fails_fast_with_its_cause() {
        // Nothing listens on port 1 of loopback.
        let opts: sqlx::postgres::PgConnectOptions = "postgres://postgres@127.0.0.1:1/test"
            .parse()
            .unwrap_or_else(|e| panic!("{e}"));
        let r: Result<(), Error> = bounded(
            Duration::from_secs(30),
            "PostgreSQL",
            std::future::pending(),
            |left| async move { probe(&opts, "PostgreSQL", "127.0.0.1:1".into(), left).await },
        )
        .await;
        let msg = r.map_err(|e| e.to_string()).err().unwrap_or_default();
        // The call never answers: only the probe can have ended it, with the cause.
        assert!(
            msg.contains("127.0.0.1:1") && msg.contains("refused"),
            "{msg}"
        );
    }

    /// However many calls are slow at once, their store opens one probe connection, and
    /// its answer reaches them all; a failed answer is shared the same way. (On the
    /// paused clock, so the answer's freshness does not depend on the machine's load.)
    #[tokio::test(start_paused = true)]
    async fn slow_calls_share_one_probe() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};
        let gate = Arc::new(ProbeGate::default());
        let probes = Arc::new(AtomicUsize::new(0));
        let refused = || {
            Unreachable::new(
                "MySQL",
                "MySQL at 127.0.0.1:3306".into(),
                "127.0.0.1:3306".into(),
                Cause::Refused,
                "refused".into(),
            )
        };
        let mut calls = tokio::task::JoinSet::new();
        for _ in 0..200 {
            let (gate, probes) = (gate.clone(), probes.clone());
            calls.spawn(async move {
                gate.probe(|| async move {
                    probes.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    Err(refused())
                })
                .await
            });
        }
        while let Some(answer) = calls.join_next().await {
            let answer = answer.unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(answer.err().map(|u| u.cause()), Some(Cause::Refused));
        }
        assert_eq!(probes.load(Ordering::SeqCst), 1);
    }
}
