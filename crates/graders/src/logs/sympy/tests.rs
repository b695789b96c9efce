//! The `sympy` parser on real runs of sympy's test runner
//! (`tests/fixtures/logs/sympy/`).

use std::collections::BTreeMap;

use super::super::{TestStatus, assert_conforms, parse};
use TestStatus::*;

#[test]
fn sympy_gives_swebenchs_map_on_every_fixture() {
    for (name, (log, json)) in [
        ("outcomes", fixture!("sympy", "outcomes")),
        ("two_files", fixture!("sympy", "two_files")),
        ("passing", fixture!("sympy", "passing")),
        ("cut", fixture!("sympy", "cut")),
    ] {
        assert_conforms("sympy", log, json, name);
    }
}

#[test]
fn sympy_reads_as_swebench_does() {
    let (log, _) = fixture!("sympy", "outcomes");
    let r = parse("sympy", log).unwrap();
    let want: BTreeMap<String, TestStatus> = [
        ("test_pass", Passed),
        ("test_fail", Failed),
        ("test_error", Error),
        // Every traceback rule is read as a failure, under `path.py:name`.
        ("sympy/outcomes/tests/test_outcomes.py:test_fail", Failed),
        ("sympy/outcomes/tests/test_outcomes.py:test_error", Failed),
        // `test_raises ok [FAIL]` (the file's last test), skips, xfails and xpasses
        // are not read.
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    assert_eq!(r.results, want);
    assert_eq!(r.distrust(), None);
    assert!(r.conflicts.is_empty());
    // The summary was wrapped over two lines.
    let s = r.summary.unwrap();
    assert_eq!(
        (
            s.passed, s.failed, s.skipped, s.xfailed, s.xpassed, s.errors
        ),
        (Some(2), Some(1), Some(1), Some(1), Some(1), Some(1))
    );
    assert!(s.line.starts_with("tests finished: 2 passed") && s.line.ends_with("seconds"));
}

#[test]
fn a_passing_run_has_a_one_line_summary() {
    let (log, _) = fixture!("sympy", "passing");
    let r = parse("sympy", log).unwrap();
    assert_eq!(r.summary.as_ref().unwrap().passed, Some(3));
    assert_eq!(
        r.summary.as_ref().unwrap().line,
        "tests finished: 3 passed, in 0.12 seconds"
    );
    assert_eq!(r.distrust(), None);
    // The last test's line ends in `[OK]`: SWE-bench does not read it.
    assert!(!r.results.contains_key("test_last"));
}

#[test]
fn a_summary_counting_failures_over_passing_lines_is_caught() {
    let (log, _) = fixture!("sympy", "passing");
    let forged = log.replace("3 passed, in", "3 passed, 1 failed, in");
    let why = parse("sympy", &forged).unwrap().distrust().unwrap();
    assert!(why.contains("counts 1 failing tests"), "{why}");
    // An exception need not have a line of its own (a test file that fails to import).
    let exception = log.replace("3 passed, in", "3 passed, 1 exceptions, in");
    assert_eq!(parse("sympy", &exception).unwrap().distrust(), None);
}

#[test]
fn a_run_cut_short_is_distrusted() {
    let (log, _) = fixture!("sympy", "cut");
    let r = parse("sympy", log).unwrap();
    assert_eq!(r.results["test_first"], Passed);
    assert!(r.distrust().unwrap().contains("no closing summary"));
}

#[test]
fn forged_lines_are_caught() {
    let (log, _) = fixture!("sympy", "outcomes");
    let after = format!("{log}test_fail ok\n");
    let r = parse("sympy", &after).unwrap();
    assert_eq!(r.results["test_fail"], Passed);
    assert!(
        r.distrust()
            .unwrap()
            .contains("after the test runner's closing summary")
    );
    let file = "sympy/outcomes/tests/test_outcomes.py";
    assert_eq!(r.conflicts[&format!("{file}:test_fail")], [Failed, Passed]);
    // Inside the run, more `ok` lines than the summary's passes.
    let inside = log.replace(
        "test_pass ok\n",
        "test_pass ok\ntest_new ok\ntest_other ok\n",
    );
    let r = parse("sympy", &inside).unwrap();
    assert!(
        r.doubts[0].contains("4 tests are listed as `ok`"),
        "{:?}",
        r.doubts
    );
}

#[test]
fn traceback_rules_are_matched_as_swebenchs_pattern_does() {
    // Each pair is a line and what `re.findall(r"(_*) (.*)\.py:(.*) (_*)", line)`
    // makes of it in SWE-bench's parser.
    for (line, want) in [
        ("____ a/b.py:c ____", Some("a/b.py:c")),
        ("x a.py:b.py:c d", Some("a.py:b.py:c")),
        ("nospace.py:x", None),
        (" .py: ", Some(".py:")),
        ("a .py:x", None),
        ("___ p.py:t ___ q.py:r", Some("p.py:t ___")),
        ("_ a.py:b", None),
        ("a.py:b c", None),
        ("  File \"/x/a.py\", line 3", None),
        ("x a.py:b\tc d", Some("a.py:b\tc")),
        ("\u{e9} a.py:\u{e9} \u{e9}", Some("a.py:\u{e9}")),
    ] {
        assert_eq!(super::rule_name(line).as_deref(), want, "{line:?}");
    }
}
