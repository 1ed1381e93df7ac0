//! A message consumer at volume: dedup by message id, with a Bloom filter in front.
//! Runs on the in-memory store, no server needed:
//!
//! ```text
//! cargo run -p idem-examples --bin consumer
//! ```
//!
//! A broker delivers at least once: some messages arrive twice right away (a lost ack),
//! some come back much later (a consumer group rebalance, a replay from an offset). The
//! consumer credits an account ledger per message, and a message must be credited once.
//!
//! - **dedup by message id** makes each message run once while its record lives. Records
//!   are kept for a short window (`--record-ttl`, standing in for "one hour"), so the
//!   store holds only recent ids.
//! - A late redelivery finds no record. Without more knowledge, the handler would have to
//!   look every message up in the ledger (an "exact lookup": the expensive query) before
//!   crediting it. The **Bloom filter** remembers every id for the filter's lifetime in a
//!   few bits each, and tells the handler which messages are definitely new: those skip
//!   the ledger lookup. Only a "maybe" (a late duplicate, or a false positive) pays for
//!   it, and a false positive is credited normally: the filter never drops a message.
//!
//! Options: `--messages N` (default 40000), `--workers N` (default 16), `--seed N`,
//! `--record-ttl-ms N` (default 300), `--store URL` (default `memory`).
//!
//! Exits non-zero if any message was credited twice or not at all.
//!
//! With `--broker nats://...`, `--broker amqp://...`, `--broker redis://...` (Redis
//! Streams) or `--broker mqtt://...` (MQTT 5) it consumes a real broker instead
//! (see `consumer/broker.rs` for the command lines).

#[path = "consumer/broker.rs"]
mod broker;
mod runtime;

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_runtime::toolbox::{BloomFilter, Filtered, Verdict};
use idem_runtime::{Error, Idem, Options};
use tokio::sync::mpsc;

mod rng;

use rng::Rng;

#[derive(Default)]
struct Counts {
    credited: AtomicU64,
    duplicates_skipped: AtomicU64,
    late_duplicates_caught: AtomicU64,
    false_positives: AtomicU64,
    ledger_lookups: AtomicU64,
    ledger_lookups_saved: AtomicU64,
    retried: AtomicU64,
}

struct Consumer {
    idem: Idem,
    opts: Options,
    filter: BloomFilter,
    /// The account ledger: message id → times credited. Looking a message up here is the
    /// expensive "exact lookup" of a real system (an indexed query on a large table).
    ledger: Mutex<HashMap<u64, u32>>,
    counts: Counts,
}

impl Consumer {
    async fn on_message(&self, id: u64) -> Result<(), Error> {
        let counts = &self.counts;
        let r: Filtered<bool> = self
            .idem
            .dedup_filtered(&self.opts, &self.filter, id, |verdict| async move {
                let mut ledger = self.ledger.lock().unwrap_or_else(|p| p.into_inner());
                if verdict == Verdict::Maybe {
                    // Seen before, or a false positive: ask the ledger.
                    counts.ledger_lookups.fetch_add(1, Ordering::Relaxed);
                    if ledger.contains_key(&id) {
                        return Ok::<_, Error>(false);
                    }
                } else {
                    // The filter never saw this id: no lookup needed.
                    counts.ledger_lookups_saved.fetch_add(1, Ordering::Relaxed);
                }
                *ledger.entry(id).or_default() += 1;
                Ok(true)
            })
            .await?;
        let counter = match (r.ran, r.value, r.verdict) {
            (false, _, _) => &counts.duplicates_skipped,
            (true, false, _) => &counts.late_duplicates_caught,
            (true, true, Verdict::Maybe) => {
                counts.false_positives.fetch_add(1, Ordering::Relaxed);
                &counts.credited
            }
            (true, true, _) => &counts.credited,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

struct Args {
    messages: u64,
    workers: usize,
    seed: u64,
    record_ttl: Duration,
    store: String,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        messages: 40_000,
        workers: 16,
        seed: 3,
        record_ttl: Duration::from_millis(300),
        store: "memory".into(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let v = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let bad = |e: std::num::ParseIntError| format!("{flag}: {e}");
        match flag.as_str() {
            "--messages" => a.messages = v.parse().map_err(bad)?,
            "--workers" => a.workers = v.parse().map_err(bad)?,
            "--seed" => a.seed = v.parse().map_err(bad)?,
            "--record-ttl-ms" => a.record_ttl = Duration::from_millis(v.parse().map_err(bad)?),
            "--store" => a.store = v,
            _ => {
                return Err("usage: consumer [--messages N] [--workers N] [--seed N] \
                            [--record-ttl-ms N] [--store URL]"
                    .into());
            }
        }
    }
    Ok(a)
}

/// Feeds `batch` to the workers and waits until every message was handled.
async fn deliver(consumer: &Arc<Consumer>, workers: usize, batch: Vec<u64>) -> Result<(), Error> {
    let (tx, rx) = mpsc::channel::<u64>(1024);
    let rx = Arc::new(tokio::sync::Mutex::new(rx));
    let mut handles = Vec::new();
    for _ in 0..workers {
        let (consumer, rx) = (consumer.clone(), rx.clone());
        handles.push(tokio::spawn(async move {
            loop {
                let next = rx.lock().await.recv().await;
                let Some(id) = next else {
                    return Ok::<_, Error>(());
                };
                // Like a broker's redelivery after a nack: a store hiccup is retried, and
                // dedup makes the retry safe.
                let mut result = consumer.on_message(id).await;
                for attempt in 0..10 {
                    match &result {
                        Err(e) if e.is_retryable() => {
                            consumer.counts.retried.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_millis(10 << attempt.min(5))).await;
                            result = consumer.on_message(id).await;
                        }
                        _ => break,
                    }
                }
                result?;
            }
        }));
    }
    for id in batch {
        if tx.send(id).await.is_err() {
            break;
        }
    }
    drop(tx);
    for h in handles {
        h.await.map_err(|e| Error::Config(e.to_string()))??;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let raw: Vec<String> = std::env::args().skip(1).collect();
    if raw.iter().any(|a| a == "--broker") {
        return match broker::parse(raw) {
            Ok(args) => broker::main(args).await,
            Err(msg) => {
                eprintln!("{msg}");
                ExitCode::from(2)
            }
        };
    }
    let args = match parse_args() {
        Ok(a) => a,
        Err(msg) => {
            eprintln!("{msg}");
            return ExitCode::from(2);
        }
    };
    let idem = match runtime::open(&args.store, "consumer", args.seed).await {
        Ok(idem) => idem,
        Err(code) => return code,
    };
    // The exact records live for the short window; the filter, sized for every id of
    // the run at 1%, remembers them all.
    let opts = Options::dedup("ledger::on_message").ttl(args.record_ttl);
    let filter = match BloomFilter::new(&idem, "ledger::message_ids", args.messages, 0.01) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let consumer = Arc::new(Consumer {
        idem,
        opts,
        filter,
        ledger: Mutex::default(),
        counts: Counts::default(),
    });

    // First pass: every message once, 10% redelivered right away (while records live).
    let mut rng = Rng::new(args.seed);
    let mut first = Vec::new();
    for id in 0..args.messages {
        first.push(id);
        if rng.below(10) == 0 {
            first.push(id);
        }
    }
    // Second pass, after the records expired: a replay of 5% of the old ids.
    let mut late: Vec<u64> = (0..args.messages).filter(|_| rng.below(20) == 0).collect();
    for i in (1..late.len()).rev() {
        late.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let deliveries = first.len() + late.len();
    if let Err(e) = deliver(&consumer, args.workers, first).await {
        eprintln!("consumer: {e}");
        return ExitCode::FAILURE;
    }
    tokio::time::sleep(args.record_ttl * 2).await;
    if let Err(e) = deliver(&consumer, args.workers, late).await {
        eprintln!("consumer: {e}");
        return ExitCode::FAILURE;
    }

    let c = &consumer.counts;
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let ledger = consumer
        .ledger
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let stats = consumer.filter.stats();
    println!(
        "consumer: {} messages, {deliveries} deliveries, {} workers",
        args.messages, args.workers
    );
    println!("  processed once           {}", get(&c.credited));
    println!(
        "  duplicates skipped       {} (by the exact record, while it lived)",
        get(&c.duplicates_skipped)
    );
    println!(
        "  late duplicates caught   {} (record expired; the filter said maybe, the ledger confirmed)",
        get(&c.late_duplicates_caught)
    );
    println!(
        "  maybe, yet new           {} (false positives, or a twin that claimed first: credited)",
        get(&c.false_positives)
    );
    println!("  ledger lookups           {}", get(&c.ledger_lookups));
    println!("  redelivered after errors {}", get(&c.retried));
    println!(
        "  ledger lookups saved     {} (filter said definitely new)",
        get(&c.ledger_lookups_saved)
    );
    println!(
        "  filter                   {} bits ({} KiB), {} hashes; {} new, {} maybe",
        consumer.filter.size_bits(),
        consumer.filter.size_bits().div_ceil(8 * 1024),
        consumer.filter.hashes(),
        stats.new,
        stats.maybe
    );

    let mut broken = Vec::new();
    if let Some((id, n)) = ledger.iter().find(|(_, n)| **n != 1) {
        broken.push(format!("message {id} credited {n} times"));
    }
    if ledger.len() as u64 != args.messages {
        broken.push(format!(
            "{} of {} messages credited",
            ledger.len(),
            args.messages
        ));
    }
    if get(&c.credited) != args.messages {
        broken.push(format!(
            "{} credits reported for {} messages",
            get(&c.credited),
            args.messages
        ));
    }
    if broken.is_empty() {
        println!("OK: every message credited exactly once");
        ExitCode::SUCCESS
    } else {
        for b in broken {
            eprintln!("BROKEN: {b}");
        }
        ExitCode::FAILURE
    }
}
