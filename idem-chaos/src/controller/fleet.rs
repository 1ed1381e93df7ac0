//! The worker processes: started with their settings in the environment, their
//! reports read from their output, killed, replaced, and stopped at the end.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::ledger::Ledger;
use crate::netns::Host;
use crate::worker;
use crate::{Fault, GRACE, Opts};

/// A worker process and what it last reported.
pub(super) struct Worker {
    pub(super) inc: i32,
    /// Its place: the same host (in a partition run) and store URL as its predecessor's.
    pub(super) slot: usize,
    pub(super) child: Child,
}

#[derive(Default)]
pub(super) struct Reports {
    /// The last `stat` line's numbers, per incarnation (the seventh: leases lost).
    stats: HashMap<i32, [u64; 7]>,
    pub(super) unexpected: Vec<String>,
}

impl Reports {
    /// The workers' `stat` numbers added up.
    pub(super) fn total(&self) -> [u64; 7] {
        let mut total = [0u64; 7];
        for s in self.stats.values() {
            for (t, v) in total.iter_mut().zip(s) {
                *t += v;
            }
        }
        total
    }
}

/// Where every worker slot reaches the store and the ledger.
pub(super) struct Places {
    /// The controller's own store URL (the final sweep's).
    pub(super) url: String,
    /// Per slot: the store URL and the host (partition runs).
    pub(super) slot_urls: Vec<String>,
    pub(super) slot_hosts: Vec<Option<Host>>,
    /// The ledger as workers reach it.
    pub(super) ledger_url: String,
    /// A partition run: workers on virtual hosts use small pools and short timeouts.
    pub(super) small: bool,
}

pub(super) struct Fleet {
    o: Opts,
    run: String,
    pub(super) url: String,
    slot_urls: Vec<String>,
    slot_hosts: Vec<Option<Host>>,
    ledger_url: String,
    history: PathBuf,
    small: bool,
    replicas: usize,
    keys: u64,
    until_ms: u64,
    next_inc: i32,
    pub(super) workers: Vec<Worker>,
    pub(super) reports: Arc<Mutex<Reports>>,
    pub(super) failed_starts: usize,
}

impl Fleet {
    /// The fleet of a run, with no worker started yet; workers stop calling
    /// `o.seconds` from now.
    pub(super) fn new(
        o: &Opts,
        run: &str,
        places: Places,
        history: &std::path::Path,
        replicas: usize,
        keys: u64,
    ) -> Fleet {
        Fleet {
            o: o.clone(),
            run: run.to_owned(),
            url: places.url,
            small: places.small,
            slot_urls: places.slot_urls,
            slot_hosts: places.slot_hosts,
            ledger_url: places.ledger_url,
            history: history.to_owned(),
            replicas,
            keys,
            until_ms: worker::now_ms() + o.seconds * 1000,
            next_inc: 1,
            workers: Vec::new(),
            reports: Arc::default(),
            failed_starts: 0,
        }
    }

    /// Starts a worker in `slot`; returns its incarnation.
    pub(super) fn spawn(&mut self, slot: usize) -> Result<i32, String> {
        let inc = self.next_inc;
        self.next_inc += 1;
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let exe = exe.to_str().ok_or("the program's path is not UTF-8")?;
        let mut cmd = match &self.slot_hosts[slot] {
            Some(h) => h.tokio_command(exe),
            None => Command::new(exe),
        };
        let mut child = cmd
            .arg("--worker")
            .env("IDEM_CHAOS_STORE", &self.slot_urls[slot])
            .env("IDEM_CHAOS_LEDGER", &self.ledger_url)
            .env("IDEM_CHAOS_HISTORY", &self.history)
            .env("IDEM_CHAOS_SMALL", u8::from(self.small).to_string())
            .env("IDEM_CHAOS_RUN", &self.run)
            .env("IDEM_CHAOS_INC", inc.to_string())
            .env("IDEM_CHAOS_KEYS", self.keys.to_string())
            .env("IDEM_CHAOS_TASKS", self.o.tasks.to_string())
            .env("IDEM_CHAOS_UNTIL", self.until_ms.to_string())
            .env("IDEM_CHAOS_REPLICAS", self.replicas.to_string())
            .env(
                "IDEM_CHAOS_SHORT_LEASE",
                if self.o.has(Fault::Netem) { "1" } else { "0" },
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
        self.workers.push(Worker { inc, slot, child });
        Ok(inc)
    }

    /// SIGKILLs worker `i` and records it; returns its slot.
    pub(super) async fn kill(&mut self, i: usize, ledger: &Ledger) -> Result<usize, String> {
        let mut w = self.workers.swap_remove(i);
        let _ = w.child.start_kill();
        let _ = w.child.wait().await;
        ledger.event("kill", w.inc).await?;
        Ok(w.slot)
    }

    /// Replaces workers that exited on their own before the end (counted); returns the
    /// new incarnations with their slots.
    pub(super) fn reap(&mut self) -> Result<Vec<(i32, usize)>, String> {
        let mut i = 0;
        let mut new = Vec::new();
        while i < self.workers.len() {
            if let Ok(Some(_)) = self.workers[i].child.try_wait() {
                let w = self.workers.swap_remove(i);
                if worker::now_ms() + 1000 < self.until_ms {
                    self.failed_starts += 1;
                    new.push((self.spawn(w.slot)?, w.slot));
                }
            } else {
                i += 1;
            }
        }
        Ok(new)
    }

    /// Waits for the workers to stop at the deadline by themselves, then kills (and
    /// records) any straggler; returns how many there were.
    pub(super) async fn stop(&mut self, ledger: &Ledger) -> Result<usize, String> {
        let grace = Instant::now() + GRACE;
        while !self.workers.is_empty() && Instant::now() < grace {
            let mut i = 0;
            while i < self.workers.len() {
                if let Ok(Some(_)) = self.workers[i].child.try_wait() {
                    self.workers.swap_remove(i);
                } else {
                    i += 1;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let stragglers = self.workers.len();
        while !self.workers.is_empty() {
            self.kill(0, ledger).await?;
        }
        Ok(stragglers)
    }
}
