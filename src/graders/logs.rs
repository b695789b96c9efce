//! Reading test results out of a test runner's log: which tests passed and which did
//! not, by name. Pluggable by name (`log_parser` in a task's grader): `pytest` reads
//! `pytest -rA` output (the `PASSED name` / `FAILED name` summary lines, and the
//! `name PASSED` lines of `-v`).
//!
//! Results come from the log, never from the runner's exit status alone: a program
//! under test that exits the interpreter with status 0 before any test ran has passed
//! nothing.

use std::collections::BTreeMap;

/// One test's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TestStatus {
    /// It passed.
    Passed,
    /// It failed, errored, or was expected to fail and passed.
    Failed,
    /// It was skipped or expected to fail.
    Skipped,
}

/// The log parsers by name.
pub const PARSERS: &[&str] = &["pytest"];

/// Parses `log` with the parser named `name`; `None` for an unknown name (task specs
/// are checked against [`PARSERS`] at submit time).
pub fn parse(name: &str, log: &str) -> Option<BTreeMap<String, TestStatus>> {
    match name {
        "pytest" => Some(pytest(log)),
        _ => None,
    }
}

/// `pytest -rA` (and `-v`) output: test ids with their outcomes. A later line about
/// the same test wins, except that a failure is never overwritten by a pass (pytest
/// reports a test's teardown error after its pass).
pub fn pytest(log: &str) -> BTreeMap<String, TestStatus> {
    let mut out = BTreeMap::new();
    let mut record = |name: &str, status: TestStatus| {
        let name = name.trim().to_string();
        if name.is_empty() || name.contains(' ') && !name.contains('[') {
            return;
        }
        let entry = out.entry(name).or_insert(status);
        if *entry != TestStatus::Failed {
            *entry = status;
        }
    };
    for line in log.lines() {
        let line = line.trim_end();
        // Summary lines: `PASSED tests/test_a.py::test_x`, `FAILED id - reason`.
        let words = [
            ("PASSED ", TestStatus::Passed),
            ("FAILED ", TestStatus::Failed),
            ("ERROR ", TestStatus::Failed),
            ("XPASS ", TestStatus::Failed),
            ("SKIPPED ", TestStatus::Skipped),
            ("XFAIL ", TestStatus::Skipped),
        ];
        let mut matched = false;
        for (word, status) in words {
            if let Some(rest) = line.strip_prefix(word) {
                let id = rest.split(" - ").next().unwrap_or(rest);
                if id.contains("::") {
                    record(id, status);
                }
                matched = true;
                break;
            }
        }
        if matched {
            continue;
        }
        // Verbose lines: `tests/test_a.py::test_x PASSED  [ 50%]`.
        let mut parts = line.split_whitespace();
        if let (Some(id), Some(word)) = (parts.next(), parts.next()) {
            if !id.contains("::") {
                continue;
            }
            let status = match word {
                "PASSED" => TestStatus::Passed,
                "FAILED" | "ERROR" | "XPASS" => TestStatus::Failed,
                "SKIPPED" | "XFAIL" => TestStatus::Skipped,
                _ => continue,
            };
            record(id, status);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pytest_summary_and_verbose_lines() {
        let log = "\
tests/test_a.py::test_one PASSED                                          [ 33%]
tests/test_a.py::test_two FAILED                                          [ 66%]
tests/test_a.py::test_p[1-2] PASSED                                       [100%]
=========================== short test summary info ============================
PASSED tests/test_a.py::test_one
PASSED tests/test_a.py::test_p[1-2]
FAILED tests/test_a.py::test_two - assert 1 == 2
ERROR tests/test_b.py::test_three - ImportError
========================= 1 failed, 2 passed in 0.01s ==========================";
        let r = pytest(log);
        assert_eq!(r["tests/test_a.py::test_one"], TestStatus::Passed);
        assert_eq!(r["tests/test_a.py::test_two"], TestStatus::Failed);
        assert_eq!(r["tests/test_a.py::test_p[1-2]"], TestStatus::Passed);
        assert_eq!(r["tests/test_b.py::test_three"], TestStatus::Failed);
        assert_eq!(r.len(), 4);
    }

    #[test]
    fn a_teardown_error_after_a_pass_is_a_failure() {
        let log = "PASSED t.py::test_x\nERROR t.py::test_x - teardown\nPASSED t.py::test_x";
        assert_eq!(pytest(log)["t.py::test_x"], TestStatus::Failed);
    }

    #[test]
    fn an_empty_log_passes_nothing() {
        assert!(pytest("").is_empty());
        assert!(parse("pytest", "1 passed").unwrap().is_empty());
        assert!(parse("junit", "").is_none());
    }
}
