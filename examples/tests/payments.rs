//! The main job as a test: exactly-once within a process on the memory store, and across
//! several OS processes on shared Redis and PostgreSQL stores. The double charges of the
//! unprotected run prove the workload really produces duplicates.

use std::process::Command;

fn payments(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_payments"))
        .args(args)
        .env_remove("IDEM_STORE_URL")
        .output()
        .expect("run the payments example");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    (out.status.success(), text)
}

#[test]
fn memory_store_charges_every_order_once() {
    let (ok, out) = payments(&["--orders", "300"]);
    assert!(ok, "{out}");
    assert!(
        out.contains("OK: every order charged at most once"),
        "{out}"
    );
}

#[test]
fn without_idem_the_same_traffic_double_charges() {
    let (ok, out) = payments(&["--orders", "300", "--no-idem"]);
    assert!(!ok, "the unprotected run should fail:\n{out}");
    assert!(out.contains("FAILED"), "{out}");
}

#[test]
fn four_processes_on_redis_charge_every_order_once() {
    let (ok, out) = payments(&[
        "--orders",
        "300",
        "--processes",
        "4",
        "--store",
        "redis://127.0.0.1:6379",
    ]);
    assert!(ok, "{out}");
    assert!(out.contains("0 charged twice"), "{out}");
}

#[test]
fn three_processes_on_postgres_charge_every_order_once() {
    let (ok, out) = payments(&[
        "--orders",
        "200",
        "--processes",
        "3",
        "--store",
        "postgres://postgres@127.0.0.1:5432/test",
    ]);
    assert!(ok, "{out}");
    assert!(out.contains("0 charged twice"), "{out}");
}
