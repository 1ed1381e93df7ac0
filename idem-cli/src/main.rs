//! `idem`: the operator tool for idem records written by any process.
//!
//! ```text
//! idem inspect --store URL --namespace NS --function PATH --key RENDERED [--json]
//! idem forget  --store URL --namespace NS --function PATH --key RENDERED [--yes] [--json]
//! idem stats   --store URL [--namespace NS] [--json]
//! idem recoverable --store URL [--namespace NS] [--limit N] [--json]
//! idem tokens issue --store URL [--namespace NS] --ttl 30s [--json]
//! ```
//!
//! `--function` takes the path idem's errors and log lines print, so it can be pasted
//! from one: `shop/app::charge#9f86d0818a3b2c4d` names namespace `shop` (then
//! `--namespace` may be left out) and function `app::charge`, and the digest after `#`
//! is checked against the one computed from `--key`, so a mistyped key is caught
//! instead of reported as "no record". `--key` is the rendered key (`charge:42` for
//! `key = "charge:{order.id}"`), or the token itself under `--function token`.
//!
//! Exit codes:
//!
//! | code | meaning |
//! |------|---------|
//! | 0 | done (the record was found, forgotten, counted, listed, or the token issued) |
//! | 1 | no such record (inspect, forget) |
//! | 2 | bad arguments (including a key that does not match the pasted digest) |
//! | 3 | the store failed or is unreachable, or the record is corrupt |
//! | 4 | forget was not confirmed: stdin is not a terminal and `--yes` was not given, or the answer was not `y` |
#![forbid(unsafe_code)]

mod args;
mod report;

use std::io::{BufRead as _, IsTerminal as _, Write as _};
use std::process::ExitCode;

use clap::Parser as _;
use idem_runtime::{Error, Idem, Key, Options};

use args::{Cli, Command, RecordArgs, TokensCommand};

/// How a command ended, as an exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Exit {
    Done = 0,
    NotFound = 1,
    Usage = 2,
    Store = 3,
    NotConfirmed = 4,
}

/// A failure to report on stderr, with its exit code.
struct Failure(Exit, String);

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        match e {
            Error::Config(msg) => Failure(Exit::Usage, msg),
            other => Failure(Exit::Store, other.to_string()),
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("idem: cannot start the async runtime: {e}");
            return ExitCode::from(Exit::Store as u8);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(exit) => ExitCode::from(exit as u8),
        Err(Failure(exit, msg)) => {
            eprintln!("idem: {msg}");
            ExitCode::from(exit as u8)
        }
    }
}

async fn run(cli: Cli) -> Result<Exit, Failure> {
    let json = cli.json;
    match cli.command {
        Command::Inspect(rec) => inspect(&rec, json).await,
        Command::Forget { record, yes } => forget(&record, yes, json).await,
        Command::Stats { store, namespace } => {
            let store = idem_runtime::store::connect(&store).await?;
            let counts = store.record_counts().ok_or_else(|| {
                Failure(
                    Exit::Usage,
                    format!(
                        "the {} store cannot count records by function",
                        store.name()
                    ),
                )
            })?;
            let rows = counts.count_records(namespace.as_deref()).await?;
            report::stats(&rows, json);
            Ok(Exit::Done)
        }
        Command::Recoverable {
            store,
            namespace,
            limit,
        } => {
            let store = idem_runtime::store::connect(&store).await?;
            let recovery = store.recovery().ok_or_else(|| {
                Failure(
                    Exit::Usage,
                    format!("the {} store keeps no recovery index", store.name()),
                )
            })?;
            let calls = recovery.list(namespace.as_deref(), limit).await?;
            report::recoverable(&calls, json);
            Ok(Exit::Done)
        }
        Command::Tokens(TokensCommand::Issue {
            store,
            namespace,
            ttl,
        }) => {
            let store = idem_runtime::store::connect(&store).await?;
            let idem = Idem::builder()
                .shared_store(store)
                .namespace(namespace)
                .build();
            let token = idem.issue_token(ttl.0).await?;
            report::token(&token, ttl.0, json);
            Ok(Exit::Done)
        }
    }
}

/// The runtime, options and record key that `rec` names.
async fn open(rec: &RecordArgs) -> Result<(Idem, Options, idem_runtime::Key), Failure> {
    let target = rec.target().map_err(|m| Failure(Exit::Usage, m))?;
    let store = idem_runtime::store::connect(&rec.store).await?;
    let idem = Idem::builder()
        .shared_store(store)
        .namespace(target.namespace.clone())
        .build();
    let token = Options::token("idem-cli");
    let opts = if target.function == token.scope() {
        token
    } else {
        Options::dedup(Key::intern(&target.function).map_err(Failure::from)?)
    };
    let key = idem.record_key(&opts, &rec.key);
    if let Some(pasted) = &target.digest
        && !key.digest_hex().starts_with(pasted.as_str())
    {
        return Err(Failure(
            Exit::Usage,
            format!(
                "--key does not match the pasted record: it names {key} (digest {}), \
                 not #{pasted}; check the rendered key (the whole text the key template \
                 produces, e.g. `charge:42`)",
                key.digest_hex()
            ),
        ));
    }
    Ok((idem, opts, key))
}

async fn inspect(rec: &RecordArgs, json: bool) -> Result<Exit, Failure> {
    let (idem, opts, key) = open(rec).await?;
    let info = idem.inspect(&opts, &rec.key).await?;
    let recovery = match idem.store().recovery() {
        Some(r) => r.call(&key).await?,
        None => None,
    };
    report::record(&key, info.as_ref(), recovery.as_ref(), json);
    Ok(if info.is_some() || recovery.is_some() {
        Exit::Done
    } else {
        Exit::NotFound
    })
}

async fn forget(rec: &RecordArgs, yes: bool, json: bool) -> Result<Exit, Failure> {
    let (idem, opts, key) = open(rec).await?;
    if !yes {
        let stdin = std::io::stdin();
        if !stdin.is_terminal() {
            return Err(Failure(
                Exit::NotConfirmed,
                format!("not forgetting {key}: stdin is not a terminal; pass --yes to confirm"),
            ));
        }
        // Show what would go, so the operator confirms knowing whose record it is.
        let info = idem.inspect(&opts, &rec.key).await?;
        report::record(&key, info.as_ref(), None, false);
        eprint!("forget {key}? Its next call runs the body again. [y/N] ");
        let _ = std::io::stderr().flush();
        let mut answer = String::new();
        if stdin.lock().read_line(&mut answer).is_err() || answer.trim() != "y" {
            return Err(Failure(Exit::NotConfirmed, format!("{key} left as it was")));
        }
    }
    let forgotten = idem.forget(&opts, &rec.key).await?;
    report::forgotten(&key, forgotten, json);
    Ok(if forgotten {
        Exit::Done
    } else {
        Exit::NotFound
    })
}
