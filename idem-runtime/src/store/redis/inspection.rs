//! What operators do with records: read one ([`Store::inspect`](crate::Store::inspect)),
//! remove one ([`Store::forget`](crate::Store::forget)), and count them by function and
//! state (`idem stats`), each one script run by SHA.

use std::collections::BTreeMap;
use std::sync::LazyLock;
use std::time::Duration;

use redis::{Script, Value};

use super::RedisStore;
#[cfg(feature = "redis-cluster")]
use super::connect::Conn;
use super::record::corrupt;
use super::record::evalsha;
use crate::store::{ClaimKind, Owner};
use crate::store::{RecordCount, RecordInfo, RecordState};
use crate::{Error, Key};

static INSPECT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/inspect.lua")));
static FORGET: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("scripts/forget.lua")));
static COUNT: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("scripts/count.lua")));

/// Keys a SCAN step looks at: small enough that one batch keeps the server busy for well
/// under a millisecond.
const SCAN_BATCH: u32 = 500;

impl RedisStore {
    pub(super) async fn inspect_record(&self, key: &Key) -> Result<Option<RecordInfo>, Error> {
        let names = self.name_with(key, ":fence");
        let rec = &names[..names.len() - ":fence".len()];
        let mut cmd = evalsha(&INSPECT, 2);
        cmd.arg(rec).arg(&names);
        match self.eval(&INSPECT, cmd).await? {
            Value::Array(items) => parse_inspect(key, items),
            other => Err(corrupt(key, format!("unexpected reply {other:?}"))),
        }
    }

    pub(super) async fn forget_record(&self, key: &Key) -> Result<bool, Error> {
        let names = self.name_with(key, super::journal::STEPS);
        let mut cmd = evalsha(&FORGET, 2);
        cmd.arg(&names[..names.len() - super::journal::STEPS.len()])
            .arg(&names)
            .arg(self.inner.notifier.channel());
        self.eval_bool(key, &FORGET, cmd).await
    }

    /// Counts records under `namespace` (or every namespace) in SCAN batches, on the
    /// server or, for a Cluster, on each primary.
    pub(super) async fn count(&self, namespace: Option<&str>) -> Result<Vec<RecordCount>, Error> {
        let prefix = &self.inner.prefix;
        let pattern = match namespace {
            Some(ns) => format!("{}{}:*", glob_escape(prefix), glob_escape(ns)),
            None => format!("{}*", glob_escape(prefix)),
        };
        let mut counts: BTreeMap<(String, String, &'static str), u64> = BTreeMap::new();
        for node in self.scan_nodes().await? {
            let mut cursor = "0".to_owned();
            loop {
                let batch = SCAN_BATCH.to_string();
                let args = [cursor.as_str(), pattern.as_str(), batch.as_str()];
                let source = include_str!("scripts/count.lua");
                let reply = self.eval_on(node.as_ref(), &COUNT, source, &args).await?;
                let (next, found) = parse_batch(reply)?;
                for (name, state) in found {
                    // `{prefix}{namespace}:{scope}:{<digest>}`; the namespace has no `:`.
                    let Some(rest) = name.strip_prefix(prefix.as_str()) else {
                        continue;
                    };
                    let Some((path, _digest)) = rest.rsplit_once(":{") else {
                        continue;
                    };
                    let Some((ns, scope)) = path.split_once(':') else {
                        continue;
                    };
                    if namespace.is_some_and(|want| want != ns) {
                        continue;
                    }
                    let state = match state.as_slice() {
                        b"p" => "in_progress",
                        b"c" => "completed",
                        b"i" => "issued",
                        _ => "corrupt",
                    };
                    *counts
                        .entry((ns.to_owned(), scope.to_owned(), state))
                        .or_default() += 1;
                }
                if next == "0" {
                    break;
                }
                cursor = next;
            }
        }
        Ok(counts
            .into_iter()
            .map(|((ns, scope, state), n)| RecordCount::new(ns, scope, state, n))
            .collect())
    }
}

/// A Cluster primary, by address.
type Node = (String, u16);

impl RedisStore {
    /// Where to SCAN: the one server, or every primary of a Cluster.
    async fn scan_nodes(&self) -> Result<Vec<Option<Node>>, Error> {
        if !self.is_cluster() {
            return Ok(vec![None]);
        }
        // `CLUSTER SLOTS`: [start, end, [primary ip, port, id], replicas...] per range.
        let slots: Value = self.command(redis::cmd("CLUSTER").arg("SLOTS")).await?;
        let mut nodes: Vec<Option<Node>> = Vec::new();
        if let Value::Array(ranges) = slots {
            for range in ranges {
                let Value::Array(parts) = range else { continue };
                let Some(Value::Array(primary)) = parts.get(2) else {
                    continue;
                };
                if let (Some(Value::BulkString(ip)), Some(Value::Int(port))) =
                    (primary.first(), primary.get(1))
                {
                    let node = (
                        String::from_utf8_lossy(ip).into_owned(),
                        u16::try_from(*port).unwrap_or(0),
                    );
                    if !nodes.iter().flatten().any(|n| *n == node) {
                        nodes.push(Some(node));
                    }
                }
            }
        }
        if nodes.is_empty() {
            return Err(Error::store("CLUSTER SLOTS named no primary"));
        }
        Ok(nodes)
    }

    /// Runs the key-less `script` (whose text is `source`) with `args`: by SHA on the
    /// server, or as source on one Cluster primary (it may not be loaded there yet).
    async fn eval_on(
        &self,
        node: Option<&Node>,
        script: &Script,
        source: &'static str,
        args: &[&str],
    ) -> Result<Value, Error> {
        let Some((host, port)) = node else {
            let mut cmd = evalsha(script, 0);
            for a in args {
                cmd.arg(*a);
            }
            return self.eval(script, cmd).await;
        };
        let lease = match self.inner.conns.ready() {
            Ok(lease) => lease,
            Err(slot) => tokio::time::timeout(self.inner.timeout, self.inner.conns.connect(slot))
                .await
                .map_err(|_| {
                    Error::store(self.inner.conns.target().timed_out(self.inner.timeout))
                })??,
        };
        #[cfg(feature = "redis-cluster")]
        if let Conn::Cluster(mut c) = lease.conn {
            use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
            let mut eval = redis::cmd("EVAL");
            eval.arg(source).arg(0);
            for a in args {
                eval.arg(*a);
            }
            let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                host: host.clone(),
                port: *port,
            });
            let run = c.route_command(eval, route);
            return match tokio::time::timeout(self.inner.timeout, run).await {
                Ok(r) => r.map_err(Error::store),
                Err(_) => Err(Error::store(format!(
                    "Redis Cluster node {host}:{port} did not answer in time"
                ))),
            };
        }
        let _ = (source, lease);
        Err(Error::store(format!("{host}:{port} is not a Cluster node")))
    }
}

/// `*`, `?`, `[` and `\` match literally in a SCAN pattern once escaped.
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// One SCAN step's answer: the next cursor, and each record's name and state byte.
type Batch = (String, Vec<(String, Vec<u8>)>);

fn parse_batch(reply: Value) -> Result<Batch, Error> {
    let bad = |v: &dyn std::fmt::Debug| Error::store(format!("unexpected SCAN batch {v:?}"));
    let Value::Array(items) = reply else {
        return Err(bad(&reply));
    };
    let mut items = items.into_iter();
    let (Some(Value::BulkString(cursor)), Some(Value::Array(found))) = (items.next(), items.next())
    else {
        return Err(Error::store("unexpected SCAN batch"));
    };
    let mut out = Vec::with_capacity(found.len() / 2);
    let mut found = found.into_iter();
    while let (Some(Value::BulkString(name)), Some(Value::BulkString(state))) =
        (found.next(), found.next())
    {
        out.push((String::from_utf8_lossy(&name).into_owned(), state));
    }
    Ok((String::from_utf8_lossy(&cursor).into_owned(), out))
}

/// The inspect script's answer as a [`RecordInfo`] (see `inspect.lua` and the layout in
/// the module docs).
fn parse_inspect(key: &Key, items: Vec<Value>) -> Result<Option<RecordInfo>, Error> {
    let mut items = items.into_iter();
    let (rec, pttl, fence, now) = match (items.next(), items.next()) {
        (Some(Value::Int(1)), None) => return Ok(None),
        (Some(Value::Int(0)), Some(Value::BulkString(why))) => {
            return Err(corrupt(key, String::from_utf8_lossy(&why)));
        }
        (Some(Value::Int(2)), Some(Value::BulkString(rec))) => {
            match (items.next(), items.next(), items.next()) {
                (
                    Some(Value::Int(pttl)),
                    Some(Value::BulkString(f)),
                    Some(Value::BulkString(n)),
                ) => (rec, pttl, f, n),
                other => return Err(corrupt(key, format!("unexpected reply {other:?}"))),
            }
        }
        other => return Err(corrupt(key, format!("unexpected reply {other:?}"))),
    };
    let ttl_left = u64::try_from(pttl).ok().map(Duration::from_millis);
    let n = rec.len();
    let digits = |b: &[u8]| -> Option<i64> { std::str::from_utf8(b).ok()?.parse().ok() };
    let info = match rec.first() {
        Some(b'p') => {
            // The lease deadline a stepped or token claim keeps, at `at`.
            let lease_left = |at: usize| -> Result<Duration, Error> {
                let lease_end = digits(&rec[at..at + 15])
                    .ok_or_else(|| corrupt(key, "claim without its lease deadline"))?;
                let now = digits(&now).unwrap_or(0);
                Ok(Duration::from_millis(
                    u64::try_from(lease_end - now).unwrap_or(0),
                ))
            };
            let (kind, with_fp, lease_left) = match (rec.get(2), n) {
                (Some(b't'), 49 | 65) => (ClaimKind::Token, n == 65, Some(lease_left(n - 30)?)),
                // A stepped dedup claim whose lease ended (released or abandoned) is
                // kept only for its journal (read with `Idem::steps`): no record.
                (Some(b's'), 34 | 50) => match lease_left(n - 15)? {
                    Duration::ZERO => return Ok(None),
                    left => (ClaimKind::Dedup, n == 50, Some(left)),
                },
                (Some(b'd'), 19 | 35) => (ClaimKind::Dedup, n == 35, ttl_left),
                (Some(b'l'), 19 | 35) => (ClaimKind::Lock, n == 35, ttl_left),
                _ => return Err(corrupt(key, "malformed in-progress record")),
            };
            let mut owner = [0u8; 16];
            owner.copy_from_slice(&rec[3..19]);
            let mut info = RecordInfo::new(RecordState::InProgress);
            info.kind = Some(kind);
            info.owner = Some(Owner(u128::from_be_bytes(owner)));
            info.lease_left = lease_left;
            info.fingerprint = with_fp;
            if kind == ClaimKind::Lock {
                info.fence = digits(&fence).and_then(|f| u64::try_from(f).ok());
            }
            info
        }
        Some(b'c') => {
            let (with_fp, header) = match rec.get(1) {
                Some(b'-') => (false, 2),
                Some(b'f') if n >= 18 => (true, 18),
                _ => return Err(corrupt(key, "malformed completed record")),
            };
            let mut info = RecordInfo::new(RecordState::Completed);
            info.fingerprint = with_fp;
            info.value_size = Some(n - header);
            info
        }
        Some(b'i') if n == 2 => {
            let mut info = RecordInfo::new(RecordState::Issued);
            info.kind = Some(ClaimKind::Token);
            info
        }
        _ => return Err(corrupt(key, "unknown record state")),
    };
    Ok(Some(RecordInfo { ttl_left, ..info }))
}

impl crate::store::RecordCounts for RedisStore {
    fn count_records<'a>(
        &'a self,
        namespace: Option<&'a str>,
    ) -> crate::store::BoxFuture<'a, Result<Vec<RecordCount>, Error>> {
        Box::pin(self.count(namespace))
    }
}
