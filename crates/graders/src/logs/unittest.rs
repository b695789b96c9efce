//! unittest's verbose logs: SWE-bench's `django` parser for Django's
//! `tests/runtests.py --verbosity 2`, and the `unittest` parser for `python -m unittest
//! -v` (Django's runner prints the same lines, so it reads those too).
//!
//! At verbosity 2 unittest writes `name ... outcome` per test, where the name is
//! `test_x (module.Class)` (Python 3.11 and later: `test_x (module.Class.test_x)`),
//! or, for a test with a docstring, that name alone on a line and the docstring's
//! first line before the ` ... `. The outcome is `ok`, `FAIL`, `ERROR`, `skipped
//! 'why'`, `expected failure` or `unexpected success`; output the test wrote to stderr
//! comes between the ` ... ` and the outcome, which may so land on a later line. A
//! failing subtest leaves its test's line open (Python 3.11 and later write the subtest
//! on an indented line of its own). Failures are then shown under `FAIL: name` and
//! `ERROR: name` headers, and the run ends with `Ran N tests in Xs` and `OK` or `FAILED
//! (failures=1, errors=2, skipped=1, expected failures=1, unexpected successes=1)`.

use std::collections::BTreeSet;

use super::text::{is_py_space, lines, py_split, py_strip};
use super::{Reading, Summary, TestStatus};

/// Which of the unittest parsers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Flavor {
    /// SWE-bench's `parse_log_django`.
    Django,
    /// Full names as printed, every outcome.
    Unittest,
}

/// Reads a unittest or Django log.
pub(super) fn read(log: &str, flavor: Flavor) -> Reading {
    let lines = lines(log);
    let mut r = Reading::default();
    sightings(&mut r, &lines);
    match flavor {
        Flavor::Django => django(&mut r, log, &lines),
        Flavor::Unittest => {
            let seen: Vec<(String, TestStatus)> = r
                .sightings
                .iter()
                .map(|s| (s.id.clone(), s.status))
                .collect();
            for (id, status) in seen {
                r.record(&id, status);
            }
        }
    }
    r.summary = summary(&lines);
    if let Some((s, at)) = &r.summary
        && let Some(total) = s.total
    {
        // Every test that ran, skipped ones aside (Python 3.12 stops counting them),
        // is in `Ran N`; one with an expected failure or unexpected success is not `ok`.
        let room = total
            .saturating_sub(s.xfailed.unwrap_or(0))
            .saturating_sub(s.xpassed.unwrap_or(0));
        let ok: BTreeSet<&str> = r
            .sightings
            .iter()
            .filter(|x| x.status == TestStatus::Passed && x.line < *at)
            .map(|x| x.id.as_str())
            .collect();
        let ok = u64::try_from(ok.len()).unwrap_or(u64::MAX);
        r.check_count("the runner", "ok", ok, Some(room));
    }
    r
}

/// The per-test lines, by full name: `name ... outcome`, an outcome alone on a later
/// line for the test still open, and the `FAIL:`/`ERROR:`/`UNEXPECTED SUCCESS:`
/// headers.
fn sightings(r: &mut Reading, lines: &[&str]) {
    let mut open: Option<String> = None;
    let mut name_above: Option<String> = None;
    for (i, raw) in lines.iter().enumerate() {
        let line = py_strip(raw);
        let this_name = (!line.contains(" ... "))
            .then(|| test_name(line))
            .flatten()
            .map(str::to_string);
        if let Some((status, rest)) = header(line) {
            let id = test_name(rest).unwrap_or(rest);
            r.saw(id, status, i);
            open = None;
        } else if line.contains(" ... ") || line.ends_with(" ...") {
            // A line left open ends in ` ...`: its outcome comes later.
            let padded = format!("{line} ");
            let parts: Vec<&str> = padded.split(" ... ").collect();
            let (Some(outcome), Some(desc)) = (parts.last(), parts.len().checked_sub(2)) else {
                continue;
            };
            let desc = parts[desc];
            let id = match test_name(desc) {
                Some(name) => name.to_string(),
                None if parts.len() == 2 => name_above.clone().unwrap_or_else(|| desc.to_string()),
                None => desc.to_string(),
            };
            match outcome_word(outcome.trim()) {
                Some(status) => {
                    r.saw(&id, status, i);
                    open = None;
                }
                None => open = Some(id),
            }
        } else if let Some(status) = outcome_word(line)
            && let Some(id) = open.take()
        {
            r.saw(&id, status, i);
        }
        name_above = this_name;
    }
}

/// An outcome as unittest writes it after ` ... `.
fn outcome_word(s: &str) -> Option<TestStatus> {
    Some(match s {
        "ok" | "OK" => TestStatus::Passed,
        "FAIL" => TestStatus::Failed,
        "ERROR" => TestStatus::Error,
        "expected failure" => TestStatus::XFail,
        "unexpected success" => TestStatus::XPass,
        _ if s == "skipped" || s.starts_with("skipped ") => TestStatus::Skipped,
        _ => return None,
    })
}

/// A failure header (`FAIL: name`, `ERROR: name`, `UNEXPECTED SUCCESS: name`).
fn header(line: &str) -> Option<(TestStatus, &str)> {
    for (prefix, status) in [
        ("FAIL: ", TestStatus::Failed),
        ("ERROR: ", TestStatus::Error),
        ("UNEXPECTED SUCCESS: ", TestStatus::XPass),
    ] {
        if let Some(rest) = line.strip_prefix(prefix) {
            let rest = rest.trim();
            if !rest.is_empty() {
                return Some((status, rest));
            }
        }
    }
    None
}

/// The test's name in `s` if `s` is one as unittest prints it: `method (dotted.path)`,
/// possibly followed by a subtest's ` (params)`, which is left out (a failing subtest
/// fails its test).
fn test_name(s: &str) -> Option<&str> {
    let open = s.find(" (")?;
    let method = &s[..open];
    let word = |c: char| c.is_alphanumeric() || c == '_';
    if method.is_empty() || !method.chars().all(word) {
        return None;
    }
    let rest = &s[open + 2..];
    let close = rest.find(')')?;
    let path = &rest[..close];
    if path.is_empty() || !path.chars().all(|c| word(c) || c == '.') {
        return None;
    }
    let end = open + 2 + close + 1;
    let after = &s[end..];
    (after.is_empty() || (after.starts_with(" (") && after.ends_with(')'))).then(|| &s[..end])
}

/// `Ran N tests in Xs` (the last one) and the `OK` / `FAILED (…)` / `NO TESTS RAN`
/// line after it, with the index of the `Ran` line.
fn summary(lines: &[&str]) -> Option<(Summary, usize)> {
    let (at, ran) = lines.iter().enumerate().rev().find_map(|(i, l)| {
        let l = py_strip(l);
        let rest = l.strip_prefix("Ran ")?;
        let (n, rest) = super::text::leading_number(rest)?;
        let rest = rest
            .strip_prefix("tests in ")
            .or_else(|| rest.strip_prefix("test in "))?;
        rest.strip_suffix('s')
            .filter(|d| !d.is_empty() && d.chars().all(|c| c.is_ascii_digit() || c == '.'))?;
        Some((i, n))
    })?;
    let verdict = lines
        .iter()
        .skip(at + 1)
        .map(|l| py_strip(l))
        .filter(|l| !l.is_empty())
        .take(3)
        .find(|l| {
            *l == "OK" || *l == "NO TESTS RAN" || l.starts_with("OK (") || l.starts_with("FAILED (")
        })?;
    let mut s = Summary {
        line: format!("{}; {verdict}", py_strip(lines[at])),
        total: Some(ran),
        ..Summary::default()
    };
    if let Some(inner) = verdict
        .split_once('(')
        .and_then(|(_, r)| r.strip_suffix(')'))
    {
        for item in inner.split(", ") {
            let Some((key, value)) = item.split_once('=') else {
                continue;
            };
            let Ok(n) = value.parse::<u64>() else {
                continue;
            };
            let slot = match key {
                "failures" => &mut s.failed,
                "errors" => &mut s.errors,
                "skipped" => &mut s.skipped,
                "expected failures" => &mut s.xfailed,
                "unexpected successes" => &mut s.xpassed,
                _ => continue,
            };
            *slot = Some(n);
        }
    }
    Some((s, at))
}

/// SWE-bench's Django parser, line by line, then its three patterns for Django's own
/// output interleaved between a test's ` ... ` and its `ok`.
fn django(r: &mut Reading, log: &str, lines: &[&str]) {
    const VERSION: &str = "--version is equivalent to version";
    let mut previous: Option<String> = None;
    for raw in lines {
        let mut line = py_strip(raw).to_string();
        if line.contains(VERSION) {
            r.record(VERSION, TestStatus::Passed);
        }
        if line.contains(" ... ") {
            previous = line.split(" ... ").next().map(str::to_string);
        }
        for suffix in [" ... ok", " ... OK", " ...  OK"] {
            if line.ends_with(suffix) {
                // One instance's test name follows a migration's output on its line.
                if line.starts_with("Applying sites.0002_alter_domain_unique...test_no_migrations")
                {
                    line = py_strip(line.split_once("...").map_or("", |(_, b)| b)).to_string();
                }
                if let Some((test, _)) = line.rsplit_once(suffix) {
                    let test = test.to_string();
                    r.record(&test, TestStatus::Passed);
                }
                break;
            }
        }
        if let Some((test, _)) = line.split_once(" ... skipped") {
            let test = test.to_string();
            r.record(&test, TestStatus::Skipped);
        }
        if line.ends_with(" ... FAIL") {
            let test = line
                .split(" ... FAIL")
                .next()
                .unwrap_or_default()
                .to_string();
            r.record(&test, TestStatus::Failed);
        }
        if line.starts_with("FAIL:")
            && let Some(word) = py_split(&line).get(1)
        {
            let word = py_strip(word).to_string();
            r.record(&word, TestStatus::Failed);
        }
        if line.ends_with(" ... ERROR") {
            let test = line
                .split(" ... ERROR")
                .next()
                .unwrap_or_default()
                .to_string();
            r.record(&test, TestStatus::Error);
        }
        if line.starts_with("ERROR:")
            && let Some(word) = py_split(&line).get(1)
        {
            let word = py_strip(word).to_string();
            r.record(&word, TestStatus::Error);
        }
        if line.trim_start_matches(is_py_space).starts_with("ok")
            && let Some(test) = &previous
        {
            let test = test.clone();
            r.record(&test, TestStatus::Passed);
        }
    }
    for tail in [Tail::TestingAgainst, Tail::ServerError, Tail::SystemCheck] {
        for name in interleaved(log, tail) {
            r.record(&name, TestStatus::Passed);
        }
    }
}

/// What follows `name ... ` in SWE-bench's three Django patterns, each ending in a
/// line `ok`.
#[derive(Debug, Clone, Copy)]
enum Tail {
    /// `Testing against Django installed in …(any lines)… silenced).` then `ok`.
    TestingAgainst,
    /// `Internal Server Error: /…/` then `ok`.
    ServerError,
    /// `System check identified no issues (0 silenced)` (no full stop) then `ok`.
    SystemCheck,
}

/// The names SWE-bench's pattern for `tail` finds in `log`, in order: `^(.*?)\s\.\.\.\s`
/// then the tail, matched as Python's `re.finditer` with `re.MULTILINE` does (a name
/// is the shortest start of a line that lets the rest match; matches do not overlap).
fn interleaved(log: &str, tail: Tail) -> Vec<String> {
    const SILENCED: &str = " silenced).\nok";
    // Where a `(?s:.*?) silenced\)\.\nok$` may end: each `…\nok` at a line's end.
    let silenced: Vec<usize> = match tail {
        Tail::TestingAgainst => log
            .match_indices(SILENCED)
            .map(|(i, _)| i + SILENCED.len())
            .filter(|&end| at_line_end(log, end))
            .collect(),
        _ => Vec::new(),
    };
    // Every `\n`'s position, to find the end of a match's line without rescanning.
    let line_ends: Vec<usize> = log.match_indices('\n').map(|(i, _)| i).collect();
    let mut found = Vec::new();
    let mut from = 0usize;
    let mut start = 0usize;
    while start < log.len() {
        let line_end = log[start..].find('\n').map_or(log.len(), |i| start + i);
        let mut matched = None;
        if start >= from {
            // Candidate ends of the name: a whitespace, `...`, a whitespace.
            // The name's end may be the line's own `\n` (`\s` matches it).
            let upto = if line_end < log.len() {
                line_end + 1
            } else {
                log.len()
            };
            for (e, c) in log[start..upto].char_indices() {
                let e = start + e;
                if !is_py_space(c) {
                    continue;
                }
                let after = &log[e + c.len_utf8()..];
                let Some(after) = after.strip_prefix("...") else {
                    continue;
                };
                let Some(c2) = after.chars().next().filter(|c| is_py_space(*c)) else {
                    continue;
                };
                let q = log.len() - after.len() + c2.len_utf8();
                if let Some(end) = tail_match(log, q, tail, &silenced, &line_ends) {
                    matched = Some((e, end));
                    break;
                }
            }
        }
        if let Some((e, end)) = matched {
            found.push(log[start..e].to_string());
            from = end;
        }
        match log[start..].find('\n') {
            Some(i) => start += i + 1,
            None => break,
        }
        while start < from && start < log.len() {
            match log[start..].find('\n') {
                Some(i) => start += i + 1,
                None => start = log.len(),
            }
        }
    }
    found
}

/// Whether `at` is the end of `log` or just before a `\n` (`$` under `re.MULTILINE`).
fn at_line_end(log: &str, at: usize) -> bool {
    at == log.len() || log[at..].starts_with('\n')
}

/// Where `tail` matches from byte `q` of `log`, if it does.
fn tail_match(
    log: &str,
    q: usize,
    tail: Tail,
    silenced: &[usize],
    line_ends: &[usize],
) -> Option<usize> {
    let rest = log.get(q..)?;
    match tail {
        Tail::TestingAgainst => {
            let body = rest.strip_prefix("Testing against Django installed in ")?;
            let from = log.len() - body.len();
            // The shortest `(?s:.*?)`: the first ` silenced).\nok` at a line's end.
            let i = silenced.partition_point(|&end| end < from + " silenced).\nok".len());
            silenced.get(i).copied()
        }
        Tail::ServerError => {
            let body = rest.strip_prefix("Internal Server Error: /")?;
            let from = log.len() - body.len();
            let nl = *line_ends.get(line_ends.partition_point(|&n| n < from))?;
            // `(.*)\/\nok$`: the line ends in `/`, the next line starts `ok` and ends there.
            if nl == from || !log[..nl].ends_with('/') {
                return None;
            }
            let end = nl + 1 + "ok".len();
            (log[nl + 1..].starts_with("ok") && at_line_end(log, end)).then_some(end)
        }
        Tail::SystemCheck => {
            let literal = "System check identified no issues (0 silenced)\nok";
            let end = q + literal.len();
            (rest.starts_with(literal) && at_line_end(log, end)).then_some(end)
        }
    }
}

/// Why `parser` can never report `id` as passing.
pub(super) fn unreportable(parser: &str, id: &str) -> Option<String> {
    if let Some((file, _)) = id.split_once("::")
        && file.contains(".py")
    {
        return Some(format!(
            "`{id}` is a pytest node id (`path::name`), but the `{parser}` parser reads unittest's \
             `test_x (module.Class)` names"
        ));
    }
    if parser == "unittest" && py_strip(id) != id {
        return Some(format!(
            "the `unittest` parser reads names from stripped lines, so it can never report `{id}` \
             with its surrounding whitespace"
        ));
    }
    None
}

#[cfg(test)]
mod tests;
