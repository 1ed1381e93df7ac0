//! The [`Store`] impl: each method one atomic step, a native command or one script.

use std::sync::LazyLock;
use std::time::Duration;

use bytes::Bytes;
use redis::{Cmd, Script, Value};

use super::RedisStore;
use super::journal::STEPS;
use super::record::corrupt;
use super::record::{ceil_millis, evalsha, in_progress};
use super::reply::{parse_claim, parse_completed};
use crate::store::{
    BloomStore, BoxFuture, ClaimKind, ClaimOutcome, ClaimRequest, Owner, StateStore, Store,
    Subscription, VersionedStore,
};
use crate::{Error, Key};

static CLAIM: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("scripts/claim.lua")));
// Complete, release and renew start alike: held.lua reads and checks the record and its
// owner for each of them.
static COMPLETE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("scripts/held.lua"),
        include_str!("scripts/complete.lua")
    ))
});
static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("scripts/held.lua"),
        include_str!("scripts/release.lua")
    ))
});
static RENEW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("scripts/held.lua"),
        include_str!("scripts/renew.lua")
    ))
});

impl RedisStore {
    /// The claim script's run and answer; a claim it made must reach the replicas.
    async fn claim_acked(&self, key: &Key, cmd: Cmd) -> Result<ClaimOutcome, Error> {
        let (v, confirm) = self.eval_acked(&CLAIM, cmd).await?;
        let outcome = parse_claim(key, v)?;
        if matches!(outcome, ClaimOutcome::Claimed { .. }) {
            confirm()?;
        }
        Ok(outcome)
    }
}

/// What a release is, for a stepped record's recovery data (see `release.lua`).
#[derive(Clone, Copy)]
pub(super) enum GiveBack {
    /// A plain call's: it has no recovery data, and nothing of it is touched.
    Plain,
    /// A recoverable call's after an `Err`: its arguments and index entry go.
    Released,
    /// A dropped recoverable call's: it stays, due now.
    Abandoned,
}

impl RedisStore {
    /// Completes `owner`'s claim; `recoverable`: a recoverable call's, which also leaves
    /// its recovery index (a plain call names no index, so its completion pays nothing
    /// for recovery).
    pub(super) async fn finish(
        &self,
        key: &Key,
        owner: Owner,
        value: Bytes,
        ttl: Duration,
        recoverable: bool,
    ) -> Result<bool, Error> {
        let names = self.name_with(key, STEPS);
        let index = recoverable.then(|| self.index_of(key));
        let mut cmd = evalsha(&COMPLETE, 2 + usize::from(recoverable));
        cmd.arg(&names[..names.len() - STEPS.len()])
            .arg(&names)
            .arg(index)
            .arg(&owner.0.to_be_bytes()[..])
            .arg(value.as_ref())
            .arg(ceil_millis(ttl))
            .arg(self.inner.notifier.channel());
        self.eval_bool_acked(key, &COMPLETE, cmd).await
    }

    /// Releases `owner`'s claim, as `how` says (see `release.lua`).
    pub(super) async fn give_back(
        &self,
        key: &Key,
        owner: Owner,
        how: GiveBack,
    ) -> Result<bool, Error> {
        let names = self.name_with(key, STEPS);
        let index = self.index_of(key);
        let mut cmd = evalsha(&RELEASE, 3);
        cmd.arg(&names[..names.len() - STEPS.len()])
            .arg(&names)
            .arg(index)
            .arg(&owner.0.to_be_bytes()[..])
            .arg(self.inner.notifier.channel())
            .arg(match how {
                GiveBack::Plain => "-",
                GiveBack::Released => "r",
                GiveBack::Abandoned => "a",
            });
        self.eval_bool(key, &RELEASE, cmd).await
    }
}

impl Store for RedisStore {
    fn claim<'a>(
        &'a self,
        key: &'a Key,
        req: &'a ClaimRequest,
    ) -> BoxFuture<'a, Result<ClaimOutcome, Error>> {
        Box::pin(async move {
            let (buf, len) = in_progress(req);
            let record = &buf[..len];
            let lease = ceil_millis(req.lease);
            let channel = self.inner.notifier.channel();
            match req.kind {
                ClaimKind::Dedup if req.recover.is_some() => {
                    // Recoverable: the arguments go with the claim, so the script runs
                    // even for a free key (see recovery.rs).
                    let recover = req
                        .recover
                        .as_ref()
                        .map_or((&[][..], 0), |r| (r.args.as_ref(), ceil_millis(r.ttl)));
                    let names = self.name_with(key, STEPS);
                    let rec = &names[..names.len() - STEPS.len()];
                    let mut cmd = evalsha(&CLAIM, 3);
                    cmd.arg(rec)
                        .arg(&names)
                        .arg(self.index_of(key))
                        .arg(record)
                        .arg(lease)
                        .arg(channel)
                        .arg(recover.0)
                        .arg(recover.1);
                    self.claim_acked(key, cmd).await
                }
                ClaimKind::Dedup => {
                    // One allocation for both names: the record's, then its journal's.
                    let names = self.name_with(key, STEPS);
                    let rec = &names[..names.len() - STEPS.len()];
                    let mut cmd = Cmd::with_capacity(7, rec.len() + len + 40);
                    cmd.arg("SET")
                        .arg(rec)
                        .arg(record)
                        .arg("NX")
                        .arg("GET")
                        .arg("PX")
                        .arg(lease);
                    // A record with a step journal outlives its claim as long as the
                    // journal does (a stepped record), so a key the `SET` finds free has
                    // no journal to resume: a new key costs this one command.
                    let wait = self.inner.wait.as_ref();
                    match self.exec_with(None, &cmd, wait).await? {
                        Ok((Value::Nil, reply)) => {
                            if let Some(w) = wait {
                                w.check(reply.as_ref())?;
                            }
                            return Ok(ClaimOutcome::claimed(0));
                        }
                        Ok((Value::BulkString(b), _)) if b.first() == Some(&b'c') => {
                            return parse_completed(key, b);
                        }
                        // WRONGTYPE: not a string; the script says so in its words.
                        Err(e) if e.code() != Some("WRONGTYPE") => return Err(Error::store(e)),
                        // Held by another owner, a stepped record (to resume, or of
                        // another payload), a token, or garbage: the script decides.
                        _ => {}
                    }
                    let mut cmd = evalsha(&CLAIM, 2);
                    cmd.arg(rec).arg(&names).arg(record).arg(lease).arg(channel);
                    self.claim_acked(key, cmd).await
                }
                ClaimKind::Lock => {
                    // One allocation for both names: the record's, then its fence counter's.
                    let names = self.name_with(key, ":fence");
                    let rec = &names[..names.len() - ":fence".len()];
                    let mut cmd = evalsha(&CLAIM, 2);
                    cmd.arg(rec)
                        .arg(&names)
                        .arg(record)
                        .arg(lease)
                        .arg(self.inner.fence_ttl_ms.max(lease + 1000));
                    self.claim_acked(key, cmd).await
                }
                ClaimKind::Token => {
                    let names = self.name_with(key, STEPS);
                    let rec = &names[..names.len() - STEPS.len()];
                    let mut cmd = evalsha(&CLAIM, 2);
                    cmd.arg(rec).arg(&names).arg(record).arg(lease).arg(channel);
                    self.claim_acked(key, cmd).await
                }
            }
        })
    }

    fn complete<'a>(
        &'a self,
        key: &'a Key,
        owner: Owner,
        value: Bytes,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.finish(key, owner, value, ttl, false))
    }

    fn release<'a>(&'a self, key: &'a Key, owner: Owner) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.give_back(key, owner, GiveBack::Plain))
    }

    fn renew<'a>(
        &'a self,
        key: &'a Key,
        owner: Owner,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            let mut cmd = evalsha(&RENEW, 1);
            cmd.arg(self.record_name(key))
                .arg(&owner.0.to_be_bytes()[..])
                .arg(ceil_millis(lease));
            self.eval_bool(key, &RENEW, cmd).await
        })
    }

    fn issue<'a>(&'a self, key: &'a Key, ttl: Duration) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            // The key's expiry is the token's deadline; a claim reads it with `PTTL`.
            let rec = self.record_name(key);
            let mut cmd = Cmd::with_capacity(6, rec.len() + 32);
            cmd.arg("SET")
                .arg(&rec)
                .arg("i-")
                .arg("NX")
                .arg("PX")
                .arg(ceil_millis(ttl));
            let wait = self.inner.wait.as_ref();
            match self
                .exec_with(None, &cmd, wait)
                .await?
                .map_err(Error::store)?
            {
                (Value::Okay, reply) => {
                    if let Some(w) = wait {
                        w.check(reply.as_ref())?;
                    }
                    Ok(true)
                }
                (Value::Nil, _) => Ok(false),
                other => Err(corrupt(key, format!("unexpected reply {other:?}"))),
            }
        })
    }

    fn inspect<'a>(
        &'a self,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<Option<crate::store::RecordInfo>, Error>> {
        Box::pin(self.inspect_record(key))
    }

    fn forget<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(self.forget_record(key))
    }

    fn record_counts(&self) -> Option<&dyn crate::store::RecordCounts> {
        Some(self)
    }

    fn subscribe<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Subscription, Error>> {
        Box::pin(async move {
            let rec = self.record_name(key);
            Ok(self.inner.notifier.subscribe(&rec).await)
        })
    }

    fn versioned(&self) -> Option<&dyn VersionedStore> {
        Some(self)
    }

    fn states(&self) -> Option<&dyn StateStore> {
        Some(self)
    }

    fn blooms(&self) -> Option<&dyn BloomStore> {
        Some(self)
    }

    fn journal(&self) -> Option<&dyn crate::store::JournalStore> {
        Some(self)
    }

    fn name(&self) -> &'static str {
        "redis"
    }

    fn recovery(&self) -> Option<&dyn crate::store::RecoveryStore> {
        Some(self)
    }
}
