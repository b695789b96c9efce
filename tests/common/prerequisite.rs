//! What a test does when something it needs is not on the machine: under `CI=true` it
//! fails with the reason (a test that passes without running hides a broken install
//! step); elsewhere it says it skipped, and why, and returns without checking anything.

/// Reports a missing prerequisite: panics under `CI=true`, else prints that `test` was
/// skipped and why. The caller returns when this returns.
pub fn missing(test: &str, why: &str) {
    if std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") {
        panic!("{test}: cannot run under CI: {why}");
    }
    eprintln!("SKIPPED {test}: {why}");
}
