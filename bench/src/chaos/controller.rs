//! The controller: starts the store (when it is ours), the ledger and the workers; kills
//! and replaces workers at random; restarts, fails over or cuts the store; at the end
//! lets the leases pass, calls every key once more, checks the ledger and prints the
//! summary.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use super::check::check;
use super::ledger::Ledger;
use super::rng::Rng;
use super::servers::{Node, Sentinels};
use super::worker::{self, LEASE, Outcome};
use super::{GRACE, Opts};

/// The store under test, and what the controller can do to it.
enum Backend {
    /// A server someone else runs; for PostgreSQL, its connections can be cut.
    Url { url: String, postgres: bool },
    /// A private Redis with an append-only file fsynced on every write.
    Aof(Node),
    /// A private primary, replica and three sentinels.
    Sentinel(Sentinels),
}

impl Backend {
    fn start(o: &Opts, run: &str) -> Result<Backend, String> {
        Ok(match o.store.as_str() {
            "redis-aof" => Backend::Aof(Node::start(
                &[
                    "--save",
                    "",
                    "--appendonly",
                    "yes",
                    "--appendfsync",
                    "always",
                ],
                None,
            )?),
            "redis-sentinel" => Backend::Sentinel(Sentinels::start()?),
            url if url.starts_with("postgres") => {
                let sep = if url.contains('?') { '&' } else { '?' };
                Backend::Url {
                    url: format!("{url}{sep}application_name={run}"),
                    postgres: true,
                }
            }
            url => Backend::Url {
                url: url.to_owned(),
                postgres: false,
            },
        })
    }

    fn url(&self) -> String {
        match self {
            Backend::Url { url, .. } => url.clone(),
            Backend::Aof(node) => format!("redis://127.0.0.1:{}", node.port),
            Backend::Sentinel(s) => s.url(),
        }
    }

    fn describe(&self, o: &Opts, replicas: usize) -> String {
        match self {
            Backend::Url { url, .. } => url.clone(),
            Backend::Aof(_) => format!("redis-aof ({}, appendfsync always)", self.url()),
            Backend::Sentinel(_) => format!(
                "{} ({}, wait_for_replicas({replicas}))",
                o.store,
                self.url()
            ),
        }
    }

    /// Makes one store fault and records it; `None` when this store takes none.
    async fn fault(&mut self, ledger: &Ledger, run: &str) -> Result<Option<&'static str>, String> {
        match self {
            Backend::Url {
                postgres: false, ..
            } => Ok(None),
            Backend::Url { postgres: true, .. } => {
                ledger.event("cut", 0).await?;
                ledger.cut_connections(run).await?;
                Ok(Some("cut"))
            }
            Backend::Aof(node) => {
                ledger.event("restart", 0).await?;
                tokio::task::block_in_place(|| {
                    node.kill();
                    std::thread::sleep(Duration::from_millis(300));
                    node.restart()
                })?;
                Ok(Some("restart"))
            }
            Backend::Sentinel(s) => {
                ledger.event("failover", 0).await?;
                let took = tokio::task::block_in_place(|| s.fail_over())?;
                // Recorded once the promotion is over (and the old primary is back).
                ledger.event("promoted", 0).await?;
                println!(
                    "failover: replica promoted {} ms after the kill",
                    took.as_millis()
                );
                Ok(Some("failover"))
            }
        }
    }
}

/// A worker process and what it last reported.
struct Worker {
    inc: i32,
    child: Child,
}

#[derive(Default)]
struct Reports {
    /// The last `stat` line's numbers, per incarnation (the seventh: leases lost).
    stats: HashMap<i32, [u64; 7]>,
    unexpected: Vec<String>,
}

struct Fleet {
    o: Opts,
    run: String,
    url: String,
    replicas: usize,
    keys: u64,
    until_ms: u64,
    next_inc: i32,
    workers: Vec<Worker>,
    reports: Arc<Mutex<Reports>>,
    failed_starts: usize,
}

impl Fleet {
    fn spawn(&mut self) -> Result<(), String> {
        let inc = self.next_inc;
        self.next_inc += 1;
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let mut child = Command::new(exe)
            .arg("--worker")
            .env("IDEM_CHAOS_STORE", &self.url)
            .env("IDEM_CHAOS_LEDGER", &self.o.ledger)
            .env("IDEM_CHAOS_RUN", &self.run)
            .env("IDEM_CHAOS_INC", inc.to_string())
            .env("IDEM_CHAOS_KEYS", self.keys.to_string())
            .env("IDEM_CHAOS_TASKS", self.o.tasks.to_string())
            .env("IDEM_CHAOS_UNTIL", self.until_ms.to_string())
            .env("IDEM_CHAOS_REPLICAS", self.replicas.to_string())
            .env(
                "IDEM_CHAOS_SHORT_LEASE",
                if self.o.fault("netem") { "1" } else { "0" },
            )
            .env("RUST_LOG", "off")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("starting a worker: {e}"))?;
        let out = child.stdout.take().ok_or("worker stdout")?;
        let reports = self.reports.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(out).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let mut r = reports.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(rest) = line.strip_prefix("stat ") {
                    let mut n = [0u64; 7];
                    for (slot, v) in n.iter_mut().zip(rest.split(' ')) {
                        *slot = v.parse().unwrap_or(0);
                    }
                    r.stats.insert(inc, n);
                } else if let Some(why) = line.strip_prefix("unexpected ") {
                    r.unexpected.push(format!("worker {inc}: {why}"));
                }
            }
        });
        self.workers.push(Worker { inc, child });
        Ok(())
    }

    /// SIGKILLs worker `i` and records it; returns its incarnation.
    async fn kill(&mut self, i: usize, ledger: &Ledger) -> Result<i32, String> {
        let mut w = self.workers.swap_remove(i);
        let _ = w.child.start_kill();
        let _ = w.child.wait().await;
        ledger.event("kill", w.inc).await?;
        Ok(w.inc)
    }

    /// Replaces workers that exited on their own before the end (counted).
    async fn reap(&mut self) -> Result<(), String> {
        let mut i = 0;
        while i < self.workers.len() {
            if let Ok(Some(_)) = self.workers[i].child.try_wait() {
                self.workers.swap_remove(i);
                if worker::now_ms() + 1000 < self.until_ms {
                    self.failed_starts += 1;
                    self.spawn()?;
                }
            } else {
                i += 1;
            }
        }
        Ok(())
    }
}

/// Runs the whole chaos run; returns the number of violations.
pub(crate) async fn run(o: Opts) -> Result<usize, String> {
    let run = format!(
        "idem_chaos_{}_{}",
        std::process::id(),
        worker::now_ms() % 1_000_000_000
    );
    let mut backend = Backend::start(&o, &run)?;
    let replicas = usize::from(o.store == "redis-sentinel" && !o.no_wait);
    let ledger = Ledger::open(&o.ledger, &run).await?;
    ledger.create().await?;
    let result = chaos(&o, &run, &mut backend, replicas, &ledger).await;
    if !o.keep {
        let _ = ledger.drop_tables().await;
    }
    result
}

async fn chaos(
    o: &Opts,
    run: &str,
    backend: &mut Backend,
    replicas: usize,
    ledger: &Ledger,
) -> Result<usize, String> {
    let keys = o.keys.unwrap_or(o.seconds * 100).max(100);
    // `--faults netem`: the workers reach the store through a slow, lossy proxy (the
    // final sweep goes direct).
    let netem = if o.fault("netem") {
        Some(super::proxy::netem(&backend.url(), o.seed).await?)
    } else {
        None
    };
    let started = Instant::now();
    let mut fleet = Fleet {
        o: o.clone(),
        run: run.to_owned(),
        url: netem
            .as_ref()
            .map_or_else(|| backend.url(), |(_, url)| url.clone()),
        replicas,
        keys,
        until_ms: worker::now_ms() + o.seconds * 1000,
        next_inc: 1,
        workers: Vec::new(),
        reports: Arc::default(),
        failed_starts: 0,
    };
    println!(
        "idem-chaos: store {}, {} s, {} workers x {} tasks, {keys} keys, seed {}",
        backend.describe(o, replicas),
        o.seconds,
        o.workers,
        o.tasks,
        o.seed
    );
    for _ in 0..o.workers {
        fleet.spawn()?;
    }
    let mut rng = Rng::new(o.seed);
    let end = started + Duration::from_secs(o.seconds);
    let (mut killed, mut faults) = (0usize, 0usize);
    let mut fault_kind = "";
    let mut next_kill = Instant::now() + Duration::from_millis(1000 + rng.below(1500));
    let mut next_fault = Instant::now() + Duration::from_millis(4000 + rng.below(3000));
    // `--faults pause`: a worker stopped past its lease every few seconds.
    let mut pauses = Vec::new();
    let mut next_pause = Instant::now() + Duration::from_millis(2000 + rng.below(2000));
    while Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(100)).await;
        fleet.reap().await?;
        let now = Instant::now();
        if now >= next_kill && !fleet.workers.is_empty() && now + Duration::from_secs(1) < end {
            let i = usize::try_from(rng.below(fleet.workers.len() as u64)).unwrap_or(0);
            fleet.kill(i, ledger).await?;
            killed += 1;
            fleet.spawn()?;
            next_kill = Instant::now() + Duration::from_millis(800 + rng.below(2000));
        }
        if now >= next_fault && now + Duration::from_secs(3) < end {
            if let Some(kind) = backend.fault(ledger, run).await? {
                faults += 1;
                fault_kind = kind;
            }
            next_fault = Instant::now() + Duration::from_millis(6000 + rng.below(6000));
        }
        if o.fault("pause")
            && now >= next_pause
            && !fleet.workers.is_empty()
            && now + super::pause::HOLD + Duration::from_secs(2) < end
        {
            let i = usize::try_from(rng.below(fleet.workers.len() as u64)).unwrap_or(0);
            let w = &fleet.workers[i];
            if let Some(pid) = w.child.id() {
                let (inc, ledger) = (w.inc, ledger.clone());
                pauses.push(tokio::spawn(async move {
                    super::pause::pause(pid, inc, super::pause::HOLD, &ledger).await
                }));
            }
            next_pause = Instant::now() + Duration::from_millis(3000 + rng.below(3000));
        }
    }
    // No worker stays stopped.
    for p in pauses {
        p.await.map_err(|e| e.to_string())??;
    }
    // Workers stop at the deadline by themselves; a straggler is killed (and recorded).
    let grace = Instant::now() + GRACE;
    while !fleet.workers.is_empty() && Instant::now() < grace {
        let mut i = 0;
        while i < fleet.workers.len() {
            if let Ok(Some(_)) = fleet.workers[i].child.try_wait() {
                fleet.workers.swap_remove(i);
            } else {
                i += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    while !fleet.workers.is_empty() {
        fleet.kill(0, ledger).await?;
    }
    // Every claim a killed worker left ends with its lease; then each key is called
    // once more and must answer.
    tokio::time::sleep(LEASE + Duration::from_secs(1)).await;
    let (stuck, unanswered) = sweep(&backend.url(), replicas, run, ledger, keys).await?;
    let contents = ledger.contents().await?;
    let verdict = check(&contents, replicas == 0 && o.store == "redis-sentinel");

    let reports = fleet.reports.lock().unwrap_or_else(|p| p.into_inner());
    let mut total = [0u64; 7];
    for s in reports.stats.values() {
        for (t, v) in total.iter_mut().zip(s) {
            *t += v;
        }
    }
    let mut violations = verdict.violations.clone();
    violations.extend(reports.unexpected.iter().cloned());
    violations.extend((0..stuck).map(|_| "a key still in progress after its lease".to_owned()));
    violations.extend(
        unanswered
            .iter()
            .map(|k| format!("key {k}: no answer from the store in the final sweep")),
    );

    println!(
        "workers killed: {killed} (SIGKILL), {} more exited early and were replaced",
        fleet.failed_starts
    );
    let fault_name = match fault_kind {
        "cut" => "connection cuts",
        "restart" => "restarts (SIGKILL)",
        "failover" => "failovers (primary SIGKILLed, replica promoted)",
        _ => "store faults",
    };
    println!("store faults: {faults} {fault_name}");
    println!(
        "failovers: {}",
        if fault_kind == "failover" { faults } else { 0 }
    );
    println!(
        "calls: {} (body ran {}, replayed {}, store errors {}, in progress {}, unexpected {})",
        total[0], total[1], total[2], total[3], total[4], total[5]
    );
    println!(
        "effects: {} for {} keys; {} keys ran more than once, each after a kill or store fault in flight",
        verdict.effects, verdict.keys, verdict.explained
    );
    if !verdict.lost_in_failover.is_empty() {
        let max = verdict.lost_in_failover.iter().max().copied().unwrap_or(0);
        println!(
            "lost in failovers (no wait_for_replicas): {} completed keys ran again; the oldest was confirmed {} ms before the primary died",
            verdict.lost_in_failover.len(),
            max / 1000
        );
    }
    if o.fault("pause") {
        let p = super::pause::summary(&contents);
        println!(
            "pauses: {} workers stopped {} ms (past their {} ms lease); {} keys taken over; \
             {} effects of paused workers landed after the stop, {} of them made after waking \
             (plain dedup: a body goes on when it wakes)",
            p.pauses,
            super::pause::HOLD.as_millis(),
            LEASE.as_millis(),
            p.taken_over,
            p.late_effects,
            p.after_waking
        );
    }
    if let Some((proxy, _)) = &netem {
        println!(
            "netem: 50-200 ms each way, 5% loss, 1 s leases; {}",
            proxy.stats.line()
        );
    }
    println!(
        "leases lost: {} (completions refused, idem_lease_lost_total); {} keys ran again after a lost lease, each counted",
        total[6],
        super::pause::lost_lease_doubles(&contents)
    );
    println!("stuck keys: {stuck}");
    for v in violations.iter().take(20) {
        println!("violation: {v}");
    }
    println!("violations: {}", violations.len());
    Ok(violations.len())
}

/// Calls every key once from the controller (incarnation 0). Returns how many keys are
/// still in progress (stuck) and which got no answer.
async fn sweep(
    url: &str,
    replicas: usize,
    run: &str,
    ledger: &Ledger,
    keys: u64,
) -> Result<(usize, Vec<String>), String> {
    let (idem, watched) = worker::open(url, replicas, run).await?;
    let outcomes: Vec<(u64, Option<Outcome>)> = futures_util::stream::iter(0..keys)
        .map(|k| {
            let (idem, watched, ledger) = (idem.clone(), watched.clone(), ledger.clone());
            async move {
                let mut rng = Rng::new(k);
                for _ in 0..40 {
                    match worker::pay(&idem, &watched, &ledger, 0, k, &mut rng).await {
                        Outcome::StoreError => tokio::time::sleep(Duration::from_millis(100)).await,
                        o => return (k, Some(o)),
                    }
                }
                (k, None)
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    let mut stuck = 0;
    let mut unanswered = Vec::new();
    for (k, o) in outcomes {
        match o {
            Some(Outcome::Busy) => stuck += 1,
            Some(Outcome::Unexpected(why)) => unanswered.push(format!("{k} ({why})")),
            None => unanswered.push(k.to_string()),
            _ => {}
        }
    }
    Ok((stuck, unanswered))
}
