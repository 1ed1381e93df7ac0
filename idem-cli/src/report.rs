//! What the commands print: aligned text for people, one JSON object with `--json`.

use std::time::Duration;

use idem_runtime::Key;
use idem_runtime::inspect::{RecordCount, RecordInfo};
use idem_runtime::store::ClaimKind;
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

/// One record, or that there is none.
pub(crate) fn record(key: &Key, info: Option<&RecordInfo>, json: bool) {
    if json {
        println!("{}", record_json(key, info));
        return;
    }
    let Some(i) = info else {
        println!("{key}: no record (never written, released, or expired)");
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
