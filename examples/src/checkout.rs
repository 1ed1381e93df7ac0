//! A checkout with three effects per order (charge, reserve, mail) as durable steps:
//! killed at any moment and run again, it finishes every order without charging or
//! mailing anyone twice.
//!
//! ```text
//! cargo run -p idem-examples --bin checkout -- --store URL --ledger postgres://... \
//!     --orders N --run ID [--transactional] [--lease-ms MS] [--recover-only]
//! ```
//!
//! Orders `0..N` go through 8 workers. Each order is one idempotent call (key: the
//! order id, in the namespace `checkout-ID`) whose body runs three steps, each an
//! effect in the ledger's PostgreSQL, so they can be counted from outside:
//!
//! - `charge`: a fake payment gateway that deduplicates by the idempotency key it is
//!   given, as Stripe does. The step passes its [`StepCtx::key`]. The gateway is the
//!   table `checkout_gateway(run_id, downstream_key UNIQUE, order_id, calls)`; `calls`
//!   counts every request it received, so `calls > 1` shows a request that the
//!   downstream key turned into a replay (the process died after the gateway charged,
//!   before the step was journaled).
//! - `reserve`: one row in `checkout_reservations(run_id, order_id)`, which has no
//!   unique constraint. As a plain step, a death between the insert and the journal
//!   write leaves a second row when the step runs again. With `--transactional` the
//!   insert and the step's journal entry commit in one transaction on the store's
//!   PostgreSQL, so `--store` must be the ledger's database.
//! - `mail`: one row in `checkout_mails(run_id, order_id)`, no unique constraint either.
//!   A [`Verified`] step: its intent is journaled before it sends, and an attempt that
//!   finds the intent without a result looks the row up before sending again.
//!
//! `--store` is where idem keeps its records and journals: `memory`, `redis://...`,
//! `postgres://...`. On a shared store the same command run again, or run again after
//! a SIGKILL, resumes: finished orders replay, an order held by the dead run is waited
//! for (its claim ends with its lease, `--lease-ms`, default 2000) and resumed from its
//! journal, running only the steps it had not finished.
//!
//! Each order is *recoverable* ([`Idem::dedup_recoverable`]): its id is recorded with
//! its claim, and every run also runs a recoverer, which finishes the orders a killed
//! run left half done (their claim's lease ran out) even if nobody submits them again.
//! Two runs side by side finish each other's abandoned orders. `--recover-only` submits
//! nothing and only recovers: it exits 0 once no order of this `--run` has been
//! recoverable for twice the lease, every abandoned one completed (1 if one was parked,
//! or after five minutes).
//!
//! Prints one `summary` line of `name=value` pairs (orders done, calls that ran or
//! replayed, each step's ran/replayed counts, orders recovered) and exits 0 once every
//! order completed; 1 if some order could not be completed; 2 for a bad command line or
//! an unreachable store or ledger.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idem_runtime::store::sql::sqlx::{self, PgPool, Postgres, Transaction};
use idem_runtime::{Idem, Options, StepCtx, Verified, step, step_tx};
use serde::{Deserialize, Serialize};

const USAGE: &str = "usage: checkout --store URL --ledger postgres://... --orders N --run ID \
[--transactional] [--lease-ms MS] [--recover-only]
  --store URL        where idem keeps records and step journals: memory, redis://..., postgres://...
  --ledger URL       the PostgreSQL database of the gateway, reservations and mails
  --orders N         orders 0..N
  --run ID           names this run: its rows in the ledger, its records in the store
  --transactional    reserve stock in one transaction with the step's journal entry
                     (--store must be the ledger's PostgreSQL)
  --lease-ms MS      the claims' lease, how soon a killed run's orders resume (default 2000)
  --recover-only     submit no orders: finish this run's abandoned ones, then exit
                     (--orders may then be left out)";

const RESERVE: &str = "INSERT INTO checkout_reservations (run_id, order_id) VALUES ($1, $2)";

/// Concurrent workers taking orders.
const WORKERS: usize = 8;
/// How many times one order is tried before the run gives up on it. Each try waits up
/// to several leases for a twin, so this is far past a killed run's leftovers.
const ATTEMPTS: u32 = 20;

struct Args {
    store: String,
    ledger: String,
    orders: u64,
    run: String,
    transactional: bool,
    lease: Duration,
    recover_only: bool,
}

fn parse(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
    let (mut store, mut ledger, mut orders, mut run) = (None, None, None, None);
    let (mut transactional, mut recover_only) = (false, false);
    let mut lease_ms = 2000u64;
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--store" => store = Some(value()?),
            "--ledger" => ledger = Some(value()?),
            "--orders" => {
                let v = value()?;
                orders = Some(
                    v.parse::<u64>()
                        .map_err(|_| format!("--orders takes a whole number, not {v:?}"))?,
                );
            }
            "--run" => run = Some(value()?),
            "--transactional" => transactional = true,
            "--recover-only" => recover_only = true,
            "--lease-ms" => {
                let v = value()?;
                lease_ms = v
                    .parse()
                    .map_err(|_| format!("--lease-ms takes a whole number, not {v:?}"))?;
            }
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    let need = |v: Option<String>, name: &str| v.ok_or_else(|| format!("{name} is required"));
    let args = Args {
        store: need(store, "--store")?,
        ledger: need(ledger, "--ledger")?,
        orders: match (orders, recover_only) {
            (Some(n), _) => n,
            (None, true) => 0,
            (None, false) => return Err("--orders is required".into()),
        },
        run: need(run, "--run")?,
        transactional,
        lease: Duration::from_millis(lease_ms),
        recover_only,
    };
    if args.run.is_empty() || args.run.len() > 100 {
        return Err("--run takes a name of 1 to 100 characters".into());
    }
    if args.lease < idem_runtime::options::MIN_LEASE {
        return Err(format!(
            "--lease-ms must be at least {} (idem_runtime::options::MIN_LEASE)",
            idem_runtime::options::MIN_LEASE.as_millis()
        ));
    }
    if !is_postgres(&args.ledger) {
        return Err("--ledger must be a postgres:// URL".into());
    }
    if args.transactional && !is_postgres(&args.store) {
        return Err(
            "--transactional commits the reservation and the step's journal entry in \
             one transaction of the store's database, so --store must be the ledger's \
             PostgreSQL (postgres://...)"
                .into(),
        );
    }
    Ok(args)
}

fn is_postgres(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

/// What a checkout returns, and what a completed order replays.
#[derive(Debug, Serialize, Deserialize)]
struct Receipt {
    charge: String,
    reserved: u64,
    mailed: u64,
}

#[derive(Debug, thiserror::Error)]
enum CheckoutError {
    #[error(transparent)]
    Idem(#[from] idem_runtime::Error),
    #[error("ledger: {0}")]
    Ledger(#[from] sqlx::Error),
}

impl CheckoutError {
    /// Contention (a killed run's claim not yet expired) and store or ledger trouble
    /// pass; anything else is a verdict.
    fn is_retryable(&self) -> bool {
        match self {
            CheckoutError::Idem(e) => e.is_retryable(),
            CheckoutError::Ledger(_) => true,
        }
    }
}

/// Counts for the summary line.
#[derive(Default)]
struct Tally {
    done: AtomicU64,
    failed: AtomicU64,
    /// Calls whose body ran here, and those answered from a completed record.
    bodies: AtomicU64,
    replayed_orders: AtomicU64,
    /// Bodies that found at least one step already journaled.
    resumed: AtomicU64,
    retries: AtomicU64,
    charge: StepTally,
    reserve: StepTally,
    mail: StepTally,
}

#[derive(Default)]
struct StepTally {
    ran: AtomicU64,
    replayed: AtomicU64,
    /// Verified steps: `verify` asked, and how often it found the effect.
    asked: AtomicU64,
    verified: AtomicU64,
}

impl StepTally {
    /// Counts one step that returned: it ran, `verify` found its effect, or it replayed
    /// from the journal (returned: true).
    fn count(&self, ran: bool, verified: bool) -> bool {
        let counter = match (ran, verified) {
            (true, _) => &self.ran,
            (false, true) => &self.verified,
            (false, false) => &self.replayed,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        !ran && !verified
    }
}

struct Checkout {
    idem: Idem,
    /// Static: a recoverer keeps the options of the functions it knows.
    opts: &'static Options,
    ledger: PgPool,
    run: String,
    transactional: bool,
    tally: Tally,
}

impl Checkout {
    /// One order, tried until it completes (bounded).
    async fn order(&self, order: u64) {
        for attempt in 1..=ATTEMPTS {
            match self.checkout(order).await {
                Ok(_) => {
                    self.tally.done.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                Err(e) if e.is_retryable() && attempt < ATTEMPTS => {
                    self.tally.retries.fetch_add(1, Ordering::Relaxed);
                    // Rare: the wait outlasts a killed run's lease, so this is store or
                    // ledger trouble, or a claim lost under load.
                    tracing::warn!(order, attempt, error = %e, "trying the order again");
                    tokio::time::sleep(Duration::from_millis(50 * u64::from(attempt))).await;
                }
                Err(e) => {
                    self.tally.failed.fetch_add(1, Ordering::Relaxed);
                    eprintln!("checkout: order {order} failed after {attempt} attempts: {e}");
                    return;
                }
            }
        }
    }

    /// The idempotent call: three durable steps, the whole receipt replayed once done.
    async fn checkout(&self, order: u64) -> Result<Receipt, CheckoutError> {
        let body_ran = AtomicBool::new(false);
        let out = self.call(order, &body_ran).await;
        if out.is_ok() {
            let counter = if body_ran.load(Ordering::Relaxed) {
                &self.tally.bodies
            } else {
                &self.tally.replayed_orders
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
        out
    }

    /// The same call made by the recoverer for an abandoned order: counted apart, as
    /// `recovered` (by the recoverer), so the workers' counts still add up to the orders.
    async fn recover(&self, order: u64) -> Result<Receipt, CheckoutError> {
        self.call(order, &AtomicBool::new(false)).await
    }

    /// The order's recoverable call: its id is recorded with the claim.
    async fn call(&self, order: u64, body_ran: &AtomicBool) -> Result<Receipt, CheckoutError> {
        self.idem
            .dedup_recoverable(self.opts, order, &order, async {
                body_ran.store(true, Ordering::Relaxed);
                let mut replayed = false;
                let charge = self.charge_step(order, &mut replayed).await?;
                let reserved = self.reserve_step(order, &mut replayed).await?;
                let mailed = self.mail_step(order, &mut replayed).await?;
                if replayed {
                    self.tally.resumed.fetch_add(1, Ordering::Relaxed);
                }
                Ok::<_, CheckoutError>(Receipt {
                    charge,
                    reserved,
                    mailed,
                })
            })
            .await
    }

    async fn charge_step(&self, order: u64, replayed: &mut bool) -> Result<String, CheckoutError> {
        let ran = AtomicBool::new(false);
        let flag = &ran;
        let charge = step("charge", |s: StepCtx| async move {
            flag.store(true, Ordering::Relaxed);
            gateway_charge(&self.ledger, &self.run, order, s.key()).await
        })
        .await?;
        *replayed |= self.tally.charge.count(ran.into_inner(), false);
        Ok(charge)
    }

    async fn reserve_step(&self, order: u64, replayed: &mut bool) -> Result<u64, CheckoutError> {
        let ran = Arc::new(AtomicBool::new(false));
        let reserved = if self.transactional {
            // The insert and the step's journal entry commit in one transaction of the
            // store's database: a kill leaves both or neither, so the row is never
            // doubled. The closure owns what it uses, as the transaction's future must.
            let (run, flag) = (self.run.clone(), ran.clone());
            step_tx(
                "reserve",
                move |_, tx: &mut Transaction<'static, Postgres>| {
                    Box::pin(async move {
                        flag.store(true, Ordering::Relaxed);
                        sqlx::query(RESERVE)
                            .bind(run)
                            .bind(order as i64)
                            .execute(&mut **tx)
                            .await?;
                        Ok::<_, CheckoutError>(order)
                    })
                },
            )
            .await?
        } else {
            step("reserve", |_| async {
                ran.store(true, Ordering::Relaxed);
                sqlx::query(RESERVE)
                    .bind(&self.run)
                    .bind(order as i64)
                    .execute(&self.ledger)
                    .await?;
                Ok::<_, CheckoutError>(order)
            })
            .await?
        };
        *replayed |= self.tally.reserve.count(ran.load(Ordering::Relaxed), false);
        Ok(reserved)
    }

    async fn mail_step(&self, order: u64, replayed: &mut bool) -> Result<u64, CheckoutError> {
        let (ran, verified) = (AtomicBool::new(false), AtomicBool::new(false));
        let mailed = Verified::new("mail")
            .verify(|_| async {
                self.tally.mail.asked.fetch_add(1, Ordering::Relaxed);
                let found = self.mail_sent(order).await?;
                verified.store(found, Ordering::Relaxed);
                Ok::<_, CheckoutError>(found.then_some(order))
            })
            .run(|_| async {
                ran.store(true, Ordering::Relaxed);
                sqlx::query("INSERT INTO checkout_mails (run_id, order_id) VALUES ($1, $2)")
                    .bind(&self.run)
                    .bind(order as i64)
                    .execute(&self.ledger)
                    .await?;
                Ok::<_, CheckoutError>(order)
            })
            .await?;
        *replayed |= self
            .tally
            .mail
            .count(ran.into_inner(), verified.into_inner());
        Ok(mailed)
    }

    async fn mail_sent(&self, order: u64) -> Result<bool, sqlx::Error> {
        let row: Option<(i32,)> = sqlx::query_as(
            "SELECT 1 FROM checkout_mails WHERE run_id = $1 AND order_id = $2 LIMIT 1",
        )
        .bind(&self.run)
        .bind(order as i64)
        .fetch_optional(&self.ledger)
        .await?;
        Ok(row.is_some())
    }
}

/// The fake gateway: one row per idempotency key; a request with a key it has seen
/// counts the call and answers with the first charge, as a real gateway replays it.
async fn gateway_charge(
    ledger: &PgPool,
    run: &str,
    order: u64,
    key: &str,
) -> Result<String, CheckoutError> {
    // A gateway takes a moment to answer: the window in which a process may die
    // after the charge happened and before the step was journaled.
    tokio::time::sleep(Duration::from_millis(1 + order % 4)).await;
    let (charge,): (String,) = sqlx::query_as(
        "INSERT INTO checkout_gateway (run_id, downstream_key, order_id, calls) \
         VALUES ($1, $2, $3, 1) \
         ON CONFLICT (downstream_key) DO UPDATE SET calls = checkout_gateway.calls + 1 \
         RETURNING 'ch_' || checkout_gateway.order_id || '_' || right(checkout_gateway.downstream_key, 12)",
    )
    .bind(run)
    .bind(key)
    .bind(order as i64)
    .fetch_one(ledger)
    .await?;
    Ok(charge)
}

/// The ledger's pool, with the three tables created if absent. Several runs may start
/// at once, and concurrent `CREATE TABLE IF NOT EXISTS` can still collide on
/// PostgreSQL's catalog: an advisory lock makes them take turns.
async fn ledger(url: &str) -> Result<PgPool, sqlx::Error> {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(WORKERS as u32)
        .connect(url)
        .await?;
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('idem checkout tables'))")
        .execute(&mut *tx)
        .await?;
    for ddl in [
        "CREATE TABLE IF NOT EXISTS checkout_gateway (run_id TEXT NOT NULL, \
         downstream_key TEXT NOT NULL UNIQUE, order_id BIGINT NOT NULL, calls BIGINT NOT NULL)",
        "CREATE TABLE IF NOT EXISTS checkout_reservations (run_id TEXT NOT NULL, \
         order_id BIGINT NOT NULL)",
        "CREATE TABLE IF NOT EXISTS checkout_mails (run_id TEXT NOT NULL, order_id BIGINT NOT NULL)",
        // Lookups and counts by run; neither index is unique.
        "CREATE INDEX IF NOT EXISTS checkout_reservations_run \
         ON checkout_reservations (run_id, order_id)",
        "CREATE INDEX IF NOT EXISTS checkout_mails_run ON checkout_mails (run_id, order_id)",
    ] {
        sqlx::query(ddl).execute(&mut *tx).await?;
    }
    tx.commit().await?;
    Ok(pool)
}

/// The store `--store` names. With `--transactional` the reservation is written through
/// the store's pool, so a store on another database than the ledger the rows are
/// counted in is refused, before idem creates its tables there.
async fn store(args: &Args, ledger: &PgPool) -> Result<Arc<dyn idem_runtime::Store>, String> {
    if args.transactional {
        same_database(&args.store, ledger).await?;
    }
    idem_runtime::store::connect(&args.store)
        .await
        .map_err(|e| format!("store {}: {e}", args.store))
}

async fn same_database(store: &str, ledger: &PgPool) -> Result<(), String> {
    use sqlx::Connection as _;
    let identity = "SELECT current_database()::text, pg_postmaster_start_time()::text";
    let mut conn = sqlx::PgConnection::connect(store)
        .await
        .map_err(|e| format!("store {store}: {e}"))?;
    let ours: (String, String) = sqlx::query_as(identity)
        .fetch_one(&mut conn)
        .await
        .map_err(|e| format!("store {store}: {e}"))?;
    let _ = conn.close().await;
    let theirs: (String, String) = sqlx::query_as(identity)
        .fetch_one(ledger)
        .await
        .map_err(|e| format!("ledger: {e}"))?;
    if ours == theirs {
        return Ok(());
    }
    Err(format!(
        "--transactional commits the reservation with the step's journal entry in the \
         store's database, so --store and --ledger must name the same PostgreSQL database; \
         they name {:?} and {:?}{}",
        ours.0,
        theirs.0,
        if ours.0 == theirs.0 {
            " on two servers"
        } else {
            ""
        }
    ))
}

/// The run's recoverer: it finishes the orders of this `--run` that a killed process
/// left half done, as the same call a worker makes.
fn recoverer(
    app: &Arc<Checkout>,
    lease: Duration,
) -> Result<idem_runtime::recover::RecovererHandle, idem_runtime::Error> {
    let to_run = app.clone();
    app.idem
        .recoverer()
        .interval(lease / 4)
        .concurrency(WORKERS)
        .register(app.opts, move |order: u64, _| {
            let app = to_run.clone();
            async move { app.recover(order).await }
        })
        .spawn()
}

/// Waits until no order of the run has been recoverable (abandoned, or held by a run
/// that may yet die) for twice the lease. `false`: one was parked, or five minutes
/// passed.
async fn recover_only(app: &Checkout, lease: Duration) -> bool {
    let Some(index) = app.idem.store().recovery() else {
        return false;
    };
    let ns = app.idem.namespace();
    let (deadline, mut quiet_since) = (Instant::now() + Duration::from_secs(300), Instant::now());
    while Instant::now() < deadline {
        match index.list(Some(ns), 1000).await {
            Ok(calls) if calls.iter().any(|c| c.parked.is_some()) => {
                eprintln!("checkout: parked orders: {calls:?}");
                return false;
            }
            Ok(calls) if calls.is_empty() => {
                if quiet_since.elapsed() >= lease * 2 {
                    return true;
                }
            }
            Ok(_) => quiet_since = Instant::now(),
            Err(e) => tracing::warn!(error = %e, "listing recoverable orders failed"),
        }
        tokio::time::sleep(lease / 8).await;
    }
    false
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,sqlx=error".into()),
        )
        .init();
    let args = match parse(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("checkout: {e}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let ledger = match ledger(&args.ledger).await {
        Ok(p) => p,
        Err(e) => {
            eprintln!("checkout: ledger {}: {e}", args.ledger);
            return ExitCode::from(2);
        }
    };
    let store = match store(&args, &ledger).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("checkout: {e}");
            return ExitCode::from(2);
        }
    };
    // The namespace is the run's: the same command run again finds the same records.
    let idem = Idem::builder()
        .shared_store(store)
        .namespace(format!("checkout-{}", args.run))
        .build();
    // Made once per process, so leaked: a recoverer keeps `&'static` options.
    let opts: &'static Options = Box::leak(Box::new(
        Options::dedup("checkout::order")
            .lease(args.lease)
            // Past a killed run's lease, so a worker waits its claim out and resumes it.
            .wait(args.lease * 3 + Duration::from_secs(2)),
    ));
    let app = Arc::new(Checkout {
        idem,
        opts,
        ledger,
        run: args.run.clone(),
        transactional: args.transactional,
        tally: Tally::default(),
    });
    println!(
        "checkout: run {} started, {} orders on {} with {WORKERS} workers",
        args.run,
        args.orders,
        app.idem.store().name()
    );
    let started = Instant::now();
    let recoverer = match recoverer(&app, args.lease) {
        Ok(r) => Some(r),
        Err(e) if !args.recover_only => {
            eprintln!("checkout: running without a recoverer: {e}");
            None
        }
        Err(e) => {
            eprintln!("checkout: no recoverer on {}: {e}", app.idem.store().name());
            return ExitCode::from(2);
        }
    };
    if args.recover_only {
        let quiet = recover_only(&app, args.lease).await;
        let totals = match recoverer {
            Some(r) => r.shutdown().await,
            None => idem_runtime::recover::Sweep::default(),
        };
        println!(
            "summary run={} orders=0 recovered={} recover_failed={} parked={} secs={:.2}",
            args.run,
            totals.recovered,
            totals.failed,
            totals.parked,
            started.elapsed().as_secs_f64()
        );
        return if quiet {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }
    let next = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| {
            let (app, next, orders) = (app.clone(), next.clone(), args.orders);
            tokio::spawn(async move {
                loop {
                    let order = next.fetch_add(1, Ordering::Relaxed);
                    if order >= orders {
                        break;
                    }
                    app.order(order).await;
                }
            })
        })
        .collect();
    for w in workers {
        if let Err(e) = w.await {
            eprintln!("checkout: a worker panicked: {e}");
            app.tally.failed.fetch_add(1, Ordering::Relaxed);
        }
    }
    let recovered = match recoverer {
        Some(r) => r.shutdown().await.recovered,
        None => 0,
    };
    let t = &app.tally;
    let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
    println!(
        "summary run={} orders={} done={} failed={} bodies_ran={} orders_replayed={} \
         resumed={} retries={} charge_ran={} charge_replayed={} reserve_ran={} \
         reserve_replayed={} mail_ran={} mail_replayed={} mail_verify_asked={} \
         mail_verified={} recovered={recovered} secs={:.2}",
        args.run,
        args.orders,
        n(&t.done),
        n(&t.failed),
        n(&t.bodies),
        n(&t.replayed_orders),
        n(&t.resumed),
        n(&t.retries),
        n(&t.charge.ran),
        n(&t.charge.replayed),
        n(&t.reserve.ran),
        n(&t.reserve.replayed),
        n(&t.mail.ran),
        n(&t.mail.replayed),
        n(&t.mail.asked),
        n(&t.mail.verified),
        started.elapsed().as_secs_f64()
    );
    if n(&t.done) == args.orders {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
