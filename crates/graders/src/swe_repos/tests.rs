//! Per-repository defaults and directives on SWE-bench-shaped instances.

use super::*;

/// A Django test patch shaped as SWE-bench's are: a changed test module, a new test
/// package's migration, a JSON fixture (not a test), and a deleted module.
const DJANGO_PATCH: &str = "\
diff --git a/tests/auth_tests/test_validators.py b/tests/auth_tests/test_validators.py
--- a/tests/auth_tests/test_validators.py
+++ b/tests/auth_tests/test_validators.py
@@ -237,7 +237,7 @@ def test_unicode_validator(self):
-        invalid_usernames = ['o\\'connell', \"zerowidth\\u200Bspace\"]
+        invalid_usernames = ['o\\'connell', \"zerowidth\\u200Bspace\", 'trailingnewline\\u000A']
diff --git a/tests/migrations/test_migrations_custom/0001_initial.py b/tests/migrations/test_migrations_custom/0001_initial.py
new file mode 100644
index 0000000..e69de29
--- /dev/null
+++ b/tests/migrations/test_migrations_custom/0001_initial.py
@@ -0,0 +1 @@
+from django.db import migrations
diff --git a/tests/fixtures/fixtures/fixture1.json b/tests/fixtures/fixtures/fixture1.json
--- a/tests/fixtures/fixtures/fixture1.json
+++ b/tests/fixtures/fixtures/fixture1.json
@@ -1 +1 @@
-[]
+[{}]
diff --git a/tests/old_app/tests.py b/tests/old_app/tests.py
deleted file mode 100644
--- a/tests/old_app/tests.py
+++ /dev/null
@@ -1 +0,0 @@
-x = 1
";

/// A sympy test patch: one test module.
const SYMPY_PATCH: &str = "\
diff --git a/sympy/core/tests/test_basic.py b/sympy/core/tests/test_basic.py
--- a/sympy/core/tests/test_basic.py
+++ b/sympy/core/tests/test_basic.py
@@ -1,3 +1,7 @@
+def test_as_dummy():
+    assert True
";

/// A pytest-dev/pytest test patch: a test module, a changelog entry (an `.rst`, which
/// SWE-bench does not filter out) and a data file that it does.
const PYTEST_PATCH: &str = "\
diff --git a/testing/test_assertrewrite.py b/testing/test_assertrewrite.py
--- a/testing/test_assertrewrite.py
+++ b/testing/test_assertrewrite.py
@@ -1 +1,2 @@
+def test_x(): pass
diff --git a/changelog/5260.bugfix.rst b/changelog/5260.bugfix.rst
new file mode 100644
--- /dev/null
+++ b/changelog/5260.bugfix.rst
@@ -0,0 +1 @@
+Improve the message.
diff --git a/testing/example_scripts/data.txt b/testing/example_scripts/data.txt
--- a/testing/example_scripts/data.txt
+++ b/testing/example_scripts/data.txt
@@ -1 +1 @@
-a
+b
";

#[test]
fn django_directives_are_dotted_modules() {
    assert_eq!(
        test_directives("django/django", DJANGO_PATCH),
        [
            "auth_tests.test_validators",
            "migrations.test_migrations_custom.0001_initial",
            "old_app.tests",
        ]
    );
    let d = defaults("django/django", Some("3.0"));
    assert_eq!(d.log_parser, "django");
    assert_eq!(
        fill_command(
            &d.test_command,
            &test_directives("django/django", DJANGO_PATCH)
        ),
        "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 \
         'auth_tests.test_validators' 'migrations.test_migrations_custom.0001_initial' 'old_app.tests'"
    );
    assert_eq!(d.python, Some("3.6"));
    assert!(d.eval_setup.iter().any(|c| c.contains("locale-gen")));
    assert_eq!(
        defaults("django/django", Some("1.9")).test_command,
        "./tests/runtests.py --verbosity 2 {tests}"
    );
    assert!(defaults("django/django", Some("5.0")).eval_setup.is_empty());
    assert_eq!(defaults("Django/Django", Some("4.2")).python, Some("3.9"));
}

#[test]
fn sympy_and_pytest_directives_are_paths() {
    assert_eq!(
        test_directives("sympy/sympy", SYMPY_PATCH),
        ["sympy/core/tests/test_basic.py"]
    );
    let d = defaults("sympy/sympy", Some("1.1"));
    assert_eq!(d.log_parser, "sympy");
    assert_eq!(
        fill_command(
            &d.test_command,
            &test_directives("sympy/sympy", SYMPY_PATCH)
        ),
        "PYTHONWARNINGS='ignore::UserWarning,ignore::SyntaxWarning' bin/test -C --verbose \
         'sympy/core/tests/test_basic.py'"
    );
    assert_eq!(
        test_directives("pytest-dev/pytest", PYTEST_PATCH),
        ["testing/test_assertrewrite.py", "changelog/5260.bugfix.rst"]
    );
    let d = defaults("pytest-dev/pytest", Some("5.4"));
    assert_eq!(
        (d.log_parser, d.test_command.as_str()),
        ("pytest", "pytest -rA {tests}")
    );
}

#[test]
fn every_swebench_repository_has_its_parser() {
    for (repo, parser) in [
        ("astropy/astropy", "pytest_v2"),
        ("django/django", "django"),
        ("marshmallow-code/marshmallow", "pytest"),
        ("matplotlib/matplotlib", "matplotlib"),
        ("mwaskom/seaborn", "seaborn"),
        ("pallets/flask", "pytest"),
        ("psf/requests", "pytest_options"),
        ("pvlib/pvlib-python", "pytest"),
        ("pydata/xarray", "pytest"),
        ("pydicom/pydicom", "pytest_options"),
        ("pylint-dev/astroid", "pytest"),
        ("pylint-dev/pylint", "pytest_options"),
        ("pytest-dev/pytest", "pytest"),
        ("pyvista/pyvista", "pytest"),
        ("scikit-learn/scikit-learn", "pytest_v2"),
        ("sphinx-doc/sphinx", "pytest_v2"),
        ("sqlfluff/sqlfluff", "pytest"),
        ("sympy/sympy", "sympy"),
    ] {
        let d = defaults(repo, None);
        assert_eq!(d.log_parser, parser, "{repo}");
        assert!(d.known && d.test_command.ends_with("{tests}"), "{repo}");
        assert!(logs::PARSERS.contains(&d.log_parser));
        assert_eq!(d.python, None);
    }
    assert_eq!(
        defaults("astropy/astropy", Some("1.3")).test_command,
        "pytest -rA -vv -o console_output_style=classic --tb=no {tests}"
    );
    assert_eq!(
        defaults("astropy/astropy", Some("v5.3")).python,
        Some("3.10")
    );
    assert_eq!(
        defaults("astropy/astropy", Some("5.1")).test_command,
        "pytest -rA {tests}"
    );
    assert!(
        defaults("sphinx-doc/sphinx", Some("7.1"))
            .test_command
            .starts_with("tox ")
    );
    let unknown = defaults("someone/something", Some("1.0"));
    assert!(!unknown.known);
    assert_eq!(unknown.log_parser, "pytest");
    assert!(unknown.test_command.contains("-rA"));
    assert_eq!(unknown.python, None);
}

#[test]
fn directives_follow_swebenchs_pattern_exactly() {
    // Anywhere in a line, after the last ` b/`; no header, no directive.
    let patch = "diff --git a/x y b/z.py b/w.py\n+ 'diff --git a/q b/r.py'\ndiff --git a/only\n";
    assert_eq!(test_directives("o/r", patch), ["w.py", "r.py'"]);
    assert!(test_directives("o/r", "").is_empty());
    assert_eq!(test_directives("swe-bench/humaneval", ""), ["test.py"]);
    // Data files are left out by their ending, `csv` with or without a dot.
    let data =
        "diff --git a/a.csv b/a.csv\ndiff --git a/bcsv b/bcsv\ndiff --git a/c.yaml b/c.yaml\n";
    assert!(test_directives("o/r", data).is_empty());
    assert_eq!(fill_command("run", &["a".into()]), "run");
    assert_eq!(fill_command("t {tests}", &["it's".into()]), r"t 'it'\''s'");
}

fn ids(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn instances_a_parser_cannot_read_are_refused() {
    let pytest_ids = ids(&["tests/test_a.py::test_x", "tests/test_a.py::test_p[a"]);
    assert_eq!(parseable("pytest", &pytest_ids, &ids(&["[100%]"])), Ok(()));
    let e = parseable("django", &pytest_ids, &[]).unwrap_err();
    assert!(
        e.contains("tests/test_a.py::test_x") && e.contains("pytest node id"),
        "{e}"
    );
    let django_ids = ids(&["test_x (admin_views.tests.AdminViewTest)"]);
    assert_eq!(
        parseable("django", &django_ids, &ids(&["A docstring."])),
        Ok(())
    );
    let e = parseable("pytest", &django_ids, &[]).unwrap_err();
    assert!(
        e.contains("first space") && e.contains("test_x (admin_views"),
        "{e}"
    );
    let e = parseable("pytest", &ids(&["test_x"]), &ids(&["test_y"])).unwrap_err();
    assert!(
        e.contains("none of the instance's tests") && e.contains("`test_x`"),
        "{e}"
    );
    assert_eq!(parseable("sympy", &ids(&["test_as_dummy"]), &[]), Ok(()));
    let e = parseable(
        "sympy",
        &ids(&["sympy/core/tests/test_basic.py::test_x"]),
        &[],
    );
    assert!(e.unwrap_err().contains("bare function name"));
    let spaced = ids(&["tests/t.py::test_p[a b]"]);
    assert_eq!(parseable("pytest_v2", &spaced, &[]), Ok(()));
    assert!(parseable("pytest_v2", &ids(&["tests/t.py::p[a  b]"]), &[]).is_err());
    assert!(parseable("pytest_options", &ids(&["t.py::x[/a/b.py]"]), &[]).is_err());
    assert!(parseable("matplotlib", &ids(&["t.py::x[MouseButton.LEFT]"]), &[]).is_err());
    assert!(
        parseable("junit", &pytest_ids, &[])
            .unwrap_err()
            .contains("not a log parser")
    );
    assert!(parseable("pytest", &ids(&[""]), &[]).is_err());
    // unittest's dotted ids: the `unittest` parser finds them, SWE-bench's Django
    // parser never reports them; neither reports a subtest or a docstring as a name.
    let dotted = ids(&["tests.test_calc.C.test_add"]);
    assert_eq!(parseable("unittest", &dotted, &[]), Ok(()));
    let e = parseable("django", &dotted, &[]).unwrap_err();
    assert!(e.contains("`tests.test_calc.C.test_add`"), "{e}");
    let e = parseable("unittest", &dotted, &ids(&["test_x (a.C.test_x) (i=1)"])).unwrap_err();
    assert!(e.contains("`test_x (a.C.test_x) (i=1)`"), "{e}");
    let e = parseable("unittest", &ids(&["A docstring."]), &[]).unwrap_err();
    assert!(e.contains("`A docstring.`"), "{e}");
    assert_eq!(parseable("parse_log_astropy", &spaced, &[]), Ok(()));
}
