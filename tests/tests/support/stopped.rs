//! Stopping a child process for a pause test, and knowing it is stopped.
//!
//! `kill -STOP` returns once the signal is sent, not once every thread of the target
//! has stopped: on a loaded machine a thread already on a CPU can run on for a moment,
//! see the "go" the test gives next, and act before the pause it was meant to sit
//! through. So the test waits until the kernel reports every thread stopped.

use std::process::Command;
use std::time::Duration;

/// Sends SIGSTOP to `pid` and returns once each of its threads is stopped (`T` in
/// `/proc/<pid>/task/*/stat`). Panics after 10 s.
pub(crate) fn stop(pid: u32) {
    signal(pid, "-STOP");
    for _ in 0..2000 {
        if all_stopped(pid) {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("process {pid} did not stop within 10 s of SIGSTOP");
}

/// Sends `sig` (`-CONT`, `-KILL`, ...) to `pid`.
pub(crate) fn signal(pid: u32, sig: &str) {
    let pid = pid.to_string();
    let ok = Command::new("kill").args([sig, &pid]).status().unwrap();
    assert!(ok.success(), "kill {sig} {pid}");
}

fn all_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().all(|task| {
        std::fs::read_to_string(task.path().join("stat")).is_ok_and(|stat| {
            // The state follows the command name's closing parenthesis.
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next())
                .is_some_and(|state| state == 'T' || state == 't')
        })
    })
}
