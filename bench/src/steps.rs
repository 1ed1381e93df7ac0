//! The `steps` family: what one durable step ([`idem_runtime::step`]) costs, next to one
//! raw write of the same store through the same connections.
//!
//! A step journals its `Ok` value in one owner-checked write. Issue 23's bar is that this
//! costs at most 1.2 times a write a user could make by hand to the same store, without
//! the owner check, at 50 concurrent tasks. To price the step alone, every case is the
//! same dedup call on a new key (claim, body, completion) and only the body differs:
//!
//! - **empty body**: the body returns its result at once;
//! - **3 steps**: the body runs three [`step`]s, each returning a small receipt;
//! - **3 raw writes**: the body writes the same three receipts itself, owner-less, where
//!   and as the journal would, through the store's own connections:
//!   - memory: an entry (name, serialized value, time) in an in-process map sharded and
//!     keyed like MemoryStore's journals (by the record's digest), under a `std` mutex
//!     (MemoryStore's journals cannot be written from outside);
//!   - Redis: `HSET <record>:steps <name> <entry>` through `RedisStore::command`: the
//!     journal's own hash and entry bytes (kind, 15 digits of milliseconds, value), one
//!     command and one round trip; the completion deletes the hash, as it does a
//!     journal;
//!   - PostgreSQL: SqlStore's own step `UPDATE` (`PG_RAW_WRITE` here) without its owner,
//!     state, lease and expiry checks: the entry, in the journal's format and stamped
//!     by the database's clock, appended to the `steps` column of the record's own row
//!     through the store's pool;
//! - **resume**: a body whose first 2 of 3 steps are already journaled. Before each
//!   measured call, unmeasured, a first attempt at the same key runs two steps and
//!   returns `Err`, which releases the key and keeps the journal; the measured attempt
//!   gets the journal with its claim, replays two steps and runs one. Each measured
//!   attempt checks that exactly one step ran.
//!
//! A step's cost is (mean call with 3 steps − mean call with an empty body) / 3, a raw
//! write's is (mean call with 3 raw writes − the same empty call) / 3, and the ratio
//! divides the first by the second (a `cost-ratio` line: lower is better; until 0.2 also
//! printed as the old `ratio` line, see `Report::cost_ratio`). At 50 tasks a mean
//! latency is the tasks over the throughput, so the ratio is also that of the capacity
//! each uses. The four cases take turns in short slices, as the Redis and SQL families'
//! do, so a change of the shared machine's load lands on all of them alike; the table
//! shows the spread of the per-slice ratios beside the figure from all slices together.
//!
//! Stores: MemoryStore always, Redis with `--redis`, PostgreSQL with a `postgres://`
//! `--sql` URL (other SQL backends are not measured here), each at 1 and 50 tasks. A
//! store without a step journal is noted and skipped. Each case measures `--quick`'s or
//! the full window in total (split in [`ROUNDS`] slices), or `$IDEM_BENCH_STEPS_SECS`
//! seconds if set: the subtraction of two means wants more samples than a throughput
//! does, so give it several seconds on a quiet machine.

use std::collections::HashMap;
use std::future::Future;
use std::hash::BuildHasherDefault;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use idem_runtime::store::JournalEntry;
use idem_runtime::store::redis::redis;
use idem_runtime::store::sql::sqlx::{self, AssertSqlSafe};
use idem_runtime::{Idem, Key, MemoryStore, Options, RedisStore, SqlStore, Store, step};

use crate::args::Args;
use crate::load::{self, Histogram};
use crate::report::{Report, Summary, fmt_dur, markdown_table};
use crate::work::{self, BenchError, Receipt, receipt};

/// Records and journals live this long; Redis keys expire by themselves after the run.
const TTL: Duration = Duration::from_secs(30);

static EMPTY: Options = Options::dedup("bench::steps_empty").ttl(TTL);
static STEPS: Options = Options::dedup("bench::steps").ttl(TTL);
static RAW: Options = Options::dedup("bench::steps_raw").ttl(TTL);
static RESUME: Options = Options::dedup("bench::steps_resume").ttl(TTL);

/// The three steps' names, as a checkout would call them.
const NAMES: [&str; 3] = ["charge", "reserve", "mail"];

/// How many turns each case takes (its measured time is split among them).
pub const ROUNDS: u32 = 5;

/// The bar of issue 23: a step costs at most this many raw writes, at [`BAR_TASKS`].
const BAR: f64 = 1.2;
const BAR_TASKS: usize = 50;

/// What the resume case's first attempt fails with.
const FAIL: &str = "steps bench: the first attempt fails after two steps";

/// The four cases, in the order they take turns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Empty,
    Steps,
    Raw,
    Resume,
}

const KINDS: [Kind; 4] = [Kind::Empty, Kind::Steps, Kind::Raw, Kind::Resume];

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Empty => "dedup new key, empty body",
            Kind::Steps => "dedup new key, 3 steps",
            Kind::Raw => "dedup new key, 3 raw writes",
            Kind::Resume => "resume: 2 steps replayed, 1 run",
        }
    }
}

/// Runs the family on every store the command line gives.
pub(crate) async fn run(args: &Args, report: &mut Report) {
    let (warmup, window) = args.window();
    let window = match std::env::var("IDEM_BENCH_STEPS_SECS") {
        Ok(s) => match s.parse::<f64>() {
            Ok(secs) if secs > 0.0 && secs.is_finite() => Duration::from_secs_f64(secs),
            _ => {
                report.note(format!(
                    "IDEM_BENCH_STEPS_SECS={s:?} is not a positive number of seconds; using {window:?}"
                ));
                window
            }
        },
        Err(_) => window,
    };
    let plan = Plan {
        warmup: warmup / ROUNDS,
        slice: window / ROUNDS,
    };
    if cfg!(debug_assertions) {
        report.note("steps: a debug build; its figures say nothing about a release build");
    }
    // One namespace per run: keys of two runs, or of a run and a test suite, never meet.
    let ns = format!("bench-steps-{}", load::run_tag());
    let mut table = Vec::new();

    let memory = Idem::builder()
        .store(MemoryStore::new())
        .namespace(ns.clone())
        .build();
    store_cases(
        report,
        &mut table,
        "memory",
        plan,
        &memory,
        &Raw::Memory(Arc::new(RawMap::new())),
    )
    .await;

    if let Some(url) = &args.redis {
        match RedisStore::connect(url) {
            Ok(store) => {
                let idem = Idem::builder()
                    .store(store.clone())
                    .namespace(ns.clone())
                    .build();
                store_cases(
                    report,
                    &mut table,
                    "redis",
                    plan,
                    &idem,
                    &Raw::Redis(store.clone()),
                )
                .await;
                // Records, journals and raw keys all live under the run's namespace.
                work::redis_cleanup(&store, &format!("idem:{ns}:")).await;
            }
            Err(e) => report.note(format!("steps/redis skipped: {e}")),
        }
    }

    for url in args.sql.iter().filter(|u| u.starts_with("postgres")) {
        if let Err(e) = postgres(report, &mut table, plan, url, &ns).await {
            report.note(format!("steps/postgres failed: {e}"));
        }
    }

    if table.is_empty() {
        return;
    }
    let mut rows = vec![
        [
            "store",
            "tasks",
            "empty body",
            "3 steps",
            "3 raw writes",
            "resume",
            "per step",
            "per raw write",
            "step / raw write",
            "per-slice ratios",
            "bar ≤ 1.2 at 50 tasks",
        ]
        .map(str::to_owned)
        .to_vec(),
    ];
    rows.extend(table);
    let mut body = markdown_table(
        &rows,
        &[
            false, true, true, true, true, true, true, true, true, false, false,
        ],
    );
    body.push_str(
        "\nMean latency of one dedup call on a new key, by what its body does; \
         `resume` is an attempt that replays 2 journaled steps and runs the third (its \
         failed first attempt not counted). `per step` = (3 steps − empty body) / 3, \
         `per raw write` = (3 raw writes − empty body) / 3, through the same store and \
         connections; `step / raw write` divides them (lower is better).\n",
    );
    report.section("Durable steps (`--cases steps`)", body);
}

/// The PostgreSQL cases: the store, the cases, clean-up.
async fn postgres(
    report: &mut Report,
    table: &mut Vec<Vec<String>>,
    plan: Plan,
    url: &str,
    ns: &str,
) -> Result<(), idem_runtime::Error> {
    let store = SqlStore::connect(url).await?;
    if store.journal().is_none() {
        report.note("steps/postgres skipped: this build's SqlStore keeps no step journal");
        store.close().await;
        return Ok(());
    }
    let Some(pool) = store.pg_pool().cloned() else {
        return Err(idem_runtime::Error::Config("not a PostgreSQL pool".into()));
    };
    let idem = Idem::builder()
        .store(store.clone())
        .namespace(ns.to_owned())
        .build();
    store_cases(
        report,
        table,
        "postgres",
        plan,
        &idem,
        &Raw::Postgres(pool.clone()),
    )
    .await;
    // Leave nothing behind: the run's records (a completion drops a journal with its
    // record's value, so no journal outlives them).
    sqlx::query(AssertSqlSafe(format!(
        "DELETE FROM idem_records WHERE namespace = '{ns}'"
    )))
    .execute(&pool)
    .await
    .map_err(idem_runtime::Error::store)?;
    store.close().await;
    Ok(())
}

/// One store's cases at 1 and 50 tasks: rows, ratio lines and the table's lines.
async fn store_cases(
    report: &mut Report,
    table: &mut Vec<Vec<String>>,
    label: &str,
    plan: Plan,
    idem: &Idem,
    raw: &Raw,
) {
    let group = format!("steps/{label}");
    for tasks in [1usize, BAR_TASKS] {
        eprintln!("  steps {label}, {tasks} tasks");
        let cases = KINDS.map(|k| (k, op(k, idem.clone(), raw.clone())));
        let measured = measure(&cases, tasks, plan, raw).await;
        let mut clean = true;
        for m in &measured {
            if let Some(e) = &m.tally.first_error {
                clean = false;
                report.note(format!(
                    "{group} / {} / {tasks} tasks: {} errors, first: {e}",
                    m.kind.name(),
                    m.tally.errors
                ));
            }
            report.add_summary(&group, m.kind.name(), m.summary(tasks));
        }
        let [empty, steps, raws, resume] = &measured;
        let per_step = (steps.mean_ns() - empty.mean_ns()) / 3.0;
        let per_raw = (raws.mean_ns() - empty.mean_ns()) / 3.0;
        let ratio = (per_raw > 0.0).then(|| per_step / per_raw);
        let per_round: Vec<f64> = (0..ROUNDS as usize)
            .filter_map(|r| {
                let e = empty.rounds.get(r)?;
                let raw = (raws.rounds.get(r)? - e) / 3.0;
                let step = (steps.rounds.get(r)? - e) / 3.0;
                (raw > 0.0).then(|| step / raw)
            })
            .collect();
        let spread = match (
            per_round.iter().copied().reduce(f64::min),
            per_round.iter().copied().reduce(f64::max),
        ) {
            (Some(lo), Some(hi)) => format!("{lo:.2} to {hi:.2} ({} slices)", per_round.len()),
            _ => "n/a".to_owned(),
        };
        let bar = match (clean, ratio) {
            (false, _) => "n/a (errors)".to_owned(),
            (true, None) => "n/a (raw writes measured no cost)".to_owned(),
            (true, Some(_)) if tasks != BAR_TASKS => "(bar is at 50 tasks)".to_owned(),
            (true, Some(r)) if r <= BAR => format!("met ({r:.2} ≤ {BAR})"),
            (true, Some(r)) => format!("NOT met ({r:.2} > {BAR})"),
        };
        if let (true, Some(r)) = (clean, ratio) {
            report.cost_ratio(
                format!("steps-{label}-step-vs-raw-write@{tasks}"),
                r,
                &format!(
                    "(dedup call with 3 steps − with an empty body) / 3, over (the same call \
                     with 3 raw owner-less writes − empty body) / 3, mean latencies, {label}, \
                     same store and connections, {tasks} tasks; a cost ratio (lower is \
                     better), bar ≤ {BAR} at {BAR_TASKS} tasks; per-slice ratios {spread}"
                ),
            );
        }
        table.push(vec![
            label.to_owned(),
            tasks.to_string(),
            fmt_ns(empty.mean_ns()),
            fmt_ns(steps.mean_ns()),
            fmt_ns(raws.mean_ns()),
            fmt_ns(resume.mean_ns()),
            fmt_ns(per_step),
            fmt_ns(per_raw),
            ratio.map_or_else(|| "n/a".to_owned(), |r| format!("{r:.2}")),
            spread,
            bar,
        ]);
    }
}

/// A duration in nanoseconds as the report prints durations; a negative one (a
/// difference lost in noise) with its sign.
fn fmt_ns(ns: f64) -> String {
    if !ns.is_finite() {
        return "n/a".to_owned();
    }
    let d = fmt_dur(Duration::from_nanos(ns.abs() as u64));
    if ns < 0.0 { format!("−{d}") } else { d }
}

// ---------------------------------------------------------------------------------------
// The raw writes.

/// Where a body's raw writes go: the same store as the steps, in the journal's shape.
#[derive(Clone)]
enum Raw {
    Memory(Arc<RawMap>),
    Redis(RedisStore),
    Postgres(sqlx::PgPool),
}

/// SqlStore's step write (`WRITE_STEP` in its postgres.rs) without its checks: it
/// appends the entry, stamped with the database's clock, to the `steps` column of the
/// record's own row and sets the journal's expiry, whoever holds the row and whatever
/// its state or lease, and whether or not an older journal expired.
const PG_RAW_WRITE: &str = "\
WITH t AS (SELECT (extract(epoch from now()) * 1000000)::int8 AS now)
UPDATE idem_records r SET
    steps = coalesce(r.steps, ''::bytea) || convert_to(lpad(t.now::text, 16, '0'), 'UTF8') || $2,
    steps_expires_us = t.now + $3
FROM t
WHERE r.id = $1";

impl Raw {
    /// One owner-less write of step `name`'s `value` beside `key`'s record.
    async fn write(&self, key: &Key, name: &str, value: &Receipt) -> Result<(), BenchError> {
        let json = serde_json::to_vec(value).map_err(|e| BenchError::of("serialize", e))?;
        match self {
            Raw::Memory(map) => {
                map.write(key, name, Bytes::from(json));
                Ok(())
            }
            Raw::Redis(store) => {
                // The journal's entry (`d`, 15 digits of milliseconds, the value), in the
                // journal's own hash, which the completion deletes as it does a journal.
                let ms = SystemTime::now()
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis());
                let mut entry = format!("d{ms:015}").into_bytes();
                entry.extend_from_slice(&json);
                let mut hset = redis::cmd("HSET");
                hset.arg(format!("{}:steps", store.record_name(key)))
                    .arg(name)
                    .arg(entry);
                store
                    .command::<redis::Value>(&hset)
                    .await
                    .map(drop)
                    .map_err(|e| BenchError::of("raw HSET", e))
            }
            Raw::Postgres(pool) => {
                // The journal's entry as SqlStore sends it: kind, name length (u16 BE),
                // name, value length (u32 BE), value.
                let mut entry = Vec::with_capacity(7 + name.len() + json.len());
                entry.push(b'd');
                entry.extend_from_slice(&(name.len() as u16).to_be_bytes());
                entry.extend_from_slice(name.as_bytes());
                entry.extend_from_slice(&(json.len() as u32).to_be_bytes());
                entry.extend_from_slice(&json);
                let done = sqlx::query(PG_RAW_WRITE)
                    .bind(&key.digest()[..])
                    .bind(entry)
                    .bind(TTL.as_micros() as i64)
                    .execute(pool)
                    .await
                    .map_err(|e| BenchError::of("raw UPDATE", e))?;
                if done.rows_affected() == 1 {
                    Ok(())
                } else {
                    Err(BenchError(format!(
                        "raw UPDATE found no record row for call {key}"
                    )))
                }
            }
        }
    }

    /// Between slices, unmeasured: the in-process map is emptied, so a long run does not
    /// grow it without bound (MemoryStore's journals are dropped as their calls complete).
    fn tidy(&self) {
        if let Raw::Memory(map) = self {
            map.clear();
        }
    }
}

/// MemoryStore's journal layout, without its owner check: as many shards, chosen from
/// the same digest bytes, each a map from the record's digest to its entries and expiry.
struct RawMap {
    shards: Vec<Mutex<RawShard>>,
}

type RawShard = HashMap<[u8; 16], Box<RawSlot>, BuildHasherDefault<DigestHasher>>;

struct RawSlot {
    entries: Vec<JournalEntry>,
    expires_at: Instant,
}

/// MemoryStore's shard count.
const SHARDS: usize = 1024;

impl RawMap {
    fn new() -> RawMap {
        RawMap {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
        }
    }

    fn write(&self, key: &Key, name: &str, value: Bytes) {
        let d = key.digest();
        let shard = &self.shards[usize::from(u16::from_le_bytes([d[14], d[15]])) % SHARDS];
        let mut shard = shard.lock().unwrap_or_else(|p| p.into_inner());
        let entry = JournalEntry::new(name, Some(value), SystemTime::now());
        let expires_at = Instant::now() + TTL;
        let slot = shard.entry(*d).or_insert_with(|| {
            Box::new(RawSlot {
                entries: Vec::new(),
                expires_at,
            })
        });
        slot.expires_at = expires_at;
        match slot.entries.iter_mut().find(|e| e.name == name) {
            Some(e) => *e = entry,
            None => slot.entries.push(entry),
        }
    }

    fn clear(&self) {
        for s in &self.shards {
            s.lock().unwrap_or_else(|p| p.into_inner()).clear();
        }
    }
}

/// Digests are uniform already: their first 8 bytes are the hash (as MemoryStore's maps).
#[derive(Default)]
struct DigestHasher(u64);

impl std::hash::Hasher for DigestHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for (i, b) in bytes.iter().take(8).enumerate() {
            self.0 |= u64::from(*b) << (8 * i);
        }
    }
}

// ---------------------------------------------------------------------------------------
// The bodies.

/// Runs the first `upto` of [`NAMES`] as steps, each returning `receipt(n + i)`, counts
/// the closures that ran in `ran`, and returns the last value, checked.
async fn steps_body(n: u64, upto: usize, ran: &AtomicU32) -> Result<Receipt, BenchError> {
    let mut last = receipt(n);
    for (i, name) in NAMES.iter().take(upto).enumerate() {
        let want = receipt(n + i as u64);
        let got: Receipt = step(name, |_| async {
            ran.fetch_add(1, Ordering::Relaxed);
            Ok::<_, BenchError>(want.clone())
        })
        .await?;
        if got != want {
            return Err(BenchError(format!("step {name} gave {got:?}")));
        }
        last = got;
    }
    Ok(last)
}

/// The same values as [`steps_body`], written raw.
async fn raw_body(raw: &Raw, key: &Key, n: u64) -> Result<Receipt, BenchError> {
    let mut last = receipt(n);
    for (i, name) in NAMES.iter().enumerate() {
        last = receipt(n + i as u64);
        raw.write(key, name, &last).await?;
    }
    Ok(last)
}

/// The value every case's call returns for key `n`.
fn check(got: &Receipt, n: u64) -> Result<(), BenchError> {
    if *got == receipt(n + 2) {
        Ok(())
    } else {
        Err(BenchError(format!("call {n} returned {got:?}")))
    }
}

/// One case's operation on a fresh key `n`: when its timed call began and how long it
/// took. Every case computes the record's key (the raw body needs it), so no case pays
/// for it alone.
fn op(kind: Kind, idem: Idem, raw: Raw) -> Spawn {
    match kind {
        Kind::Empty => spawner(move |n| {
            let idem = idem.clone();
            async move {
                let t0 = Instant::now();
                std::hint::black_box(idem.key(&EMPTY, format_args!("{n}")));
                let got = idem
                    .dedup(
                        &EMPTY,
                        n,
                        async move { Ok::<_, BenchError>(receipt(n + 2)) },
                    )
                    .await?;
                let d = t0.elapsed();
                check(&got, n)?;
                Ok((t0, d))
            }
        }),
        Kind::Steps => spawner(move |n| {
            let idem = idem.clone();
            async move {
                let ran = AtomicU32::new(0);
                let t0 = Instant::now();
                std::hint::black_box(idem.key(&STEPS, format_args!("{n}")));
                let got = idem.dedup(&STEPS, n, steps_body(n, 3, &ran)).await?;
                let d = t0.elapsed();
                check(&got, n)?;
                expect_ran(&ran, 3, "a new key")?;
                Ok((t0, d))
            }
        }),
        Kind::Raw => spawner(move |n| {
            let (idem, raw) = (idem.clone(), raw.clone());
            async move {
                let t0 = Instant::now();
                let key = idem.key(&RAW, format_args!("{n}"));
                let got = idem.dedup(&RAW, n, raw_body(&raw, &key, n)).await?;
                let d = t0.elapsed();
                check(&got, n)?;
                Ok((t0, d))
            }
        }),
        Kind::Resume => spawner(move |n| {
            let idem = idem.clone();
            async move {
                // Unmeasured: a first attempt journals two steps, then fails, which
                // releases the key and keeps its journal.
                let ran = AtomicU32::new(0);
                let first = idem
                    .dedup(&RESUME, n, async {
                        steps_body(n, 2, &ran).await?;
                        Err::<Receipt, _>(BenchError(FAIL.to_owned()))
                    })
                    .await;
                match first {
                    Err(BenchError(e)) if e == FAIL => {}
                    Err(e) => return Err(e),
                    Ok(v) => return Err(BenchError(format!("first attempt gave {v:?}"))),
                }
                expect_ran(&ran, 2, "the first attempt")?;
                let ran = AtomicU32::new(0);
                let t0 = Instant::now();
                std::hint::black_box(idem.key(&RESUME, format_args!("{n}")));
                let got = idem.dedup(&RESUME, n, steps_body(n, 3, &ran)).await?;
                let d = t0.elapsed();
                check(&got, n)?;
                expect_ran(&ran, 1, "the resumed attempt")?;
                Ok((t0, d))
            }
        }),
    }
}

fn expect_ran(ran: &AtomicU32, want: u32, what: &str) -> Result<(), BenchError> {
    match ran.load(Ordering::Relaxed) {
        n if n == want => Ok(()),
        n => Err(BenchError(format!(
            "{what} ran {n} step closures, expected {want}"
        ))),
    }
}

// ---------------------------------------------------------------------------------------
// The measuring loop.

/// The unmeasured start and the measured time of one slice.
#[derive(Debug, Clone, Copy)]
struct Plan {
    warmup: Duration,
    slice: Duration,
}

/// One slice's window: calls whose timed part begins in `start..end` are measured; no
/// call starts at or after `end`.
///
/// The tasks watch the clock themselves rather than a flag set by a timer: a MemoryStore
/// call never yields, so tasks looping on it could keep every worker thread busy and a
/// timer meant to stop them might never fire.
#[derive(Debug, Clone, Copy)]
struct Window {
    start: Instant,
    end: Instant,
}

/// What a task (then a case) gathered: measured calls, their latencies, errors, and
/// when its last measured call ended.
#[derive(Default)]
struct Tally {
    hist: Histogram,
    sum_ns: u128,
    ops: u64,
    errors: u64,
    first_error: Option<String>,
    last_end: Option<Instant>,
}

impl Tally {
    fn merge(&mut self, o: Tally) {
        self.hist.merge(&o.hist);
        self.sum_ns += o.sum_ns;
        self.ops += o.ops;
        self.errors += o.errors;
        if self.first_error.is_none() {
            self.first_error = o.first_error;
        }
        self.last_end = self.last_end.max(o.last_end);
    }
}

/// One operation as the spawner of a slice's tasks. The loop around it is generic, so
/// each case's future is awaited in place rather than boxed per call.
type Spawn = Arc<dyn Fn(Window) -> tokio::task::JoinHandle<Tally> + Send + Sync>;

fn spawner<F, Fut>(f: F) -> Spawn
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(Instant, Duration), BenchError>> + Send + 'static,
{
    let f = Arc::new(f);
    Arc::new(move |w: Window| {
        let f = f.clone();
        tokio::spawn(async move {
            let mut t = Tally::default();
            loop {
                let t0 = Instant::now();
                if t0 >= w.end {
                    break;
                }
                match f(load::fresh_id()).await {
                    // Measured if its timed part began in the window (the resume
                    // case's first attempt, before it, is not timed).
                    Ok((began, d)) if began >= w.start && began < w.end => {
                        t.hist.record(d);
                        t.sum_ns += d.as_nanos();
                        t.ops += 1;
                        t.last_end = Some(Instant::now());
                    }
                    Ok(_) => {}
                    Err(e) => {
                        // A case that fails is not a measurement: its task stops here.
                        t.errors += 1;
                        t.first_error = Some(e.to_string());
                        break;
                    }
                }
                // Outside the timed call: a MemoryStore call never waits, so without a
                // yield each worker thread would run one task to the end of the window
                // and "50 tasks" would be as many as there are threads.
                tokio::task::yield_now().await;
            }
            t
        })
    })
}

/// One case after its slices.
struct Measured {
    kind: Kind,
    tally: Tally,
    elapsed: Duration,
    /// Each slice's mean latency (ns).
    rounds: Vec<f64>,
}

impl Measured {
    fn mean_ns(&self) -> f64 {
        if self.tally.ops == 0 {
            f64::NAN
        } else {
            self.tally.sum_ns as f64 / self.tally.ops as f64
        }
    }

    /// The row of the run's main table. The resume case's ops/s counts measured attempts
    /// only, while its slices also ran the unmeasured first attempts.
    fn summary(&self, tasks: usize) -> Summary {
        let secs = self.elapsed.as_secs_f64();
        Summary {
            tasks,
            ops_per_sec: if secs > 0.0 {
                self.tally.ops as f64 / secs
            } else {
                0.0
            },
            p50: self.tally.hist.quantile(0.50),
            p99: self.tally.hist.quantile(0.99),
            errors: self.tally.errors,
        }
    }
}

/// Runs `cases` in turns, [`ROUNDS`] slices each, from `tasks` tasks.
async fn measure(cases: &[(Kind, Spawn); 4], tasks: usize, plan: Plan, raw: &Raw) -> [Measured; 4] {
    let mut out = cases.each_ref().map(|(kind, _)| Measured {
        kind: *kind,
        tally: Tally::default(),
        elapsed: Duration::ZERO,
        rounds: Vec::new(),
    });
    for _ in 0..ROUNDS {
        for ((_, spawn), m) in cases.iter().zip(&mut out) {
            let (tally, elapsed) = one_slice(spawn, tasks, plan).await;
            raw.tidy();
            if tally.ops > 0 {
                m.rounds.push(tally.sum_ns as f64 / tally.ops as f64);
            }
            m.tally.merge(tally);
            m.elapsed += elapsed;
        }
    }
    out
}

async fn one_slice(spawn: &Spawn, tasks: usize, plan: Plan) -> (Tally, Duration) {
    let start = Instant::now() + plan.warmup;
    let w = Window {
        start,
        end: start + plan.slice,
    };
    let handles: Vec<_> = (0..tasks).map(|_| spawn(w)).collect();
    let mut all = Tally::default();
    for h in handles {
        match h.await {
            Ok(t) => all.merge(t),
            Err(e) => {
                all.errors += 1;
                all.first_error
                    .get_or_insert_with(|| format!("task panicked: {e}"));
            }
        }
    }
    let elapsed = all
        .last_end
        .map_or(Duration::ZERO, |e| e.saturating_duration_since(start));
    (all, elapsed)
}
