//! A process that never configured a runtime falls back to a process-local `MemoryStore`,
//! and says so on stderr once, whether or not it installed a `tracing` subscriber: a
//! service that forgot `init` must not deduplicate only inside one process in silence.
//!
//! Each case runs this test binary again as a child (a fresh process, so nothing is
//! configured yet and the once-per-process message is not spent) and reads its stderr.

use std::process::Command;

use idem_runtime::{Error, Idem, MemoryStore, idempotent};

/// Set in the child: which scenario to run instead of the parent's checks.
const CHILD: &str = "IDEM_TEST_FALLBACK_CHILD";
const MESSAGE: &str = "idem: no runtime configured";

#[idempotent(key = "fallback:{n}")]
async fn once(n: u64) -> Result<u64, Error> {
    Ok(n)
}

/// The scenarios, run in the child process.
fn child(scenario: &str) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        if scenario == "init" {
            let idem = Idem::builder().store(MemoryStore::new()).build();
            idem_runtime::init(idem).expect("first init");
        }
        // Several calls and keys: the message is still said once.
        for n in [1, 2, 1] {
            assert_eq!(once(n).await.expect("runs"), n);
        }
    });
}

/// Runs `scenario` in a child process with `env` set; its stderr.
fn stderr_of(scenario: &str, env: &[(&str, &str)]) -> String {
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut command = Command::new(exe);
    command
        .args([
            "--exact",
            "fallback_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, scenario)
        .env_remove("IDEM_QUIET_FALLBACK")
        .env_remove("RUST_LOG");
    for (name, value) in env {
        command.env(name, value);
    }
    let output = command.output().expect("the child runs");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(
        output.status.success(),
        "child {scenario} failed: {}\nstdout: {}\nstderr: {stderr}",
        output.status,
        String::from_utf8_lossy(&output.stdout)
    );
    stderr
}

/// The child's entry: does nothing in a normal run.
#[test]
fn fallback_child() {
    if let Ok(scenario) = std::env::var(CHILD) {
        child(&scenario);
    }
}

#[test]
fn the_fallback_says_so_on_stderr_once_per_process() {
    let stderr = stderr_of("fallback", &[]);
    assert_eq!(stderr.matches(MESSAGE).count(), 1, "stderr: {stderr}");
    // It says what to do about it, and how to opt in.
    assert!(stderr.contains("idem_runtime::init"), "stderr: {stderr}");
    assert!(stderr.contains("IDEM_QUIET_FALLBACK=1"), "stderr: {stderr}");
}

#[test]
fn an_opted_in_fallback_is_quiet() {
    let stderr = stderr_of("fallback", &[("IDEM_QUIET_FALLBACK", "1")]);
    assert!(!stderr.contains(MESSAGE), "stderr: {stderr}");
}

#[test]
fn an_initialised_memory_store_is_no_fallback() {
    let stderr = stderr_of("init", &[]);
    assert!(!stderr.contains(MESSAGE), "stderr: {stderr}");
}
