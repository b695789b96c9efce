//! The pytest parsers on real pytest output (`tests/fixtures/logs/pytest/`).

use std::collections::BTreeMap;

use super::super::{TestStatus, assert_conforms, parse};
use super::summary;
use TestStatus::*;

/// Every pytest fixture, by name.
fn fixtures() -> Vec<(&'static str, (&'static str, &'static str))> {
    vec![
        ("rA", fixture!("pytest", "rA")),
        ("rA_v", fixture!("pytest", "rA_v")),
        ("pytest4_rA", fixture!("pytest", "pytest4_rA")),
        ("rA_vv_classic", fixture!("pytest", "rA_vv_classic")),
        ("no_header_rA", fixture!("pytest", "no_header_rA")),
        (
            "no_header_rA_tb_no",
            fixture!("pytest", "no_header_rA_tb_no"),
        ),
        ("rA_color", fixture!("pytest", "rA_color")),
        ("rA_v_color", fixture!("pytest", "rA_v_color")),
        ("verbose_tb_no", fixture!("pytest", "verbose_tb_no")),
        ("forged", fixture!("pytest", "forged")),
        ("forged_import", fixture!("pytest", "forged_import")),
        ("forged_output", fixture!("pytest", "forged_output")),
        ("cut", fixture!("pytest", "cut")),
        ("collect_error", fixture!("pytest", "collect_error")),
        ("mouse", fixture!("pytest", "mouse")),
        ("inner", fixture!("pytest", "inner")),
    ]
}

const ID: &str = "tests/test_sample.py::";

fn id(name: &str) -> String {
    format!("{ID}{name}")
}

#[test]
fn every_pytest_parser_gives_swebenchs_map_on_every_fixture() {
    for (name, (log, json)) in fixtures() {
        for parser in super::super::PYTEST_FAMILY {
            assert_conforms(parser, log, json, name);
        }
    }
}

#[test]
fn pytest_ra_reads_every_outcome_the_runner_reported() {
    let (log, _) = fixture!("pytest", "rA");
    let r = parse("pytest", log).unwrap();
    let want: BTreeMap<String, TestStatus> = [
        ("test_pass", Passed),
        ("test_fail", Failed),
        ("test_setup_error", Error),
        // Passed, then errored in teardown: the later line wins.
        ("test_teardown_error", Error),
        ("test_xfail", XFail),
        // SWE-bench's pytest parser cuts an id at its first space.
        ("test_param[a", Passed),
        ("test_param[log(photon", Passed),
        ("test_param[x[1]]", Failed),
        ("test_param[/usr/lib/python3/site.py]", Passed),
        ("test_param[plain]", Passed),
        ("TestGroup::test_method", Passed),
        ("TestGroup::test_method_fails", Failed),
    ]
    .into_iter()
    .map(|(n, s)| (id(n), s))
    .collect();
    // The skip is `SKIPPED [1] path:line` (no id) and the xpass is not read.
    assert_eq!(r.results, want);
    let s = r.summary.clone().unwrap();
    assert_eq!(
        (
            s.passed, s.failed, s.errors, s.skipped, s.xfailed, s.xpassed
        ),
        (Some(7), Some(3), Some(2), Some(1), Some(1), Some(1))
    );
    assert_eq!(s.total, None);
    assert!(r.doubts.is_empty(), "{:?}", r.doubts);
    assert_eq!(
        r.conflicts,
        BTreeMap::from([(id("test_teardown_error"), vec![Passed, Error])])
    );
    let why = r.distrust().unwrap();
    assert!(why.contains("test_teardown_error") && why.contains("passed and then error"));
}

#[test]
fn pytest_4s_short_summary_reads_the_same() {
    let (log, _) = fixture!("pytest", "pytest4_rA");
    let r = parse("pytest", log).unwrap();
    let (new, _) = fixture!("pytest", "rA");
    assert_eq!(r.results, parse("pytest", new).unwrap().results);
    let s = r.summary.clone().unwrap();
    assert_eq!((s.passed, s.errors, s.xpassed), (Some(7), Some(2), Some(1)));
    assert!(r.doubts.is_empty(), "{:?}", r.doubts);
    assert_eq!(r.conflicts.len(), 1);
}

#[test]
fn pytest_v2_keeps_whole_ids_and_reads_through_colour() {
    for (name, (log, _)) in [
        ("rA_v", fixture!("pytest", "rA_v")),
        ("rA_color", fixture!("pytest", "rA_color")),
        ("rA_v_color", fixture!("pytest", "rA_v_color")),
    ] {
        let r = parse("pytest_v2", log).unwrap();
        assert_eq!(r.results[&id("test_param[a b]")], Passed, "{name}");
        assert_eq!(
            r.results[&id("test_param[log(photon s)]")],
            Passed,
            "{name}"
        );
        assert_eq!(
            r.results[&id("TestGroup::test_method_fails")],
            Failed,
            "{name}"
        );
        assert_eq!(r.summary.as_ref().unwrap().passed, Some(7), "{name}");
        assert!(r.doubts.is_empty(), "{name}: {:?}", r.doubts);
        assert_eq!(
            r.conflicts.keys().collect::<Vec<_>>(),
            [&id("test_teardown_error")],
            "{name}"
        );
    }
    // Colour hides every line from the parsers that do not clean it, as in SWE-bench.
    let (log, _) = fixture!("pytest", "rA_color");
    assert!(parse("pytest", log).unwrap().results.is_empty());
}

#[test]
fn the_classic_style_teardown_error_is_a_conflict_even_where_swebench_says_passed() {
    let (log, _) = fixture!("pytest", "rA_vv_classic");
    let r = parse("pytest_v2", log).unwrap();
    // `id ERROR` (per-test line), then `PASSED id`, then `ERROR id - message`, which
    // pytest_v2 keys with its message: SWE-bench's map says passed.
    assert_eq!(r.results[&id("test_teardown_error")], Passed);
    assert_eq!(r.conflicts[&id("test_teardown_error")], [Passed, Error]);
    assert!(r.distrust().unwrap().contains("test_teardown_error"));
}

#[test]
fn swe_smiths_verbose_parser_reads_per_test_lines() {
    let (log, _) = fixture!("pytest", "verbose_tb_no");
    let r = parse("pytest_verbose", log).unwrap();
    assert_eq!(r.results[&id("test_skip")], Skipped);
    assert_eq!(r.results[&id("test_teardown_error")], Error);
    assert!(!r.results.contains_key(&id("test_xpass")));
    assert_eq!(r.summary.as_ref().unwrap().failed, Some(3));
    // Only failures are listed in this summary: no count disagrees with it.
    assert!(r.doubts.is_empty(), "{:?}", r.doubts);
}

#[test]
fn matplotlib_rewrites_mouse_buttons() {
    let (log, _) = fixture!("pytest", "mouse");
    let m = parse("matplotlib", log).unwrap().results;
    assert_eq!(
        m.keys().collect::<Vec<_>>(),
        [
            "tests/test_mouse.py::test_click[1]",
            "tests/test_mouse.py::test_click[3]"
        ]
    );
    let p = parse("pytest", log).unwrap().results;
    assert!(p.contains_key("tests/test_mouse.py::test_click[MouseButton.LEFT]"));
    assert_eq!(parse("pytest", log).unwrap().distrust(), None);
}

#[test]
fn pytest_options_shortens_path_parameters() {
    let (log, _) = fixture!("pytest", "rA");
    let r = parse("pytest_options", log).unwrap().results;
    assert_eq!(r[&id("test_param[/site.py]")], Passed);
    assert!(!r.contains_key(&id("test_param[/usr/lib/python3/site.py]")));
    assert_eq!(super::options_key("t.py::x[//a/b]"), "t.py::x[//a/b]");
    assert_eq!(super::options_key("t.py::x[/a/*]"), "t.py::x[/a/*]");
    assert_eq!(super::options_key("t.py::x[a]tail"), "t.py::x[a]");
    assert_eq!(super::options_key("t.py::x]y[z"), "t.py::x]y[z");
}

#[test]
fn lines_forged_after_the_summary_are_caught() {
    let (log, _) = fixture!("pytest", "forged");
    let r = parse("pytest", log).unwrap();
    // SWE-bench's last-wins map is fooled by the forged line…
    assert_eq!(r.results["tests/test_forged.py::test_target"], Passed);
    // …but the log is not evidence.
    let why = r.distrust().unwrap();
    assert!(
        why.contains("after the test runner's closing summary"),
        "{why}"
    );
    assert!(
        why.contains("test_target") || why.contains("test_other"),
        "{why}"
    );
    assert_eq!(
        r.conflicts["tests/test_forged.py::test_target"],
        [Failed, Passed]
    );
}

#[test]
fn passes_printed_by_the_code_under_test_are_caught() {
    // A module that fails to import prints a `PASSED` line for its own test: pytest
    // shows it as captured output, and SWE-bench's map takes it.
    let (log, _) = fixture!("pytest", "forged_import");
    for parser in ["pytest", "pytest_v2", "pytest_options"] {
        let r = parse(parser, log).unwrap();
        assert_eq!(
            r.results["tests/test_forged_import.py::test_target"],
            Passed
        );
        let why = r.distrust().unwrap();
        assert!(
            why.contains("captured before pytest's own list"),
            "{parser}: {why}"
        );
    }
    // A failing test prints `PASSED` lines for itself and for a test that does not
    // exist: pytest's list has the real outcome last, and names neither claim.
    let (log, _) = fixture!("pytest", "forged_output");
    let r = parse("pytest", log).unwrap();
    assert_eq!(
        r.results["tests/test_forged_output.py::test_target"],
        Failed
    );
    assert_eq!(
        r.results["tests/test_forged_output.py::test_not_collected"],
        Passed
    );
    assert!(r.distrust().unwrap().contains("test_not_collected"));
    assert_eq!(
        r.conflicts["tests/test_forged_output.py::test_target"],
        [Passed, Failed]
    );
    // Per-test lines of `-v` before a complete list are pytest's own.
    let (log, _) = fixture!("pytest", "rA_v");
    assert!(parse("pytest", log).unwrap().doubts.is_empty());
}

#[test]
fn a_run_cut_short_has_no_summary() {
    let (log, _) = fixture!("pytest", "cut");
    for parser in ["pytest", "pytest_v2", "seaborn", "pytest_verbose"] {
        let r = parse(parser, log).unwrap();
        assert_eq!(r.summary, None);
        assert!(r.distrust().unwrap().contains("no closing summary"));
    }
    // The per-test line before the exit says passed; it proves nothing.
    let r = parse("seaborn", log).unwrap();
    assert_eq!(r.results["tests/test_cut.py::test_first"], Passed);
}

#[test]
fn a_collection_error_is_a_clean_log_of_one_error() {
    let (log, _) = fixture!("pytest", "collect_error");
    let r = parse("pytest", log).unwrap();
    assert_eq!(
        r.results,
        BTreeMap::from([("tests/test_collect_error.py".to_string(), Error)])
    );
    assert_eq!(r.summary.as_ref().unwrap().errors, Some(1));
    assert_eq!(r.distrust(), None);
}

#[test]
fn pytest_inside_pytest_is_not_a_conflict() {
    let (log, _) = fixture!("pytest", "inner");
    let r = parse("pytest", log).unwrap();
    // SWE-bench reads the inner runs' lines too (the later one wins)…
    assert_eq!(r.results["test_inner_file.py::test_a"], Passed);
    assert_eq!(
        r.results["tests/test_inner.py::test_inner_run_twice"],
        Passed
    );
    // …and they are not the outer run's reports: the log is clean.
    assert!(r.conflicts.is_empty(), "{:?}", r.conflicts);
    assert_eq!(r.distrust(), None);
    assert_eq!(r.summary.unwrap().passed, Some(1));
}

#[test]
fn more_passed_lines_than_the_summary_counts_are_caught() {
    let (log, _) = fixture!("pytest", "rA");
    let forged = log.replace(
        "PASSED tests/test_sample.py::test_pass\n",
        "PASSED tests/test_sample.py::test_pass\nPASSED tests/test_sample.py::test_new\n",
    );
    let r = parse("pytest", &forged).unwrap();
    assert!(
        r.doubts[0].contains("8 tests are listed as PASSED"),
        "{:?}",
        r.doubts
    );
    assert!(r.distrust().unwrap().contains("summary counts 7"));
    // A skip line beyond the summary's count too.
    let forged = log.replace(
        "SKIPPED [1] tests/test_sample.py:33: not on this platform\n",
        "SKIPPED [2] tests/test_sample.py:33: not on this platform\n",
    );
    assert!(parse("pytest", &forged).unwrap().doubts[0].contains("SKIPPED"));
}

#[test]
fn a_second_summary_after_pytests_own_is_caught() {
    let (log, _) = fixture!("pytest", "forged");
    // The code under test could print a whole summary block of its own after the run.
    let forged = format!(
        "{log}=========================== short test summary info ============================\n\
         PASSED tests/test_forged.py::test_target\n\
         ============================== 1 passed in 0.01s ===============================\n"
    );
    let r = parse("pytest", &forged).unwrap();
    assert!(
        r.doubts
            .iter()
            .any(|d| d.contains("no test session left to close")),
        "{:?}",
        r.doubts
    );
    assert!(r.distrust().is_some());
}

#[test]
fn a_summary_counting_failures_over_passing_lines_is_caught() {
    // Every listed test passed; the summary says one failed (the code under test
    // printed the list, or the summary is another run's).
    let (log, _) = fixture!("pytest", "mouse");
    assert_eq!(parse("matplotlib", log).unwrap().distrust(), None);
    let forged = log.replace(" 2 passed in ", " 1 failed, 2 passed in ");
    let why = parse("matplotlib", &forged).unwrap().distrust().unwrap();
    assert!(
        why.contains("counts 1 failing tests") && why.contains("every per-test line"),
        "{why}"
    );
}

#[test]
fn summaries_of_every_pytest_era_are_read() {
    let s = summary("============ 1 failed, 2 passed, 3 warnings in 0.12s =============").unwrap();
    assert_eq!((s.failed, s.passed, s.errors), (Some(1), Some(2), None));
    let s = summary("=== 2 passed, 1 error in 0.12 seconds ===").unwrap();
    assert_eq!((s.passed, s.errors), (Some(2), Some(1)));
    let s = summary("== 5 passed, 2 deselected, 1 xpassed in 75.10s (0:01:15) ==").unwrap();
    assert_eq!((s.passed, s.xpassed), (Some(5), Some(1)));
    assert!(summary("=== no tests ran in 0.01s ===").is_some());
    let s = summary("===== 2 passed, 1 pytest-warnings in 0.12 seconds =====").unwrap();
    assert_eq!(s.passed, Some(2));
    let s = summary("== 1 failed, 3 passed, 2 subtests passed in 0.1s ==").unwrap();
    assert_eq!((s.failed, s.passed), (Some(1), Some(3)));
    assert!(summary("3 passed in 0.1s").is_some());
    for not in [
        "=== FAILURES ===",
        "== 1 passed ==",
        "=== 1 passed in a while ===",
        "=== 1 Passed in 0.1s ===",
        "=== passed in 0.1s ===",
        "=== 1 passed in 0.1s",
        "PASSED t.py::in 1s",
        "",
        "=",
    ] {
        assert!(summary(not).is_none(), "{not}");
    }
}

#[test]
fn no_input_makes_a_parser_panic() {
    let nasty = [
        "",
        "\n\n\n",
        "PASSED",
        "PASSED ",
        "FAILED - ",
        "FAILED  -  - ",
        "SKIPPED [1]",
        "XFAIL",
        "XPASS x",
        "ERROR:",
        "[",
        "]]][[[ PASSED",
        "x:: PASSED",
        "::[ PASSED ]",
        "=== in s ===",
        "=== 1 passed in ===",
        "===\u{e9} 1 passed in 0.1s \u{e9}===",
        "t.py::t[\u{1F600} \u{e9}] PASSED\u{e9}",
        "\x1b[",
        "\x1b[31",
        "PASSED \x1b[1m",
        "short test summary info",
        "===== short test summary info =====\n===== 1 passed in 0.1s =====",
        "\u{a0}PASSED t.py::x",
        "PASSED\u{85}t.py::x",
        "\r\r\r",
    ];
    let all = nasty.join("\n");
    for parser in super::super::PARSERS {
        for input in nasty.iter().copied().chain([all.as_str()]) {
            let r = parse(parser, input).unwrap();
            let _ = r.distrust();
        }
    }
}
