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
        ("calc_py39", fixture!("unittest", "calc_py39")),
        ("calc_py311", fixture!("unittest", "calc_py311")),
        ("calc_forged_py39", fixture!("unittest", "calc_forged_py39")),
        (
            "calc_forged_py311",
            fixture!("unittest", "calc_forged_py311"),
        ),
        ("calc_quiet_py311", fixture!("unittest", "calc_quiet_py311")),
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
        r.doubts
            .iter()
            .any(|d| d.contains("14 tests are listed as ok")),
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

/// The four tests of `tests/test_calc.py` by their dotted ids.
const CALC: [&str; 4] = [
    "tests.test_calc.C.test_add",
    "tests.test_calc.C.test_div",
    "tests.test_calc.C.test_mul",
    "tests.test_calc.C.test_sub",
];

#[test]
fn dotted_ids_find_their_tests_in_either_pythons_names() {
    for (name, (log, _)) in [
        ("calc_py39", fixture!("unittest", "calc_py39")),
        ("calc_py311", fixture!("unittest", "calc_py311")),
    ] {
        let r = parse("unittest", log).unwrap();
        assert_eq!(r.distrust(), None, "{name}");
        for id in CALC {
            // `test_div` has a docstring: its name is the line above it.
            assert_eq!(r.status(id), Some(Passed), "{name}: {id}");
        }
        // A name as the other Python prints it finds the same test.
        assert_eq!(
            r.status("test_add (tests.test_calc.C)"),
            Some(Passed),
            "{name}"
        );
        assert_eq!(
            r.status("test_add (tests.test_calc.C.test_add)"),
            Some(Passed),
            "{name}"
        );
        assert_eq!(r.status("tests.test_calc.C.test_nope"), None, "{name}");
        assert_eq!(r.status("tests.test_calc.C"), None, "{name}");
        // SWE-bench's Django parser matches exact names only.
        let d = parse("django", log).unwrap();
        assert_eq!(d.status(CALC[0]), None, "{name}");
    }
}

#[test]
fn the_forms_of_a_tests_name() {
    use super::{dotted, spellings};
    for (id, want) in [
        ("test_m (a.b.C)", Some("a.b.C.test_m")),
        ("test_m (a.b.C.test_m)", Some("a.b.C.test_m")),
        ("test_m (C.test_m)", Some("C.test_m.test_m")),
        ("test_m (a.C)", Some("a.C.test_m")),
        ("a.b.C.test_m", Some("a.b.C.test_m")),
        ("test_m (a.b.C.test_m) (i=1)", None),
        ("A docstring.", None),
        ("test_m", None),
        ("a..b", None),
    ] {
        assert_eq!(dotted(id).as_deref(), want, "{id}");
    }
    assert_eq!(
        spellings("a.C.test_m"),
        ["test_m (a.C.test_m)", "test_m (a.C)"]
    );
    // A printed name is never looked up as a dotted one: unittest prints a test
    // method's dotted id only when something else wrote the line.
    assert_eq!(
        spellings("test_m (a.C)"),
        ["test_m (a.C)", "test_m (a.C.test_m)"]
    );
    assert_eq!(spellings("A docstring."), ["A docstring."]);
}

#[test]
fn a_wrong_fix_printing_ok_lines_for_its_failing_tests_is_distrusted() {
    // The code under test writes `tests.test_calc.C.test_x ... ok` for each test it
    // fails; unittest's own `ERROR`s, reports and `FAILED (errors=4)` follow.
    for (name, (log, _)) in [
        ("calc_forged_py39", fixture!("unittest", "calc_forged_py39")),
        (
            "calc_forged_py311",
            fixture!("unittest", "calc_forged_py311"),
        ),
    ] {
        for parser in ["unittest", "django"] {
            let r = parse(parser, log).unwrap();
            let why = r.distrust().unwrap();
            assert!(
                why.contains("8 per-test results") && why.contains("ran 4 tests"),
                "{name} {parser}: {why}"
            );
            // Each test is reported both ways, under its two names.
            assert_eq!(r.conflicts.len(), 4, "{name} {parser}: {:?}", r.conflicts);
            assert_eq!(
                r.conflicts["tests.test_calc.C.test_add"],
                [Passed, Error],
                "{name} {parser}"
            );
        }
        // And the dotted ids find unittest's own word on the tests, never the forgery
        // (a line naming a test by its dotted id).
        let r = parse("unittest", log).unwrap();
        for id in CALC {
            assert_eq!(r.status(id), Some(Error), "{name}: {id}");
        }
        let only_forged = log.replace("ERROR: test_", "ERROR: other_");
        let only_forged = only_forged.replace("\nERROR\n", "\n");
        let r = parse("unittest", &only_forged).unwrap();
        assert_eq!(r.results["tests.test_calc.C.test_add"], Passed, "{name}");
        assert_eq!(r.status("tests.test_calc.C.test_add"), None, "{name}");
    }
}

#[test]
fn a_summary_that_disagrees_with_the_lines_is_distrusted() {
    let (ok, _) = fixture!("unittest", "calc_py311");
    let verdict = "\nOK\n";
    assert!(ok.ends_with(verdict));
    let body = &ok[..ok.len() - verdict.len()];
    // Every line passes, the summary says four errors: no report of them.
    let failed = format!("{body}\nFAILED (errors=4)\n");
    let r = parse("unittest", &failed).unwrap();
    let why = r.distrust().unwrap();
    assert!(
        why.contains("counts 0 failures and 4 errors") || why.contains("4 errors, but"),
        "{why}"
    );
    assert!(
        r.doubts.iter().any(|d| d.contains("every per-test line")),
        "{:?}",
        r.doubts
    );
    // `OK` with a failing line.
    let failing = ok.replacen(
        "test_mul (tests.test_calc.C.test_mul) ... ok",
        "test_mul (tests.test_calc.C.test_mul) ... FAIL",
        1,
    );
    let r = parse("unittest", &failing).unwrap();
    let why = r.distrust().unwrap();
    assert!(why.contains("listed as FAIL"), "{why}");
    // A line more than the tests run.
    let more = ok.replacen(
        "test_mul (",
        "test_new (tests.test_calc.C.test_new) ... ok\ntest_mul (",
        1,
    );
    let why = parse("unittest", &more).unwrap().distrust().unwrap();
    assert!(why.contains("5 per-test results"), "{why}");
    // A run without `-v`: the summary counts tests the log does not name.
    let (quiet, _) = fixture!("unittest", "calc_quiet_py311");
    let why = parse("unittest", quiet).unwrap().distrust().unwrap();
    assert!(why.contains("names only 0"), "{why}");
}

#[test]
fn a_second_summary_is_distrusted() {
    // A forger's whole passing run printed after the real, failing one (from an exit
    // hook): the last summary is the forged one.
    let (forged, _) = fixture!("unittest", "calc_forged_py311");
    let (gold, _) = fixture!("unittest", "calc_py311");
    let log = format!("{forged}{gold}");
    for parser in ["unittest", "django"] {
        let r = parse(parser, &log).unwrap();
        assert!(r.summary.as_ref().unwrap().line.ends_with("; OK"));
        let why = r.distrust().unwrap();
        assert!(why.contains("two closing summaries"), "{parser}: {why}");
    }
}

#[test]
fn ids_the_parser_never_reports_are_refused() {
    use super::super::unreportable;
    for id in [
        "tests.test_calc.C.test_add",
        "test_add (tests.test_calc.C)",
        "test_add (tests.test_calc.C.test_add)",
        "setUpClass (tests.test_outcomes.BrokenClassSetup)",
        "unittest.case.FunctionTestCase (test_fn)",
        "mymod.func",
    ] {
        assert_eq!(unreportable("unittest", id), None, "{id}");
    }
    for (id, why) in [
        ("test_x (a.C.test_x) (i=1)", "subtest"),
        ("A docstring's first line.", "docstring"),
        ("test_add", "bare method name"),
        ("t.py::test_x", "pytest node id"),
        (" test_x (a.C)", "whitespace"),
    ] {
        let got = unreportable("unittest", id).unwrap_or_default();
        assert!(got.contains(why) && got.contains(id.trim()), "{id}: {got}");
    }
    // SWE-bench's Django parser never reports a dotted id; its own forms pass.
    let got = unreportable("django", "tests.test_calc.C.test_add").unwrap();
    assert!(got.contains("`unittest` parser"), "{got}");
    assert_eq!(unreportable("django", "test_x (a.C)"), None);
    assert_eq!(unreportable("django", "A docstring."), None);
}
