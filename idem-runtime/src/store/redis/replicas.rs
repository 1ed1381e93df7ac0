//! Replica-acknowledged writes ([`RedisStoreBuilder::wait_for_replicas`]).
//!
//! Redis replicates asynchronously: a primary confirms a write before any replica has
//! it, and a failover in between loses the write. With `wait_for_replicas(n, timeout)`
//! each claim, completion and token issue is sent together with `WAIT n timeout` in one
//! pipeline (one round trip), and succeeds only if `WAIT` reports that at least `n`
//! replicas have every write made so far on that connection, ours included. A new
//! key's body therefore starts after the claim and the wait, nothing more.
//!
//! Too few replicas in time is [`Error::Store`] holding a [`NotReplicated`]; never a
//! silent success. The write itself did reach the primary (`WAIT` cannot undo it):
//!
//! - a claim that is not confirmed fails the call before the body runs, and the runtime
//!   releases the claim in the background, as after any uncertain claim;
//! - a completion that is not confirmed is logged, counted as a store failure and
//!   retried in the background; the caller still gets the body's result (its effect
//!   happened). Until a replica has it, a failover may lose it and the key may run again;
//! - a token issue that is not confirmed fails, and the token is not handed out.
//!
//! [`RedisStoreBuilder::wait_for_replicas`]: super::RedisStoreBuilder::wait_for_replicas

use std::time::Duration;

use redis::{Cmd, Value};

use crate::Error;

/// Fewer replicas than asked for confirmed a write in time (inside [`Error::Store`]).
///
/// ```
/// use idem_runtime::Error;
/// use idem_runtime::store::redis::NotReplicated;
///
/// fn is_unreplicated(e: &Error) -> bool {
///     matches!(e, Error::Store(source) if source.downcast_ref::<NotReplicated>().is_some())
/// }
/// # let _ = is_unreplicated;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NotReplicated {
    /// Replicas asked for.
    pub wanted: usize,
    /// Replicas that confirmed within the wait.
    pub confirmed: usize,
    /// How long the primary waited.
    pub waited: Duration,
}

impl std::fmt::Display for NotReplicated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "only {} of {} replicas confirmed the write within {:?}; a failover may lose it",
            self.confirmed, self.wanted, self.waited
        )
    }
}

impl std::error::Error for NotReplicated {}

/// The configured wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Wait {
    pub(crate) replicas: usize,
    pub(crate) timeout: Duration,
}

impl Wait {
    /// `WAIT n ms`. A timeout of 0 would make Redis wait forever: at least 1 ms.
    pub(crate) fn cmd(&self) -> Cmd {
        let ms = u64::try_from(self.timeout.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        let mut cmd = Cmd::with_capacity(3, 24);
        cmd.arg("WAIT").arg(self.replicas).arg(ms);
        cmd
    }

    /// Whether `WAIT`'s reply confirms enough replicas.
    pub(crate) fn check(&self, reply: Option<&Value>) -> Result<(), Error> {
        match reply {
            Some(Value::Int(n)) => {
                let confirmed = usize::try_from(*n).unwrap_or(0);
                if confirmed >= self.replicas {
                    Ok(())
                } else {
                    Err(Error::store(NotReplicated {
                        wanted: self.replicas,
                        confirmed,
                        waited: self.timeout,
                    }))
                }
            }
            other => Err(Error::store(UnexpectedWait(format!("{other:?}")))),
        }
    }
}

/// `WAIT` answered something other than a count.
#[derive(Debug)]
struct UnexpectedWait(String);

impl std::fmt::Display for UnexpectedWait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "unexpected reply to WAIT: {}", self.0)
    }
}

impl std::error::Error for UnexpectedWait {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enough_replicas_pass_and_too_few_are_a_typed_store_error() {
        let w = Wait {
            replicas: 2,
            timeout: Duration::from_millis(250),
        };
        assert!(w.check(Some(&Value::Int(2))).is_ok());
        assert!(w.check(Some(&Value::Int(3))).is_ok());
        for reply in [
            Some(Value::Int(1)),
            Some(Value::Int(0)),
            Some(Value::Nil),
            None,
        ] {
            let e = w.check(reply.as_ref()).unwrap_err();
            assert!(matches!(e, Error::Store(_)), "{e}");
        }
        let Err(Error::Store(e)) = w.check(Some(&Value::Int(1))) else {
            unreachable!()
        };
        let n = e.downcast_ref::<NotReplicated>().unwrap();
        assert_eq!((n.wanted, n.confirmed), (2, 1));
    }

    #[test]
    fn a_zero_timeout_never_means_forever() {
        let w = Wait {
            replicas: 1,
            timeout: Duration::ZERO,
        };
        let packed = String::from_utf8_lossy(&w.cmd().get_packed_command()).into_owned();
        assert!(packed.ends_with("$1\r\n1\r\n"), "{packed:?}");
    }
}
