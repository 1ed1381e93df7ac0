//! The controller: starts the store (when it is ours), the ledger and the workers; kills
//! and replaces workers at random; restarts, fails over or cuts the store, or partitions
//! the network (`--faults partition`); at the end heals everything, lets the leases
//! pass, calls every key once more, checks the ledger and the history and prints the
//! summary.

mod backend;
mod faults;
mod fleet;
mod lab;
mod summary;

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;

use self::backend::Backend;
use self::faults::Schedule;
use self::fleet::{Fleet, Places};
use self::lab::{Lab, rehost};
use self::summary::Ending;
use crate::check::check;
use crate::ledger::{History, Ledger};
use crate::proxy::Proxy;
use crate::rng::Rng;
use crate::worker::{self, LEASE, Outcome};
use crate::{Fault, Opts};

/// Runs the whole chaos run; returns the number of violations.
pub(crate) async fn run(mut o: Opts) -> Result<usize, String> {
    if o.has(Fault::Netem)
        && let Some(why) = no_netem(&o)
    {
        if !o.all_faults {
            return Err(format!("--faults netem: {why}"));
        }
        println!("--faults all: netem skipped: {why}");
        o.faults.retain(|&f| f != Fault::Netem);
    }
    let run = format!(
        "idem_chaos_{}_{}",
        std::process::id(),
        worker::now_ms() % 1_000_000_000
    );
    // `--faults netem` on a URL store: the proxy first, so that a partition run's
    // forwarder leads the workers into it.
    let mut netem = if o.has(Fault::Netem) && o.store.contains("://") {
        Some(crate::proxy::netem(&o.store, o.seed).await?.0)
    } else {
        None
    };
    let mut lab = if o.has(Fault::Partition) {
        let through = netem
            .as_ref()
            .map(|p| SocketAddr::from((Ipv4Addr::LOCALHOST, p.port)));
        Some(Lab::start(&o, through).await?)
    } else {
        None
    };
    let mut backend = Backend::start(&o, &run, lab.as_ref())?;
    if o.has(Fault::Netem) && netem.is_none() {
        // `redis-aof` (no partitions): in front of its private server.
        netem = Some(crate::proxy::netem(&backend.url(), o.seed).await?.0);
    }
    let replicas = usize::from(o.store == "redis-sentinel" && !o.no_wait);
    let history = std::env::temp_dir().join(format!("{run}_history"));
    std::fs::create_dir_all(&history).map_err(|e| format!("{}: {e}", history.display()))?;
    let ledger = Ledger::open(&o.ledger, &run, 8).await?;
    ledger.create().await?;
    // On an error too, the servers, workers and namespaces are dropped below; a run
    // killed by a signal leaves its namespaces to the next run's `remove_stale`.
    let result = chaos(
        &o,
        &run,
        &mut backend,
        lab.as_mut(),
        netem.as_ref(),
        replicas,
        &ledger,
        &history,
    )
    .await;
    if !o.keep {
        let _ = ledger.drop_tables().await;
        let _ = std::fs::remove_dir_all(&history);
    } else {
        println!("history kept in {}", history.display());
    }
    drop(backend);
    drop(lab);
    drop(netem);
    result
}

/// Why `--faults netem` cannot run on this store, if it cannot: its proxy stands in
/// front of one server the controller can reach.
fn no_netem(o: &Opts) -> Option<String> {
    match o.store.as_str() {
        "redis-sentinel" => Some(
            "the proxy needs a single-host store, and Sentinel hands the workers its servers' own addresses"
                .into(),
        ),
        "redis-aof" if o.has(Fault::Partition) => Some(
            "with partitions, redis-aof's server is on a virtual host, out of the proxy's way"
                .into(),
        ),
        "redis-aof" => None,
        url => crate::proxy::through(url)
            .is_none()
            .then(|| format!("{url} is not a single-host URL")),
    }
}
/// The run itself: the workers started, the faults made until the deadline, everything
/// healed and stopped, every key called once more, the ledger and history checked.
#[allow(clippy::too_many_arguments)]
async fn chaos(
    o: &Opts,
    run: &str,
    backend: &mut Backend,
    mut lab: Option<&mut Lab>,
    netem: Option<&Proxy>,
    replicas: usize,
    ledger: &Ledger,
    history: &std::path::Path,
) -> Result<usize, String> {
    let keys = o.keys.unwrap_or(o.seconds * 100).max(100);
    let started = Instant::now();
    let places = places(o, backend, lab.as_deref(), netem)?;
    let mut fleet = Fleet::new(o, run, places, history, replicas, keys);
    println!("{}", summary::opening(o, backend, replicas, keys));
    for slot in 0..o.workers {
        fleet.spawn(slot)?;
    }
    let mut schedule = Schedule::new(o, started + Duration::from_secs(o.seconds));
    while Instant::now() < schedule.end {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut new = fleet.reap()?;
        let now = Instant::now();
        new.extend(schedule.kill(now, &mut fleet, ledger).await?);
        if let Some(lab) = lab.as_deref_mut() {
            schedule
                .partition(now, o, backend, lab, &fleet, ledger, new)
                .await?;
        } else {
            schedule.store_fault(now, backend, ledger, run).await?;
        }
        schedule.pause(now, o, &fleet, ledger);
    }
    schedule.resume_all().await?;
    if let Some(lab) = lab.as_deref_mut() {
        lab.heal(&fleet, ledger).await?;
    }
    // Workers stop at the deadline by themselves; a straggler is killed (and recorded).
    let stragglers = fleet.stop(ledger).await?;
    // Every claim a killed or cut worker left ends with its lease, and a recoverer (the
    // controller's, as a surviving process would run one) finishes it: none may be left
    // recoverable after lease + interval + slack. Then each key is called once more and
    // must answer.
    let sweep_history = Arc::new(History::create(&history.display().to_string(), 0)?);
    let unrecovered = recover(
        &fleet.url,
        replicas,
        run,
        ledger,
        &sweep_history,
        lab.is_some(),
    )
    .await?;
    let (stuck, unanswered) = sweep(
        &fleet.url,
        replicas,
        run,
        ledger,
        &sweep_history,
        keys,
        lab.is_some(),
    )
    .await?;
    let contents = ledger.contents(history).await?;
    let verdict = check(&contents, replicas == 0 && o.store == "redis-sentinel");
    let ending = Ending {
        stuck,
        unanswered,
        stragglers,
        unrecovered,
    };
    Ok(summary::print(
        o,
        &fleet,
        lab.as_deref(),
        netem,
        &schedule,
        &ending,
        &contents,
        &verdict,
    ))
}

/// Where the workers reach the store and the ledger. `--faults netem`: through the
/// slow, lossy proxy (in a partition run, through their forwarder and then the proxy);
/// the final sweep goes direct.
fn places(
    o: &Opts,
    backend: &Backend,
    lab: Option<&Lab>,
    netem: Option<&Proxy>,
) -> Result<Places, String> {
    let slot_urls = (0..o.workers)
        .map(|i| match (netem, lab) {
            (Some(p), None) => rehost(&backend.url(), Ipv4Addr::LOCALHOST, p.port),
            (_, lab) => backend.worker_url(i, lab),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let ledger_url = match lab {
        Some(l) => rehost(&o.ledger, l.net.root_addr(), l.ledger_fwd.port)?,
        None => o.ledger.clone(),
    };
    Ok(Places {
        url: backend.url(),
        slot_urls,
        slot_hosts: (0..o.workers)
            .map(|i| lab.map(|l| l.slots[i].clone()))
            .collect(),
        ledger_url,
        small: lab.is_some(),
    })
}

/// After the last fault: a recoverer runs for the lease, its interval and a slack, and
/// the calls then left recoverable in the store's index (not parked) are returned.
async fn recover(
    url: &str,
    replicas: usize,
    run: &str,
    ledger: &Ledger,
    history: &Arc<History>,
    small: bool,
) -> Result<Vec<String>, String> {
    let (idem, watched) = worker::open(url, replicas, run, small).await?;
    let recoverer = worker::recoverer(&idem, &watched, ledger, history, 0)?;
    let index = idem
        .store()
        .recovery()
        .ok_or("the store keeps no recovery index")?;
    let deadline = Instant::now() + LEASE + worker::RECOVERY_INTERVAL + RECOVERY_SLACK;
    let mut left = Vec::new();
    // Bounded by the deadline; a listing that fails is tried again until then.
    while Instant::now() < deadline {
        tokio::time::sleep(worker::RECOVERY_INTERVAL).await;
        match index.list(Some(run), 10_000).await {
            Ok(calls) => {
                left = calls
                    .iter()
                    .filter(|c| c.parked.is_none())
                    .map(|c| format!("{} ({} attempts)", c.scope, c.attempts))
                    .collect();
                if left.is_empty() {
                    break;
                }
            }
            Err(e) => left = vec![format!("the index could not be listed: {e}")],
        }
    }
    let done = recoverer.shutdown().await;
    println!(
        "recovery: {} abandoned payments finished by the controller's recoverer, {} left",
        done.recovered,
        left.len()
    );
    Ok(left)
}

/// How long past the lease and the interval a recoverer may take to finish what a
/// killed run left.
const RECOVERY_SLACK: Duration = Duration::from_secs(5);

/// The final sweep: every key called once more, retried past store errors; returns the
/// keys still in progress and those the store never answered.
async fn sweep(
    url: &str,
    replicas: usize,
    run: &str,
    ledger: &Ledger,
    history: &History,
    keys: u64,
    small: bool,
) -> Result<(usize, Vec<String>), String> {
    let (idem, watched) = worker::open(url, replicas, run, small).await?;
    let outcomes: Vec<(u64, Option<Outcome>)> = futures_util::stream::iter(0..keys)
        .map(|k| {
            let (idem, watched, ledger) = (idem.clone(), watched.clone(), ledger.clone());
            async move {
                let mut rng = Rng::new(k);
                for _ in 0..40 {
                    match worker::pay(&idem, &watched, &ledger, history, 0, k, &mut rng).await {
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
#[cfg(test)]
mod tests {
    use super::lab::host_port;
    use super::*;

    #[test]
    fn netem_goes_only_in_front_of_one_server() {
        let o = |s: &str| crate::parse(&s.split(' ').map(str::to_owned).collect::<Vec<_>>());
        for ok in [
            "--store redis://127.0.0.1:6379 --faults all",
            "--store postgres://postgres@127.0.0.1:5432/test --faults netem",
            "--store redis-aof --faults netem,pause",
        ] {
            assert!(no_netem(&o(ok).unwrap()).is_none(), "{ok}");
        }
        for skipped in [
            "--store redis-sentinel --faults all",
            "--store redis-aof --faults all",
            "--store redis+sentinel://127.0.0.1:1,127.0.0.1:2/svc --faults netem",
        ] {
            assert!(no_netem(&o(skipped).unwrap()).is_some(), "{skipped}");
        }
    }

    #[test]
    fn urls_are_rehosted_onto_the_forwarder() {
        let pg = "postgres://postgres@127.0.0.1:5432/test?application_name=x";
        assert_eq!(host_port(pg).unwrap(), ("127.0.0.1".to_owned(), 5432));
        assert_eq!(
            rehost(pg, Ipv4Addr::new(198, 18, 3, 1), 4000).unwrap(),
            "postgres://postgres@198.18.3.1:4000/test?application_name=x"
        );
        assert_eq!(
            host_port("redis://127.0.0.1").unwrap(),
            ("127.0.0.1".to_owned(), 6379)
        );
        assert_eq!(
            rehost("redis://127.0.0.1:6379", Ipv4Addr::new(198, 18, 3, 1), 7).unwrap(),
            "redis://198.18.3.1:7"
        );
        assert_eq!(
            host_port("redis://[::1]:6380/0").unwrap(),
            ("::1".to_owned(), 6380)
        );
    }
}
