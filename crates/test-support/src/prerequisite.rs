//! What a test does when something it needs is not on the machine: under `CI=true` it
//! fails with the reason (a test that passes without running hides a broken install
//! step); elsewhere it says it skipped, and why, and returns without checking anything.
//!
//! The skip is written straight to the process's standard error, past the test
//! harness's capture (which shows a passing test's output to nobody), and appended to
//! the file `ROLLOUT_TEST_SKIPS` names, from which the test command counts and lists
//! every skip at its end.

use std::io::Write;

/// Reports a missing prerequisite: panics under `CI=true`, else reports that `test` was
/// skipped and why. The caller returns when this returns.
pub fn missing(test: &str, why: &str) {
    if std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") {
        panic!("{test}: cannot run under CI: {why}");
    }
    let line = format!("SKIPPED {test}: {why}\n");
    let _ = std::io::stderr().write_all(line.as_bytes());
    if let Some(path) = std::env::var_os("ROLLOUT_TEST_SKIPS")
        && let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
    {
        let _ = f.write_all(line.as_bytes());
    }
}
