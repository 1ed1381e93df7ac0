//! idem's load program as a library: the `idem-bench` binary (every case family, one
//! report) and `idem-bench-redis` and `idem-bench-sql` (one family each, for profiling)
//! are thin command lines over it.
//!
//! Wall-clock numbers on a shared machine move with its load; the report's header gives
//! the load average before and after, and every comparison is made within the same run.
//!
//! Modules, in three layers. No module imports one that imports it back: the kit imports
//! no family; a family imports the kit (and [`peers`], whose charge functions and stores
//! the others share) but never [`cases`]; `cases` imports the families.
//!
//! 1. the measuring kit: [`load`] (the load loop and its histogram), [`stats`] and
//!    [`runner`] (the Redis family's rows and fixed-time loop), [`args`] (the command
//!    line's options), [`work`] (the shared workload and the machine header), [`report`]
//!    (tables and `ratio` lines), [`chart`] (the SVG);
//! 2. one module per case family: [`peers`] (`memory` and `peers`), [`redis`], [`sql`],
//!    [`steps`] (a durable step against a raw write), [`durable`] (the 3-step workflow
//!    against the Rust durable-workflow libraries), [`recovery`] (abandoned calls finished
//!    by each library's recovery), [`consumer`], [`http`],
//!    [`guarantees`], [`scaling`], [`footprint`], [`replay`] (the `metrics` feature's cost,
//!    run by `bench/metrics-cost.sh` rather than by the load program);
//! 3. [`cases`]: every family wired in one place, and the full run. A new family is a
//!    module here and one line there.
#![forbid(unsafe_code)]

// The measuring kit.
pub mod args;
pub mod chart;
pub mod load;
pub mod report;
pub mod runner;
pub mod stats;
pub mod work;

// One module per case family.
pub mod consumer;
pub mod durable;
pub mod footprint;
pub mod guarantees;
pub mod http;
pub mod peers;
pub mod recovery;
pub mod redis;
pub mod replay;
pub mod scaling;
pub mod sql;
pub mod steps;

// Every family wired in one place.
pub mod cases;
