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
//!
//! The code under test writes to the same log, and can write lines of the runner's
//! shape (`tests.test_x.C.test_m ... ok`) for tests the runner says failed. So the
//! lines are checked against the summary the runner writes last ([`agree`]), one test's
//! names (`test_m (m.C)`, `test_m (m.C.test_m)`, `m.C.test_m`) count as one
//! ([`dotted`]), and an expected dotted id is looked for under the runner's printed
//! forms only ([`spellings`]).

use std::collections::BTreeSet;

use super::text::{is_py_space, lines, py_split, py_strip};
use super::{Names, Reading, Summary, TestStatus};

/// Which of the unittest parsers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Flavor {
    /// SWE-bench's `parse_log_django`.
    Django,
    /// Full names as printed, every outcome.
    Unittest,
}

/// The names unittest gives the errors of a class's or a module's fixtures (its
/// `_ErrorHolder`s): reported, but not tests that ran.
const FIXTURES: [&str; 4] = [
    "setUpClass",
    "tearDownClass",
    "setUpModule",
    "tearDownModule",
];

/// The rule unittest writes above each failure report (`separator1`).
const REPORT_RULE: &str = "======================================================================";

/// Reads a unittest or Django log.
pub(super) fn read(log: &str, flavor: Flavor) -> Reading {
    let lines = lines(log);
    let mut r = Reading {
        same: Some(dotted),
        ..Reading::default()
    };
    let seen = sightings(&mut r, &lines);
    match flavor {
        Flavor::Django => django(&mut r, log, &lines),
        Flavor::Unittest => {
            r.names = Names::Unittest;
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
    let mut all = summaries(&lines);
    r.summary = all.pop();
    if let Some((s, at)) = r.summary.clone() {
        if let Some((earlier, line)) = all.last() {
            r.doubts.push(format!(
                "the log holds two closing summaries of unittest's (`{}` on line {}, and `{}` \
                 last): the runner writes one, so the other was written by the code under test",
                earlier.line,
                line + 1,
                s.line
            ));
        }
        agree(&mut r, &seen, &s, at);
    }
    r
}

/// What the runner's own lines say about each test, for the checks against its
/// summary.
#[derive(Debug, Default)]
struct Lines {
    /// Each outcome a per-test line gives (not a failure report, nor a subtest's line,
    /// nor a class's or module's fixture): the test's name, the outcome and the line.
    outcomes: Vec<(String, TestStatus, usize)>,
    /// The line of each test's start: its name (or docstring) written before ` ... `,
    /// once each time a test is started (fixtures and subtests aside).
    started: Vec<usize>,
    /// Each failure report (`FAIL: name`, `ERROR: name` under unittest's `====` rule):
    /// its outcome and line.
    reports: Vec<(TestStatus, usize)>,
}

/// The per-test lines, by full name: `name ... outcome`, an outcome alone on a later
/// line for the test still open, and the `FAIL:`/`ERROR:`/`UNEXPECTED SUCCESS:`
/// headers. A ` ... outcome` line that names no test as unittest prints names (output
/// of the code under test, or a doctest's dotted name) does not close the test that
/// is open: its outcome, on a later line, is still the runner's word on that test.
fn sightings(r: &mut Reading, lines: &[&str]) -> Lines {
    let mut seen = Lines::default();
    let mut open: Option<String> = None;
    let mut name_above: Option<String> = None;
    let mut rule_above = false;
    for (i, raw) in lines.iter().enumerate() {
        let line = py_strip(raw);
        let this_name = (!line.contains(" ... "))
            .then(|| test_name(line))
            .flatten()
            .map(str::to_string);
        if let Some((status, rest)) = header(line) {
            let id = test_name(rest).unwrap_or(rest);
            r.saw(id, status, i);
            if rule_above && status != TestStatus::XPass {
                seen.reports.push((status, i));
            }
            open = None;
        } else if line.contains(" ... ") || line.ends_with(" ...") {
            // A line left open ends in ` ...`: its outcome comes later.
            let padded = format!("{line} ");
            let parts: Vec<&str> = padded.split(" ... ").collect();
            let Some((outcome, descs)) = parts.split_last() else {
                continue;
            };
            // Each description's test. A line naming no test, just below a name, is
            // that test's docstring (whatever it holds, ` ... ` included).
            let named = descs.iter().any(|d| test_name(d).is_some());
            let ids: Vec<(String, bool, bool)> = match &name_above {
                Some(above) if !named => vec![(above.clone(), true, true)],
                _ => descs
                    .iter()
                    .map(|d| match test_name(d) {
                        Some(name) => (name.to_string(), true, name == d.trim()),
                        None => (d.trim().to_string(), false, true),
                    })
                    .collect(),
            };
            for (id, _, whole) in &ids {
                if *whole && !id.is_empty() && !is_fixture(id) {
                    seen.started.push(i);
                }
            }
            let last_name = ids
                .iter()
                .rev()
                .find(|(_, name, _)| *name)
                .map(|x| x.0.clone());
            let Some((id, is_name, whole)) = ids.last() else {
                continue;
            };
            match outcome_word(outcome.trim()) {
                Some(status) => {
                    r.saw(id, status, i);
                    // Output of a test that merely holds ` ... ok` names no test; a
                    // line naming one in any of its forms counts as its result.
                    if *whole && !is_fixture(id) && (*is_name || dotted(id).is_some()) {
                        seen.outcomes.push((id.clone(), status, i));
                    }
                    if *is_name {
                        open = None;
                    } else if last_name.is_some() {
                        open = last_name;
                    }
                }
                None => {
                    if last_name.is_some() {
                        open = last_name;
                    } else if open.is_none() {
                        open = Some(id.clone());
                    }
                }
            }
        } else if let Some(status) = outcome_word(line)
            && let Some(id) = open.take()
        {
            r.saw(&id, status, i);
            if !is_fixture(&id) {
                seen.outcomes.push((id, status, i));
            }
        }
        name_above = this_name;
        rule_above = line == REPORT_RULE;
    }
    seen
}

/// Whether `id` names a class's or module's fixture (`setUpClass (m.C)`).
fn is_fixture(id: &str) -> bool {
    id.split_once(" (")
        .is_some_and(|(method, _)| FIXTURES.contains(&method))
}

/// Adds a doubt for each way the runner's lines before its summary (on line `at`)
/// disagree with what the summary counts. unittest writes, per test it starts, its
/// name and ` ... ` and then one outcome (a failing subtest adds lines of its own,
/// and, before Python 3.11, leaves the test's own line without one); a report under a
/// `====` rule per failure and per error (of a subtest or a fixture too); and `Ran N
/// tests` counting the tests started (from 3.12 not those skipped before they
/// started) and `OK` or `FAILED (failures=…, errors=…, …)` counting the reports. A
/// log whose lines say more than that, or other than that, was written in part by
/// something else: the code under test printing the runner's lines for itself.
fn agree(r: &mut Reading, seen: &Lines, s: &Summary, at: usize) {
    let before = |line: &usize| *line < at;
    let count = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
    let total = s.total.unwrap_or(0);
    let (failed, errors, skipped) = (
        s.failed.unwrap_or(0),
        s.errors.unwrap_or(0),
        s.skipped.unwrap_or(0),
    );
    let reported = |st: TestStatus| {
        count(
            seen.reports
                .iter()
                .filter(|(x, l)| *x == st && before(l))
                .count(),
        )
    };
    let (failure_reports, error_reports) =
        (reported(TestStatus::Failed), reported(TestStatus::Error));
    if (failure_reports, error_reports) != (failed, errors) {
        r.doubts.push(format!(
            "unittest's own summary (`{}`) counts {failed} failures and {errors} errors, but the \
             log holds {failure_reports} failure and {error_reports} error reports: the log is \
             not one run of the runner",
            s.line
        ));
    }
    let outcomes: Vec<&(String, TestStatus, usize)> =
        seen.outcomes.iter().filter(|(_, _, l)| before(l)).collect();
    let results = count(outcomes.len());
    let unskipped = count(
        outcomes
            .iter()
            .filter(|(_, st, _)| *st != TestStatus::Skipped)
            .count(),
    );
    if unskipped > total || results > total.saturating_add(skipped) {
        r.doubts.push(format!(
            "the log gives {results} per-test results but unittest's own summary (`{}`) says it \
             ran {total} tests: lines were added to the log",
            s.line
        ));
    }
    let started = count(seen.started.iter().filter(|l| before(l)).count());
    if started < total {
        r.doubts.push(format!(
            "unittest's own summary (`{}`) says it ran {total} tests, but the log names only \
             {started} (run it with `-v`, verbosity 2, so each test has its line)",
            s.line
        ));
    }
    let tests = |st: TestStatus| -> u64 {
        let ids: BTreeSet<String> = outcomes
            .iter()
            .filter(|(_, x, _)| *x == st)
            .map(|(id, _, _)| dotted(id).unwrap_or_else(|| id.clone()))
            .collect();
        count(ids.len())
    };
    // Every test that ran, skipped ones aside (Python 3.12 stops counting them), is in
    // `Ran N`; one with an expected failure or unexpected success is not `ok`.
    let room = total
        .saturating_sub(s.xfailed.unwrap_or(0))
        .saturating_sub(s.xpassed.unwrap_or(0));
    for (st, word, counted) in [
        (TestStatus::Passed, "ok", room),
        (TestStatus::Failed, "FAIL", failed),
        (TestStatus::Error, "ERROR", errors),
        (TestStatus::Skipped, "skipped", skipped),
        (
            TestStatus::XFail,
            "expected failure",
            s.xfailed.unwrap_or(0),
        ),
        (
            TestStatus::XPass,
            "unexpected success",
            s.xpassed.unwrap_or(0),
        ),
    ] {
        r.check_count("the runner", word, tests(st), Some(counted));
    }
    r.check_failing("unittest", &s.line, at, failed.saturating_add(errors));
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

/// Whether `s` is a dotted name: two or more words of letters, digits and `_`,
/// joined by dots (`pkg.mod.Class.test_m`, what `TestCase.id()` gives).
fn is_dotted(s: &str) -> bool {
    let word = |w: &str| !w.is_empty() && w.chars().all(|c| c.is_alphanumeric() || c == '_');
    s.contains('.') && s.split('.').all(word)
}

/// A test's one name, its dotted id (`pkg.mod.Class.test_m`), from any of the forms
/// unittest gives it: `test_m (pkg.mod.Class)` (Python before 3.11), `test_m
/// (pkg.mod.Class.test_m)` (3.11 and later: the dotted id in brackets, at least
/// module, class and method), or the dotted id itself. `None` for anything else (a
/// subtest's name with its parameters, a docstring). A class whose name is its
/// method's, in a dotted module, printed by a Python before 3.11 (`test_m
/// (pkg.mod.test_m)`), reads as 3.11's form: the one ambiguity of the two forms.
pub(super) fn dotted(id: &str) -> Option<String> {
    if is_dotted(id) {
        return Some(id.to_string());
    }
    if test_name(id) != Some(id) {
        return None;
    }
    let (method, rest) = id.split_once(" (")?;
    let path = rest.strip_suffix(')')?;
    let full = path
        .strip_suffix(method)
        .is_some_and(|p| p.ends_with('.') && p.matches('.').count() >= 2);
    Some(if full {
        path.to_string()
    } else {
        format!("{path}.{method}")
    })
}

/// The names a test `id` may be recorded under by the `unittest` parser, in the order
/// to try them: `id` itself, then its other printed form; a dotted id only under its
/// two printed forms, since unittest never prints one (a doctest too is printed as
/// `name (module)`): a line that names a test by its dotted id was written by
/// something else.
pub(super) fn spellings(id: &str) -> Vec<String> {
    let Some(full) = dotted(id) else {
        return vec![id.to_string()];
    };
    let Some((path, method)) = full.rsplit_once('.') else {
        return vec![id.to_string()];
    };
    let new = format!("{method} ({full})");
    let old = format!("{method} ({path})");
    let mut out = if is_dotted(id) {
        vec![new, old]
    } else {
        vec![id.to_string(), new, old]
    };
    let mut seen = BTreeSet::new();
    out.retain(|n| seen.insert(n.clone()));
    out
}

/// Every closing summary in the log with the index of its `Ran N tests in Xs` line:
/// the `OK` / `FAILED (…)` / `NO TESTS RAN` line after it read into counts. The last
/// `Ran` line is the runner's; without its verdict line the run was cut short and
/// there is none.
fn summaries(lines: &[&str]) -> Vec<(Summary, usize)> {
    let ran: Vec<(usize, u64)> = lines
        .iter()
        .enumerate()
        .filter_map(|(i, l)| {
            let l = py_strip(l);
            let rest = l.strip_prefix("Ran ")?;
            let (n, rest) = super::text::leading_number(rest)?;
            let rest = rest
                .strip_prefix("tests in ")
                .or_else(|| rest.strip_prefix("test in "))?;
            rest.strip_suffix('s')
                .filter(|d| !d.is_empty() && d.chars().all(|c| c.is_ascii_digit() || c == '.'))?;
            Some((i, n))
        })
        .collect();
    let complete: Vec<(Summary, usize)> = ran
        .iter()
        .filter_map(|&(at, n)| Some((summary_at(lines, at, n)?, at)))
        .collect();
    match (ran.last(), complete.last()) {
        (Some((last, _)), Some((_, at))) if last == at => complete,
        _ => Vec::new(),
    }
}

/// The summary whose `Ran {ran} tests` line is line `at`, if its verdict line follows.
fn summary_at(lines: &[&str], at: usize, ran: u64) -> Option<Summary> {
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
    Some(s)
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

/// Why `parser` can never report `id` as passing. The `unittest` parser reports a
/// test by its name as unittest prints it (`test_x (module.Class)`, or from Python 3.11
/// `test_x (module.Class.test_x)`; a `FunctionTestCase`'s `module.Class (function)`),
/// and finds a test by its dotted id (`module.Class.test_x`) under either printed form;
/// nothing else (a docstring, which unittest prints below the name; a subtest's
/// parameters, which are not part of the test's name; a bare method name). SWE-bench's
/// `django` parser records a passing test by its line's text, which Django's runner
/// never writes as a dotted id.
pub(super) fn unreportable(parser: &str, id: &str) -> Option<String> {
    if let Some((file, _)) = id.split_once("::")
        && file.contains(".py")
    {
        return Some(format!(
            "`{id}` is a pytest node id (`path::name`), but the `{parser}` parser reads unittest's \
             `test_x (module.Class)` names"
        ));
    }
    if parser == "django" {
        if is_dotted(id) && id.matches('.').count() >= 2 {
            return Some(format!(
                "`{id}` is unittest's dotted id, which Django's runner never prints and the \
                 `django` parser (SWE-bench's) never reports: name the test as the runner prints \
                 it (`test_x (module.Class)`), or use the `unittest` parser, which reads Django's \
                 runner and matches dotted ids"
            ));
        }
        return None;
    }
    if py_strip(id) != id {
        return Some(format!(
            "the `unittest` parser reads names from stripped lines, so it can never report `{id}` \
             with its surrounding whitespace"
        ));
    }
    let printed = id.split_once(" (").is_some_and(|(left, rest)| {
        let word = |c: char| c.is_alphanumeric() || c == '_' || c == '.';
        !left.is_empty()
            && left.chars().all(word)
            && rest
                .strip_suffix(')')
                .is_some_and(|p| !p.is_empty() && p.chars().all(word))
    });
    if is_dotted(id) || printed {
        return None;
    }
    let what = if test_name(id).is_some() {
        "a subtest's parameters are not part of its test's name, and the parser reports the test"
    } else if id.chars().all(|c| c.is_alphanumeric() || c == '_') {
        "a bare method name is never printed alone"
    } else {
        "unittest prints a test's docstring below its name, which the parser reports it by"
    };
    Some(format!(
        "the `unittest` parser reports a test by its name as unittest prints it (`test_x \
         (module.Class)`, `test_x (module.Class.test_x)` from Python 3.11) or finds it by its \
         dotted id (`module.Class.test_x`), so it can never report `{id}`: {what}"
    ))
}

#[cfg(test)]
mod tests;
