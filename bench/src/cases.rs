//! Every case family of the load program, wired in one place: [`FAMILIES`].
//!
//! A family is a module with `pub(crate) async fn run(args: &Args, report: &mut Report)`
//! that measures its cases and adds rows, ratio lines and sections to the report; a
//! family whose store is not on the command line returns without adding anything. To add
//! one, write its module (declared in `lib.rs`) and give it a line here: `--cases`, the
//! usage text and the full run all read this list.

use futures_util::future::LocalBoxFuture;

use crate::args::Args;
use crate::report::Report;
use crate::{
    consumer, durable, footprint, guarantees, http, peers, recovery, redis, scaling, sql, steps,
    work,
};

/// One case family.
pub struct Family {
    /// Its name on the command line (`--cases NAME,…`).
    pub name: &'static str,
    /// What it measures, for the usage text.
    pub about: &'static str,
    run: for<'a> fn(&'a Args, &'a mut Report) -> LocalBoxFuture<'a, ()>,
}

/// Every family, in the order a full run takes them.
pub const FAMILIES: &[Family] = &[
    Family {
        name: "memory",
        about: "#[idempotent] on MemoryStore beside cached's #[cached] and #[concurrent_cached]",
        run: |a, r| Box::pin(peers::memory(a, r)),
    },
    Family {
        name: "redis",
        about: "idem on RedisStore against raw SET NX PX (+ DEL) on the same connections",
        run: |a, r| Box::pin(redis::run(a, r)),
    },
    Family {
        name: "peers",
        about: "idem beside cached, rslock and a hand-written SET NX PX + GET dedup",
        run: |a, r| Box::pin(peers::run(a, r)),
    },
    Family {
        name: "sql",
        about: "idem on SqlStore against a raw INSERT … ON CONFLICT DO NOTHING, per --sql",
        run: |a, r| Box::pin(sql::run(a, r)),
    },
    Family {
        name: "steps",
        about: "a durable step against a raw write of the same store, same connections (memory, --redis, postgres --sql)",
        run: |a, r| Box::pin(steps::run(a, r)),
    },
    Family {
        name: "durable",
        about: "a 3-step workflow in idem (postgres, redis) beside DBOS, durare and durable-rust on the same postgres --sql",
        run: |a, r| Box::pin(durable::run(a, r)),
    },
    Family {
        name: "recovery",
        about: "N calls abandoned after step 2 by a killed process, finished by idem's recoverer (postgres, redis), DBOS's relaunch and durare's recover",
        run: |a, r| Box::pin(recovery::run(a, r)),
    },
    Family {
        name: "consumer",
        about: "idem's consumer rules against a bare ack-only consumer on NATS, RabbitMQ, Redis Streams and MQTT",
        run: |a, r| Box::pin(consumer::run(a, r)),
    },
    Family {
        name: "http",
        about: "requests/s through idem-http's layer against the same axum app without it",
        run: |a, r| Box::pin(http::run(a, r)),
    },
    Family {
        name: "guarantees",
        about: "body executions under concurrent duplicates, crashes and slow bodies",
        run: |a, r| Box::pin(guarantees::run(a, r)),
    },
    Family {
        name: "scaling",
        about: "throughput from 1 to 256 tasks (the chart's series)",
        run: |a, r| Box::pin(scaling::run(a, r)),
    },
    Family {
        name: "footprint",
        about: "bytes per completed record",
        run: |a, r| Box::pin(footprint::run(a, r)),
    },
];

/// The family called `name`.
pub fn family(name: &str) -> Option<&'static Family> {
    FAMILIES.iter().find(|f| f.name == name)
}

/// Runs every family `args` asks for and returns the report: the machine header first,
/// the load average at the end.
pub async fn run(args: &Args) -> Report {
    let mut report = Report::default();
    let header = work::machine(args).await;
    report.section("Machine and run", header);
    for f in FAMILIES.iter().filter(|f| args.wants(f.name)) {
        eprintln!("== {}", f.name);
        (f.run)(args, &mut report).await;
    }
    report.note(format!(
        "load average at the end of the run: {}",
        work::loadavg()
    ));
    report
}
