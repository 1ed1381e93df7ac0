//! How an expansion picks a clone-replay for its `Ok` type without a bound on it.

use std::marker::PhantomData;

use crate::codec::CloneReplay;

/// Picks [`CloneReplay`](crate::codec::CloneReplay) for a type that supports it, at compile time, without a bound
/// on the caller: `(&&Probe::<T>::NEW).clone_replay()` resolves to [`ByClone`] when
/// `T: Clone + Send + Sync + 'static` and to [`ByDecode`] otherwise (method lookup tries
/// the receiver `&&Probe<T>` before auto-dereferencing it to `&Probe<T>`).
#[doc(hidden)]
pub struct Probe<T>(PhantomData<fn() -> T>);

impl<T> Probe<T> {
    #[doc(hidden)]
    pub const NEW: Self = Probe(PhantomData);
}

#[doc(hidden)]
pub trait ByClone<T> {
    fn clone_replay(&self) -> Option<CloneReplay<T>>;
}

impl<T: Clone + Send + Sync + 'static> ByClone<T> for &Probe<T> {
    fn clone_replay(&self) -> Option<CloneReplay<T>> {
        Some(CloneReplay::new())
    }
}

#[doc(hidden)]
pub trait ByDecode<T> {
    fn clone_replay(&self) -> Option<CloneReplay<T>>;
}

impl<T> ByDecode<T> for Probe<T> {
    fn clone_replay(&self) -> Option<CloneReplay<T>> {
        None
    }
}
