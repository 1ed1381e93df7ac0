//! The command line.

use std::time::Duration;

use clap::{Args, Parser, Subcommand};

/// See and steer idem records in a shared store (Redis, PostgreSQL, MySQL, SQLite).
#[derive(Debug, Parser)]
#[command(name = "idem", version, about)]
pub(crate) struct Cli {
    /// Print the result as one JSON object.
    #[arg(long, global = true)]
    pub(crate) json: bool,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Print one record: state, owner, lease and ttl left, fingerprint, value size, fence.
    Inspect(RecordArgs),
    /// Remove one record whoever holds it, so its next call runs the body.
    Forget {
        #[command(flatten)]
        record: RecordArgs,
        /// Do not ask; required when stdin is not a terminal.
        #[arg(long)]
        yes: bool,
    },
    /// Count records by namespace, function and state.
    Stats {
        /// The store URL (redis://, redis+cluster://, postgres://, mysql://, sqlite://).
        #[arg(long)]
        store: String,
        /// Only this namespace.
        #[arg(long)]
        namespace: Option<String>,
    },
    /// List the calls marked `recover` that a recoverer may finish: abandoned (their
    /// owner gone), still held, or parked with why, with their function, age, attempts
    /// and steps done.
    Recoverable {
        /// The store URL.
        #[arg(long)]
        store: String,
        /// Only this namespace (Redis needs one).
        #[arg(long)]
        namespace: Option<String>,
        /// At most this many calls, the longest due first.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// One-time tokens.
    #[command(subcommand)]
    Tokens(TokensCommand),
}

#[derive(Debug, Subcommand)]
pub(crate) enum TokensCommand {
    /// Issue a token (prints it), for a caller that needs one by hand.
    Issue {
        /// The store URL.
        #[arg(long)]
        store: String,
        /// The namespace of the service that consumes it.
        #[arg(long, default_value = idem_runtime::options::DEFAULT_NAMESPACE)]
        namespace: String,
        /// How long the token stays valid: 250ms, 30s, 5m, 24h, 7d.
        #[arg(long, value_parser = parse_ttl)]
        ttl: Ttl,
    },
}

/// Which record: store, namespace, function and rendered key.
#[derive(Debug, Args)]
pub(crate) struct RecordArgs {
    /// The store URL (redis://, redis+cluster://, postgres://, mysql://, sqlite://).
    #[arg(long)]
    pub(crate) store: String,
    /// The namespace (optional when --function names it, as in `shop/app::charge#...`).
    #[arg(long)]
    pub(crate) namespace: Option<String>,
    /// The function path as errors print it (`app::charge`, `shop/app::charge#9f86d081`),
    /// or `token` for a one-time token.
    #[arg(long)]
    pub(crate) function: String,
    /// The rendered key (`charge:42`), or the token itself.
    #[arg(long)]
    pub(crate) key: String,
}

/// A record named by [`RecordArgs`], with what was pasted from a log line taken apart.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Target {
    pub(crate) namespace: String,
    pub(crate) function: String,
    /// Lowercase hex digits of the digest after `#`, if given.
    pub(crate) digest: Option<String>,
}

impl RecordArgs {
    /// Splits `--function` as errors print a record: `[namespace/]function[#digest]`.
    pub(crate) fn target(&self) -> Result<Target, String> {
        let (path, digest) = match self.function.split_once('#') {
            Some((path, digest)) => {
                // A log line may cut the digest short with an ellipsis.
                let digest = digest.trim_end_matches(['…', '.']).to_ascii_lowercase();
                if !digest.chars().all(|c| c.is_ascii_hexdigit()) || digest.len() > 32 {
                    return Err(format!(
                        "--function {:?}: after `#` comes the record's hex digest",
                        self.function
                    ));
                }
                (path, (!digest.is_empty()).then_some(digest))
            }
            None => (self.function.as_str(), None),
        };
        let (namespace, function) = match (path.split_once('/'), &self.namespace) {
            (Some((ns, _)), Some(given)) if ns != given => {
                return Err(format!(
                    "--function names namespace {ns:?} but --namespace is {given:?}"
                ));
            }
            (Some((ns, f)), _) => (ns.to_owned(), f.to_owned()),
            (None, Some(ns)) => (ns.clone(), path.to_owned()),
            (None, None) => {
                return Err(format!(
                    "which namespace? pass --namespace, or --function as errors print it \
                     (`namespace/{path}#digest`)"
                ));
            }
        };
        if function.is_empty() || namespace.is_empty() {
            return Err("--function and --namespace must not be empty".into());
        }
        Ok(Target {
            namespace,
            function,
            digest,
        })
    }
}

/// A token's validity.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ttl(pub(crate) Duration);

/// `250ms`, `30s`, `5m`, `24h`, `7d`, as in the attribute's options.
pub(crate) fn parse_ttl(s: &str) -> Result<Ttl, String> {
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: u64 = n
        .parse()
        .map_err(|_| format!("{s:?}: expected a number and a unit, e.g. 30s"))?;
    let secs = |k: u64| Duration::from_secs(n.saturating_mul(k));
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "s" => secs(1),
        "m" => secs(60),
        "h" => secs(3600),
        "d" => secs(86_400),
        _ => return Err(format!("{s:?}: the unit is one of ms, s, m, h, d")),
    };
    if d.is_zero() {
        return Err("a ttl of zero would issue a token that is already expired".into());
    }
    Ok(Ttl(d))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(ns: Option<&str>, function: &str) -> RecordArgs {
        RecordArgs {
            store: "memory".into(),
            namespace: ns.map(str::to_owned),
            function: function.into(),
            key: "k".into(),
        }
    }

    #[test]
    fn function_is_taken_as_errors_print_it() {
        let t = rec(None, "shop/app::charge#9F86d081…").target();
        assert_eq!(
            t,
            Ok(Target {
                namespace: "shop".into(),
                function: "app::charge".into(),
                digest: Some("9f86d081".into()),
            })
        );
        let t = rec(Some("shop"), "app::charge").target();
        assert_eq!(
            t.map(|t| (t.namespace, t.function, t.digest)),
            Ok(("shop".into(), "app::charge".into(), None))
        );
        assert!(rec(None, "app::charge").target().is_err());
        assert!(rec(Some("billing"), "shop/app::charge").target().is_err());
        assert!(rec(Some("shop"), "app::charge#xyz").target().is_err());
    }

    #[test]
    fn ttls_parse_like_the_attribute() {
        assert_eq!(
            parse_ttl("250ms").map(|t| t.0),
            Ok(Duration::from_millis(250))
        );
        assert_eq!(parse_ttl("30s").map(|t| t.0), Ok(Duration::from_secs(30)));
        assert_eq!(
            parse_ttl("7d").map(|t| t.0),
            Ok(Duration::from_secs(7 * 86_400))
        );
        assert!(parse_ttl("30").is_err());
        assert!(parse_ttl("0s").is_err());
        assert!(parse_ttl("s").is_err());
        assert!(parse_ttl("3w").is_err());
    }
}
