//! What a recoverer can run: every function marked `recover` in the binary (collected at
//! link time, so marking one is the whole registration), the ones registered by hand,
//! and the dependencies they are given by type.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::store::BoxFuture;
use crate::{Error, Options};

/// How one recovery attempt of a function ended, as its entry reports it.
#[doc(hidden)]
#[derive(Debug)]
pub enum Ran {
    /// The call returned `Ok`: completed (or replayed, if someone else finished it).
    Done,
    /// The call returned `Err` (the body's, or idem's own: busy, a store down).
    Failed(String),
    /// The recorded arguments no longer decode into the function's parameters.
    Undecodable(String),
}

/// The dependencies a recoverer hands to the functions it runs, by type: the pool, the
/// client, the service a parameter named in `context = [...]` asks for.
#[derive(Default, Clone)]
pub struct Context {
    values: HashMap<TypeId, Arc<dyn Any + Send + Sync>>,
}

impl Context {
    /// Adds `value`, replacing one of the same type.
    pub fn insert<T: Send + Sync + 'static>(&mut self, value: T) {
        self.values.insert(TypeId::of::<T>(), Arc::new(value));
    }

    /// The value of type `T`, if one was provided.
    pub fn get<T: Send + Sync + 'static>(&self) -> Option<&T> {
        self.values.get(&TypeId::of::<T>())?.downcast_ref()
    }

    fn has(&self, ty: TypeId) -> bool {
        self.values.contains_key(&ty)
    }
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("values", &self.values.len())
            .finish()
    }
}

/// A function's context parameter: its type, and its name for messages.
#[doc(hidden)]
pub type Need = (fn() -> TypeId, &'static str);

/// The recovery entry of a function marked `recover`, as the attribute submits it.
#[doc(hidden)]
pub struct Recoverable {
    pub(crate) options: &'static Options,
    pub(crate) needs: &'static [Need],
    pub(crate) run: fn(Bytes, Arc<Context>) -> BoxFuture<'static, Ran>,
}

impl Recoverable {
    /// The entry of the function with `options`, which needs `needs` from the context.
    pub const fn new(
        options: &'static Options,
        needs: &'static [Need],
        run: fn(Bytes, Arc<Context>) -> BoxFuture<'static, Ran>,
    ) -> Self {
        Recoverable {
            options,
            needs,
            run,
        }
    }
}

inventory::collect!(Recoverable);

/// A function the recoverer knows: what runs one attempt from the recorded arguments.
pub(crate) type Entry = Arc<dyn Fn(Bytes, Arc<Context>) -> BoxFuture<'static, Ran> + Send + Sync>;

/// The functions a recoverer knows, by scope, with their options.
pub(crate) type Known = HashMap<&'static str, (Entry, &'static Options)>;

/// Every function marked `recover` in this binary, by scope, whose context `context`
/// can supply; the others are returned with the first type they lack.
pub(crate) fn linked(context: &Context) -> (Known, Vec<(&'static str, &'static str)>) {
    let mut known = HashMap::new();
    let mut lacking = Vec::new();
    for r in inventory::iter::<Recoverable> {
        if let Some((_, name)) = r.needs.iter().find(|(ty, _)| !context.has(ty())) {
            lacking.push((r.options.scope(), *name));
            continue;
        }
        let run = r.run;
        let entry: Entry = Arc::new(move |args, ctx| run(args, ctx));
        known.insert(r.options.scope(), (entry, r.options));
    }
    (known, lacking)
}

/// The arguments of a call, as recorded with its claim (the record codec: MessagePack,
/// fields by name).
#[doc(hidden)]
pub fn encode_args<A: Serialize + ?Sized>(key: &crate::Key, args: &A) -> Result<Bytes, Error> {
    let mut buf = Vec::with_capacity(64);
    rmp_serde::encode::write_named(&mut buf, args).map_err(|e| Error::Codec {
        key: *key,
        message: format!("the call's arguments do not serialize for recovery: {e}"),
    })?;
    Ok(Bytes::from(buf))
}

/// The arguments recorded by [`encode_args`], decoded; the error says why not.
#[doc(hidden)]
pub fn decode_args<A: DeserializeOwned>(bytes: &[u8]) -> Result<A, String> {
    rmp_serde::from_slice(bytes).map_err(|e| {
        format!("the recorded arguments do not decode into the function's parameters: {e}")
    })
}

/// How a recovered call's result counts.
#[doc(hidden)]
pub fn ran<T, E: fmt::Display>(result: Result<T, E>) -> Ran {
    match result {
        Ok(_) => Ran::Done,
        Err(e) => Ran::Failed(e.to_string()),
    }
}

/// A hand-registered function (see [`Recoverer::register`](super::Recoverer::register)).
pub(crate) fn entry<A, F, Fut, T, E>(f: F) -> Entry
where
    A: DeserializeOwned + Send + 'static,
    F: Fn(A, Arc<Context>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<T, E>> + Send + 'static,
    E: fmt::Display,
{
    let f = Arc::new(f);
    Arc::new(move |args: Bytes, ctx| {
        let f = f.clone();
        Box::pin(async move {
            match decode_args::<A>(&args) {
                Ok(a) => ran(f(a, ctx).await),
                Err(e) => Ran::Undecodable(e),
            }
        })
    })
}
