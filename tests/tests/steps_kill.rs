//! Durable steps across a process killed with SIGKILL, past its lease, on every shared
//! store: Redis, PostgreSQL, MariaDB and SQLite (a file shared by the processes).
//!
//! A checkout body runs three steps `a`, `b`, `c`, each an effect that appends a line
//! (what happened, the step, its `StepCtx::key()`, the process id, the value) to a log
//! file every process of the test shares. Each test plays one key's history across
//! processes, as a service's replicas would:
//!
//! - `*_steps_resume_after_sigkill`: a first process finds every downstream down (its
//!   steps fail, nothing is journaled); a second one runs `a` and `b` and is killed
//!   with SIGKILL before `c`, its claim still held; this process then calls again, its
//!   claim waits for the dead holder's lease, and the body replays `a` and `b` from the
//!   journal (the killed process's values) and runs only `c`. Every step's downstream
//!   key is the same in each process that ran it.
//! - `*_verified_step_after_sigkill_asks_verify`: a verified step is killed after its
//!   intent was journaled and before its result; the next process asks `verify`, and
//!   runs the effect only if `verify` did not find it.
//!
//! Child processes are this test binary run again with `IDEM_STEPS_KILL_CHILD` set to
//! the role they play: `steps_kill_child` below then plays it and exits; in a normal run
//! it returns at once. A missing server is a loud failure saying how to start it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/sql.rs"]
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::Duration;

use idem_runtime::inspect::{RecordState, StepInfo};
use idem_runtime::store::sql::sqlx;
use idem_runtime::{Error, Idem, Options, RedisStore, SqlStore, Verified, step};

/// Short leases: a killed holder's key is taken over soon after its death. A second,
/// not less: the parent looks at the record a live child holds, and on a loaded machine
/// a shorter lease could run out between two of the child's heartbeats (every third of
/// it). The calls wait (up to a minute, a bound and no expectation) for a dead holder's
/// lease.
static CHECKOUT: Options = Options::dedup("steps_kill::checkout")
    .lease(Duration::from_secs(1))
    .wait(Duration::from_secs(60))
    .ttl(Duration::from_secs(600));
static SHIP: Options = Options::dedup("steps_kill::ship")
    .lease(Duration::from_secs(1))
    .wait(Duration::from_secs(60))
    .ttl(Duration::from_secs(600));

const REDIS_URL: &str = "redis://127.0.0.1:6379";

/// The child's role; and what it needs to know, set by the parent.
const ROLE: &str = "IDEM_STEPS_KILL_CHILD";
const URL: &str = "IDEM_STEPS_KILL_URL";
const NS: &str = "IDEM_STEPS_KILL_NS";
const KEY: &str = "IDEM_STEPS_KILL_KEY";
const LOG: &str = "IDEM_STEPS_KILL_LOG";

/// How long the parent waits for a child's line: a bound for a stuck child, never an
/// expectation.
const CHILD_LINE_BOUND: Duration = Duration::from_secs(120);

// ---------------------------------------------------------------------------------
// Stores

/// The store at `url` under namespace `ns`, with small pools: the test's processes share
/// the servers with every other test. Fails loudly, saying how to start the server.
/// Also the SQL store itself, for the test's own statements.
async fn open(url: &str, ns: &str) -> (Idem, Option<SqlStore>) {
    let builder = Idem::builder().namespace(ns);
    let sql = open_sql(url).await;
    let idem = match sql.clone() {
        Some(sql) => builder.store(sql),
        None => {
            if std::net::TcpStream::connect_timeout(
                &"127.0.0.1:6379".parse().unwrap(),
                Duration::from_secs(5),
            )
            .is_err()
            {
                panic!(
                    "no Redis on 127.0.0.1:6379: start it with \
                     `redis-server --daemonize yes --save '' --appendonly no`"
                );
            }
            builder.store(RedisStore::connect(url).unwrap())
        }
    }
    .build();
    (idem, sql)
}

/// The SQL store at `url`; `None` for Redis.
async fn open_sql(url: &str) -> Option<SqlStore> {
    Some(if url.starts_with("postgres") {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(30))
            .connect(url)
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "PostgreSQL is not reachable at {url} ({e}).\nStart it with: \
                     pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start\n\
                     (or set IDEM_TEST_PG_URL)"
                )
            });
        SqlStore::from_pg_pool(pool).await.unwrap()
    } else if url.starts_with("mysql") {
        let pool = sqlx::mysql::MySqlPoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(30))
            .connect(url)
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "MariaDB/MySQL is not reachable at {url} ({e}).\nStart it with: \
                     start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd\n\
                     (or set IDEM_TEST_MYSQL_URL)"
                )
            });
        SqlStore::from_mysql_pool(pool).await.unwrap()
    } else if url.starts_with("sqlite") {
        SqlStore::connect(url).await.unwrap()
    } else {
        return None;
    })
}

/// Removes the run's rows from a shared SQL database. `Idem::forget` leaves a free row
/// behind (for a lock's fencing), which only the store's purge removes once expired;
/// Redis keeps nothing after a forget, and SQLite's file goes with the run's directory.
async fn remove_rows(sql: Option<&SqlStore>, run: &Run) {
    let Some(sql) = sql else {
        return;
    };
    let ns = &run.ns;
    if let Some(pool) = sql.pg_pool() {
        sqlx::query("DELETE FROM idem_records WHERE namespace = $1")
            .bind(ns)
            .execute(pool)
            .await
            .unwrap();
    } else if let Some(pool) = sql.mysql_pool() {
        sqlx::query("DELETE FROM idem_records WHERE namespace = ?")
            .bind(ns)
            .execute(pool)
            .await
            .unwrap();
    }
}

/// One test's run: its own namespace and key, and a directory for the shared log (and,
/// on SQLite, for the database file every process opens). Removed on drop.
struct Run {
    dir: PathBuf,
    log: PathBuf,
    url: String,
    ns: String,
    key: String,
    run_id: String,
}

impl Run {
    /// `url`: the store's; `None` for SQLite, whose file goes in the run's directory.
    fn new(name: &str, url: Option<String>) -> Run {
        let run_id = support::suffix();
        let dir = std::env::temp_dir().join(format!("idem-steps-kill-{name}-{run_id}"));
        std::fs::create_dir_all(&dir).unwrap();
        let url =
            url.unwrap_or_else(|| format!("sqlite://{}?mode=rwc", dir.join("idem.db").display()));
        Run {
            log: dir.join("effects.log"),
            dir,
            url,
            ns: format!("steps-kill-{name}-{run_id}"),
            key: format!("order-{run_id}"),
            run_id,
        }
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

// ---------------------------------------------------------------------------------
// The effects and their log

/// One line of the shared log.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Line {
    what: String,
    step: String,
    key: String,
    pid: u32,
    value: String,
}

/// Appends a line to the log. The write reaches the kernel before the step returns, so
/// it outlives a SIGKILL of its process.
fn record(log: &Path, what: &str, step: &str, key: &str, value: &str) {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    writeln!(f, "{what} {step} {key} {} {value}", std::process::id()).unwrap();
}

fn read_log(log: &Path) -> Vec<Line> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            assert_eq!(f.len(), 5, "a torn log line: {l:?}");
            Line {
                what: f[0].into(),
                step: f[1].into(),
                key: f[2].into(),
                pid: f[3].parse().unwrap(),
                value: f[4].into(),
            }
        })
        .collect()
}

/// The lines saying `what`, as (step, pid, value), in log order.
fn lines_of(lines: &[Line], what: &str) -> Vec<(String, u32, String)> {
    lines
        .iter()
        .filter(|l| l.what == what)
        .map(|l| (l.step.clone(), l.pid, l.value.clone()))
        .collect()
}

/// Tells the parent how far the child got.
fn signal(tag: &str) {
    println!("{tag}");
    std::io::stdout().flush().unwrap();
}

/// How an attempt at the checkout goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Checkout {
    /// Every downstream is down: each step is tried and fails; the call fails.
    Down,
    /// `a` and `b` run; then the process waits to be killed, before `c`.
    DieAfterB,
    /// All the way through.
    Finish,
}

type Receipt = (String, String, String);

/// One step of the checkout: an effect that logs what it did with its downstream key.
async fn effect(log: &Path, name: &str, down: bool) -> Result<String, Error> {
    step(name, |s| async move {
        if down {
            record(log, "declined", name, s.key(), "-");
            return Err(Error::Config(format!("the downstream of {name} is down")));
        }
        let value = format!("{name}-by-{}", std::process::id());
        record(log, "ran", name, s.key(), &value);
        Ok(value)
    })
    .await
}

/// The body every process runs for the key.
async fn checkout(log: &Path, how: Checkout) -> Result<Receipt, Error> {
    if how == Checkout::Down {
        for name in ["a", "b", "c"] {
            assert!(effect(log, name, true).await.is_err());
        }
        return Err(Error::Config("every downstream is down".into()));
    }
    let a = effect(log, "a", false).await?;
    let b = effect(log, "b", false).await?;
    if how == Checkout::DieAfterB {
        // `b` returned, so it is journaled: the parent checks that, then kills us.
        signal("JOURNALED-B");
        std::future::pending::<()>().await;
    }
    let c = effect(log, "c", false).await?;
    Ok((a, b, c))
}

/// How an attempt at the verified step goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ship {
    /// The parcel ships, then the process waits to be killed before the result is
    /// journaled.
    LandThenDie,
    /// The process waits to be killed before the parcel ships.
    DieBeforeLanding,
    /// All the way through.
    Finish,
}

/// A verified step whose downstream (a carrier) has no idempotency key, only a lookup:
/// `verify` finds a shipment by the step's key in the log.
async fn ship(log: &Path, how: Ship) -> Result<String, Error> {
    Verified::new("ship")
        .verify(|s| async move {
            record(log, "verify", "ship", s.key(), "-");
            let found = read_log(log)
                .into_iter()
                .find(|l| l.what == "shipped" && l.key == s.key())
                .map(|l| l.value);
            Ok::<_, Error>(found)
        })
        .run(|s| async move {
            record(log, "started", "ship", s.key(), "-");
            let parcel = format!("parcel-by-{}", std::process::id());
            if how != Ship::DieBeforeLanding {
                record(log, "shipped", "ship", s.key(), &parcel);
            }
            if how != Ship::Finish {
                signal("SHIP-STARTED");
                std::future::pending::<()>().await;
            }
            Ok(parcel)
        })
        .await
}

// ---------------------------------------------------------------------------------
// Child processes

/// The child side: plays the role named in `IDEM_STEPS_KILL_CHILD`. Does nothing in a
/// normal test run.
#[test]
fn steps_kill_child() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let var = |name: &str| std::env::var(name).unwrap();
    let (url, ns, key, log) = (var(URL), var(NS), var(KEY), PathBuf::from(var(LOG)));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let (idem, _) = open(&url, &ns).await;
        match role.as_str() {
            "down" => {
                let r = idem
                    .dedup(&CHECKOUT, &key, checkout(&log, Checkout::Down))
                    .await;
                signal(&format!("DONE {r:?}"));
            }
            "die-after-b" => {
                let r = idem
                    .dedup(&CHECKOUT, &key, checkout(&log, Checkout::DieAfterB))
                    .await;
                signal(&format!("FAILED {r:?}"));
            }
            "land-then-die" | "die-before-landing" => {
                let how = if role == "land-then-die" {
                    Ship::LandThenDie
                } else {
                    Ship::DieBeforeLanding
                };
                let r = idem.dedup(&SHIP, &key, ship(&log, how)).await;
                signal(&format!("FAILED {r:?}"));
            }
            other => panic!("unknown child role {other}"),
        }
    });
    std::process::exit(0);
}

/// A child process; killed (SIGKILL) and reaped on drop if still running, so a failed
/// assertion leaves no process behind.
struct ChildProcess {
    child: Child,
    out: Option<BufReader<ChildStdout>>,
}

impl ChildProcess {
    fn spawn(role: &str, run: &Run, key: &str, log: &Path) -> ChildProcess {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "steps_kill_child",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(ROLE, role)
            .env(URL, &run.url)
            .env(NS, &run.ns)
            .env(KEY, key)
            .env(LOG, log)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let out = Some(BufReader::new(child.stdout.take().unwrap()));
        ChildProcess { child, out }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The rest of the first line the child prints that contains `tag`. Panics with what
    /// it printed if it exits first, or after a generous bound.
    async fn line(&mut self, tag: &'static str) -> String {
        let mut out = self.out.take().expect("the child's stdout");
        let read = tokio::task::spawn_blocking(move || {
            let (mut line, mut seen) = (String::new(), String::new());
            loop {
                line.clear();
                if out.read_line(&mut line).unwrap() == 0 {
                    return (out, Err(seen));
                }
                seen.push_str(&line);
                // libtest prints "test steps_kill_child ... " before the child's first line.
                if let Some(at) = line.find(tag) {
                    let rest = line[at + tag.len()..].trim().to_owned();
                    return (out, Ok(rest));
                }
            }
        });
        match tokio::time::timeout(CHILD_LINE_BOUND, read).await {
            Ok(joined) => {
                let (out, got) = joined.unwrap();
                self.out = Some(out);
                got.unwrap_or_else(|seen| {
                    panic!("the child exited before printing {tag}; it printed:\n{seen}")
                })
            }
            Err(_) => {
                self.kill();
                panic!("the child printed no {tag} in {CHILD_LINE_BOUND:?}")
            }
        }
    }

    /// SIGKILL, and reap it.
    fn kill(&mut self) {
        self.child.kill().expect("SIGKILL the child");
        let status = self.child.wait().unwrap();
        assert!(!status.success(), "the child was killed: {status:?}");
    }

    fn wait_success(&mut self) {
        let status = self.child.wait().unwrap();
        assert!(status.success(), "the child failed: {status:?}");
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

// ---------------------------------------------------------------------------------
// The checks

/// The step names and whether each is done, sorted.
fn done(steps: &[StepInfo]) -> Vec<(String, bool)> {
    let mut v: Vec<(String, bool)> = steps.iter().map(|s| (s.name.clone(), s.done)).collect();
    v.sort();
    v
}

/// The downstream keys the log shows per step: each step has one key, the same in
/// every process that ran it, well formed and free of the raw key; no two steps share
/// one. Returns step → (key, the processes that saw it).
fn keys_per_step(lines: &[Line], run: &Run) -> BTreeMap<String, (String, BTreeSet<u32>)> {
    let mut seen = BTreeMap::<String, (BTreeSet<String>, BTreeSet<u32>)>::new();
    for l in lines {
        let e = seen.entry(l.step.clone()).or_default();
        e.0.insert(l.key.clone());
        e.1.insert(l.pid);
    }
    let mut out = BTreeMap::new();
    for (step, (keys, pids)) in seen {
        assert_eq!(
            keys.len(),
            1,
            "step {step}'s downstream key differs between attempts or processes: {keys:?}"
        );
        let key = keys.into_iter().next().unwrap();
        assert!(!key.is_empty() && key.len() <= 255, "{key:?}");
        assert!(key.bytes().all(|b| b.is_ascii_graphic()), "{key:?}");
        assert!(
            !key.contains(&run.run_id) && !key.contains("order"),
            "raw key material in {key:?}"
        );
        out.insert(step, (key, pids));
    }
    let distinct: BTreeSet<&String> = out.values().map(|(k, _)| k).collect();
    assert_eq!(distinct.len(), out.len(), "two steps share a key: {out:?}");
    out
}

/// The record of `key` completed, and its journal dropped with the completion: by the
/// store's own journal read, and as `Idem::inspect` and `Idem::steps` list it.
async fn assert_completed_without_journal(idem: &Idem, opts: &Options, key: &str) {
    let record = idem.key(opts, format_args!("{key}"));
    let journal = idem
        .store()
        .journal()
        .expect("a store with a step journal")
        .read_journal(&record)
        .await
        .unwrap();
    assert!(
        journal.is_empty(),
        "the completion kept a journal: {journal:?}"
    );
    let info = idem.inspect(opts, key).await.unwrap().expect("the record");
    assert_eq!(info.state, RecordState::Completed);
    assert!(info.steps.is_empty(), "{:?}", info.steps);
    assert!(idem.steps(opts, key).await.unwrap().is_empty());
}

/// Three processes, one key: downstreams down; killed after `b`; resumed past the lease.
async fn steps_resume_after_sigkill(name: &str, url: Option<String>) {
    let run = Run::new(name, url);
    let (idem, sql) = open(&run.url, &run.ns).await;
    let key = run.key.clone();

    // Attempt 1, in a first process: every step fails, so none is journaled.
    let mut down = ChildProcess::spawn("down", &run, &key, &run.log);
    let done_line = down.line("DONE ").await;
    assert!(done_line.starts_with("Err(Config("), "{done_line}");
    down.wait_success();
    assert!(idem.inspect(&CHECKOUT, &key).await.unwrap().is_none());
    assert!(
        idem.steps(&CHECKOUT, &key).await.unwrap().is_empty(),
        "a failed step was journaled"
    );

    // Attempt 2, in a second process: `a` and `b` run and are journaled, then SIGKILL
    // before `c`, the claim still held.
    let mut dying = ChildProcess::spawn("die-after-b", &run, &key, &run.log);
    dying.line("JOURNALED-B").await;
    let held = idem
        .inspect(&CHECKOUT, &key)
        .await
        .unwrap()
        .expect("the record the child holds");
    assert_eq!(held.state, RecordState::InProgress);
    let journaled = vec![("a".to_owned(), true), ("b".to_owned(), true)];
    assert_eq!(done(&held.steps), journaled);
    let record = idem.key(&CHECKOUT, format_args!("{key}"));
    let journal = idem
        .store()
        .journal()
        .unwrap()
        .read_journal(&record)
        .await
        .unwrap();
    assert!(
        journal
            .iter()
            .all(|e| e.value.as_ref().is_some_and(|v| !v.is_empty())),
        "{journal:?}"
    );
    dying.kill();
    let dead = dying.pid();

    // Attempt 3, here: the claim waits for the dead holder's lease and takes the record
    // over with its journal; `a` and `b` replay the dead process's values, `c` runs.
    let me = std::process::id();
    let receipt = idem
        .dedup(&CHECKOUT, &key, checkout(&run.log, Checkout::Finish))
        .await
        .expect("the resumed call");
    assert_eq!(
        receipt,
        (
            format!("a-by-{dead}"),
            format!("b-by-{dead}"),
            format!("c-by-{me}")
        ),
        "a and b are replayed from the journal with their values, c is this run's"
    );
    let lines = read_log(&run.log);
    let ran = lines_of(&lines, "ran");
    let ran_expected = vec![
        ("a".to_owned(), dead, format!("a-by-{dead}")),
        ("b".to_owned(), dead, format!("b-by-{dead}")),
        ("c".to_owned(), me, format!("c-by-{me}")),
    ];
    assert_eq!(ran, ran_expected, "each effect happened exactly once");
    let declined: Vec<(String, u32)> = lines_of(&lines, "declined")
        .into_iter()
        .map(|(s, p, _)| (s, p))
        .collect();
    let first = declined.first().map(|d| d.1).unwrap_or_default();
    assert_eq!(
        declined,
        [
            ("a".into(), first),
            ("b".into(), first),
            ("c".into(), first)
        ]
    );
    assert!(first != dead && first != me);

    // Every step's downstream key is the one each process that tried it saw: a and b
    // in the first and second processes, c in the first and this one.
    let keys = keys_per_step(&lines, &run);
    let pids: Vec<(&str, Vec<u32>)> = keys
        .iter()
        .map(|(s, (_, p))| (s.as_str(), p.iter().copied().collect()))
        .collect();
    let mut ab = vec![first, dead];
    ab.sort();
    let mut c = vec![first, me];
    c.sort();
    assert_eq!(pids, [("a", ab.clone()), ("b", ab), ("c", c)]);

    assert_completed_without_journal(&idem, &CHECKOUT, &key).await;
    // Later calls replay the receipt and run nothing.
    let again = idem
        .dedup(&CHECKOUT, &key, checkout(&run.log, Checkout::Finish))
        .await
        .unwrap();
    assert_eq!(again, receipt);
    assert_eq!(read_log(&run.log).len(), lines.len(), "a replay ran a step");

    assert!(idem.forget(&CHECKOUT, &key).await.unwrap());
    remove_rows(sql.as_ref(), &run).await;
}

/// A verified step killed after its intent was journaled, before its result: the next
/// process asks `verify`; found, the effect does not run again; not found, it runs.
async fn verified_step_after_sigkill_asks_verify(name: &str, url: Option<String>) {
    let run = Run::new(name, url);
    let (idem, sql) = open(&run.url, &run.ns).await;
    for (role, landed) in [("land-then-die", true), ("die-before-landing", false)] {
        let key = format!("{}-{role}", run.key);
        let log = run.dir.join(format!("{role}.log"));
        let mut dying = ChildProcess::spawn(role, &run, &key, &log);
        dying.line("SHIP-STARTED").await;
        let held = idem
            .inspect(&SHIP, &key)
            .await
            .unwrap()
            .expect("the record the child holds");
        assert_eq!(held.state, RecordState::InProgress);
        assert_eq!(
            done(&held.steps),
            [("ship".to_owned(), false)],
            "the intent, without a result"
        );
        assert!(held.steps[0].value_size.is_none());
        dying.kill();
        let dead = dying.pid();

        let me = std::process::id();
        let parcel = idem
            .dedup(&SHIP, &key, ship(&log, Ship::Finish))
            .await
            .expect("the resumed call");
        let lines = read_log(&log);
        let verify = lines_of(&lines, "verify");
        assert_eq!(
            verify,
            [("ship".to_owned(), me, "-".to_owned())],
            "verify is asked once, by the resuming process, with the same step key"
        );
        let started: Vec<u32> = lines_of(&lines, "started").iter().map(|s| s.1).collect();
        let shipped = lines_of(&lines, "shipped");
        if landed {
            assert_eq!(parcel, format!("parcel-by-{dead}"), "verify's value");
            assert_eq!(started, [dead], "the effect ran again although verified");
            assert_eq!(shipped, [("ship".to_owned(), dead, parcel.clone())]);
        } else {
            assert_eq!(parcel, format!("parcel-by-{me}"));
            assert_eq!(started, [dead, me]);
            assert_eq!(shipped, [("ship".to_owned(), me, parcel.clone())]);
        }
        let keys = keys_per_step(&lines, &run);
        let pids: Vec<u32> = keys["ship"].1.iter().copied().collect();
        let mut both = vec![dead, me];
        both.sort();
        assert_eq!(pids, both, "both processes saw the step's key");
        assert_completed_without_journal(&idem, &SHIP, &key).await;
        assert!(idem.forget(&SHIP, &key).await.unwrap());
    }
    remove_rows(sql.as_ref(), &run).await;
}

// ---------------------------------------------------------------------------------
// Per store

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_steps_resume_after_sigkill() {
    steps_resume_after_sigkill("redis", Some(REDIS_URL.into())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_verified_step_after_sigkill_asks_verify() {
    verified_step_after_sigkill_asks_verify("redis", Some(REDIS_URL.into())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_steps_resume_after_sigkill() {
    steps_resume_after_sigkill("pg", Some(support::pg_url())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_verified_step_after_sigkill_asks_verify() {
    verified_step_after_sigkill_asks_verify("pg", Some(support::pg_url())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_steps_resume_after_sigkill() {
    steps_resume_after_sigkill("mariadb", Some(support::mysql_url())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_verified_step_after_sigkill_asks_verify() {
    verified_step_after_sigkill_asks_verify("mariadb", Some(support::mysql_url())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_steps_resume_after_sigkill() {
    steps_resume_after_sigkill("sqlite", None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_verified_step_after_sigkill_asks_verify() {
    verified_step_after_sigkill_asks_verify("sqlite", None).await;
}
