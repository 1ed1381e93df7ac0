//! The effects ledger, counted outside idem: PostgreSQL tables private to one run.
//!
//! - `<run>_runs`: one row per body run (key, worker incarnation, start, the owner of
//!   the claim it ran under), no unique constraint, so a key whose body ran twice has
//!   two rows;
//! - `<run>_seen`: one row each time a caller learnt, from the store, that a key is
//!   completed (its completion was acknowledged, or a replay came back);
//! - `<run>_events`: the faults the controller made (worker kills, store faults).
//!
//! Every time is PostgreSQL's `clock_timestamp()`, one clock for all processes.
//!
//! Beside the tables, each process appends every call it makes to a file of the run's
//! history directory ([`History`]): who called which key, when it started and ended
//! (this machine's clock, the same as the database's), and what it returned. A process
//! killed mid-call leaves that call out, as Jepsen leaves an indeterminate operation.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use idem_runtime::store::sql::sqlx::{self, AssertSqlSafe, PgPool, Row};

/// A connection pool on the ledger database and the run's table names.
#[derive(Clone)]
pub(crate) struct Ledger {
    pool: PgPool,
    run: String,
}

/// One body run.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Run {
    pub(crate) key: i64,
    pub(crate) incarnation: i32,
    /// Microseconds since the epoch, by the database's clock.
    pub(crate) at: i64,
    /// The low 64 bits of the owner of the claim it ran under (0: none).
    pub(crate) owner: i64,
}

/// One call, from the history files.
#[derive(Debug, Clone)]
pub(crate) struct Call {
    pub(crate) incarnation: i32,
    pub(crate) key: i64,
    /// Microseconds since the epoch.
    pub(crate) start: i64,
    /// [`CUT_SHORT`] for a call whose process was killed before it ended.
    pub(crate) end: i64,
    /// `ran`, `ran-unacked`, `ran-lost` (its completion refused: the lease was lost),
    /// `replayed`, `store-error`, `busy`, `unexpected`, or `cut-short` (its process
    /// was killed in the middle of it: only its start is known).
    pub(crate) outcome: String,
}

impl Call {
    /// Whether its process's kill cut it short (its end is [`CUT_SHORT`]).
    pub(crate) fn cut_short(&self) -> bool {
        self.end == CUT_SHORT
    }
}

/// The end of a call its process's kill cut short: it may have run until then, and
/// its effect may land even later (a request held up on a cut link).
pub(crate) const CUT_SHORT: i64 = i64::MAX;

/// A process's history file: a line as each call starts and another as it ends
/// (unbuffered, so a SIGKILL loses neither). A call whose end is missing was cut short
/// by a kill; as Jepsen keeps an indeterminate operation's invocation, its start still
/// tells the checker how long it was in flight.
pub(crate) struct History {
    file: Mutex<std::fs::File>,
}

impl History {
    /// The history file of incarnation `inc` in `dir`.
    pub(crate) fn create(dir: &str, inc: i32) -> Result<History, String> {
        let path = Path::new(dir).join(format!("calls-{inc}.tsv"));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(History {
            file: Mutex::new(file),
        })
    }

    /// A call starting: its end is written by [`call`](Self::call).
    pub(crate) fn started(&self, inc: i32, key: u64, start: i64) {
        self.write(format!("{inc}\t{key}\t{start}\t-\tstarted\n"));
    }

    pub(crate) fn call(&self, inc: i32, key: u64, start: i64, end: i64, outcome: &str) {
        self.write(format!("{inc}\t{key}\t{start}\t{end}\t{outcome}\n"));
    }

    fn write(&self, line: String) {
        let mut f = self.file.lock().unwrap_or_else(|p| p.into_inner());
        let _ = f.write_all(line.as_bytes());
    }

    /// Every call in the files of `dir`, in order of their start: those that ended, and
    /// those a kill cut short (ended at [`CUT_SHORT`]).
    pub(crate) fn read(dir: &Path) -> Result<Vec<Call>, String> {
        let mut calls = Vec::new();
        let mut started: std::collections::BTreeSet<(i32, i64, i64)> = Default::default();
        let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for entry in entries.flatten() {
            let path: PathBuf = entry.path();
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            for line in text.lines() {
                let f: Vec<&str> = line.split('\t').collect();
                let [inc, key, start, end, outcome] = f.as_slice() else {
                    continue; // a line cut short by a kill
                };
                let (Ok(incarnation), Ok(key), Ok(start)) =
                    (inc.parse(), key.parse(), start.parse())
                else {
                    continue;
                };
                if (*end, *outcome) == ("-", "started") {
                    started.insert((incarnation, key, start));
                    continue;
                }
                let Ok(end) = end.parse() else {
                    continue;
                };
                started.remove(&(incarnation, key, start));
                calls.push(Call {
                    incarnation,
                    key,
                    start,
                    end,
                    outcome: (*outcome).to_owned(),
                });
            }
        }
        // Started and never ended: cut short by a kill.
        calls.extend(started.into_iter().map(|(incarnation, key, start)| Call {
            incarnation,
            key,
            start,
            end: CUT_SHORT,
            outcome: "cut-short".to_owned(),
        }));
        calls.sort_by_key(|c| c.start);
        Ok(calls)
    }
}

/// A fault the controller made.
#[derive(Debug, Clone)]
pub(crate) struct Event {
    pub(crate) kind: String,
    /// The killed worker, for a kill.
    pub(crate) incarnation: i32,
    pub(crate) at: i64,
}

/// What the tables hold at the end.
pub(crate) struct Contents {
    pub(crate) runs: Vec<Run>,
    /// (key, time) of each "completed" sighting.
    pub(crate) seen: Vec<(i64, i64)>,
    pub(crate) events: Vec<Event>,
    /// Every call the history files hold, by start.
    pub(crate) calls: Vec<Call>,
}

fn db(e: sqlx::Error) -> String {
    format!("ledger: {e}")
}

impl Ledger {
    /// Connects with up to `connections`; the run's tables must exist
    /// ([`create`](Self::create)).
    pub(crate) async fn open(url: &str, run: &str, connections: u32) -> Result<Ledger, String> {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(connections)
            .acquire_timeout(std::time::Duration::from_secs(10))
            .connect(url)
            .await
            .map_err(db)?;
        Ok(Ledger {
            pool,
            run: run.to_owned(),
        })
    }

    pub(crate) async fn create(&self) -> Result<(), String> {
        let r = &self.run;
        for ddl in [
            format!(
                "CREATE TABLE {r}_runs (key BIGINT NOT NULL, inc INT NOT NULL, owner BIGINT NOT NULL, at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp())"
            ),
            format!(
                "CREATE TABLE {r}_seen (key BIGINT NOT NULL, inc INT NOT NULL, at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp())"
            ),
            format!(
                "CREATE TABLE {r}_events (kind TEXT NOT NULL, inc INT NOT NULL, at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp())"
            ),
        ] {
            sqlx::query(AssertSqlSafe(ddl))
                .execute(&self.pool)
                .await
                .map_err(db)?;
        }
        Ok(())
    }

    pub(crate) async fn drop_tables(&self) -> Result<(), String> {
        let r = &self.run;
        let ddl = format!("DROP TABLE IF EXISTS {r}_runs, {r}_seen, {r}_events");
        sqlx::query(AssertSqlSafe(ddl))
            .execute(&self.pool)
            .await
            .map_err(db)?;
        Ok(())
    }

    /// The effect of one body run, under the claim of `owner`.
    pub(crate) async fn ran(&self, key: i64, inc: i32, owner: i64) -> Result<(), sqlx::Error> {
        let q = format!(
            "INSERT INTO {}_runs (key, inc, owner) VALUES ($1, $2, $3)",
            self.run
        );
        sqlx::query(AssertSqlSafe(q))
            .bind(key)
            .bind(inc)
            .bind(owner)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// The store said `key` is completed.
    pub(crate) async fn seen(&self, key: i64, inc: i32) -> Result<(), sqlx::Error> {
        let q = format!("INSERT INTO {}_seen (key, inc) VALUES ($1, $2)", self.run);
        sqlx::query(AssertSqlSafe(q))
            .bind(key)
            .bind(inc)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    pub(crate) async fn event(&self, kind: &str, inc: i32) -> Result<(), String> {
        let q = format!(
            "INSERT INTO {}_events (kind, inc) VALUES ($1, $2)",
            self.run
        );
        sqlx::query(AssertSqlSafe(q))
            .bind(kind)
            .bind(inc)
            .execute(&self.pool)
            .await
            .map_err(db)?;
        Ok(())
    }

    /// The tables' contents, and the calls of the history files in `history`.
    pub(crate) async fn contents(&self, history: &Path) -> Result<Contents, String> {
        let r = &self.run;
        let us = "(extract(epoch from at) * 1000000)::bigint";
        let runs = sqlx::query(AssertSqlSafe(format!(
            "SELECT key, inc, {us}, owner FROM {r}_runs ORDER BY key, at"
        )))
        .fetch_all(&self.pool)
        .await
        .map_err(db)?
        .iter()
        .map(|row| Run {
            key: row.get(0),
            incarnation: row.get(1),
            at: row.get(2),
            owner: row.get(3),
        })
        .collect();
        let seen = sqlx::query(AssertSqlSafe(format!("SELECT key, {us} FROM {r}_seen")))
            .fetch_all(&self.pool)
            .await
            .map_err(db)?
            .iter()
            .map(|row| (row.get(0), row.get(1)))
            .collect();
        let events = sqlx::query(AssertSqlSafe(format!(
            "SELECT kind, inc, {us} FROM {r}_events ORDER BY at"
        )))
        .fetch_all(&self.pool)
        .await
        .map_err(db)?
        .iter()
        .map(|row| Event {
            kind: row.get(0),
            incarnation: row.get(1),
            at: row.get(2),
        })
        .collect();
        let calls = History::read(history)?;
        Ok(Contents {
            runs,
            seen,
            events,
            calls,
        })
    }

    /// Cuts every PostgreSQL connection whose application name is `app` (the store's).
    pub(crate) async fn cut_connections(&self, app: &str) -> Result<u64, String> {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE application_name = $1 AND pid <> pg_backend_pid()",
        )
        .bind(app)
        .fetch_one(&self.pool)
        .await
        .map_err(db)?;
        Ok(u64::try_from(n).unwrap_or(0))
    }
}

/// The ledger event a worker writes when the store refused its completion of `key`
/// (its lease was lost, under a pause or a slow link).
pub(crate) fn lost_event(key: u64) -> String {
    format!("lost {key}")
}
