//! `transaction = ...` without a SQL feature: the expansion still type-checks against
//! these, and fails with a message that says which feature to enable.

use crate::{Error, Fingerprint, Idem, Key, Options};

#[diagnostic::on_unimplemented(
    message = "`transaction = ...` needs a SQL store: enable idem-runtime's feature \
               `postgres`, `mysql` or `sqlite`"
)]
pub trait SqlFeature {}

pub enum TxBegun<R> {
    Replayed(R),
    Claimed(TxClaim),
}

pub struct TxClaim;

const NO_SQL: Error = Error::Unsupported("transactional mode without a SQL feature");

pub async fn tx_begin<C, X: SqlFeature + ?Sized, T, E>(
    _: &Idem,
    _: &Options,
    _: &mut X,
    _: Key,
    _: Option<Fingerprint>,
) -> Result<TxBegun<Result<T, E>>, Error> {
    Err(NO_SQL)
}

pub async fn tx_end<C, X: SqlFeature + ?Sized, T, E>(
    _: &Idem,
    _: &Options,
    _: TxClaim,
    _: &mut X,
    _: &Result<T, E>,
) -> Result<(), Error> {
    Err(NO_SQL)
}
