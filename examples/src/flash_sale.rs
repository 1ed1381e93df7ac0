//! A flash sale: a few units, many buyers at once, double clicks, and a limit of one unit
//! per customer. Runs on the in-memory store, no server needed:
//!
//! ```text
//! cargo run -p idem-examples --bin flash_sale
//! ```
//!
//! Three techniques, each where it fits:
//!
//! - **dedup** on the order id: a double-clicked order is placed once and both clicks
//!   get the same answer;
//! - a **lock** per customer: one customer's concurrent orders are serialized, so the
//!   "one unit per customer" check and the purchase that follows it cannot interleave;
//! - **optimistic** compare-and-set on the stock: no lock on the hot key; a buyer who
//!   loses a race reloads and tries again (bounded, jittered), and nobody decrements a
//!   stock that another buyer already took.
//!
//! Options: `--units N` (default 100), `--customers N` (default 400), `--seed N`,
//! `--store URL` (default `memory`; e.g. `redis://127.0.0.1:6379`).
//!
//! Exits non-zero if a unit was oversold, a customer got two units, an order was
//! fulfilled twice, or units sold and stock left do not add up.

mod runtime;

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_runtime::toolbox::{Optimistic, Retry};
use idem_runtime::{Error, Idem, IsConflict, Options, retry_on_conflict};
use serde::{Deserialize, Serialize};

mod rng;

use rng::Rng;

static PLACE_ORDER: Options = Options::dedup("flash_sale::place_order");
static PER_CUSTOMER: Options = Options::lock("flash_sale::customer").wait(Duration::from_secs(30));
static STOCK: Optimistic = Optimistic::new("flash_sale::stock");
static BOUGHT: Optimistic = Optimistic::new("flash_sale::bought");
/// Many buyers hit one stock record: allow many attempts, with short jittered naps.
static CONTENDED: Retry =
    Retry::new(200).backoff(Duration::from_micros(200), Duration::from_millis(20));

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
enum Outcome {
    Bought { unit: u64 },
    SoldOut,
    LimitReached,
}

#[derive(Debug, thiserror::Error)]
enum SaleError {
    #[error(transparent)]
    Idem(#[from] Error),
}

impl IsConflict for SaleError {
    fn is_conflict(&self) -> bool {
        matches!(self, SaleError::Idem(e) if e.is_conflict())
    }
}

struct Shop {
    idem: Idem,
    /// What actually shipped, as (customer, order): the effect that must never happen
    /// twice for an order, nor more than once for a customer.
    shipments: Mutex<Vec<(u64, u64)>>,
    attempts: AtomicU64,
    client_retries: AtomicU64,
}

impl Shop {
    /// Places `order` for `customer`: once per order id, one unit per customer.
    async fn place_order(&self, customer: u64, order: u64) -> Result<Outcome, SaleError> {
        self.idem
            .dedup(&PLACE_ORDER, order, async {
                self.idem
                    .lock(&PER_CUSTOMER, customer, self.buy(customer, order))
                    .await
            })
            .await
    }

    /// Under the customer's lock: check their limit, take a unit, record it.
    async fn buy(&self, customer: u64, order: u64) -> Result<Outcome, SaleError> {
        let bought = self.idem.load::<u64>(&BOUGHT, customer).await?;
        if bought.as_ref().is_some_and(|b| b.value >= 1) {
            return Ok(Outcome::LimitReached);
        }
        let unit = retry_on_conflict(&CONTENDED, || async {
            self.attempts.fetch_add(1, Ordering::Relaxed);
            let stock = self
                .idem
                .load::<u64>(&STOCK, "sku-1")
                .await?
                .ok_or_else(|| Error::Config("stock not initialised".into()))?;
            if stock.value == 0 {
                return Ok(None);
            }
            // Pricing, fraud checks...: the await where other buyers get in.
            tokio::task::yield_now().await;
            self.idem
                .compare_and_set(&STOCK, "sku-1", stock.version, stock.value - 1)
                .await?;
            Ok::<_, SaleError>(Some(stock.value))
        })
        .await?;
        let Some(unit) = unit else {
            return Ok(Outcome::SoldOut);
        };
        // Only the holder of this customer's lock writes their count, so the version read
        // above still holds; a conflict here would mean the lock failed.
        let expected = bought.map_or(0, |b| b.version);
        self.idem
            .compare_and_set(&BOUGHT, customer, expected, 1u64)
            .await?;
        self.shipments
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((customer, order));
        Ok(Outcome::Bought { unit })
    }
}

struct Args {
    units: u64,
    customers: u64,
    seed: u64,
    store: String,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        units: 100,
        customers: 400,
        seed: 7,
        store: "memory".into(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--units" => a.units = value()?.parse().map_err(|e| format!("--units: {e}"))?,
            "--customers" => {
                a.customers = value()?.parse().map_err(|e| format!("--customers: {e}"))?
            }
            "--seed" => a.seed = value()?.parse().map_err(|e| format!("--seed: {e}"))?,
            "--store" => a.store = value()?,
            "-h" | "--help" => {
                return Err(
                    "usage: flash_sale [--units N] [--customers N] [--seed N] [--store URL]".into(),
                );
            }
            other => return Err(format!("unknown option {other}")),
        }
    }
    Ok(a)
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(msg) => {
            eprintln!("{msg}");
            return ExitCode::from(2);
        }
    };
    let idem = match runtime::open(&args.store, "flash-sale", args.seed).await {
        Ok(idem) => idem,
        Err(code) => return code,
    };
    if let Err(e) = idem.compare_and_set(&STOCK, "sku-1", 0, args.units).await {
        eprintln!("could not stock the shelf: {e}");
        return ExitCode::FAILURE;
    }
    let shop = Arc::new(Shop {
        idem: idem.clone(),
        shipments: Mutex::default(),
        attempts: AtomicU64::new(0),
        client_retries: AtomicU64::new(0),
    });

    // Every customer places one or two orders; a third of the orders are double-clicked
    // (the same order id sent twice at once).
    let mut rng = Rng::new(args.seed);
    let mut tasks = Vec::new();
    let mut order_id = 0;
    for customer in 0..args.customers {
        for _ in 0..1 + rng.below(2) {
            order_id += 1;
            let clicks = if rng.below(3) == 0 { 2 } else { 1 };
            for _ in 0..clicks {
                let shop = shop.clone();
                let order = order_id;
                tasks.push(tokio::spawn(async move {
                    // A client retries what is worth retrying (its twin still running, the
                    // customer's lock busy, a store hiccup): the order id makes it safe.
                    let mut result = shop.place_order(customer, order).await;
                    for attempt in 0..20 {
                        match &result {
                            Err(SaleError::Idem(e)) if e.is_retryable() => {
                                shop.client_retries.fetch_add(1, Ordering::Relaxed);
                                tokio::time::sleep(Duration::from_millis(20 << attempt.min(4)))
                                    .await;
                                result = shop.place_order(customer, order).await;
                            }
                            _ => break,
                        }
                    }
                    (order, result)
                }));
            }
        }
    }
    let clicks = tasks.len();
    let mut answers: HashMap<u64, Vec<Outcome>> = HashMap::new();
    let mut failed = 0;
    for t in tasks {
        match t.await {
            Ok((order, Ok(outcome))) => answers.entry(order).or_default().push(outcome),
            Ok((order, Err(e))) => {
                failed += 1;
                eprintln!("order {order}: {e}");
            }
            Err(e) => {
                failed += 1;
                eprintln!("task: {e}");
            }
        }
    }

    let left = idem
        .load::<u64>(&STOCK, "sku-1")
        .await
        .ok()
        .flatten()
        .map_or(u64::MAX, |v| v.value);
    let shipments = shop
        .shipments
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let sold = shipments.len() as u64;
    let mut per_order: HashMap<u64, u64> = HashMap::new();
    let mut per_customer: HashMap<u64, u64> = HashMap::new();
    for (customer, order) in &shipments {
        *per_order.entry(*order).or_default() += 1;
        *per_customer.entry(*customer).or_default() += 1;
    }
    let count = |f: fn(&Outcome) -> bool| {
        answers
            .values()
            .filter(|v| v.first().is_some_and(f))
            .count()
    };
    let bought = count(|o| matches!(o, Outcome::Bought { .. }));
    let sold_out = count(|o| *o == Outcome::SoldOut);
    let limited = count(|o| *o == Outcome::LimitReached);
    let attempts = shop.attempts.load(Ordering::Relaxed);

    println!(
        "flash sale: {} units, {} customers, {} orders, {clicks} clicks",
        args.units,
        args.customers,
        answers.len()
    );
    println!("  bought                 {bought}");
    println!("  sold out               {sold_out}");
    println!("  one-per-customer limit {limited}");
    println!("  failed                 {failed}");
    println!(
        "  client retries         {}",
        shop.client_retries.load(Ordering::Relaxed)
    );
    println!("  stock left             {left}");
    println!(
        "  stock CAS attempts     {attempts} ({} lost a race and retried)",
        attempts.saturating_sub(bought as u64 + sold_out as u64)
    );

    let mut broken = Vec::new();
    if sold + left != args.units {
        broken.push(format!("sold {sold} + left {left} != {} units", args.units));
    }
    if sold > args.units {
        broken.push(format!("oversold: {sold} of {} units", args.units));
    }
    if let Some((order, n)) = per_order.iter().find(|(_, n)| **n > 1) {
        broken.push(format!("order {order} fulfilled {n} times"));
    }
    if let Some((customer, n)) = per_customer.iter().find(|(_, n)| **n > 1) {
        broken.push(format!("customer {customer} got {n} units"));
    }
    if answers.values().any(|v| v.windows(2).any(|w| w[0] != w[1])) {
        broken.push("a double click got two different answers".into());
    }
    let mut units: Vec<u64> = answers
        .values()
        .filter_map(|v| match v.first() {
            Some(Outcome::Bought { unit }) => Some(*unit),
            _ => None,
        })
        .collect();
    units.sort_unstable();
    if units.windows(2).any(|w| w[0] == w[1]) {
        broken.push("one unit was sold twice".into());
    }
    if bought as u64 != sold {
        broken.push(format!("{bought} orders bought but {sold} units shipped"));
    }
    if args.customers >= args.units && left != 0 && failed == 0 {
        broken.push(format!("{left} units left although demand exceeded supply"));
    }
    if failed > 0 {
        broken.push(format!("{failed} orders failed"));
    }
    if broken.is_empty() {
        println!("OK: no unit oversold, no customer over the limit, no order fulfilled twice");
        ExitCode::SUCCESS
    } else {
        for b in broken {
            eprintln!("BROKEN: {b}");
        }
        ExitCode::FAILURE
    }
}
