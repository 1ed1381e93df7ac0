//! What the commands print: aligned text for people, one JSON object with `--json`.

use std::time::Duration;

use idem_runtime::Key;
use idem_runtime::inspect::{RecordCount, RecordInfo};
use idem_runtime::store::{ClaimKind, RecoverableCall};
use serde_json::{Value, json};

fn kind_name(kind: ClaimKind) -> &'static str {
    match kind {
        ClaimKind::Dedup => "dedup",
        ClaimKind::Lock => "lock",
        ClaimKind::Token => "token",
        _ => "other",
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn seconds(d: Duration) -> String {
    format!("{:.3}s", d.as_secs_f64())
}

fn record_json(key: &Key, info: Option<&RecordInfo>) -> Value {
    let mut v = json!({
        "record": key.to_string(),
        "namespace": key.namespace(),
        "function": key.scope(),
        "digest": key.digest_hex(),
        "state": info.map_or("absent", |i| i.state.as_str()),
    });
    if let (Some(i), Some(obj)) = (info, v.as_object_mut()) {
        obj.insert("kind".into(), json!(i.kind.map(kind_name)));
        obj.insert(
            "owner".into(),
            json!(i.owner.map(|o| format!("{:032x}", o.0))),
        );
        obj.insert("lease_left_ms".into(), json!(i.lease_left.map(millis)));
        obj.insert("ttl_left_ms".into(), json!(i.ttl_left.map(millis)));
        obj.insert("fingerprint".into(), json!(i.fingerprint));
        obj.insert("value_bytes".into(), json!(i.value_size));
        obj.insert("fence".into(), json!(i.fence));
        let steps: Vec<Value> = i
            .steps
            .iter()
            .map(|s| {
                json!({
                    "name": s.name,
                    "done": s.done,
                    "at_unix_ms": unix_ms(s.at),
                    "value_bytes": s.value_size,
                })
            })
            .collect();
        obj.insert("steps".into(), Value::Array(steps));
    }
    v
}

/// Milliseconds since the Unix epoch (0 before it).
fn unix_ms(t: std::time::SystemTime) -> u64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A recoverable call's state in a word: parked, abandoned (a recoverer may take it),
/// or in flight.
fn recovery_state(c: &RecoverableCall) -> &'static str {
    match (&c.parked, c.abandoned) {
        (Some(_), _) => "parked",
        (None, true) => "recoverable",
        (None, false) => "in flight",
    }
}

fn recovery_json(c: &RecoverableCall) -> Value {
    json!({
        "state": recovery_state(c),
        "attempts": c.attempts,
        "parked": c.parked,
        "overdue_ms": millis(c.overdue),
        "steps": c.steps,
    })
}

/// One record, or that there is none, and its recovery state if it is recoverable.
pub(crate) fn record(
    key: &Key,
    info: Option<&RecordInfo>,
    recovery: Option<&RecoverableCall>,
    json: bool,
) {
    if json {
        let mut v = record_json(key, info);
        if let Some(obj) = v.as_object_mut() {
            obj.insert(
                "recovery".into(),
                recovery.map_or(Value::Null, recovery_json),
            );
        }
        println!("{v}");
        return;
    }
    let print_recovery = |c: &RecoverableCall| {
        let why = c
            .parked
            .as_deref()
            .map(|e| format!(": {e}"))
            .unwrap_or_default();
        println!(
            "  recovery     {}{why} ({} attempts, {} steps journaled)",
            recovery_state(c),
            c.attempts,
            c.steps
        );
    };
    let Some(i) = info else {
        match recovery {
            // A released stepped record: free, its call's arguments kept.
            Some(c) => {
                println!("{key}: free, and recoverable");
                print_recovery(c);
            }
            None => println!("{key}: no record (never written, released, or expired)"),
        }
        return;
    };
    let or_dash = |s: Option<String>| s.unwrap_or_else(|| "-".into());
    println!("{key}");
    for (name, value) in [
        ("digest", key.digest_hex()),
        ("state", i.state.to_string()),
        ("kind", or_dash(i.kind.map(|k| kind_name(k).to_owned()))),
        ("owner", or_dash(i.owner.map(|o| format!("{:032x}", o.0)))),
        ("lease left", or_dash(i.lease_left.map(seconds))),
        ("ttl left", or_dash(i.ttl_left.map(seconds))),
        (
            "fingerprint",
            if i.fingerprint { "yes" } else { "no" }.into(),
        ),
        (
            "value size",
            or_dash(i.value_size.map(|n| format!("{n} bytes"))),
        ),
        ("fence", or_dash(i.fence.map(|f| f.to_string()))),
    ] {
        println!("  {name:<12} {value}");
    }
    // Durable steps journaled by the record's calls (kept across releases).
    for s in &i.steps {
        let what = match s.value_size {
            Some(n) if s.done => format!("done, {n} bytes"),
            _ => "intent, no result (verify is asked on resume)".to_owned(),
        };
        println!(
            "  step         {} ({what}; at {} ms since the epoch)",
            s.name,
            unix_ms(s.at)
        );
    }
    if let Some(c) = recovery {
        print_recovery(c);
    }
}

/// Recoverable calls, one per line.
pub(crate) fn recoverable(calls: &[RecoverableCall], json: bool) {
    if json {
        let rows: Vec<Value> = calls
            .iter()
            .map(|c| {
                let mut v = recovery_json(c);
                if let Some(obj) = v.as_object_mut() {
                    obj.insert("namespace".into(), json!(c.namespace));
                    obj.insert("function".into(), json!(c.scope));
                    obj.insert("digest".into(), json!(hex(&c.digest)));
                }
                v
            })
            .collect();
        println!("{}", json!({ "calls": rows, "total": calls.len() }));
        return;
    }
    let wf = calls
        .iter()
        .map(|c| c.namespace.len() + 1 + c.scope.len())
        .max()
        .unwrap_or(0)
        .max(8);
    println!(
        "{:<wf$}  {:<16}  {:<11}  {:>10}  {:>8}  {:>5}  error",
        "function", "digest", "state", "due for", "attempts", "steps"
    );
    for c in calls {
        println!(
            "{:<wf$}  {:<16}  {:<11}  {:>10}  {:>8}  {:>5}  {}",
            format!("{}/{}", c.namespace, c.scope),
            &hex(&c.digest)[..16],
            recovery_state(c),
            seconds(c.overdue),
            c.attempts,
            c.steps,
            c.parked.as_deref().unwrap_or("-")
        );
    }
    println!("{} calls", calls.len());
}

fn hex(digest: &[u8; 16]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// The result of a forget.
pub(crate) fn forgotten(key: &Key, forgotten: bool, json: bool) {
    if json {
        println!(
            "{}",
            json!({ "record": key.to_string(), "digest": key.digest_hex(), "forgotten": forgotten })
        );
    } else if forgotten {
        println!("{key}: forgotten; its next call runs the body");
    } else {
        println!("{key}: no record to forget");
    }
}

/// Record counts by namespace, function and state.
pub(crate) fn stats(rows: &[RecordCount], json: bool) {
    let total: u64 = rows.iter().map(|r| r.count).sum();
    if json {
        let rows: Vec<Value> = rows
            .iter()
            .map(|r| {
                json!({
                    "namespace": r.namespace,
                    "function": r.function,
                    "state": r.state,
                    "count": r.count,
                })
            })
            .collect();
        println!("{}", json!({ "records": rows, "total": total }));
        return;
    }
    let width =
        |f: fn(&RecordCount) -> usize, min: usize| rows.iter().map(f).max().unwrap_or(0).max(min);
    let (wn, wf) = (
        width(|r| r.namespace.len(), 9),
        width(|r| r.function.len(), 8),
    );
    println!(
        "{:<wn$}  {:<wf$}  {:<11}  {:>10}",
        "namespace", "function", "state", "records"
    );
    for r in rows {
        println!(
            "{:<wn$}  {:<wf$}  {:<11}  {:>10}",
            r.namespace, r.function, r.state, r.count
        );
    }
    println!("{:<wn$}  {:<wf$}  {:<11}  {total:>10}", "total", "", "");
}

/// A freshly issued token.
pub(crate) fn token(token: &str, ttl: Duration, json: bool) {
    if json {
        println!("{}", json!({ "token": token, "ttl_ms": millis(ttl) }));
    } else {
        println!("{token}");
    }
}
