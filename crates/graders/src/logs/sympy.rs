//! sympy's own test runner (`bin/test -C --verbose`, which calls
//! `sympy.testing.runtests`): SWE-bench's `sympy` parser, and what the runner says.
//!
//! The runner names each file (`sympy/core/tests/test_basic.py[22] `), then writes a
//! line per test, `test_x ok`, `F` (failed), `E` (exception), `s` after the skip's
//! reason, `f` (expected to fail), `X` (expected to fail but passed); the file's last
//! line also gets `[OK]` or `[FAIL]`. Failures follow under `____ path.py:test_x ____`
//! rules, and the run ends with `tests finished: 2 passed, 1 failed, … in 0.35
//! seconds`, wrapped over lines when long.

use std::collections::BTreeSet;

use super::text::{leading_number, lines, py_split, py_strip};
use super::{Reading, Summary, TestStatus};

/// Reads a sympy log.
pub(super) fn read(log: &str) -> Reading {
    let lines = lines(log);
    let mut r = Reading::default();
    // SWE-bench: every traceback rule's `path.py:name` failed, then the test lines.
    for line in &lines {
        if let Some(key) = rule_name(line) {
            r.record(&key, TestStatus::Failed);
        }
    }
    for line in &lines {
        let line = py_strip(line);
        if !line.starts_with("test_") {
            continue;
        }
        let Some(name) = py_split(line).first().map(|w| (*w).to_string()) else {
            continue;
        };
        if line.ends_with(" E") {
            r.record(&name, TestStatus::Error);
        }
        if line.ends_with(" F") {
            r.record(&name, TestStatus::Failed);
        }
        if line.ends_with(" ok") {
            r.record(&name, TestStatus::Passed);
        }
    }
    let mut file: Option<String> = None;
    for (i, raw) in lines.iter().enumerate() {
        let line = py_strip(raw);
        if let Some(f) = file_header(line) {
            file = Some(f.to_string());
            continue;
        }
        if !line.starts_with("test_") {
            continue;
        }
        let mut words = py_split(line);
        if matches!(words.last(), Some(&"[OK]" | &"[FAIL]")) {
            words.pop();
        }
        if words.len() < 2 {
            continue;
        }
        let status = match words.last() {
            Some(&"ok") => TestStatus::Passed,
            Some(&"F") => TestStatus::Failed,
            Some(&"E") => TestStatus::Error,
            Some(&"s") => TestStatus::Skipped,
            Some(&"f") => TestStatus::XFail,
            Some(&"X") => TestStatus::XPass,
            _ => continue,
        };
        let id = match &file {
            Some(f) => format!("{f}:{}", words[0]),
            None => words[0].to_string(),
        };
        r.saw(&id, status, i);
    }
    r.summary = summary(&lines);
    if let Some((s, at)) = r.summary.clone() {
        let listed = |status: TestStatus| -> u64 {
            let ids: BTreeSet<&str> = r
                .sightings
                .iter()
                .filter(|x| x.status == status && x.line < at)
                .map(|x| x.id.as_str())
                .collect();
            u64::try_from(ids.len()).unwrap_or(u64::MAX)
        };
        let counts: Vec<(&str, u64, Option<u64>)> = [
            ("ok", TestStatus::Passed, s.passed),
            ("F", TestStatus::Failed, s.failed),
            ("E", TestStatus::Error, s.errors),
            ("s", TestStatus::Skipped, s.skipped),
            ("f", TestStatus::XFail, s.xfailed),
            ("X", TestStatus::XPass, s.xpassed),
        ]
        .into_iter()
        .map(|(word, st, counted)| (word, listed(st), counted))
        .collect();
        for (word, n, counted) in counts {
            r.check_count("sympy", &format!("`{word}`"), n, counted);
        }
        // Only failures: an exception may be a test file's import error, which has no
        // per-test line.
        r.check_failing("sympy", &s.line, at, s.failed.unwrap_or(0));
    }
    r
}

/// SWE-bench's `(_*) (.*)\.py:(.*) (_*)` on one line, as `re.findall` matches it: from
/// the line's first space, the last `.py:` that a later space follows, up to the last
/// space; `path.py:name`.
fn rule_name(line: &str) -> Option<String> {
    let first_space = line.find(' ')?;
    let last_space = line.rfind(' ')?;
    let body = &line[first_space + 1..];
    let mut best = None;
    for (i, _) in body.match_indices(".py:") {
        let at = first_space + 1 + i;
        if at + 4 <= last_space {
            best = Some(at);
        }
    }
    let at = best?;
    Some(format!(
        "{}.py:{}",
        &line[first_space + 1..at],
        &line[at + 4..last_space]
    ))
}

/// A file's header line, `path.py[N]`: the path.
fn file_header(line: &str) -> Option<&str> {
    let (path, count) = line.split_once('[')?;
    let count = count.strip_suffix(']')?;
    (path.ends_with(".py") && !count.is_empty() && count.bytes().all(|b| b.is_ascii_digit()))
        .then_some(path)
}

/// The last `tests finished: …, in X seconds` (up to three more lines when wrapped),
/// with the index of its first line.
fn summary(lines: &[&str]) -> Option<(Summary, usize)> {
    let at = lines.iter().rposition(|l| l.contains("tests finished:"))?;
    let mut text = String::new();
    for line in lines.iter().skip(at).take(4) {
        text.push_str(py_strip(line));
        text.push(' ');
        if line.contains(" seconds") {
            break;
        }
    }
    let body = text.split_once("tests finished:")?.1;
    let body = body.trim().trim_end_matches('=').trim();
    let mut s = Summary {
        line: text.trim().trim_matches('=').trim().to_string(),
        ..Summary::default()
    };
    let mut timed = false;
    for item in body.split(',') {
        let item = item.trim();
        if item.starts_with("in ") && item.ends_with(" seconds") {
            timed = true;
            continue;
        }
        let Some((n, words)) = leading_number(item) else {
            continue;
        };
        let slot = match words {
            "passed" => &mut s.passed,
            "failed" => &mut s.failed,
            "skipped" => &mut s.skipped,
            "expected to fail" => &mut s.xfailed,
            "expected to fail but passed" => &mut s.xpassed,
            "exceptions" | "exception" => &mut s.errors,
            _ => continue,
        };
        *slot = Some(n);
    }
    timed.then_some((s, at))
}

/// Why the `sympy` parser can never report `id` as passing: it reads passes only as
/// the first word of a line starting `test_`.
pub(super) fn unreportable(id: &str) -> Option<String> {
    if id.starts_with("test_") && !id.contains(super::text::is_py_space) {
        return None;
    }
    Some(format!(
        "the `sympy` parser reports a pass only for a bare function name such as \
         `test_basic` (the first word of `test_basic ok`), so it can never report `{id}` \
         as passing"
    ))
}

#[cfg(test)]
mod tests;
