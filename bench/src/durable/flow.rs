//! What every library's 3-step workflow offers the measuring loop, and the workload they
//! share: three steps, each one insert into the bench's own effects table.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures_util::future::BoxFuture;
use idem_runtime::store::sql::sqlx::{self, postgres::PgPoolOptions};
use tokio::sync::oneshot;

use crate::work::{BenchError, Receipt, receipt};

/// One library's workflow, driven by workflow number `n` (its id is derived from `n`, so a
/// second call with the same `n` is a duplicate).
pub(crate) trait Flow: Send + Sync + 'static {
    /// Runs workflow `n`: a new one, or a duplicate of a finished one (then its recorded
    /// result is returned and no step runs).
    fn run(&self, n: u64) -> BoxFuture<'static, Result<Receipt, BenchError>>;

    /// Runs workflow `n` and kills its execution right after step 2's checkpoint: returns
    /// once the execution is stopped for good, with steps 1 and 2 recorded.
    fn run_killed(&self, n: u64) -> BoxFuture<'static, Result<(), BenchError>>;

    /// Resumes killed workflow `n` the way the library documents, to its result.
    fn resume(&self, n: u64) -> BoxFuture<'static, Result<Receipt, BenchError>>;
}

/// An error a library can store with a workflow (DBOS keeps the body's error type, so it
/// must serialize): the bench's error as text.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct PeerError(pub(crate) String);

impl std::fmt::Display for PeerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PeerError {}

impl From<BenchError> for PeerError {
    fn from(e: BenchError) -> Self {
        PeerError(e.0)
    }
}

/// The value workflow `n` returns: its last step's.
pub(crate) fn expected(n: u64) -> Receipt {
    receipt(n + 2)
}

/// Step `i`'s value in workflow `n`.
pub(crate) fn step_value(n: u64, i: usize) -> Receipt {
    receipt(n + i as u64)
}

pub(crate) fn check(got: &Receipt, n: u64) -> Result<(), BenchError> {
    if *got == expected(n) {
        Ok(())
    } else {
        Err(BenchError(format!("workflow {n} returned {got:?}")))
    }
}

/// The table every step inserts into, `idem_bench_durable_effects`: one row per step
/// execution, so a step that ran twice shows as two rows (checked at the end of the
/// family).
const CREATE: &str = "CREATE TABLE IF NOT EXISTS idem_bench_durable_effects (
    lib text NOT NULL,
    wf text NOT NULL,
    step int NOT NULL,
    at timestamptz NOT NULL DEFAULT now()
)";

/// The effect of step `step` of workflow `wf` of library `lib`, as SQL and its binds.
pub(crate) const INSERT: &str =
    "INSERT INTO idem_bench_durable_effects (lib, wf, step) VALUES ($1, $2, $3)";

/// The bench's own connections for the steps' effects: not a library's pool, so no
/// library's pool limit or settings apply to them. As wide as idem's (an insert holds a
/// connection for one round trip, so 16 serve 50 workflows; the server's 100 connections
/// are shared with every library's pool and other clients), and without sqlx's ping
/// before each use, so an effect is one round trip for every library.
#[derive(Clone)]
pub(crate) struct Effects {
    pub(crate) pool: sqlx::PgPool,
}

impl Effects {
    pub(crate) async fn connect(url: &str) -> Result<Effects, BenchError> {
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .test_before_acquire(false)
            .connect(url)
            .await
            .map_err(|e| BenchError::of("effects pool", e))?;
        sqlx::query(CREATE)
            .execute(&pool)
            .await
            .map_err(|e| BenchError::of("effects table", e))?;
        Ok(Effects { pool })
    }

    /// Step `step`'s effect: one insert, one round trip.
    pub(crate) async fn insert(&self, lib: &str, wf: &str, step: usize) -> Result<(), BenchError> {
        sqlx::query(INSERT)
            .bind(lib)
            .bind(wf)
            .bind(step as i32)
            .execute(&self.pool)
            .await
            .map(drop)
            .map_err(|e| BenchError::of("effect insert", e))
    }

    /// Rows of `lib` whose (workflow, step) appears more than once: a step that ran twice.
    pub(crate) async fn doubled(&self, lib: &str) -> Result<i64, BenchError> {
        sqlx::query_scalar(
            "SELECT count(*) FROM (SELECT 1 FROM idem_bench_durable_effects WHERE lib = $1 \
             GROUP BY wf, step HAVING count(*) > 1) d",
        )
        .bind(lib)
        .fetch_one(&self.pool)
        .await
        .map_err(|e| BenchError::of("effects check", e))
    }

    pub(crate) async fn forget(&self, lib: &str) {
        let _ = sqlx::query("DELETE FROM idem_bench_durable_effects WHERE lib = $1")
            .bind(lib)
            .execute(&self.pool)
            .await;
    }
}

/// Workflows to kill after step 2: the body of workflow `n` looks itself up here after its
/// second step, tells the driver, and never returns (a process that died there).
#[derive(Default)]
pub(crate) struct Kills(Mutex<HashMap<u64, oneshot::Sender<()>>>);

impl Kills {
    /// Arms the kill of workflow `n`; the receiver fires when its body reaches the point.
    pub(crate) fn arm(&self, n: u64) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(n, tx);
        rx
    }

    /// Whether workflow `n` is to die here (and if so, the driver is told).
    pub(crate) fn due(&self, n: u64) -> bool {
        let tx = self.0.lock().unwrap_or_else(|p| p.into_inner()).remove(&n);
        match tx {
            Some(tx) => {
                let _ = tx.send(());
                true
            }
            None => false,
        }
    }

    /// Called after step 2: workflow `n`, if armed, waits here forever; its driver drops or
    /// abandons it.
    pub(crate) async fn point(&self, n: u64) {
        if self.due(n) {
            std::future::pending::<()>().await;
        }
    }
}

/// Shared by a library's flows: its label in the effects table, the effects pool, kills.
#[derive(Clone)]
pub(crate) struct Shared {
    pub(crate) lib: Arc<str>,
    pub(crate) effects: Effects,
    pub(crate) kills: Arc<Kills>,
    /// Distinguishes this run's workflow ids from any earlier run's on the same database.
    pub(crate) tag: Arc<str>,
}

impl Shared {
    pub(crate) fn new(lib: &str, effects: &Effects, tag: &str) -> Shared {
        Shared {
            lib: Arc::from(format!("{lib}-{tag}")),
            effects: effects.clone(),
            kills: Arc::default(),
            tag: Arc::from(tag),
        }
    }

    /// Workflow `n`'s id.
    pub(crate) fn wf(&self, n: u64) -> String {
        format!("{}-{n}", self.tag)
    }
}
