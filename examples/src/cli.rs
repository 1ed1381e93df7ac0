//! Arguments, store selection, the multi-process mode and the report of the payments job.

use std::collections::HashMap;
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::Duration;

use idem_runtime::{MemoryStore, Store};

pub(crate) const USAGE: &str = "usage: payments [--orders N] [--clients N] [--seed N] \
[--store URL] [--processes N] [--client-timeout-ms N] [--no-idem]
  --store URL     memory (default), redis://host:port/db, postgres://..., mysql://..., sqlite://path?mode=rwc
                  (also IDEM_STORE_URL)
  --processes N   run N copies at once on one shared store (needs a shared store)";

pub(crate) struct Args {
    pub(crate) orders: u64,
    pub(crate) clients: usize,
    pub(crate) seed: u64,
    pub(crate) store: String,
    pub(crate) processes: u32,
    pub(crate) worker: Option<u32>,
    pub(crate) namespace: String,
    pub(crate) no_idem: bool,
    pub(crate) timeout_ms: Option<u64>,
}

impl Args {
    pub(crate) fn parse(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
        let mut a = Args {
            orders: 400,
            clients: 64,
            seed: 7,
            store: std::env::var("IDEM_STORE_URL").unwrap_or_else(|_| "memory".into()),
            processes: 1,
            worker: None,
            namespace: String::new(),
            no_idem: false,
            timeout_ms: None,
        };
        let mut namespace = None;
        while let Some(flag) = it.next() {
            let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
            let num = |v: String, name: &str| {
                v.parse::<u64>()
                    .map_err(|_| format!("{name} takes a whole number, not {v:?}"))
            };
            match flag.as_str() {
                "--orders" => a.orders = num(value("--orders")?, "--orders")?.max(1),
                "--clients" => a.clients = num(value("--clients")?, "--clients")?.max(1) as usize,
                "--seed" => a.seed = num(value("--seed")?, "--seed")?,
                "--store" => a.store = value("--store")?,
                "--processes" => {
                    a.processes = num(value("--processes")?, "--processes")?.clamp(1, 64) as u32
                }
                "--worker" => a.worker = Some(num(value("--worker")?, "--worker")? as u32),
                "--namespace" => namespace = Some(value("--namespace")?),
                "--no-idem" => a.no_idem = true,
                "--client-timeout-ms" => {
                    a.timeout_ms =
                        Some(num(value("--client-timeout-ms")?, "--client-timeout-ms")?.max(1))
                }
                "-h" | "--help" => return Err("help".into()),
                other => return Err(format!("unknown argument {other:?}")),
            }
        }
        // A fresh namespace per run, so runs against a shared store do not replay each
        // other's receipts; workers of one run share the parent's.
        a.namespace = namespace.unwrap_or_else(|| {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0);
            format!("payments-{t:x}")
        });
        Ok(a)
    }
}

impl Args {
    /// How long a client waits for an answer before it retries. Short enough that
    /// retries meet first attempts still in flight (the case idem exists for), long
    /// enough for the store's round trips under this load.
    pub(crate) fn client_timeout(&self) -> Duration {
        let ms = self
            .timeout_ms
            .unwrap_or(match self.store.split(':').next() {
                Some("memory") | None => 25,
                Some("redis" | "rediss" | "redis+cluster") => 60,
                _ => 400,
            });
        Duration::from_millis(ms)
    }
}

/// The store named by `--store` / `IDEM_STORE_URL`.
pub(crate) async fn store(args: &Args) -> Result<Arc<dyn Store>, idem_runtime::Error> {
    if args.store == "memory" || args.store.is_empty() {
        return Ok(Arc::new(MemoryStore::new()));
    }
    idem_runtime::store::connect(&args.store).await
}

/// Runs `args.processes` workers of this program on one store and adds up their charges.
pub(crate) fn run_processes(args: &Args) -> ExitCode {
    if args.store == "memory" {
        eprintln!("payments: --processes needs a shared store (--store redis://... or a SQL URL)");
        return ExitCode::from(2);
    }
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("payments: cannot find my own executable: {e}");
            return ExitCode::from(2);
        }
    };
    let started = std::time::Instant::now();
    let children: Vec<_> = (0..args.processes)
        .map(|i| {
            Command::new(&exe)
                .args(["--orders", &args.orders.to_string()])
                .args(["--clients", &args.clients.to_string()])
                .args(["--seed", &args.seed.to_string()])
                .args(["--store", &args.store])
                .args(["--namespace", &args.namespace])
                .args([
                    "--client-timeout-ms",
                    &args.client_timeout().as_millis().to_string(),
                ])
                .args(["--worker", &(i + 1).to_string()])
                .stdout(Stdio::piped())
                .spawn()
        })
        .collect();
    let mut ledger: HashMap<u64, Vec<u64>> = HashMap::new();
    let mut paid = 0;
    for child in children {
        let out = match child.and_then(|c| c.wait_with_output()) {
            Ok(o) if o.status.success() => o,
            Ok(o) => {
                eprintln!("payments: a worker failed ({})", o.status);
                return ExitCode::FAILURE;
            }
            Err(e) => {
                eprintln!("payments: cannot run a worker: {e}");
                return ExitCode::FAILURE;
            }
        };
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let mut w = line.split_whitespace();
            match (w.next(), w.next(), w.next()) {
                (Some("charged"), Some(o), Some(c)) => {
                    if let (Ok(o), Ok(c)) = (o.parse(), c.parse()) {
                        ledger.entry(o).or_default().push(c);
                    }
                }
                (Some("paid"), Some(n), None) => paid += n.parse::<u64>().unwrap_or(0),
                _ => {}
            }
        }
    }
    let expected: u64 = (1..=args.orders).map(|id| 100 + (id * 37) % 9_900).sum();
    let doubled = ledger.values().filter(|c| c.len() > 1).count();
    let charged: u64 = ledger.values().flatten().sum();
    println!(
        "{} processes on {}: {} orders, {} paid answers, {} orders charged, {} charged twice, \
         expected {}, charged {} ({:.1?})",
        args.processes,
        args.store,
        args.orders,
        paid,
        ledger.len(),
        doubled,
        cents(expected),
        cents(charged),
        started.elapsed()
    );
    if doubled == 0 && ledger.len() as u64 == args.orders && charged == expected {
        println!(
            "OK: every order charged exactly once across {} processes",
            args.processes
        );
        ExitCode::SUCCESS
    } else {
        println!("FAILED: some order was charged twice or not at all");
        ExitCode::FAILURE
    }
}

pub(crate) struct Report {
    pub(crate) label: &'static str,
    pub(crate) store: &'static str,
    pub(crate) orders: u64,
    pub(crate) requests: u64,
    pub(crate) executions: u64,
    pub(crate) gateway_failures: u64,
    pub(crate) ok: u64,
    pub(crate) served_ok: u64,
    pub(crate) conflicting_receipts: u64,
    pub(crate) timeouts: u64,
    pub(crate) in_progress: u64,
    pub(crate) errors: u64,
    pub(crate) paid_orders: u64,
    pub(crate) ledger: HashMap<u64, Vec<u64>>,
    pub(crate) expected_cents: u64,
    pub(crate) elapsed: Duration,
}

fn cents(c: u64) -> String {
    format!("${}.{:02}", c / 100, c % 100)
}

impl Report {
    /// Prints the table; returns whether every order was charged at most once and the
    /// money adds up.
    pub(crate) fn print(&self) -> bool {
        let charged: u64 = self.ledger.values().flatten().sum();
        let doubled = self.ledger.values().filter(|c| c.len() > 1).count() as u64;
        let charges: u64 = self.ledger.values().map(|c| c.len() as u64).sum();
        // Money owed for the orders that were charged at all, once each.
        let owed: u64 = self.ledger.keys().map(|id| 100 + (id * 37) % 9_900).sum();
        // Every execution that succeeded answered its own request; any other receipt
        // served was a replay of a stored result.
        let replays = self
            .served_ok
            .saturating_sub(self.executions - self.gateway_failures);
        let rows: [(&str, String); 16] = [
            ("store", self.store.to_string()),
            ("orders", self.orders.to_string()),
            (
                "requests sent (with duplicates and retries)",
                self.requests.to_string(),
            ),
            ("body executions", self.executions.to_string()),
            (
                "  of which the gateway failed (key released)",
                self.gateway_failures.to_string(),
            ),
            ("receipts served", self.served_ok.to_string()),
            ("  of which replayed, not re-run", replays.to_string()),
            ("receipts the clients waited for", self.ok.to_string()),
            (
                "answers: client timed out, retried",
                self.timeouts.to_string(),
            ),
            (
                "answers: in progress elsewhere",
                self.in_progress.to_string(),
            ),
            ("answers: errors", self.errors.to_string()),
            (
                "orders paid (client got a receipt)",
                self.paid_orders.to_string(),
            ),
            ("charges made at the gateway", charges.to_string()),
            ("orders charged twice or more", doubled.to_string()),
            (
                "clients told two different receipts",
                self.conflicting_receipts.to_string(),
            ),
            (
                "money expected / owed / charged",
                format!(
                    "{} / {} / {}",
                    cents(self.expected_cents),
                    cents(owed),
                    cents(charged)
                ),
            ),
        ];
        println!(
            "\npayments simulation, {} ({:.2?})",
            self.label, self.elapsed
        );
        println!("{:-<72}", "");
        for (k, v) in rows {
            println!("{k:<48} {v:>23}");
        }
        println!("{:-<72}", "");
        let ok = doubled == 0 && charged == owed && self.conflicting_receipts == 0;
        if ok {
            println!("OK: every order charged at most once; the money adds up.");
        } else {
            println!(
                "FAILED: {doubled} orders charged more than once; {} overcharged.",
                cents(charged - owed.min(charged))
            );
        }
        ok
    }
}
