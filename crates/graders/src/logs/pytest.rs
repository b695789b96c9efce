//! pytest's logs: SWE-bench's parsers for them (`pytest`, `pytest_options`,
//! `pytest_v2`, `matplotlib`, `seaborn`), SWE-smith's `pytest_verbose`, and what pytest
//! itself says at the end of a run.
//!
//! pytest writes one `=== … test session starts ===` header and one closing summary
//! (`=== 3 failed, 7 passed, 2 errors in 0.06s ===`) per run; with `-rA` the run's
//! `short test summary info` section just above the summary lists every outcome
//! (`PASSED id`, `FAILED id - message`, `SKIPPED [N] path:line: reason`). Output
//! captured from tests comes before that section, and may hold whole runs of its own
//! (pytest's test suite runs pytest inside pytest), so the checks look at the last
//! section only.

use super::text::{
    cut_message, is_skip_count, leading_number, lines, py_split, strip_ansi, v2_clean,
};
use super::{Reading, SWEBENCH_WORDS, Summary, TestStatus};

/// Which of the pytest parsers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Flavor {
    /// SWE-bench's `parse_log_pytest`.
    Pytest,
    /// SWE-bench's `parse_log_pytest_options`.
    Options,
    /// SWE-bench's `parse_log_pytest_v2`.
    V2,
    /// SWE-bench's `parse_log_matplotlib`.
    Matplotlib,
    /// SWE-bench's `parse_log_seaborn`.
    Seaborn,
    /// SWE-smith's default Python profile's parser (`pytest --verbose`).
    Verbose,
}

/// The words pytest prints for outcomes, in the short summary and after ids.
const WORDS: [TestStatus; 6] = [
    TestStatus::Passed,
    TestStatus::Failed,
    TestStatus::Error,
    TestStatus::Skipped,
    TestStatus::XFail,
    TestStatus::XPass,
];

/// Reads a pytest log with the given parser's rules.
pub(super) fn read(log: &str, flavor: Flavor) -> Reading {
    let lines = lines(log);
    let mut r = Reading::default();
    for line in &lines {
        swebench_line(&mut r, flavor, line);
    }
    let clean: Vec<String> = lines.iter().map(|l| strip_ansi(l)).collect();
    // With session headers (any mode but `-q`) pytest's summaries carry their `=`
    // rule: an undecorated one is a test's output (`-q` runs inside tests) or forged.
    let headers = clean.iter().any(|l| session_header(l));
    let summaries: Vec<(usize, Summary)> = clean
        .iter()
        .enumerate()
        .filter_map(|(i, l)| summary(l).map(|s| (i, s)))
        .filter(|(_, s)| !headers || s.line.starts_with('='))
        .collect();
    let last = summaries.last().map(|(i, _)| *i);
    r.list = last.and_then(|at| section(&clean, at));
    let mut skipped_listed = 0u64;
    for (i, line) in clean.iter().enumerate() {
        match sighting(line) {
            Some(Seen::Test(id, status)) => r.saw(&id, status, i),
            Some(Seen::Skips(n)) if r.list.as_ref().is_some_and(|l| l.contains(&i)) => {
                skipped_listed = skipped_listed.saturating_add(n);
            }
            _ => {}
        }
    }
    if headers && let Some(doubt) = second_summary(&clean, &summaries) {
        r.doubts.push(doubt);
    }
    if let (Some((_, s)), Some(list)) = (summaries.last(), r.list.clone()) {
        let listed = |status: TestStatus| -> u64 {
            let ids: std::collections::BTreeSet<&str> = r
                .sightings
                .iter()
                .filter(|x| x.status == status && list.contains(&x.line))
                .map(|x| x.id.as_str())
                .collect();
            u64::try_from(ids.len()).unwrap_or(u64::MAX)
        };
        let counts = [
            (TestStatus::Passed, s.passed),
            (TestStatus::Failed, s.failed),
            (TestStatus::Error, s.errors),
            (TestStatus::XFail, s.xfailed),
            (TestStatus::XPass, s.xpassed),
        ];
        let listed: Vec<(TestStatus, u64, Option<u64>)> = counts
            .into_iter()
            .map(|(st, counted)| (st, listed(st), counted))
            .collect();
        let complete = |st: TestStatus| {
            listed
                .iter()
                .any(|(x, n, counted)| *x == st && *n == counted.unwrap_or(0))
        };
        let (passes_listed, xfails_listed) =
            (complete(TestStatus::Passed), complete(TestStatus::XFail));
        for (st, n, counted) in &listed {
            r.check_count("pytest", st.pytest_word(), *n, *counted);
        }
        r.check_count("pytest", "SKIPPED", skipped_listed, s.skipped);
        if let Some(doubt) = unlisted_pass(&r, &list, passes_listed, xfails_listed) {
            r.doubts.push(doubt);
        }
    }
    if let Some((at, s)) = summaries.last() {
        let failing = s.failed.unwrap_or(0).saturating_add(s.errors.unwrap_or(0));
        r.check_failing("pytest", &s.line, *at, failing);
    }
    r.summary = summaries.into_iter().last().map(|(i, s)| (s, i));
    r
}

/// A doubt when output captured before pytest's own list claims a pass for a test of
/// a file that list names, while the list (complete for passes: as many `PASSED`
/// lines as the summary counts) does not name that test: code under test printed it
/// (a module that fails to import can print `PASSED` lines for its own tests, which
/// SWE-bench's map takes). Runs of pytest inside a test name files of their own
/// temporary directories, which the outer list does not.
fn unlisted_pass(
    r: &Reading,
    list: &std::ops::Range<usize>,
    passes_listed: bool,
    xfails_listed: bool,
) -> Option<String> {
    let listed: std::collections::BTreeSet<&str> = r
        .sightings
        .iter()
        .filter(|x| list.contains(&x.line))
        .map(|x| x.id.as_str())
        .collect();
    let files: std::collections::BTreeSet<&str> = listed
        .iter()
        .map(|id| id.split_once("::").map_or(*id, |(file, _)| file))
        .collect();
    r.sightings.iter().find_map(|x| {
        let claimed = match x.status {
            TestStatus::Passed => passes_listed,
            TestStatus::XFail => xfails_listed,
            _ => false,
        };
        let (file, _) = x.id.split_once("::")?;
        (claimed && x.line < list.start && !listed.contains(x.id.as_str()) && files.contains(file))
            .then(|| {
                format!(
                    "`{}` is reported {} in output captured before pytest's own list of outcomes, \
                     which names `{file}` but not this test: pytest did not write that line",
                    x.id,
                    x.status.name()
                )
            })
    })
}

/// One line through SWE-bench's (or SWE-smith's) parser for `flavor`.
fn swebench_line(r: &mut Reading, flavor: Flavor, line: &str) {
    match flavor {
        Flavor::Pytest | Flavor::Options | Flavor::Matplotlib => {
            let line = if flavor == Flavor::Matplotlib {
                line.replace("MouseButton.LEFT", "1")
                    .replace("MouseButton.RIGHT", "3")
            } else {
                line.to_string()
            };
            if !SWEBENCH_WORDS.iter().any(|w| line.starts_with(w)) {
                return;
            }
            let line = if line.starts_with("FAILED") {
                line.replace(" - ", " ")
            } else {
                line
            };
            let parts = py_split(&line);
            let (Some(word), Some(id)) = (parts.first(), parts.get(1)) else {
                return;
            };
            if *word == "SKIPPED" && is_skip_count(id) {
                return;
            }
            if let Some(status) = TestStatus::from_swebench(word) {
                let key = if flavor == Flavor::Options {
                    options_key(id)
                } else {
                    (*id).to_string()
                };
                r.record(&key, status);
            }
        }
        Flavor::Seaborn => {
            let parts = py_split(line);
            let (Some(first), Some(second)) = (parts.first(), parts.get(1)) else {
                return;
            };
            if line.starts_with("FAILED") {
                r.record(second, TestStatus::Failed);
            } else if line.contains(" PASSED ") {
                if *second == "PASSED" {
                    r.record(first, TestStatus::Passed);
                }
            } else if line.starts_with("PASSED") {
                r.record(second, TestStatus::Passed);
            }
        }
        Flavor::V2 => {
            let clean = v2_clean(line);
            if SWEBENCH_WORDS.iter().any(|w| clean.starts_with(w)) {
                let body = if clean.starts_with("FAILED") {
                    clean.split(" - ").next().unwrap_or_default()
                } else {
                    &clean
                };
                let parts = py_split(body);
                if parts.len() >= 2
                    && !(parts[0] == "SKIPPED" && is_skip_count(parts[1]))
                    && let Some(status) = TestStatus::from_swebench(parts[0])
                {
                    r.record(&parts[1..].join(" "), status);
                }
            } else if SWEBENCH_WORDS.iter().any(|w| clean.ends_with(w)) {
                let parts = py_split(&clean);
                if let Some((last, rest)) = parts.split_last()
                    && !rest.is_empty()
                    && let Some(status) = TestStatus::from_swebench(last)
                {
                    r.record(&rest.join(" "), status);
                }
            }
        }
        Flavor::Verbose => {
            // `^(\S+)(\s+)STATUS`: the first word, whitespace, then a status word's start.
            let Some(end) = line.find(super::text::is_py_space) else {
                return;
            };
            if end == 0 {
                return;
            }
            let rest = line[end..].trim_start_matches(super::text::is_py_space);
            for word in SWEBENCH_WORDS {
                if rest.starts_with(word)
                    && let Some(status) = TestStatus::from_swebench(word)
                {
                    r.record(&line[..end], status);
                }
            }
        }
    }
}

/// SWE-bench's `pytest_options` id: `main[option]` from the first `[` to the last `]`
/// (anything after that `]` dropped), an option that is an absolute path (`/…`, not
/// `//…`, no `*`) shortened to `/` and its last component.
fn options_key(id: &str) -> String {
    let (Some(open), Some(close)) = (id.find('['), id.rfind(']')) else {
        return id.to_string();
    };
    if close < open {
        return id.to_string();
    }
    let main = &id[..open];
    let mut option = &id[open + 1..close];
    let shortened;
    if option.starts_with('/') && !option.starts_with("//") && !option.contains('*') {
        shortened = format!("/{}", option.rsplit('/').next().unwrap_or_default());
        option = &shortened;
    }
    format!("{main}[{option}]")
}

/// A per-test line as pytest writes it (colour codes already removed).
enum Seen {
    /// `STATUS id[ - message]` or `id STATUS[ …]`.
    Test(String, TestStatus),
    /// `SKIPPED [N] path:line: reason`: N skipped tests, unnamed.
    Skips(u64),
}

/// Reads a line of pytest's own: a short-summary line (`PASSED id`, `FAILED id -
/// message`, `SKIPPED [N] …`) or a verbose one (`id PASSED [ 50%]`, `id SKIPPED
/// (reason)`, `id PASSED` in the classic style).
fn sighting(line: &str) -> Option<Seen> {
    let line = line.trim_end();
    for status in WORDS {
        let word = status.pytest_word();
        if let Some(rest) = line.strip_prefix(word).and_then(|r| r.strip_prefix(' ')) {
            if status == TestStatus::Skipped
                && let Some(count) = rest.split(' ').next().filter(|w| is_skip_count(w))
            {
                let n = count.trim_matches(['[', ']']).parse().unwrap_or(0);
                return Some(Seen::Skips(n));
            }
            let id = node_id(rest);
            return (!id.is_empty()).then(|| Seen::Test(id.to_string(), status));
        }
    }
    if line.starts_with(' ') || !line.contains("::") {
        return None;
    }
    // `id STATUS…`: the first status word after a space, outside brackets, once the
    // id so far has its `::` (one pass: the bracket depth and `::` kept as it goes).
    let colons = line.find("::")?;
    let mut depth = 0i64;
    for (i, c) in line.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ' ' if depth == 0 && i > colons => {
                let word = line[i + 1..].split(' ').next().unwrap_or_default();
                if let Some(status) = WORDS.into_iter().find(|s| s.pytest_word() == word) {
                    return Some(Seen::Test(line[..i].trim().to_string(), status));
                }
            }
            _ => {}
        }
        if depth < 0 {
            return None;
        }
    }
    None
}

/// The node id a short-summary line starts with: up to its first space outside
/// brackets, before ` - message` (pytest 5 and later) or a bare reason (pytest 4's
/// `XPASS id reason`).
fn node_id(rest: &str) -> &str {
    let rest = rest.trim_start();
    let mut depth = 0i64;
    for (i, c) in rest.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ' ' if depth <= 0 => return &rest[..i],
            _ => {}
        }
    }
    cut_message(rest)
}

/// pytest's closing summary line (`=== 1 failed, 2 passed, 1 warning in 0.12s ===`,
/// `no tests ran in 0.01s`, pytest 4's `in 0.12 seconds`, long runs' `in 75.1s
/// (0:01:15)`), with or without its `=` rule.
fn summary(line: &str) -> Option<Summary> {
    let t = line.trim();
    let inner = if t.starts_with('=') {
        if !t.ends_with('=') {
            return None;
        }
        t.trim_matches('=').trim()
    } else {
        t
    };
    let at = inner.rfind(" in ")?;
    let (items, duration) = (&inner[..at], &inner[at + 4..]);
    if !is_duration(duration) {
        return None;
    }
    let mut s = Summary {
        line: t.to_string(),
        ..Summary::default()
    };
    if items == "no tests ran" {
        return Some(s);
    }
    for item in items.split(", ") {
        let (n, word) = leading_number(item)?;
        // Words such as pytest 3's `pytest-warnings` or pytest 9's `subtests passed`.
        if word.is_empty()
            || !word
                .chars()
                .all(|c| c.is_ascii_lowercase() || c == ' ' || c == '-')
        {
            return None;
        }
        let slot = match word {
            "passed" => &mut s.passed,
            "failed" => &mut s.failed,
            "error" | "errors" => &mut s.errors,
            "skipped" => &mut s.skipped,
            "xfailed" => &mut s.xfailed,
            "xpassed" => &mut s.xpassed,
            _ => continue,
        };
        *slot = Some(n);
    }
    Some(s)
}

/// `0.12s`, `75.10s (0:01:15)`, `0.12 seconds`.
fn is_duration(d: &str) -> bool {
    let number_end = d
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(d.len());
    if number_end == 0 {
        return false;
    }
    let unit = &d[number_end..];
    let rest = if let Some(r) = unit.strip_prefix(" seconds") {
        r
    } else if let Some(r) = unit.strip_prefix('s') {
        r
    } else {
        return false;
    };
    rest.is_empty()
        || rest
            .strip_prefix(" (")
            .and_then(|r| r.strip_suffix(')'))
            .is_some_and(|clock| clock.chars().all(|c| c.is_ascii_digit() || c == ':'))
}

/// The lines of the short summary that ends at the closing summary on line `at`: from
/// the line after its `short test summary info` rule to the summary. `None` when the
/// run has none (no `-r` option), or another run's summary comes first.
fn section(clean: &[String], at: usize) -> Option<std::ops::Range<usize>> {
    for i in (0..at).rev() {
        let t = clean[i].trim();
        if t.starts_with('=') && t.contains(" short test summary info ") {
            return Some(i + 1..at);
        }
        if (t.starts_with('=') && summary(t).is_some()) || session_header(t) {
            return None;
        }
    }
    None
}

/// pytest's `=== test session starts ===` rule.
fn session_header(line: &str) -> bool {
    let t = line.trim();
    t.starts_with('=') && t.contains(" test session starts ")
}

/// A doubt when a closing summary closes no session: pytest writes one header and one
/// summary per session (sessions run inside a test, as pytest's own suite does, nest
/// within the outer one), so a summary with no session open was written by something
/// else after pytest finished.
fn second_summary(clean: &[String], summaries: &[(usize, Summary)]) -> Option<String> {
    let mut open = 0usize;
    let mut next = summaries.iter().peekable();
    for (i, line) in clean.iter().enumerate() {
        if session_header(line) {
            open += 1;
        }
        if next.peek().is_some_and(|(at, _)| *at == i) {
            next.next();
            if open == 0 {
                return Some(format!(
                    "the log holds a closing summary of pytest's (`{}`, its line {}) with no test \
                     session left to close: something wrote to the log after pytest finished",
                    line.trim(),
                    i + 1
                ));
            }
            open -= 1;
        }
    }
    None
}

/// Why `parser` (one of the whitespace-splitting pytest parsers) can never report
/// `id` as passing.
pub(super) fn unreportable(parser: &str, id: &str) -> Option<String> {
    if id.contains(super::text::is_py_space) {
        return Some(format!(
            "the `{parser}` parser takes a test's name up to its first space, so it can never \
             report `{id}` (SWE-bench's own lists hold such ids cut at the space); use \
             `pytest_v2`, which keeps whole ids"
        ));
    }
    if parser == "matplotlib"
        && (id.contains("MouseButton.LEFT") || id.contains("MouseButton.RIGHT"))
    {
        return Some(format!(
            "the `matplotlib` parser rewrites `MouseButton.LEFT`/`RIGHT` as `1`/`3`, so it can \
             never report `{id}`"
        ));
    }
    if parser == "pytest_options" && options_key(id) != id {
        return Some(format!(
            "the `pytest_options` parser shortens a path parameter to its last component and \
             drops text after the last `]`, so it reports `{id}` as `{}`",
            options_key(id)
        ));
    }
    None
}

/// Why `pytest_v2` can never report `id` as passing: it joins an id's words with
/// single spaces, after removing control characters and `[NNm` sequences.
pub(super) fn unreportable_v2(id: &str) -> Option<String> {
    let joined = py_split(id).join(" ");
    if joined != id {
        return Some(format!(
            "the `pytest_v2` parser joins a name's words with single spaces, so it can never \
             report `{id}`"
        ));
    }
    if v2_clean(id) != id {
        return Some(format!(
            "the `pytest_v2` parser removes control characters and `[NNm` colour codes, so it \
             reports `{id}` as `{}`",
            v2_clean(id)
        ));
    }
    None
}

#[cfg(test)]
mod tests;
