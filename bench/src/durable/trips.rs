//! Round trips and commits per workflow, counted on the wire rather than guessed.
//!
//! A process of its own (`idem-bench --durable-trips-child URL`, so no library's
//! connections or background tasks meet the timed ones) starts every library against a
//! small PostgreSQL proxy in the same process, runs workflows one at a time, and counts
//! what the server answered:
//!
//! - a round trip is one `ReadyForQuery`: the server sends one per `Sync` (a pipelined
//!   Parse/Bind/Execute, a ping) or simple query, so it closes exactly one
//!   request-response exchange;
//! - an empty round trip is one with no command completed: a ping (sqlx pings every
//!   connection as it goes back to its pool, off the caller's path, and, in pools left
//!   on sqlx's default `test_before_acquire`, again before handing it out, on the path),
//!   the describe step of a statement not yet prepared, or the close of one evicted
//!   from the connection's statement cache;
//! - a commit is a `COMMIT`, or a statement that wrote rows (`INSERT`/`UPDATE`/`DELETE`
//!   with a count above 0) outside a transaction block. A write hidden in a `SELECT`
//!   (a CTE) is not seen; the docs add those from the libraries' sources.
//!
//! The libraries' background work (queue pollers, heartbeats) goes through the proxy too:
//! it is measured while nothing runs and subtracted. The steps' effects go straight to
//! the server (they are the bench's, not a library's), except inside a transactional step.
//! The connection goes without TLS so the proxy can read it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::flow::Effects;
use crate::args::Args;
use crate::load;
use crate::report::Report;

#[derive(Default)]
struct Counts {
    trips: AtomicU64,
    empty: AtomicU64,
    commits: AtomicU64,
}

#[derive(Debug, Clone, Copy, Default)]
struct Snapshot {
    trips: f64,
    empty: f64,
    commits: f64,
}

impl Counts {
    fn snapshot(&self) -> Snapshot {
        Snapshot {
            trips: self.trips.load(Ordering::Relaxed) as f64,
            empty: self.empty.load(Ordering::Relaxed) as f64,
            commits: self.commits.load(Ordering::Relaxed) as f64,
        }
    }
}

impl std::ops::Sub for Snapshot {
    type Output = Snapshot;
    fn sub(self, o: Snapshot) -> Snapshot {
        Snapshot {
            trips: self.trips - o.trips,
            empty: self.empty - o.empty,
            commits: self.commits - o.commits,
        }
    }
}

impl Snapshot {
    fn scale(self, k: f64) -> Snapshot {
        Snapshot {
            trips: self.trips * k,
            empty: self.empty * k,
            commits: self.commits * k,
        }
    }
}

/// Starts the proxy in front of `upstream` (`host:port`); returns its address.
async fn proxy(upstream: String, counts: Arc<Counts>) -> std::io::Result<String> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?.to_string();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let (upstream, counts) = (upstream.clone(), counts.clone());
            tokio::spawn(async move {
                if let Ok(server) = TcpStream::connect(&upstream).await {
                    relay(client, server, counts).await;
                }
            });
        }
    });
    Ok(addr)
}

/// Copies both ways; reads the server's messages as they pass.
async fn relay(client: TcpStream, server: TcpStream, counts: Arc<Counts>) {
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let up = tokio::spawn(async move {
        let mut buf = vec![0u8; 16 * 1024];
        while let Ok(n) = cr.read(&mut buf).await {
            if n == 0 || sw.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
    });
    let mut buf = vec![0u8; 16 * 1024];
    let mut parser = Parser::default();
    while let Ok(n) = sr.read(&mut buf).await {
        if n == 0 {
            break;
        }
        parser.feed(&buf[..n], &counts);
        if cw.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    up.abort();
}

/// The server's side of the protocol, message by message (type byte, length, body); with
/// TLS off every server message has that framing, from the start-up's answer on.
#[derive(Default)]
struct Parser {
    pending: Vec<u8>,
    completed_since_ready: bool,
    wrote: bool,
}

impl Parser {
    fn feed(&mut self, bytes: &[u8], counts: &Counts) {
        self.pending.extend_from_slice(bytes);
        let mut at = 0;
        while self.pending.len() >= at + 5 {
            let kind = self.pending[at];
            let len = u32::from_be_bytes([
                self.pending[at + 1],
                self.pending[at + 2],
                self.pending[at + 3],
                self.pending[at + 4],
            ]) as usize;
            if self.pending.len() < at + 1 + len {
                break;
            }
            let body = &self.pending[at + 5..at + 1 + len];
            match kind {
                b'C' => {
                    self.completed_since_ready = true;
                    let tag = String::from_utf8_lossy(body.strip_suffix(&[0]).unwrap_or(body));
                    let word = tag.split(' ').next().unwrap_or("");
                    let rows: u64 = tag
                        .rsplit(' ')
                        .next()
                        .and_then(|n| n.parse().ok())
                        .unwrap_or(0);
                    match word {
                        "COMMIT" => {
                            counts.commits.fetch_add(1, Ordering::Relaxed);
                            self.wrote = false;
                        }
                        "ROLLBACK" => self.wrote = false,
                        "INSERT" | "UPDATE" | "DELETE" | "MERGE" if rows > 0 => self.wrote = true,
                        _ => {}
                    }
                }
                b'Z' => {
                    counts.trips.fetch_add(1, Ordering::Relaxed);
                    if !self.completed_since_ready {
                        counts.empty.fetch_add(1, Ordering::Relaxed);
                    }
                    // `I`: idle, outside a transaction block: a write so far committed alone.
                    if body.first() == Some(&b'I') && self.wrote {
                        counts.commits.fetch_add(1, Ordering::Relaxed);
                        self.wrote = false;
                    }
                    self.completed_since_ready = false;
                }
                _ => {}
            }
            at += 1 + len;
        }
        self.pending.drain(..at);
    }
}

/// The `host:port` a `postgres://` URL names (5432 if it names no port).
fn upstream(url: &str) -> Option<String> {
    let (_, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?']).next()?;
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    Some(if host.contains(':') {
        host.to_owned()
    } else {
        format!("{host}:5432")
    })
}

/// `url` with its host and port replaced by `addr`, and TLS off (so the proxy can read).
fn through(url: &str, addr: &str) -> Option<String> {
    let host = upstream(url)?;
    let url = if url.contains(&host) {
        url.replacen(&host, addr, 1)
    } else {
        // No port written: the host alone.
        url.replacen(host.trim_end_matches(":5432"), addr, 1)
    };
    let sep = if url.contains('?') { '&' } else { '?' };
    Some(format!("{url}{sep}sslmode=disable"))
}

/// How many workflows each library runs while counted.
const RUNS: u64 = 30;

/// How many (new, duplicate) pairs each library runs before it is counted: enough for
/// every connection of a 16-connection pool to have prepared its statements.
const WARM: u64 = 50;

/// The child process: counts, and prints one tab-separated `trips` line per library.
pub(crate) async fn child(url: &str) -> Result<(), String> {
    let counts = Arc::new(Counts::default());
    let upstream = upstream(url).ok_or("not a URL")?;
    let addr = proxy(upstream, counts.clone())
        .await
        .map_err(|e| format!("proxy: {e}"))?;
    let counted = through(url, &addr).ok_or("not a URL")?;
    let effects = Effects::connect(url).await.map_err(|e| e.0)?;
    let args = Args {
        sql: vec![counted.clone()],
        ..Args::default()
    };
    let mut report = Report::default();
    let mut running = super::Running::default();
    let tag = load::run_tag();
    let cases = super::start(&args, &counted, &effects, tag, &mut report, &mut running).await;
    for note in &report.notes {
        eprintln!("trips child: {note}");
    }
    // The background rate, all libraries idle.
    let idle_for = Duration::from_secs(2);
    let before = counts.snapshot();
    tokio::time::sleep(idle_for).await;
    let idle = (counts.snapshot() - before).scale(1.0 / idle_for.as_secs_f64());
    for case in &cases {
        // Right before counting (idem pings a connection idle for 5 s): connections
        // opened and statements prepared on each pooled connection, as in a warm service.
        for _ in 0..WARM {
            let n = load::fresh_id();
            let _ = case.flow.run(n).await;
            let _ = case.flow.run(n).await;
        }
        let ids: Vec<u64> = (0..RUNS).map(|_| load::fresh_id()).collect();
        let (new, t_new) = counted_runs(&counts, &ids, case).await?;
        let (replay, t_replay) = counted_runs(&counts, &ids, case).await?;
        // Background traffic is bursty: a subtraction a little past zero is zero.
        let per = |s: Snapshot, t: f64| {
            let d = (s - idle.scale(t)).scale(1.0 / RUNS as f64);
            Snapshot {
                trips: d.trips.max(0.0),
                empty: d.empty.max(0.0),
                commits: d.commits.max(0.0),
            }
        };
        let (new, replay) = (per(new, t_new), per(replay, t_replay));
        println!(
            "trips\t{}\t{:.1}\t{:.1}\t{:.1}\t{:.1}\t{:.1}",
            case.label, new.trips, new.empty, new.commits, replay.trips, replay.commits
        );
    }
    super::stop(running, &effects, tag).await;
    for case in &cases {
        effects.forget(&case.sh.lib).await;
    }
    Ok(())
}

async fn counted_runs(
    counts: &Counts,
    ids: &[u64],
    case: &super::Case,
) -> Result<(Snapshot, f64), String> {
    let before = counts.snapshot();
    let t0 = Instant::now();
    for &n in ids {
        case.flow
            .run(n)
            .await
            .map_err(|e| format!("{}: {e}", case.label))?;
    }
    let secs = t0.elapsed().as_secs_f64();
    // Let the last answers pass the proxy before reading.
    tokio::time::sleep(Duration::from_millis(20)).await;
    Ok((counts.snapshot() - before, secs))
}

/// Runs the child and turns its lines into the report's section.
pub(crate) async fn run(url: &str, report: &mut Report) {
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            report.note(format!("durable: round trips not counted: {e}"));
            return;
        }
    };
    let out = tokio::process::Command::new(exe)
        .arg("--durable-trips-child")
        .arg(url)
        .output()
        .await;
    let out = match out {
        Ok(o) if o.status.success() => o,
        Ok(o) => {
            report.note(format!(
                "durable: round-trip count failed: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ));
            return;
        }
        Err(e) => {
            report.note(format!("durable: round-trip count failed: {e}"));
            return;
        }
    };
    let mut rows = vec![
        [
            "library",
            "round trips / new workflow",
            "of which empty (ping, prepare, close)",
            "commits that wrote",
            "round trips / replay",
            "commits / replay",
        ]
        .map(str::to_owned)
        .to_vec(),
    ];
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let cols: Vec<&str> = line.split('\t').collect();
        if cols.len() == 7 && cols[0] == "trips" {
            rows.push(cols[1..].iter().map(|c| (*c).to_owned()).collect());
        }
    }
    let mut body = crate::report::markdown_table(&rows, &[false, true, true, true, true, true]);
    body.push_str(&format!(
        "\nCounted on the wire by a proxy in a process of its own, {RUNS} workflows one at a \
         time, the libraries' idle background traffic subtracted. Effects of plain steps go \
         to the server directly and are not counted; the inserts of transactional steps are. \
         A write inside a `SELECT` (a CTE) is not seen as a commit.\n"
    ));
    report.section(
        "Round trips and commits per workflow (`--cases durable`)",
        body,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server message: type byte, length (itself included), body.
    fn msg(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut m = vec![kind];
        m.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
        m.extend_from_slice(body);
        m
    }

    fn complete(tag: &str) -> Vec<u8> {
        msg(b'C', format!("{tag}\0").as_bytes())
    }

    #[test]
    fn counts_exchanges_empty_ones_and_commits_across_split_reads() {
        let counts = Counts::default();
        let mut p = Parser::default();
        let mut wire = Vec::new();
        // A ping: ReadyForQuery alone.
        wire.extend(msg(b'Z', b"I"));
        // An autocommit insert that wrote a row.
        wire.extend(complete("INSERT 0 1"));
        wire.extend(msg(b'Z', b"I"));
        // An update that matched nothing: no commit that wrote.
        wire.extend(complete("UPDATE 0"));
        wire.extend(msg(b'Z', b"I"));
        // A transaction: BEGIN, UPDATE 1, COMMIT: one commit, not two.
        wire.extend(complete("BEGIN"));
        wire.extend(msg(b'Z', b"T"));
        wire.extend(complete("UPDATE 1"));
        wire.extend(msg(b'Z', b"T"));
        wire.extend(complete("COMMIT"));
        wire.extend(msg(b'Z', b"I"));
        // Fed in uneven pieces, as TCP delivers them.
        for chunk in wire.chunks(3) {
            p.feed(chunk, &counts);
        }
        let s = counts.snapshot();
        assert_eq!(s.trips, 6.0);
        assert_eq!(s.empty, 1.0);
        assert_eq!(s.commits, 2.0);
    }

    #[test]
    fn a_url_is_pointed_at_the_proxy_without_tls() {
        assert_eq!(
            upstream("postgres://postgres@127.0.0.1:5432/test").as_deref(),
            Some("127.0.0.1:5432")
        );
        assert_eq!(
            through("postgres://postgres@127.0.0.1:5432/test", "127.0.0.1:9").as_deref(),
            Some("postgres://postgres@127.0.0.1:9/test?sslmode=disable")
        );
        assert_eq!(
            through("postgres://db.local/test?application_name=x", "127.0.0.1:9").as_deref(),
            Some("postgres://127.0.0.1:9/test?application_name=x&sslmode=disable")
        );
    }
}
