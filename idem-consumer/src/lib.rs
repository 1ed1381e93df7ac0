//! Exactly-once effects for broker consumers, on any idem store.
#![forbid(unsafe_code)]
#![deny(missing_docs)]
