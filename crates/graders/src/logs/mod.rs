//! Reading test results out of a test runner's log: which tests passed and which did
//! not, by name, and whether the log can be trusted as evidence at all. Pluggable by
//! name (`log_parser` in a task's grader, [`PARSERS`]).
//!
//! # SWE-bench's semantics
//!
//! The parsers reproduce SWE-bench's harness (the `swebench` package, 5.0.2, module
//! `harness/log_parsers/python.py`; test commands and directives from 4.1.0's
//! `harness/constants/python.py` and `harness/test_spec/python.py`, which 5.x moved
//! into its dataset records): a clean log gives exactly the status map SWE-bench
//! gives, so an instance's `FAIL_TO_PASS`/`PASS_TO_PASS` lists, which SWE-bench made
//! with these parsers on gold runs, match. What SWE-bench does:
//!
//! - A status map, test name to `PASSED`, `FAILED`, `SKIPPED`, `ERROR` or `XFAIL`,
//!   written line by line: a later line about the same name wins. There is no `XPASS`:
//!   pytest's `XPASS` lines are not read, so such a test is absent.
//! - `pytest` (most repositories): lines that *start* with a status word, `-rA`'s short
//!   summary (`PASSED id`, `FAILED id - message`); the id is the line's second
//!   whitespace-separated word, so `test_p[a b]` is recorded as `test_p[a` (the
//!   instance lists hold ids cut the same way). `SKIPPED [N] path:line` is no test.
//! - `pytest_options` (requests, pydicom, pylint): the same, and a parameter that is an
//!   absolute path is shortened to its last component (`test[/a/b.py]` → `test[/b.py]`).
//! - `pytest_v2` (astropy, scikit-learn, sphinx): ANSI codes and control characters
//!   removed; ids keep their spaces (every word after the status); also lines that
//!   *end* with a status word (`-o console_output_style=classic` per-test lines).
//! - `matplotlib`: `pytest` after `MouseButton.LEFT`/`RIGHT` become `1`/`3`.
//! - `seaborn`: only `FAILED id`, `PASSED id` and `id PASSED …` lines; errors, skips and
//!   xfails are not read.
//! - `django`: `./tests/runtests.py --verbosity 2`'s `name ... ok` lines (` ... ok`,
//!   ` ... OK`, ` ...  OK` pass; ` ... skipped`, ` ... FAIL`, ` ... ERROR`), the
//!   `FAIL: x`/`ERROR: x` headers (recorded under their second word, the method name
//!   alone), an `ok` on a later line for the last test named before it (a test that
//!   printed something first), and three known interleavings of Django's own output. A
//!   test with a docstring is named by the docstring's first line, as the runner
//!   prints it. `expected failure` and `unexpected success` are not read.
//! - `sympy`: `bin/test -C --verbose`'s `test_x ok` / `F` / `E` lines (the bare function
//!   name), and every traceback header `path.py:test_x` as `FAILED`. A file's last test,
//!   whose line ends with `[OK]`/`[FAIL]`, is not read, nor are skips and xfails.
//! - Grading (`harness/grading.py`): `PASSED` and `XFAIL` pass ([`TestStatus::passed`]);
//!   a `FAIL_TO_PASS` test that is absent, failed, errored or skipped fails; a
//!   `PASS_TO_PASS` test passes or is skipped to count as kept. An expected id with
//!   more `[` than `]` (cut by an older parser) matches the ids it begins, when they
//!   agree on passing. A run whose command exited non-zero while the map holds no
//!   failure or error is not evidence ([`Report::exit_code`]).
//!
//! Three deliberate departures, all for lines no real runner writes: a status word
//! with more glued to it (`PASSEDx id`) is ignored, where SWE-bench stores the unknown
//! word and then counts the test neither passed nor failed (so such a line could
//! excuse a failing test); a bare `FAIL:` or `ERROR:` line, on which SWE-bench's
//! Django parser raises, is ignored; and `\d` in the `pytest_v2` cleaning is ASCII
//! digits only.
//!
//! Beyond SWE-bench: `pytest_verbose` reads the per-test lines of `pytest --verbose`
//! as SWE-smith's default Python profile does (`id STATUS`, the id up to its first
//! space; SWE-smith gives each repository profile its own parser, this being the
//! default, with `pytest --disable-warnings --color=no --tb=no --verbose`), and
//! `unittest` reads `python -m unittest -v` (and Django's runner) by the
//! test's full name as printed, `test_x (module.Class)` before Python 3.11 and
//! `test_x (module.Class.test_x)` after, a docstring's line given to the name above
//! it, `expected failure` as [`TestStatus::XFail`] and `unexpected success` as
//! [`TestStatus::XPass`]; an instance may name a test in either printed form or by
//! its dotted id (`module.Class.test_x`), which finds the test under whichever form
//! the run's Python printed ([`Names::Unittest`]). SWE-bench's own names (`parse_log_django`,
//! `parse_log_astropy`, …) are accepted too ([`canonical`]).
//!
//! # Trust
//!
//! The log is written by the code under test, so it is evidence only when it reads as
//! one complete run of the runner ([`Report::distrust`]): the runner's closing summary
//! is there, no test line follows it, no test is reported with two different outcomes
//! (under any of its names), where the format lists every outcome (pytest's `-rA`
//! summary, unittest and Django at verbosity 2, sympy's `--verbose`) no more tests are
//! listed with an outcome than the summary counts, and a summary that counts failing
//! tests does not close a log whose every per-test line passes. For unittest and
//! Django also: one closing summary, as many per-test results as `Ran N tests` (a line
//! per test started, skips before the start aside), and exactly as many failure and
//! error reports as `FAILED (failures=…, errors=…)` counts (none with `OK`). For
//! pytest also: no closing summary without a session to close, and no pass claimed in
//! captured output for a test of a file that pytest's complete `-rA` list names but
//! not that test (a module that fails to import can print `PASSED` for its own tests,
//! and SWE-bench's map takes the line). Results come from the log, never from the
//! runner's exit status alone: a program that exits the interpreter with status 0
//! before the summary has passed nothing. None of this can see through code that
//! changes the runner's own reports in-process (a `conftest.py` hook): the grader
//! keeps such files out.

/// A fixture log and the status maps the reference parsers give for it
/// (`tests/fixtures/logs/RUNNER/NAME.log` and `NAME.expected.json`).
#[cfg(test)]
macro_rules! fixture {
    ($runner:literal, $name:literal) => {
        (
            include_str!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../tests/fixtures/logs/",
                $runner,
                "/",
                $name,
                ".log"
            )),
            include_str!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../tests/fixtures/logs/",
                $runner,
                "/",
                $name,
                ".expected.json"
            )),
        )
    };
}

mod pytest;
mod sympy;
mod text;
mod unittest;

use std::collections::BTreeMap;
use std::ops::Range;

use serde::{Deserialize, Serialize};

/// One test's outcome, as a runner reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TestStatus {
    /// It passed.
    Passed,
    /// An assertion failed.
    Failed,
    /// It was skipped.
    Skipped,
    /// It raised, or its setup or teardown did.
    Error,
    /// It was expected to fail and did: SWE-bench counts it as passing.
    #[serde(rename = "xfail")]
    XFail,
    /// It was expected to fail and passed: not a pass.
    #[serde(rename = "xpass")]
    XPass,
}

impl TestStatus {
    /// SWE-bench's `test_passed`: `PASSED` or `XFAIL`.
    pub fn passed(self) -> bool {
        matches!(self, Self::Passed | Self::XFail)
    }

    /// The status in words, as it is serialized (`passed`, `xfail`, …).
    pub fn name(self) -> &'static str {
        match self {
            Self::Passed => "passed",
            Self::Failed => "failed",
            Self::Skipped => "skipped",
            Self::Error => "error",
            Self::XFail => "xfail",
            Self::XPass => "xpass",
        }
    }

    /// The word pytest prints for it (`PASSED`, `XPASS`, …).
    fn pytest_word(self) -> &'static str {
        match self {
            Self::Passed => "PASSED",
            Self::Failed => "FAILED",
            Self::Skipped => "SKIPPED",
            Self::Error => "ERROR",
            Self::XFail => "XFAIL",
            Self::XPass => "XPASS",
        }
    }

    /// One of SWE-bench's status words (`TestStatus` there has no `XPASS`).
    fn from_swebench(word: &str) -> Option<Self> {
        Some(match word {
            "PASSED" => Self::Passed,
            "FAILED" => Self::Failed,
            "SKIPPED" => Self::Skipped,
            "ERROR" => Self::Error,
            "XFAIL" => Self::XFail,
            _ => return None,
        })
    }
}

/// SWE-bench's status words in its enum's order, which is the order its parsers try
/// them in.
const SWEBENCH_WORDS: [&str; 5] = ["FAILED", "PASSED", "SKIPPED", "ERROR", "XFAIL"];

/// What the runner itself says at the end of its run: pytest's `=== 3 passed, 1
/// failed in 0.1s ===`, unittest's and Django's `Ran N tests in Xs` with `OK` or
/// `FAILED (failures=1, errors=2)`, sympy's `tests finished: 3 passed, 1 failed, …`.
/// A count the runner leaves out is `None` (pytest omits zeros).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// The summary as the runner wrote it (colour codes removed, lines joined).
    pub line: String,
    /// Tests that passed.
    pub passed: Option<u64>,
    /// Tests that failed.
    pub failed: Option<u64>,
    /// Errors (pytest and unittest count setup and collection errors here too; sympy's
    /// "exceptions").
    pub errors: Option<u64>,
    /// Tests skipped.
    pub skipped: Option<u64>,
    /// Tests that failed as expected.
    pub xfailed: Option<u64>,
    /// Tests that passed though expected to fail.
    pub xpassed: Option<u64>,
    /// Tests run, where the runner states it (unittest's `Ran N tests`).
    pub total: Option<u64>,
}

/// A log read by a parser.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Report {
    /// Each test's final status by SWE-bench's rules (its name as SWE-bench records it;
    /// a later line wins): on a clean log, exactly SWE-bench's status map.
    pub results: BTreeMap<String, TestStatus>,
    /// Tests reported with more than one outcome, by full name, with the outcomes in
    /// the order the log gives them (a pytest test that passed and then errored in
    /// teardown is here: it did not cleanly pass).
    pub conflicts: BTreeMap<String, Vec<TestStatus>>,
    /// The runner's closing summary, if the log has one.
    pub summary: Option<Summary>,
    /// Other reasons the log does not read as one complete run, in words: test lines
    /// after the summary, more tests listed with an outcome than the summary counts.
    pub doubts: Vec<String>,
    /// The test command's exit status, when the caller knows it (parsing cannot):
    /// with it, a non-zero status while no test failed or errored is a doubt, as in
    /// SWE-bench.
    pub exit_code: Option<i32>,
    /// How an expected id finds its test in [`Report::results`] ([`Report::status`]).
    #[serde(skip)]
    pub names: Names,
}

/// How an instance's expected ids are matched against a parser's names.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Names {
    /// Only the name exactly as the parser records it (SWE-bench's parsers: their
    /// instance lists were made by them).
    #[default]
    Exact,
    /// unittest's names in any of the forms a test is known by: as Python before 3.11
    /// prints it (`test_m (pkg.mod.Class)`), as 3.11 and later print it (`test_m
    /// (pkg.mod.Class.test_m)`), or by its dotted id (`pkg.mod.Class.test_m`, what
    /// `TestCase.id()` gives and SWE-Gym-style lists hold). unittest never prints a
    /// test's dotted id (a doctest's neither: `name (module)`), so a dotted id is
    /// looked up by the printed forms only: a line naming a test by its dotted id was
    /// written by the code under test.
    Unittest,
}

impl Report {
    /// The status of the test an instance names `id`, by [`Report::names`]: the
    /// name's own entry, or for unittest's names the entry of either printed form of
    /// the same test (the id's own form first).
    pub fn status(&self, id: &str) -> Option<TestStatus> {
        match self.names {
            Names::Exact => self.results.get(id).copied(),
            Names::Unittest => unittest::spellings(id)
                .iter()
                .find_map(|name| self.results.get(name).copied()),
        }
    }

    /// Why this log cannot be trusted as evidence, in words for a user, or `None` when
    /// it can: a doubt ([`Report::doubts`]); no runner summary at all (the run was cut
    /// short, or never started); a test reported with two different outcomes (named);
    /// a failing exit status with no failure in the log.
    pub fn distrust(&self) -> Option<String> {
        // A doubt first: it says more than a missing summary (the seal's, that the
        // code under test ended the run, leaves no summary of the runner's either).
        if let Some(d) = self.doubts.first() {
            return Some(d.clone());
        }
        if self.summary.is_none() {
            return Some(
                "the log has no closing summary from the test runner: the run ended before \
                 the runner finished (a crash, a time-out, or the code under test ending the \
                 process), so its test lines prove nothing"
                    .to_string(),
            );
        }
        if let Some((id, statuses)) = self.conflicts.iter().next() {
            let said: Vec<&str> = statuses.iter().map(|s| s.name()).collect();
            let more = match self.conflicts.len() {
                1 => String::new(),
                n => format!(" ({} more tests like it)", n - 1),
            };
            return Some(format!(
                "test `{id}` is reported as {}{more}: a test with two outcomes did not cleanly pass, \
                 and a log that says both is not evidence",
                said.join(" and then ")
            ));
        }
        if let Some(code) = self.exit_code
            && code != 0
            && !self.results.is_empty()
            && !self
                .results
                .values()
                .any(|s| matches!(s, TestStatus::Failed | TestStatus::Error))
        {
            return Some(format!(
                "the test command exited with status {code} but the log reports no failing test: \
                 the log does not describe the run that happened"
            ));
        }
        None
    }
}

/// The parsers that read pytest's output (their test ids are pytest node ids,
/// `path::name`).
pub const PYTEST_FAMILY: &[&str] = &[
    "pytest",
    "pytest_options",
    "pytest_v2",
    "matplotlib",
    "seaborn",
    "pytest_verbose",
];

/// The log parsers by name: SWE-bench's families (`pytest`, `pytest_options`,
/// `pytest_v2`, `matplotlib`, `seaborn`, `django`, `sympy`), SWE-smith's
/// `pytest_verbose`, and `unittest`.
pub const PARSERS: &[&str] = &[
    "pytest",
    "pytest_options",
    "pytest_v2",
    "matplotlib",
    "seaborn",
    "pytest_verbose",
    "django",
    "sympy",
    "unittest",
];

/// The parser a name stands for: one of [`PARSERS`], or SWE-bench's own name for it
/// (`parse_log_pytest_v2`, and the per-repository ones its dataset records carry, such
/// as `parse_log_astropy` or `parse_log_requests`).
pub fn canonical(name: &str) -> Option<&'static str> {
    if let Some(p) = PARSERS.iter().find(|p| **p == name) {
        return Some(p);
    }
    Some(match name.strip_prefix("parse_log_")? {
        "pytest" | "astroid" | "flask" | "marshmallow" | "pvlib" | "pyvista" | "sqlfluff"
        | "xarray" => "pytest",
        "pytest_options" | "pydicom" | "requests" | "pylint" => "pytest_options",
        "pytest_v2" | "astropy" | "scikit" | "sphinx" => "pytest_v2",
        "matplotlib" => "matplotlib",
        "seaborn" => "seaborn",
        "django" => "django",
        "sympy" => "sympy",
        _ => return None,
    })
}

/// Parses `log` with the parser `parser` names (see [`canonical`]); `None` for an
/// unknown name (task specs are checked against [`PARSERS`] at submit time).
pub fn parse(parser: &str, log: &str) -> Option<Report> {
    let reading = match canonical(parser)? {
        "pytest" => pytest::read(log, pytest::Flavor::Pytest),
        "pytest_options" => pytest::read(log, pytest::Flavor::Options),
        "pytest_v2" => pytest::read(log, pytest::Flavor::V2),
        "matplotlib" => pytest::read(log, pytest::Flavor::Matplotlib),
        "seaborn" => pytest::read(log, pytest::Flavor::Seaborn),
        "pytest_verbose" => pytest::read(log, pytest::Flavor::Verbose),
        "django" => unittest::read(log, unittest::Flavor::Django),
        "unittest" => unittest::read(log, unittest::Flavor::Unittest),
        "sympy" => sympy::read(log),
        _ => return None,
    };
    Some(reading.into_report())
}

/// Why the parser `parser` can never report the test `id` as passing, or `None` if it
/// can: a submit-time check that an instance's expected ids are ones this parser
/// produces (a `pytest` id with a space, a `django` id that is a pytest node id, a
/// `sympy` id that is not a bare `test_…` name).
pub fn unreportable(parser: &str, id: &str) -> Option<String> {
    let Some(parser) = canonical(parser) else {
        return Some(format!("`{parser}` is not a log parser"));
    };
    if id.is_empty() {
        return Some("an empty test name is never reported".into());
    }
    if id.contains('\n') {
        return Some(format!(
            "`{id}` spans lines; no parser reads a name across lines"
        ));
    }
    match parser {
        "pytest" | "pytest_options" | "matplotlib" | "seaborn" | "pytest_verbose" => {
            pytest::unreportable(parser, id)
        }
        "pytest_v2" => pytest::unreportable_v2(id),
        "django" | "unittest" => unittest::unreportable(parser, id),
        "sympy" => sympy::unreportable(id),
        _ => None,
    }
}

/// One per-test line as the runner wrote it: the test's full name (which may differ
/// from SWE-bench's key for it), its outcome, and the line's index.
#[derive(Debug, Clone)]
struct Sighting {
    id: String,
    status: TestStatus,
    line: usize,
}

/// What a parser read from a log, before the checks every runner shares.
#[derive(Debug, Default)]
struct Reading {
    /// SWE-bench's status map.
    results: BTreeMap<String, TestStatus>,
    /// Every per-test line the parser recognised, for the checks.
    sightings: Vec<Sighting>,
    /// The runner's summary and the index of its (first) line.
    summary: Option<(Summary, usize)>,
    /// The lines holding the runner's own complete list of outcomes, when the format
    /// has one apart from captured output (pytest's last `-rA` short summary): only
    /// tests listed there are checked for conflicting reports, since output captured
    /// from tests (pytest running pytest) may legitimately name a test twice.
    list: Option<Range<usize>>,
    /// The parser's own doubts (counts that disagree with the summary).
    doubts: Vec<String>,
    /// The one name of a test the runner may name in several ways (unittest's printed
    /// and dotted forms), so that two outcomes given it under different names are
    /// seen as a conflict; `None` when each name is its own test.
    same: Option<fn(&str) -> Option<String>>,
    /// How expected ids find their tests in the report ([`Report::names`]).
    names: Names,
}

impl Reading {
    /// Records `status` for SWE-bench's key `key` (a later line wins).
    fn record(&mut self, key: &str, status: TestStatus) {
        self.results.insert(key.to_string(), status);
    }

    /// Notes a per-test line for the checks.
    fn saw(&mut self, id: &str, status: TestStatus, line: usize) {
        let id = id.trim();
        if !id.is_empty() {
            self.sightings.push(Sighting {
                id: id.to_string(),
                status,
                line,
            });
        }
    }

    /// Adds a doubt when the runner's own list names more tests with `word` than its
    /// summary counts (`counted` is `None` when the summary leaves the count out, which
    /// pytest does for zero).
    fn check_count(&mut self, runner: &str, word: &str, listed: u64, counted: Option<u64>) {
        let counted = counted.unwrap_or(0);
        if listed > counted {
            self.doubts.push(format!(
                "{listed} tests are listed as {word} but {runner}'s own summary counts {counted}: \
                 lines were added to the log"
            ));
        }
    }

    /// Adds a doubt when the runner's summary (on line `at`) counts failed or errored
    /// tests (`counted`, those it leaves out as zero) while every per-test line before
    /// it that reports an outcome reports a pass: the runner wrote the summary, so the
    /// passing lines were written by something else (the code under test printing the
    /// runner's lines for itself).
    fn check_failing(&mut self, runner: &str, summary: &str, at: usize, counted: u64) {
        let before = || self.sightings.iter().filter(|s| s.line < at);
        let failing = before().any(|s| matches!(s.status, TestStatus::Failed | TestStatus::Error));
        let passing = before().any(|s| s.status.passed());
        if counted > 0 && passing && !failing {
            self.doubts.push(format!(
                "{runner}'s own summary (`{summary}`) counts {counted} failing tests, but every \
                 per-test line in the log reports a pass: {runner} did not write those lines"
            ));
        }
    }

    /// The shared checks: test lines after the summary, and conflicting reports.
    fn into_report(mut self) -> Report {
        let mut doubts = Vec::new();
        if let Some((_, at)) = &self.summary {
            let late: Vec<&Sighting> = self.sightings.iter().filter(|s| s.line > *at).collect();
            if let Some(first) = late.first() {
                let more = match late.len() {
                    1 => String::new(),
                    n => format!(" (and {} more test lines)", n - 1),
                };
                doubts.push(format!(
                    "`{}` is reported {} after the test runner's closing summary{more}: the runner \
                     did not write it",
                    first.id,
                    first.status.name()
                ));
            }
        }
        doubts.append(&mut self.doubts);
        // Sightings of one test under its different names are grouped by its one
        // name, and a conflict is reported under the name first seen.
        let same = self.same;
        let key = |id: &str| same.and_then(|f| f(id)).unwrap_or_else(|| id.to_string());
        let checked: std::collections::BTreeSet<String> = match &self.list {
            Some(range) => self
                .sightings
                .iter()
                .filter(|s| range.contains(&s.line))
                .map(|s| key(&s.id))
                .collect(),
            None => self.sightings.iter().map(|s| key(&s.id)).collect(),
        };
        let mut seen: BTreeMap<String, (&str, Vec<TestStatus>)> = BTreeMap::new();
        for s in &self.sightings {
            let k = key(&s.id);
            if checked.contains(&k) {
                let (_, statuses) = seen.entry(k).or_insert((&s.id, Vec::new()));
                if !statuses.contains(&s.status) {
                    statuses.push(s.status);
                }
            }
        }
        let conflicts = seen
            .into_values()
            .filter(|(_, v)| v.len() > 1)
            .map(|(first, v)| (first.to_string(), v))
            .collect();
        Report {
            results: self.results,
            conflicts,
            summary: self.summary.map(|(s, _)| s),
            doubts,
            exit_code: None,
            names: self.names,
        }
    }
}

/// The status map a reference parser gave for a fixture (`parser` as named in the
/// fixture's `.expected.json`), in this crate's statuses.
#[cfg(test)]
fn expected(json: &str, parser: &str) -> BTreeMap<String, TestStatus> {
    let all: BTreeMap<String, BTreeMap<String, String>> =
        serde_json::from_str(json).expect("fixture JSON");
    all.get(parser)
        .unwrap_or_else(|| panic!("no `{parser}` map in the fixture"))
        .iter()
        .map(|(k, v)| {
            let status = TestStatus::from_swebench(v).expect("a SWE-bench status");
            (k.clone(), status)
        })
        .collect()
}

/// Asserts `parser` gives exactly the reference map on `log`, naming the difference.
#[cfg(test)]
fn assert_conforms(parser: &str, log: &str, json: &str, what: &str) {
    let got = parse(parser, log).expect("a known parser").results;
    let want = expected(json, parser);
    let missing: Vec<_> = want
        .iter()
        .filter(|(k, v)| got.get(*k) != Some(v))
        .collect();
    let extra: Vec<_> = got.iter().filter(|(k, _)| !want.contains_key(*k)).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "{parser} on {what}: expected but not given {missing:?}; given but not expected {extra:?}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_aliases() {
        for p in PARSERS {
            assert_eq!(canonical(p), Some(*p));
            assert!(parse(p, "").is_some());
        }
        assert_eq!(canonical("parse_log_astropy"), Some("pytest_v2"));
        assert_eq!(canonical("parse_log_requests"), Some("pytest_options"));
        assert_eq!(canonical("parse_log_flask"), Some("pytest"));
        assert_eq!(canonical("parse_log_django"), Some("django"));
        assert_eq!(canonical("junit"), None);
        assert!(parse("junit", "").is_none());
    }

    #[test]
    fn statuses_serialize_in_words() {
        let all = [
            TestStatus::Passed,
            TestStatus::Failed,
            TestStatus::Skipped,
            TestStatus::Error,
            TestStatus::XFail,
            TestStatus::XPass,
        ];
        for s in all {
            assert_eq!(serde_json::to_value(s).unwrap(), s.name());
        }
        let passing: Vec<_> = all.into_iter().filter(|s| s.passed()).collect();
        assert_eq!(passing, [TestStatus::Passed, TestStatus::XFail]);
    }

    #[test]
    fn an_empty_log_is_no_evidence() {
        let r = parse("pytest", "").unwrap();
        assert!(r.results.is_empty());
        assert!(r.distrust().unwrap().contains("no closing summary"));
        assert!(Report::default().distrust().is_some());
    }

    #[test]
    fn large_hostile_logs_are_read_in_one_pass() {
        // Shapes that a parser rescanning a line (or the log) per candidate would take
        // quadratic time on (a test that took minutes here would show it); a log may
        // be megabytes.
        let big = 1 << 18;
        let shapes = [
            "a:: ".repeat(big / 4),
            "a::".to_string() + &" x".repeat(big / 2),
            "[".repeat(big),
            "t ... Internal Server Error: /a ".repeat(big / 32),
            "t ... Testing against Django installed in \n".repeat(big / 44),
            "x ... \n".repeat(big / 7),
            " a.py: ".repeat(big / 7),
            "PASSED t.py::x[\n".repeat(big / 16),
            "\x1b[".repeat(big / 2),
        ];
        for log in &shapes {
            for parser in PARSERS {
                let r = parse(parser, log).unwrap();
                let _ = r.distrust();
            }
        }
    }

    #[test]
    fn a_failing_exit_with_no_failure_is_distrusted() {
        let mut r = parse("pytest", "PASSED t.py::a\n==== 1 passed in 0.01s ====\n").unwrap();
        assert_eq!(r.distrust(), None);
        r.exit_code = Some(0);
        assert_eq!(r.distrust(), None);
        r.exit_code = Some(1);
        assert!(r.distrust().unwrap().contains("status 1"));
    }
}
