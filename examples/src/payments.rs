//! The main job: a payments service under duplicate requests, client retries and a flaky
//! gateway. Run it first:
//!
//! ```text
//! cargo run -p idem-examples --bin payments
//! ```
//!
//! Many clients send charges for their orders. Each client double-submits some requests
//! (a double click), gives up on slow answers and retries (a client timeout), and the
//! payment gateway is slow and fails now and then. Requests are served on their own
//! tasks, as a web server would: a client that gives up does not cancel the server's
//! work, so its retry meets the first attempt still in flight. Without idem, orders get
//! charged twice. With one attribute on `charge`, every order is charged exactly once.
//!
//! Options: `--orders N` (default 400), `--clients N` (default 64), `--seed N`,
//! `--store URL` (or `IDEM_STORE_URL`; default: the in-memory store), `--processes N`
//! (run N copies of the simulation at once against one shared store: every order is
//! still charged once across all of them), `--no-idem` (the same workload without the
//! attribute, to see the double charges it prevents).
//!
//! Exits non-zero if any order was charged twice or the money charged differs from the
//! money expected.

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_runtime::{Idem, idempotent};
use serde::{Deserialize, Serialize};

mod cli;
mod rng;

use cli::Args;
use rng::Rng;

/// What the service returns to a client.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Receipt {
    order_id: u64,
    cents: u64,
    charge_id: u64,
}

#[derive(Debug, thiserror::Error)]
enum PayError {
    #[error("gateway unavailable, try again")]
    GatewayDown,
    #[error(transparent)]
    Idem(#[from] idem_runtime::Error),
}

struct Order {
    id: u64,
    cents: u64,
}

/// The payment gateway: slow, sometimes down, and it charges every call it gets.
struct Gateway {
    ledger: Mutex<HashMap<u64, Vec<u64>>>,
    next_charge: AtomicU64,
    calls: AtomicU64,
    failures: AtomicU64,
    seed: u64,
}

impl Gateway {
    async fn charge(&self, order_id: u64, cents: u64) -> Result<u64, PayError> {
        let n = self.calls.fetch_add(1, Ordering::Relaxed);
        let mut rng = Rng::new(self.seed ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ order_id);
        tokio::time::sleep(Duration::from_millis(rng.below(40) + 1)).await;
        if rng.below(100) < 8 {
            // Down before charging: the client sees an error and may retry.
            self.failures.fetch_add(1, Ordering::Relaxed);
            return Err(PayError::GatewayDown);
        }
        let charge_id = self.next_charge.fetch_add(1, Ordering::Relaxed) + 1;
        lock(&self.ledger).entry(order_id).or_default().push(cents);
        Ok(charge_id)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

struct Service {
    gateway: Gateway,
    executions: AtomicU64,
}

impl Service {
    /// The one line that matters: the body runs once per order, whatever the traffic.
    #[idempotent(key = "charge:{order.id}", ttl = "1h", wait = "5s", fingerprint = [cents])]
    async fn charge(&self, order: &Order, cents: u64) -> Result<Receipt, PayError> {
        self.executions.fetch_add(1, Ordering::Relaxed);
        let charge_id = self.gateway.charge(order.id, cents).await?;
        Ok(Receipt {
            order_id: order.id,
            cents,
            charge_id,
        })
    }

    /// The same service without idem, for `--no-idem`.
    async fn charge_unprotected(&self, order: &Order, cents: u64) -> Result<Receipt, PayError> {
        self.executions.fetch_add(1, Ordering::Relaxed);
        let charge_id = self.gateway.charge(order.id, cents).await?;
        Ok(Receipt {
            order_id: order.id,
            cents,
            charge_id,
        })
    }
}

#[derive(Default)]
struct ClientStats {
    requests: AtomicU64,
    ok: AtomicU64,
    timeouts: AtomicU64,
    errors: AtomicU64,
    in_progress: AtomicU64,
    paid_orders: AtomicU64,
    /// Requests whose server task returned a receipt (whether or not the client still
    /// waited for it).
    served_ok: AtomicU64,
    /// Receipts that differ from an earlier receipt for the same order.
    conflicting_receipts: AtomicU64,
}

async fn client(
    service: Arc<Service>,
    idem: Option<Idem>,
    stats: Arc<ClientStats>,
    orders: Vec<(u64, u64)>,
    seed: u64,
    client_timeout: Duration,
    receipts: Arc<Mutex<HashMap<u64, Receipt>>>,
) {
    let mut rng = Rng::new(seed);
    for (id, cents) in orders {
        // A double click sends the first attempt twice at once.
        let copies = if rng.below(100) < 30 { 2 } else { 1 };
        for attempt in 0..8 {
            let mut inflight = Vec::new();
            for _ in 0..if attempt == 0 { copies } else { 1 } {
                stats.requests.fetch_add(1, Ordering::Relaxed);
                let (service, idem, stats) = (service.clone(), idem.clone(), stats.clone());
                // Served on its own task, as by a web server: the client's timeout does
                // not cancel it.
                inflight.push(tokio::spawn(async move {
                    let order = Order { id, cents };
                    let r = match idem {
                        Some(idem) => idem.scope(service.charge(&order, order.cents)).await,
                        None => service.charge_unprotected(&order, order.cents).await,
                    };
                    if r.is_ok() {
                        stats.served_ok.fetch_add(1, Ordering::Relaxed);
                    }
                    r
                }));
            }
            let mut paid = false;
            for handle in inflight {
                match tokio::time::timeout(client_timeout, handle).await {
                    Ok(Ok(Ok(receipt))) => {
                        stats.ok.fetch_add(1, Ordering::Relaxed);
                        let mut seen = lock(&receipts);
                        if seen.get(&id).is_some_and(|prev| prev != &receipt) {
                            // Two different charges answered for one order.
                            stats.conflicting_receipts.fetch_add(1, Ordering::Relaxed);
                        }
                        seen.insert(id, receipt);
                        paid = true;
                    }
                    Ok(Ok(Err(PayError::Idem(idem_runtime::Error::InProgress { .. })))) => {
                        stats.in_progress.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(Ok(Err(_))) | Ok(Err(_)) => {
                        stats.errors.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(_) => {
                        stats.timeouts.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            if paid {
                stats.paid_orders.fetch_add(1, Ordering::Relaxed);
                break;
            }
            // Back off a little, then retry with the same order (the same key).
            tokio::time::sleep(Duration::from_millis(rng.below(20))).await;
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match Args::parse(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(msg) => {
            eprintln!("payments: {msg}\n\n{}", cli::USAGE);
            return ExitCode::from(2);
        }
    };
    if args.processes > 1 {
        return cli::run_processes(&args);
    }
    match run(&args).await {
        Ok(ok) if ok => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("payments: {e}");
            ExitCode::from(2)
        }
    }
}

async fn run(args: &Args) -> Result<bool, idem_runtime::Error> {
    let store = cli::store(args).await?;
    let idem = (!args.no_idem).then(|| {
        Idem::builder()
            .shared_store(store.clone())
            .namespace(args.namespace.clone())
            .build()
    });
    let service = Arc::new(Service {
        gateway: Gateway {
            ledger: Mutex::default(),
            next_charge: AtomicU64::new(0),
            calls: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            seed: args.seed ^ u64::from(args.worker.unwrap_or(0)),
        },
        executions: AtomicU64::new(0),
    });
    let stats = Arc::new(ClientStats::default());
    let receipts = Arc::new(Mutex::new(HashMap::new()));

    // Orders are dealt to clients round-robin; amounts are derived from the order id, so
    // every process of a multi-process run agrees on them.
    let mut per_client: Vec<Vec<(u64, u64)>> = vec![Vec::new(); args.clients];
    for id in 1..=args.orders {
        per_client[(id as usize) % args.clients].push((id, 100 + (id * 37) % 9_900));
    }
    let started = std::time::Instant::now();
    let mut tasks = Vec::new();
    for (i, orders) in per_client.into_iter().enumerate() {
        tasks.push(tokio::spawn(client(
            service.clone(),
            idem.clone(),
            stats.clone(),
            orders,
            args.seed.wrapping_add(i as u64 * 7919) ^ u64::from(args.worker.unwrap_or(0)) << 32,
            args.client_timeout(),
            receipts.clone(),
        )));
    }
    for t in tasks {
        if let Err(e) = t.await {
            eprintln!("payments: a client failed: {e}");
            return Ok(false);
        }
    }
    let elapsed = started.elapsed();

    let ledger = lock(&service.gateway.ledger).clone();
    if args.worker.is_some() {
        // A worker of a multi-process run: report charges for the parent to add up.
        for (order, charges) in &ledger {
            for cents in charges {
                println!("charged {order} {cents}");
            }
        }
        println!("paid {}", stats.paid_orders.load(Ordering::Relaxed));
        return Ok(true);
    }

    let expected: u64 = (1..=args.orders).map(|id| 100 + (id * 37) % 9_900).sum();
    let report = cli::Report {
        label: if args.no_idem {
            "without idem"
        } else {
            "with #[idempotent]"
        },
        store: store.name(),
        orders: args.orders,
        requests: stats.requests.load(Ordering::Relaxed),
        executions: service.executions.load(Ordering::Relaxed),
        gateway_failures: service.gateway.failures.load(Ordering::Relaxed),
        ok: stats.ok.load(Ordering::Relaxed),
        served_ok: stats.served_ok.load(Ordering::Relaxed),
        conflicting_receipts: stats.conflicting_receipts.load(Ordering::Relaxed),
        timeouts: stats.timeouts.load(Ordering::Relaxed),
        in_progress: stats.in_progress.load(Ordering::Relaxed),
        errors: stats.errors.load(Ordering::Relaxed),
        paid_orders: stats.paid_orders.load(Ordering::Relaxed),
        ledger,
        expected_cents: expected,
        elapsed,
    };
    Ok(report.print())
}
