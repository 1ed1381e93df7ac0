//! The cases, as plain async functions of a store, one file per concept.

use super::*;

mod cancel;
mod dedup;
mod inspect;
mod lease;
mod lock;
mod recovery;
mod step_edges;
mod steps;
mod token;
pub mod toolbox;

static DEDUP: Options = Options::dedup("conformance::dedup");

crate::__conformance_cases!([export_cases]);
