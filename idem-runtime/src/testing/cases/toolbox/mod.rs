//! Conformance cases of the toolbox primitives: versioned values, state-machine moves
//! and Bloom bitmaps. Run them with `toolbox_conformance_tests!`; a store that does not
//! implement these primitives yet still passes `conformance_tests!`.

use std::collections::HashMap;
use std::sync::Mutex;

use super::*;
use crate::store::{Settle, TransitionOutcome, TransitionRequest};
use crate::toolbox::retry_on_conflict;
use crate::toolbox::{BloomFilter, Moved, Optimistic, Retry, StateMachine, Verdict};

mod bloom;
mod state_machine;
mod versioned;

crate::__toolbox_conformance_cases!([export_cases]);
