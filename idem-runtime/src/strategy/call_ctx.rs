//! What a claimed body knows of its own call: the key it holds, from which
//! [`call_key`] derives a downstream idempotency key, the keys its task already
//! holds, so that a function calling itself with its own key fails at once instead of
//! waiting for itself. (Its durable steps keep a frame of their own: see
//! [`super::step::frame`].)

use std::future::Future;
use std::sync::Arc;

use crate::Key;

tokio::task_local! {
    static CALL: Frame;
}

/// The claim a body runs under, and the claims of the bodies it runs inside (in the
/// same task).
pub(crate) struct Frame {
    key: Key,
    /// Whether the call's effect is meant to happen once (dedup, token), so that a
    /// downstream key makes sense; a lock's body runs again on every call.
    once: bool,
    outer: Option<Arc<Link>>,
}

/// A claim of a call that a body runs inside (in the same task): its key, and the claims
/// around it in turn.
struct Link {
    key: Key,
    outer: Option<Arc<Link>>,
}

/// `body`, run with `key` as the claim its task holds. The frames of calls nested in
/// one task are chained, which costs an allocation only to a nested call.
pub(crate) fn scope<F: Future>(key: Key, once: bool, body: F) -> impl Future<Output = F::Output> {
    let outer = CALL
        .try_with(|f| {
            Arc::new(Link {
                key: f.key,
                outer: f.outer.clone(),
            })
        })
        .ok();
    CALL.scope(Frame { key, once, outer }, body)
}

/// Whether a body running in this task already holds `key`: claiming it again could
/// only wait for itself (until `wait` ran out, or the lease of a body that never ends).
/// Asked only when a key is found busy, so an uncontended call never looks.
pub(crate) fn held_here(key: &Key) -> bool {
    CALL.try_with(|f| {
        if f.key == *key {
            return true;
        }
        let mut link = f.outer.as_deref();
        while let Some(l) = link {
            if l.key == *key {
                return true;
            }
            link = l.outer.as_deref();
        }
        false
    })
    .unwrap_or(false)
}

/// The downstream idempotency key of the call whose body is running in this task: pass
/// it to a payment gateway or any API that deduplicates by a key (an
/// `Idempotency-Key` header), so that an effect sent by an attempt that was cut off
/// and sent again by the retry lands once.
///
/// `None` outside a claimed body, and in a lock's body (a lock runs its body on every
/// call, so one key for all of them would wrongly deduplicate them downstream).
///
/// The key is `idem-` and 32 lowercase hex digits: printable ASCII, 37 characters
/// (every gateway's limit allows it, Stripe's is 255), derived one-way from the
/// record's digest, so no raw key material (an email, a card id) reaches the
/// downstream API. It is the same on every attempt at one record: after a release (an
/// `Err`, a cancelled call, a panic), after a lease ran out, and in every process
/// sharing the store. On an in-process store ([`MemoryStore`](crate::MemoryStore)),
/// whose records never leave the process, it is the same within the process only.
/// Two functions, or two namespaces, with the same key text get different keys.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), idem_runtime::Error> {
/// use idem_runtime::{Idem, Options};
/// static CHARGE: Options = Options::dedup("shop::charge");
/// let idem = Idem::builder().build();
/// let sent = idem
///     .dedup(&CHARGE, "order-42", async {
///         // gateway.charge(cents).idempotency_key(call_key)...
///         Ok::<_, idem_runtime::Error>(idem_runtime::call_key())
///     })
///     .await?;
/// let sent = sent.expect("inside a claimed body");
/// assert!(sent.starts_with("idem-") && sent.len() == 37);
/// assert_eq!(idem_runtime::call_key(), None); // outside the body
/// # Ok(()) }
/// ```
pub fn call_key() -> Option<String> {
    CALL.try_with(|f| f.once.then(|| downstream_key(&f.key)))
        .ok()
        .flatten()
}

/// `idem-` and the first 128 bits of BLAKE3 in key-derivation mode over the record's
/// digest: a context of its own, so the key is not the record's name in the store.
fn downstream_key(key: &Key) -> String {
    let mut h = blake3::Hasher::new_derive_key("idem 2026 call downstream idempotency key");
    h.update(key.digest());
    crate::key::downstream(h.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A call's downstream key reaches gateways, which deduplicate by it: it must never
    /// change from one release to the next.
    #[test]
    fn the_call_key_is_pinned() {
        let key = Key::from_parts("shop", "shop::charge", [7; 16]);
        assert_eq!(
            downstream_key(&key),
            "idem-f02a4a442a34b448f45e7a3034db4614"
        );
    }
}
