//! An `Idempotency-Key` layer for tower and axum services, on any idem store.
#![forbid(unsafe_code)]
#![deny(missing_docs)]
