//! The `django` and `unittest` parsers on real runs of Django's runner and of
//! `python -m unittest -v` (`tests/fixtures/logs/django/`, `…/unittest/`).

use std::collections::BTreeMap;

use super::super::{TestStatus, assert_conforms, parse};
use TestStatus::*;

/// Every fixture SWE-bench's Django parser is checked on.
fn fixtures() -> Vec<(&'static str, (&'static str, &'static str))> {
    vec![
        ("django32", fixture!("django", "django32")),
        ("django32_forged", fixture!("django", "django32_forged")),
        ("django52", fixture!("django", "django52")),
        ("py39", fixture!("unittest", "py39")),
        ("py311", fixture!("unittest", "py311")),
        ("py312", fixture!("unittest", "py312")),
    ]
}

fn map(entries: &[(&str, TestStatus)]) -> BTreeMap<String, TestStatus> {
    entries.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

#[test]
fn django_gives_swebenchs_map_on_every_fixture() {
    for (name, (log, json)) in fixtures() {
        assert_conforms("django", log, json, name);
    }
}

#[test]
fn django_names_tests_as_swebench_does() {
    let (log, _) = fixture!("django", "django32");
    let r = parse("django", log).unwrap();
    // The docstring's line names a documented test; `FAIL:` headers name the method;
    // expected failures and unexpected successes are not read.
    let want = map(&[
        ("Uses the test database.", Passed),
        ("A docstring's first line stands for the test.", Passed),
        ("test_error (outcomes.tests.Outcomes)", Error),
        ("test_error", Error),
        ("test_fail (outcomes.tests.Outcomes)", Failed),
        ("test_fail", Failed),
        ("test_multiline_docstring (outcomes.tests.Outcomes)", Failed),
        ("test_multiline_docstring", Failed),
        ("test_pass (outcomes.tests.Outcomes)", Passed),
        ("test_skip (outcomes.tests.Outcomes)", Skipped),
        ("test_subtests", Failed),
        // Its `ok` comes on the line after the output it wrote.
        ("test_writes_to_stderr (outcomes.tests.Outcomes)", Passed),
    ]);
    assert_eq!(r.results, want);
    assert_eq!(r.distrust(), None);
    let s = r.summary.unwrap();
    assert_eq!(s.total, Some(11));
    assert_eq!(
        (s.failed, s.errors, s.skipped, s.xfailed, s.xpassed),
        (Some(3), Some(1), Some(1), Some(1), Some(1))
    );
    assert!(s.line.starts_with("Ran 11 tests in ") && s.line.contains("FAILED (failures=3"));
}

#[test]
fn unittest_reads_full_names_and_every_outcome() {
    let want = |class: &str, new: bool| {
        let name = |m: &str| {
            if new {
                format!("{m} (tests.test_outcomes.{class}.{m})")
            } else {
                format!("{m} (tests.test_outcomes.{class})")
            }
        };
        let mut m: BTreeMap<String, TestStatus> = [
            ("test_docstring", Passed),
            ("test_error", Error),
            ("test_expected_failure", XFail),
            ("test_fail", Failed),
            ("test_multiline_docstring", Failed),
            ("test_pass", Passed),
            ("test_skip", Skipped),
            ("test_subtests", Failed),
            ("test_unexpected_success", XPass),
            ("test_writes_to_stderr", Passed),
        ]
        .into_iter()
        .map(|(m, s)| (name(m), s))
        .collect();
        m.insert(
            "setUpClass (tests.test_outcomes.BrokenClassSetup)".into(),
            Error,
        );
        m
    };
    for (name, (log, _), new, ran) in [
        ("py39", fixture!("unittest", "py39"), false, 10),
        ("py311", fixture!("unittest", "py311"), true, 10),
        ("py312", fixture!("unittest", "py312"), true, 9),
    ] {
        let r = parse("unittest", log).unwrap();
        assert_eq!(r.results, want("Outcomes", new), "{name}");
        assert!(r.conflicts.is_empty(), "{name}: {:?}", r.conflicts);
        assert_eq!(r.distrust(), None, "{name}");
        assert_eq!(r.summary.unwrap().total, Some(ran), "{name}");
    }
}

#[test]
fn unittest_reads_djangos_runner_too() {
    let (log, _) = fixture!("django", "django52");
    let r = parse("unittest", log).unwrap();
    let c = "outcomes.tests.Outcomes";
    assert_eq!(
        r.results["test_database (outcomes.tests.WithDatabase.test_database)"],
        Passed
    );
    assert_eq!(
        r.results[&format!("test_multiline_docstring ({c}.test_multiline_docstring)")],
        Failed
    );
    assert_eq!(
        r.results[&format!("test_unexpected_success ({c}.test_unexpected_success)")],
        XPass
    );
    assert_eq!(r.results.len(), 11);
    assert_eq!(r.distrust(), None);
    // Migrations' `Applying x... OK` lines are no tests.
    assert!(!r.results.keys().any(|k| k.contains("Applying")));
}

#[test]
fn a_line_forged_after_djangos_summary_is_caught() {
    let (log, _) = fixture!("django", "django32_forged");
    for parser in ["django", "unittest"] {
        let r = parse(parser, log).unwrap();
        assert_eq!(
            r.results["test_target (forged.tests.Forged)"], Passed,
            "{parser}"
        );
        let why = r.distrust().unwrap();
        assert!(
            why.contains("after the test runner's closing summary"),
            "{why}"
        );
        assert_eq!(
            r.conflicts["test_target (forged.tests.Forged)"],
            [Failed, Passed]
        );
    }
}

#[test]
fn a_run_cut_before_ran_n_tests_is_distrusted() {
    let (log, _) = fixture!("unittest", "py311");
    let cut = &log[..log.find("test_unexpected_success").unwrap()];
    let r = parse("unittest", cut).unwrap();
    assert_eq!(r.summary, None);
    assert!(r.distrust().unwrap().contains("no closing summary"));
    // `Ran N tests` without its verdict line is cut short too.
    let cut = &log[..log.find("FAILED (failures").unwrap()];
    assert!(parse("django", cut).unwrap().summary.is_none());
}

#[test]
fn more_ok_lines_than_tests_run_are_caught() {
    let (log, _) = fixture!("django", "django32");
    let extra: String = (0..10)
        .map(|i| format!("test_new{i} (outcomes.tests.Outcomes) ... ok\n"))
        .collect();
    let forged = log.replacen("test_pass (", &format!("{extra}test_pass ("), 1);
    let r = parse("django", &forged).unwrap();
    assert!(
        r.doubts[0].contains("14 tests are listed as ok"),
        "{:?}",
        r.doubts
    );
    assert!(r.distrust().is_some());
}

#[test]
fn swebenchs_django_quirks() {
    // Django's own output interleaved between a name's ` ... ` and its `ok`, an `ok`
    // starting a later line, the one migration-glued name, the `--version` docstring.
    // The expected map is what SWE-bench's `parse_log_django` gives for these bytes
    // (less the bare `FAIL:` line, on which it raises; here it is ignored).
    let log = "test_a (m.T) ... Testing against Django installed in '/t/django' with up to 2 processes\n\
Found 3 test(s).\n\
System check identified no issues (0 silenced).\n\
ok\n\
test_b (m.T) ... Internal Server Error: /admin/x/\n\
ok\n\
test_c (m.T) ... System check identified no issues (0 silenced)\n\
ok\n\
Applying sites.0002_alter_domain_unique...test_no_migrations (m.T) ... ok\n\
test_d (m.T) ... printed something\n\
okay, that was output\n\
test_e (m.T) ...  OK\n\
test_f (m.T) ... skipped 'why' ... ok\n\
FAIL:\n\
ERROR: test_g (m.T)\n\
--version is equivalent to version\n\
x\\t... ok\n\
test_h (m.T)\t...\tInternal Server Error: //\n\
ok";
    let r = parse("django", log).unwrap();
    let want = map(&[
        ("--version is equivalent to version", Passed),
        ("test_a (m.T)", Passed),
        ("test_b (m.T)", Passed),
        ("test_c (m.T)", Passed),
        ("test_d (m.T)", Passed),
        ("test_e (m.T)", Passed),
        ("test_f (m.T)", Passed),
        ("test_f (m.T) ... skipped 'why'", Passed),
        ("test_g", Error),
        ("test_h (m.T)", Passed),
        ("test_no_migrations (m.T)", Passed),
    ]);
    assert_eq!(r.results, want);
    // Only the Testing-against pattern spans lines; it takes the first `silenced).`
    // that ends with an `ok` line.
    let names = super::interleaved(
        "a ... Testing against Django installed in x silenced).\nnope\nb silenced).\nok\n",
        super::Tail::TestingAgainst,
    );
    assert_eq!(names, ["a"]);
    assert!(super::interleaved("é ... é", super::Tail::ServerError).is_empty());
}

#[test]
fn test_names_are_recognised_as_unittest_prints_them() {
    use super::test_name;
    assert_eq!(test_name("test_x (a.b.C)"), Some("test_x (a.b.C)"));
    assert_eq!(
        test_name("test_x (a.C.test_x) (i=1)"),
        Some("test_x (a.C.test_x)")
    );
    assert_eq!(test_name("setUpClass (a.C)"), Some("setUpClass (a.C)"));
    for not in [
        "A docstring (sort of).",
        "test_x",
        "test_x ()",
        "x y (a.C)",
        "t (a b)",
    ] {
        assert_eq!(test_name(not), None, "{not}");
    }
}
