//! An order workflow guarded by a state machine, fed by an event bus that redelivers,
//! reorders and races. Runs on the in-memory store, no server needed:
//!
//! ```text
//! cargo run -p idem-examples --bin order_workflow
//! ```
//!
//! Orders move `created → paid → shipped → delivered`, and may be `cancelled` before
//! they ship. Events arrive on many workers at once: payments twice, shipping requests
//! three times, some cancellations racing the shipment, deliveries before the order even
//! shipped. Each handler is one state-machine move:
//!
//! - `paid`, `delivered`, `cancelled`: a plain atomic move. A duplicate finds the order
//!   already there and succeeds without effect; a move the table forbids (delivering an
//!   unshipped order, cancelling a shipped one) is refused with the order's state.
//! - `shipped`: the move *with a body* that calls the carrier. The body runs only for the
//!   handler that performs the move, and the move is recorded only if the carrier call
//!   succeeds; a cancellation arriving meanwhile waits for it and is then refused.
//!
//! Options: `--orders N` (default 300), `--seed N`, `--store URL` (default `memory`).
//!
//! Exits non-zero if an order shipped twice, a cancelled order shipped, a delivered order
//! did not ship, or any order ends outside the table.

mod runtime;

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_runtime::toolbox::{Moved, StateMachine};
use idem_runtime::{Error, Idem};

mod rng;

use rng::Rng;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Event {
    Create,
    Pay,
    Ship,
    Deliver,
    Cancel,
}

impl Event {
    fn target(self) -> &'static str {
        match self {
            Event::Create => "created",
            Event::Pay => "paid",
            Event::Ship => "shipped",
            Event::Deliver => "delivered",
            Event::Cancel => "cancelled",
        }
    }
}

#[derive(Default)]
struct Tally {
    performed: AtomicU64,
    already: AtomicU64,
    refused: AtomicU64,
    carrier_failures: AtomicU64,
}

struct Workflow {
    idem: Idem,
    orders: StateMachine,
    /// Parcels handed to the carrier, per order: must never exceed one.
    parcels: Mutex<HashMap<u64, u32>>,
    tally: Tally,
}

impl Workflow {
    async fn handle(&self, order: u64, event: Event, carrier_fails: bool) -> Result<(), Error> {
        let to = event.target();
        let step = if event == Event::Ship {
            self.idem
                .transition_with(&self.orders, order, to, self.ship(order, carrier_fails))
                .await
        } else {
            self.idem.transition(&self.orders, order, to).await
        };
        let tally = &self.tally;
        match step {
            Ok(Moved::Performed { .. }) => tally.performed.fetch_add(1, Ordering::Relaxed),
            Ok(Moved::AlreadyThere) => tally.already.fetch_add(1, Ordering::Relaxed),
            Err(Error::InvalidTransition { .. }) => tally.refused.fetch_add(1, Ordering::Relaxed),
            Err(Error::Config(msg)) if msg == "carrier unavailable" => {
                tally.carrier_failures.fetch_add(1, Ordering::Relaxed)
            }
            Err(e) => return Err(e),
        };
        Ok(())
    }

    /// The effect tied to the `shipped` move: one parcel per order, ever.
    async fn ship(&self, order: u64, carrier_fails: bool) -> Result<(), Error> {
        tokio::time::sleep(Duration::from_millis(2)).await;
        if carrier_fails {
            // Nothing was handed over; the order stays `paid` and a retry can ship it.
            return Err(Error::Config("carrier unavailable".into()));
        }
        *self
            .parcels
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(order)
            .or_default() += 1;
        Ok(())
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let mut orders_n = 300u64;
    let mut seed = 11u64;
    let mut store_url = "memory".to_owned();
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next();
        let parsed = match (flag.as_str(), value) {
            ("--orders", Some(v)) => v.parse().map(|n| orders_n = n).map_err(|e| e.to_string()),
            ("--seed", Some(v)) => v.parse().map(|n| seed = n).map_err(|e| e.to_string()),
            ("--store", Some(v)) => {
                store_url = v;
                Ok(())
            }
            _ => Err("usage: order_workflow [--orders N] [--seed N] [--store URL]".to_owned()),
        };
        if let Err(e) = parsed {
            eprintln!("{flag}: {e}");
            return ExitCode::from(2);
        }
    }
    let orders = match StateMachine::builder("shop::order")
        .states(["created", "paid", "shipped", "delivered", "cancelled"])
        .initial("created")
        .allow("created", ["paid", "cancelled"])
        .allow("paid", ["shipped", "cancelled"])
        .allow("shipped", ["delivered"])
        .terminal(["delivered", "cancelled"])
        .wait(Duration::from_secs(30))
        .build()
    {
        Ok(m) => m,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let idem = match runtime::open(&store_url, "order-workflow", seed).await {
        Ok(idem) => idem,
        Err(code) => return code,
    };
    let flow = Arc::new(Workflow {
        idem,
        orders,
        parcels: Mutex::default(),
        tally: Tally::default(),
    });

    // Each order's events, with duplicates; created first (the order exists before the
    // bus talks about it), the rest racing on their own tasks.
    let mut rng = Rng::new(seed);
    for order in 0..orders_n {
        if let Err(e) = flow.handle(order, Event::Create, false).await {
            eprintln!("create {order}: {e}");
            return ExitCode::FAILURE;
        }
    }
    let mut tasks = Vec::new();
    for order in 0..orders_n {
        let mut events = vec![Event::Pay, Event::Pay];
        // Payment first, then the rest of the story arrives in any order.
        let mut rest = vec![Event::Ship, Event::Ship, Event::Ship, Event::Deliver];
        if rng.below(4) == 0 {
            rest.push(Event::Cancel);
        }
        // Shuffle.
        for i in (1..rest.len()).rev() {
            rest.swap(i, rng.below(i as u64 + 1) as usize);
        }
        events.extend(rest);
        let first_ship_fails = rng.below(5) == 0;
        let flow = flow.clone();
        tasks.push(tokio::spawn(async move {
            // The payment is handled before shipping starts, like a bus with per-order
            // ordering for payments; the rest fan out on their own tasks.
            for e in &events[..2] {
                flow.handle(order, *e, false).await?;
            }
            let mut inner = Vec::new();
            let mut failed_once = !first_ship_fails;
            for e in events[2..].iter().copied() {
                let fail = e == Event::Ship && !failed_once;
                failed_once |= e == Event::Ship;
                let flow = flow.clone();
                inner.push(tokio::spawn(
                    async move { flow.handle(order, e, fail).await },
                ));
            }
            for t in inner {
                t.await.map_err(|e| Error::Config(e.to_string()))??;
            }
            Ok::<_, Error>(())
        }));
    }
    let mut errors = 0;
    for t in tasks {
        match t.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                errors += 1;
                eprintln!("handler: {e}");
            }
            Err(e) => {
                errors += 1;
                eprintln!("task: {e}");
            }
        }
    }

    let parcels = flow
        .parcels
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let mut finals: HashMap<String, u64> = HashMap::new();
    let mut broken = Vec::new();
    for order in 0..orders_n {
        let state = match flow.idem.state(&flow.orders, order).await {
            Ok(s) => s.unwrap_or_else(|| "(none)".into()),
            Err(e) => {
                broken.push(format!("order {order}: {e}"));
                continue;
            }
        };
        let shipped = parcels.get(&order).copied().unwrap_or(0);
        if shipped > 1 {
            broken.push(format!("order {order} shipped {shipped} times"));
        }
        match state.as_str() {
            "cancelled" if shipped > 0 => {
                broken.push(format!("order {order} shipped but cancelled"))
            }
            "shipped" | "delivered" if shipped != 1 => {
                broken.push(format!("order {order} is {state} with {shipped} parcels"))
            }
            "paid" | "created" if shipped > 0 => {
                broken.push(format!("order {order} shipped but still {state}"))
            }
            "paid" | "shipped" | "delivered" | "cancelled" => {}
            other => broken.push(format!("order {order} ends in {other}")),
        }
        *finals.entry(state).or_default() += 1;
    }
    let t = &flow.tally;
    let mut finals: Vec<_> = finals.into_iter().collect();
    finals.sort();
    println!("order workflow: {orders_n} orders");
    println!(
        "  moves performed        {}",
        t.performed.load(Ordering::Relaxed)
    );
    println!(
        "  duplicates absorbed    {} (already in the target state)",
        t.already.load(Ordering::Relaxed)
    );
    println!(
        "  moves refused          {} (not allowed from the order's state)",
        t.refused.load(Ordering::Relaxed)
    );
    println!(
        "  carrier failures       {} (order stayed paid; a later request shipped it)",
        t.carrier_failures.load(Ordering::Relaxed)
    );
    println!("  parcels handed over    {}", parcels.values().sum::<u32>());
    println!("  final states           {finals:?}");
    if errors > 0 {
        broken.push(format!("{errors} handlers failed"));
    }
    if broken.is_empty() {
        println!("OK: every order shipped at most once, never after a cancellation");
        ExitCode::SUCCESS
    } else {
        for b in broken {
            eprintln!("BROKEN: {b}");
        }
        ExitCode::FAILURE
    }
}
