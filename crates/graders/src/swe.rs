//! SWE-bench-style instances: what a repository task is, which files its test patch
//! touches, and the verdict from a test run's results.
//!
//! An instance is SWE-bench's record as its datasets ship it: `instance_id`, `repo`
//! (`owner/name`), `base_commit`, the gold `patch`, the `test_patch` that adds or changes
//! the tests, and the tests that must go from failing to passing (`FAIL_TO_PASS`) and
//! keep passing (`PASS_TO_PASS`), as JSON lists or as the JSON-encoded strings of lists
//! the HuggingFace exports hold. Other fields (`problem_statement`, `hints_text`,
//! `version`, …) are kept as they are.
//!
//! The reward is 1 iff every named test passed in the log by SWE-bench's grading
//! ([`verdict`]), and the log can be trusted as evidence; a test the log does not
//! mention did not pass (a run that crashed, or an agent that deleted it).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Deserializer, Serialize};

use super::logs::{Report, TestStatus};

/// A SWE-bench instance.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Instance {
    /// The instance's name (`astropy__astropy-12907`).
    pub instance_id: String,
    /// The repository, `owner/name`.
    pub repo: String,
    /// The commit the agent starts from and the tests are applied to.
    pub base_commit: String,
    /// The gold patch (never shown to the agent; kept for checking the instance).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patch: Option<String>,
    /// The patch that adds the instance's tests.
    pub test_patch: String,
    /// Tests that fail before the fix and must pass after it.
    #[serde(rename = "FAIL_TO_PASS", deserialize_with = "test_names")]
    pub fail_to_pass: Vec<String>,
    /// Tests that pass before the fix and must still pass.
    #[serde(rename = "PASS_TO_PASS", default, deserialize_with = "test_names")]
    pub pass_to_pass: Vec<String>,
    /// The commit SWE-bench builds the instance's environment from (recorded; the
    /// environment is the task's sandbox image or setup).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment_setup_commit: Option<String>,
    /// A prepared image holding the environment and the repository.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The dataset's other fields, kept as they were.
    #[serde(flatten)]
    pub other: BTreeMap<String, serde_json::Value>,
}

/// A list of test names, or a JSON string holding one (SWE-bench's HuggingFace form).
fn test_names<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Names {
        List(Vec<String>),
        Encoded(String),
    }
    match Names::deserialize(d)? {
        Names::List(v) => Ok(v),
        Names::Encoded(s) if s.trim().is_empty() => Ok(Vec::new()),
        Names::Encoded(s) => serde_json::from_str(&s).map_err(|e| {
            serde::de::Error::custom(format!(
                "a string of test names must hold a JSON list of strings: {e}"
            ))
        }),
    }
}

/// The paths a unified diff touches, both sides of renames included, in order and once
/// each (from `--- a/…`, `+++ b/…`, `rename from/to` and, for diffs without content
/// lines such as binary or mode changes, the `diff --git` header).
pub fn patch_paths(patch: &str) -> Vec<String> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    let mut add = |p: Option<String>| {
        if let Some(p) = p
            && !p.is_empty()
            && seen.insert(p.clone())
        {
            out.push(p);
        }
    };
    for line in patch.lines() {
        if let Some(rest) = line.strip_prefix("--- ") {
            add(side_path(rest, "a/"));
        } else if let Some(rest) = line.strip_prefix("+++ ") {
            add(side_path(rest, "b/"));
        } else if let Some(rest) = line.strip_prefix("rename from ") {
            add(Some(unquote(rest)));
        } else if let Some(rest) = line.strip_prefix("rename to ") {
            add(Some(unquote(rest)));
        } else if let Some(rest) = line.strip_prefix("diff --git ") {
            add(header_path(rest));
        }
    }
    out
}

/// A `---`/`+++` line's path without its `a/`/`b/` side, or `None` for `/dev/null`.
fn side_path(rest: &str, side: &str) -> Option<String> {
    // Git ends the name with a tab when it holds spaces; anything after is a timestamp.
    let name = unquote(rest.split('\t').next().unwrap_or(rest).trim_end());
    if name == "/dev/null" {
        return None;
    }
    Some(name.strip_prefix(side).unwrap_or(&name).to_string())
}

/// The path of a `diff --git a/X b/X` header when both sides agree (a binary or
/// mode-only change); renames are read from their own lines.
fn header_path(rest: &str) -> Option<String> {
    if rest.starts_with('"') {
        let end = closing_quote(rest)?;
        let a = unquote(&rest[..=end]);
        return a.strip_prefix("a/").map(str::to_string);
    }
    // Unquoted: `a/X b/X`, X the same on both sides.
    let half = rest.len().checked_sub(1)? / 2;
    let (a, b) = (rest.get(..half)?, rest.get(half + 1..)?);
    match (a.strip_prefix("a/"), b.strip_prefix("b/")) {
        (Some(x), Some(y)) if x == y => Some(x.to_string()),
        _ => None,
    }
}

/// The index of the quote closing the C-quoted string `s` starts with.
fn closing_quote(s: &str) -> Option<usize> {
    let bytes = s.as_bytes();
    let mut i = 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'"' => return Some(i),
            _ => i += 1,
        }
    }
    None
}

/// Git's C-style quoting undone (`"a/sp\303\244ce \"x\""` → `a/späce "x"`); other
/// names as they are.
fn unquote(s: &str) -> String {
    let Some(inner) = s.strip_prefix('"').and_then(|t| t.strip_suffix('"')) else {
        return s.to_string();
    };
    let mut bytes = Vec::with_capacity(inner.len());
    let mut it = inner.bytes().peekable();
    while let Some(b) = it.next() {
        if b != b'\\' {
            bytes.push(b);
            continue;
        }
        match it.next() {
            Some(b'n') => bytes.push(b'\n'),
            Some(b't') => bytes.push(b'\t'),
            Some(b'a') => bytes.push(7),
            Some(b'b') => bytes.push(8),
            Some(b'f') => bytes.push(12),
            Some(b'v') => bytes.push(11),
            Some(b'r') => bytes.push(b'\r'),
            Some(d @ b'0'..=b'7') => {
                let mut v = u32::from(d - b'0');
                for _ in 0..2 {
                    match it.peek() {
                        Some(&n @ b'0'..=b'7') => {
                            v = v * 8 + u32::from(n - b'0');
                            it.next();
                        }
                        _ => break,
                    }
                }
                bytes.push(u8::try_from(v).unwrap_or(b'?'));
            }
            Some(other) => bytes.push(other),
            None => bytes.push(b'\\'),
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// How the named tests came out.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Verdict {
    /// Every `FAIL_TO_PASS` test passed and every `PASS_TO_PASS` test was kept, in a
    /// log that can be trusted.
    pub resolved: bool,
    /// `FAIL_TO_PASS` tests that passed, of how many.
    pub fail_to_pass_passed: usize,
    /// How many `FAIL_TO_PASS` tests there are.
    pub fail_to_pass_total: usize,
    /// `PASS_TO_PASS` tests kept: passed, or skipped (which SWE-bench does not count
    /// as breaking a test).
    pub pass_to_pass_passed: usize,
    /// How many `PASS_TO_PASS` tests there are.
    pub pass_to_pass_total: usize,
    /// The named tests that count against the instance, with what the log says
    /// (`failed`, `error`, `skipped`, …, or `missing` when it does not mention them),
    /// at most [`MAX_LISTED`].
    pub not_passed: BTreeMap<String, String>,
    /// Why it is not resolved, in words for a user: the log's distrust reason (a log
    /// that cannot be trusted resolves nothing), or the tests missing from the log and
    /// those that did not pass, named (a few of each).
    pub failure: Option<String>,
}

/// How many tests that did not pass a verdict lists by name.
pub const MAX_LISTED: usize = 50;

/// How many names a verdict's `failure` sentence gives of each kind.
const NAMED_IN_FAILURE: usize = 5;

/// The verdict on `instance` from a run's parsed log, by SWE-bench's grading: a
/// `FAIL_TO_PASS` test resolves when it passed or failed as expected
/// ([`TestStatus::passed`]); a `PASS_TO_PASS` test is kept when it did so or was
/// skipped; an absent test did neither. Under the `unittest` parser an expected id
/// names its test in any of unittest's forms (dotted `pkg.mod.Class.test_m`, or as
/// Python before or after 3.11 prints it), whichever the run's Python printed. An expected id cut inside its `[…]` (more `[`
/// than `]`, as older SWE-bench lists hold) stands for the ids it begins when they
/// agree on passing. A report [`Report::distrust`]s never resolves.
pub fn verdict(instance: &Instance, report: &Report) -> Verdict {
    let distrust = report.distrust();
    let mut not_passed = BTreeMap::new();
    let mut missing: Vec<String> = Vec::new();
    let mut failing: Vec<String> = Vec::new();
    let mut count = |names: &[String], skip_keeps: bool| -> usize {
        let mut passed = 0;
        for name in names {
            let status = lookup(name, report);
            let ok = status.is_some_and(|s| s.passed() || (skip_keeps && s == TestStatus::Skipped));
            if ok {
                passed += 1;
                continue;
            }
            let what = status.map_or("missing", TestStatus::name);
            match status {
                None => missing.push(name.clone()),
                Some(_) => failing.push(format!("{name} ({what})")),
            }
            if not_passed.len() < MAX_LISTED {
                not_passed.insert(name.clone(), what.to_string());
            }
        }
        passed
    };
    let f2p = count(&instance.fail_to_pass, false);
    let p2p = count(&instance.pass_to_pass, true);
    let all_passed = f2p == instance.fail_to_pass.len() && p2p == instance.pass_to_pass.len();
    let resolved = all_passed && !instance.fail_to_pass.is_empty() && distrust.is_none();
    let failure = if resolved {
        None
    } else if let Some(why) = distrust {
        Some(why)
    } else if instance.fail_to_pass.is_empty() {
        Some("the instance names no FAIL_TO_PASS test, so nothing can resolve it".to_string())
    } else {
        let mut parts = Vec::new();
        if !missing.is_empty() {
            parts.push(format!("tests missing from the log: {}", named(&missing)));
        }
        if !failing.is_empty() {
            parts.push(format!("tests that did not pass: {}", named(&failing)));
        }
        Some(parts.join("; "))
    };
    Verdict {
        resolved,
        fail_to_pass_passed: f2p,
        fail_to_pass_total: instance.fail_to_pass.len(),
        pass_to_pass_passed: p2p,
        pass_to_pass_total: instance.pass_to_pass.len(),
        not_passed,
        failure,
    }
}

/// A few names and how many more there are (`a, b, c, … (12 in all)`).
fn named(names: &[String]) -> String {
    let shown = names[..names.len().min(NAMED_IN_FAILURE)].join(", ");
    if names.len() > NAMED_IN_FAILURE {
        format!("{shown}, … ({} in all)", names.len())
    } else {
        shown
    }
}

/// The status of the expected id `name`: its own ([`Report::status`], which finds a
/// unittest test by any of its names), or, for an id cut inside its brackets, that of
/// the ids it begins when they agree on passing (SWE-bench's `_resolve_case`; of
/// agreeing ids the first in name order stands for them all).
fn lookup(name: &str, report: &Report) -> Option<TestStatus> {
    if let Some(s) = report.status(name) {
        return Some(s);
    }
    let results = &report.results;
    if name.matches('[').count() <= name.matches(']').count() {
        return None;
    }
    let mut matches = results
        .range::<str, _>((std::ops::Bound::Included(name), std::ops::Bound::Unbounded))
        .take_while(|(k, _)| k.starts_with(name))
        .map(|(_, s)| *s);
    let first = matches.next()?;
    matches
        .all(|s| s.passed() == first.passed())
        .then_some(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEST_PATCH: &str = "diff --git a/tests/test_calc.py b/tests/test_calc.py
index 1111111..2222222 100644
--- a/tests/test_calc.py
+++ b/tests/test_calc.py
@@ -1,2 +1,5 @@
 from calc import add
+
+def test_neg():
+    assert add(-1, -1) == -2
diff --git a/tests/test_new.py b/tests/test_new.py
new file mode 100644
--- /dev/null
+++ b/tests/test_new.py
@@ -0,0 +1 @@
+def test_x(): pass
diff --git a/tests/old.py b/tests/old.py
deleted file mode 100644
--- a/tests/old.py
+++ /dev/null
@@ -1 +0,0 @@
-x = 1
diff --git a/tests/data.bin b/tests/data.bin
new file mode 100644
index 0000000..e69de29
Binary files /dev/null and b/tests/data.bin differ
diff --git a/t/a.txt b/t/b.txt
similarity index 100%
rename from t/a.txt
rename to t/b.txt
diff --git \"a/tests/sp ace\\303\\244.py\" \"b/tests/sp ace\\303\\244.py\"
--- \"a/tests/sp ace\\303\\244.py\"
+++ \"b/tests/sp ace\\303\\244.py\"
@@ -1 +1 @@
-a
+b
";

    #[test]
    fn every_path_a_patch_touches_is_found() {
        assert_eq!(
            patch_paths(TEST_PATCH),
            [
                "tests/test_calc.py",
                "tests/test_new.py",
                "tests/old.py",
                "tests/data.bin",
                "t/a.txt",
                "t/b.txt",
                "tests/sp aceä.py",
            ]
        );
    }

    #[test]
    fn instances_read_either_form_of_test_lists_and_keep_other_fields() {
        let listed: Instance = serde_json::from_value(serde_json::json!({
            "instance_id": "o__r-1", "repo": "o/r", "base_commit": "abc",
            "test_patch": TEST_PATCH,
            "FAIL_TO_PASS": ["tests/test_calc.py::test_neg"],
            "PASS_TO_PASS": [],
            "problem_statement": "add() is wrong",
        }))
        .unwrap();
        let encoded: Instance = serde_json::from_value(serde_json::json!({
            "instance_id": "o__r-1", "repo": "o/r", "base_commit": "abc",
            "test_patch": TEST_PATCH,
            "FAIL_TO_PASS": "[\"tests/test_calc.py::test_neg\"]",
            "PASS_TO_PASS": "[]",
        }))
        .unwrap();
        assert_eq!(listed.fail_to_pass, encoded.fail_to_pass);
        assert!(encoded.pass_to_pass.is_empty());
        assert_eq!(listed.other["problem_statement"], "add() is wrong");
        let bad = serde_json::from_value::<Instance>(serde_json::json!({
            "instance_id": "x", "repo": "o/r", "base_commit": "abc", "test_patch": "",
            "FAIL_TO_PASS": "not json",
        }));
        assert!(bad.unwrap_err().to_string().contains("JSON list"));
    }

    /// A report of `v` from a log whose summary is there and nothing is doubted.
    fn report(v: &[(&str, TestStatus)]) -> Report {
        Report {
            results: v.iter().map(|(n, s)| (n.to_string(), *s)).collect(),
            summary: Some(crate::logs::Summary::default()),
            ..Report::default()
        }
    }

    fn instance(f2p: &[&str], p2p: &[&str]) -> Instance {
        serde_json::from_value(serde_json::json!({
            "instance_id": "i", "repo": "o/r", "base_commit": "abc", "test_patch": "",
            "FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p,
        }))
        .unwrap()
    }

    #[test]
    fn only_every_named_test_passing_resolves() {
        use TestStatus::*;
        let inst = instance(&["t.py::a"], &["t.py::b", "t.py::c"]);
        let all = verdict(
            &inst,
            &report(&[
                ("t.py::a", Passed),
                ("t.py::b", Passed),
                ("t.py::c", Passed),
            ]),
        );
        assert!(all.resolved);
        assert_eq!(all.failure, None);
        let missing = verdict(&inst, &report(&[("t.py::a", Passed), ("t.py::b", Passed)]));
        assert!(!missing.resolved);
        assert_eq!(missing.not_passed["t.py::c"], "missing");
        assert_eq!(
            missing.failure.as_deref(),
            Some("tests missing from the log: t.py::c")
        );
        let skipped = verdict(
            &inst,
            &report(&[
                ("t.py::a", Skipped),
                ("t.py::b", Passed),
                ("t.py::c", Error),
            ]),
        );
        assert!(!skipped.resolved);
        assert_eq!(skipped.fail_to_pass_passed, 0);
        assert_eq!(skipped.not_passed.len(), 2);
        assert_eq!(
            skipped.failure.as_deref(),
            Some("tests that did not pass: t.py::a (skipped), t.py::c (error)")
        );
        // An instance that names no test to fix resolves nothing.
        let none = instance(&[], &[]);
        let v = verdict(&none, &report(&[]));
        assert!(!v.resolved && v.failure.unwrap().contains("no FAIL_TO_PASS"));
    }

    #[test]
    fn swebenchs_grading_xfail_passes_skips_keep_pass_to_pass() {
        use TestStatus::*;
        let inst = instance(&["t.py::a"], &["t.py::b"]);
        // An expected failure passes; a skipped PASS_TO_PASS test is kept.
        let v = verdict(&inst, &report(&[("t.py::a", XFail), ("t.py::b", Skipped)]));
        assert!(v.resolved, "{v:?}");
        assert_eq!(v.pass_to_pass_passed, 1);
        // An unexpected pass is no pass; neither is a failure or an error.
        for bad in [XPass, Failed, Error, Skipped] {
            let v = verdict(&inst, &report(&[("t.py::a", bad), ("t.py::b", Passed)]));
            assert!(!v.resolved, "{bad:?}");
            assert_eq!(v.not_passed["t.py::a"], bad.name());
        }
        for bad in [XPass, Failed, Error] {
            let v = verdict(&inst, &report(&[("t.py::a", Passed), ("t.py::b", bad)]));
            assert!(!v.resolved, "{bad:?}");
        }
    }

    #[test]
    fn ids_cut_inside_brackets_match_the_ids_they_begin() {
        use TestStatus::*;
        let inst = instance(&["t.py::test_grammar[log(photon"], &[]);
        let both = report(&[
            ("t.py::test_grammar[log(photon s)]", Passed),
            ("t.py::test_grammar[log(photon m)]", XFail),
        ]);
        assert!(verdict(&inst, &both).resolved);
        let disagree = report(&[
            ("t.py::test_grammar[log(photon s)]", Passed),
            ("t.py::test_grammar[log(photon m)]", Failed),
        ]);
        assert_eq!(
            verdict(&inst, &disagree).not_passed["t.py::test_grammar[log(photon"],
            "missing"
        );
        // A whole id never matches by prefix.
        let whole = instance(&["t.py::x"], &[]);
        assert!(!verdict(&whole, &report(&[("t.py::x2", Passed)])).resolved);
    }

    #[test]
    fn failures_name_a_few_tests_and_count_the_rest() {
        let names: Vec<String> = (0..8).map(|i| format!("t.py::m{i}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let v = verdict(&instance(&refs, &[]), &report(&[]));
        let f = v.failure.unwrap();
        assert!(
            f.starts_with("tests missing from the log: t.py::m0, t.py::m1"),
            "{f}"
        );
        assert!(f.ends_with(", … (8 in all)"), "{f}");
        assert!(!f.contains("t.py::m5"));
    }

    #[test]
    fn a_log_that_cannot_be_trusted_resolves_nothing() {
        use TestStatus::*;
        let inst = instance(&["t.py::a"], &[]);
        let mut r = report(&[("t.py::a", Passed)]);
        r.summary = None;
        let v = verdict(&inst, &r);
        assert!(!v.resolved);
        assert_eq!(v.fail_to_pass_passed, 1);
        assert!(v.failure.unwrap().contains("no closing summary"));
        // A real log with lines forged after pytest's summary.
        let log = include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/logs/pytest/forged.log"
        ));
        let r = crate::logs::parse("pytest", log).unwrap();
        let v = verdict(&instance(&["tests/test_forged.py::test_target"], &[]), &r);
        assert!(!v.resolved);
        assert!(
            v.failure
                .unwrap()
                .contains("after the test runner's closing summary")
        );
    }

    #[test]
    fn unittest_dotted_ids_resolve_a_gold_run_of_either_python_and_not_a_forged_one() {
        use crate::logs::parse;
        let fixture = |p: &str| {
            std::fs::read_to_string(format!(
                "{}/../../tests/fixtures/logs/unittest/{p}.log",
                env!("CARGO_MANIFEST_DIR")
            ))
            .unwrap()
        };
        // SWE-Gym-style rows: unittest's own dotted ids, one of them a documented test.
        let inst = instance(
            &["tests.test_calc.C.test_add", "tests.test_calc.C.test_div"],
            &["tests.test_calc.C.test_mul", "tests.test_calc.C.test_sub"],
        );
        for gold in ["calc_py39", "calc_py311"] {
            let v = verdict(&inst, &parse("unittest", &fixture(gold)).unwrap());
            assert!(v.resolved, "{gold}: {v:?}");
        }
        // The same ids as Python 3.9 printed them match a 3.11 run, and back.
        let printed = instance(&["test_add (tests.test_calc.C)"], &[]);
        let r = parse("unittest", &fixture("calc_py311")).unwrap();
        assert!(verdict(&printed, &r).resolved);
        // A wrong fix that printed `tests.test_calc.C.test_x ... ok` for each test it
        // failed: unittest's own summary says `FAILED (errors=4)`.
        for forged in ["calc_forged_py39", "calc_forged_py311"] {
            let r = parse("unittest", &fixture(forged)).unwrap();
            let v = verdict(&inst, &r);
            assert!(!v.resolved, "{forged}");
            assert_eq!(v.fail_to_pass_passed, 0, "{forged}: {v:?}");
            assert_eq!(v.not_passed["tests.test_calc.C.test_add"], "error");
            let why = v.failure.unwrap();
            assert!(why.contains("per-test results"), "{forged}: {why}");
        }
    }

    #[test]
    fn gold_runs_of_each_runner_resolve() {
        use crate::logs::parse;
        let fixture = |p: &str| {
            std::fs::read_to_string(format!(
                "{}/../../tests/fixtures/logs/{p}",
                env!("CARGO_MANIFEST_DIR")
            ))
            .unwrap()
        };
        // Lists as SWE-bench makes them from such runs: Django's docstring names, the
        // pytest parser's ids cut at a space, sympy's bare names.
        let django = instance(
            &["A docstring's first line stands for the test."],
            &[
                "test_pass (outcomes.tests.Outcomes)",
                "test_skip (outcomes.tests.Outcomes)",
                "Uses the test database.",
            ],
        );
        let r = parse("django", &fixture("django/django32.log")).unwrap();
        assert!(verdict(&django, &r).resolved);
        let unittest = instance(
            &["test_docstring (outcomes.tests.Outcomes.test_docstring)"],
            &["test_expected_failure (outcomes.tests.Outcomes.test_expected_failure)"],
        );
        let r = parse("unittest", &fixture("django/django52.log")).unwrap();
        assert!(verdict(&unittest, &r).resolved);
        let pytest = instance(
            &["tests/test_sample.py::test_param[a"],
            &[
                "tests/test_sample.py::test_pass",
                "tests/test_sample.py::test_xfail",
            ],
        );
        // The teardown error makes the log one that cannot be trusted; a log without it
        // (the passing run of the matplotlib fixture) resolves.
        let r = parse("pytest", &fixture("pytest/rA.log")).unwrap();
        let v = verdict(&pytest, &r);
        assert!(!v.resolved && v.failure.unwrap().contains("test_teardown_error"));
        let mouse = instance(&["tests/test_mouse.py::test_click[1]"], &[]);
        let r = parse("matplotlib", &fixture("pytest/mouse.log")).unwrap();
        assert!(verdict(&mouse, &r).resolved);
        let sympy = instance(&["test_expand", "test_rational"], &[]);
        let r = parse("sympy", &fixture("sympy/passing.log")).unwrap();
        assert!(verdict(&sympy, &r).resolved);
        // The file's last test is never read by SWE-bench's sympy parser.
        let last = instance(&["test_last"], &[]);
        let v = verdict(&last, &r);
        assert_eq!(
            v.failure.as_deref(),
            Some("tests missing from the log: test_last")
        );
    }
}
