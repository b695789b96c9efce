//! Per-repository defaults for SWE-bench instances: the log parser, the test command
//! and how the test patch's files become the command's arguments, as SWE-bench's
//! harness has them, so an instance that names only its `repo` (and `version`) is
//! graded the way SWE-bench grades it.
//!
//! From the `swebench` package 4.1.0 (`harness/constants/python.py`'s
//! `MAP_REPO_VERSION_TO_SPECS`, `harness/test_spec/python.py`'s `get_test_directives`)
//! and 5.0.2's `MAP_REPO_TO_PARSER_PY`:
//!
//! | repository | parser | test command |
//! | --- | --- | --- |
//! | `astropy/astropy` | `pytest_v2` | `pytest -rA`; versions 0.1–1.3: `pytest -rA -vv -o console_output_style=classic --tb=no` |
//! | `django/django` | `django` | `./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1`; 1.9: `./tests/runtests.py --verbosity 2` |
//! | `marshmallow-code/marshmallow` | `pytest` | `pytest -rA` |
//! | `matplotlib/matplotlib` | `matplotlib` | `pytest -rA` |
//! | `mwaskom/seaborn` | `seaborn` | `pytest --no-header -rA` |
//! | `pallets/flask` | `pytest` | `pytest -rA` |
//! | `psf/requests` | `pytest_options` | `pytest -rA` |
//! | `pvlib/pvlib-python` | `pytest` | `pytest -rA` |
//! | `pydata/xarray` | `pytest` | `pytest -rA` |
//! | `pydicom/pydicom` | `pytest_options` | `pytest -rA` |
//! | `pylint-dev/astroid` | `pytest` | `pytest -rA` |
//! | `pylint-dev/pylint` | `pytest_options` | `pytest -rA` |
//! | `pytest-dev/pytest` | `pytest` | `pytest -rA` |
//! | `pyvista/pyvista` | `pytest` | `pytest -rA` |
//! | `scikit-learn/scikit-learn` | `pytest_v2` | `pytest -rA` |
//! | `sphinx-doc/sphinx` | `pytest_v2` | `tox --current-env -epy39 -v --` (SWE-bench's image edits `tox.ini` so tox runs `pytest -rA`) |
//! | `sqlfluff/sqlfluff` | `pytest` | `pytest -rA` |
//! | `sympy/sympy` | `sympy` | `PYTHONWARNINGS='ignore::UserWarning,ignore::SyntaxWarning' bin/test -C --verbose` |
//! | any other | `pytest` | `python3 -m pytest -rA -p no:cacheprovider` |
//!
//! The directives (SWE-bench's `get_test_directives`) are the `b/` paths of the test
//! patch's `diff --git` headers (deleted files included), less data files by their
//! extension (`NON_TEST_EXTS`); for Django each becomes a dotted module name without
//! `tests/` and `.py` (`tests/admin_views/tests.py` → `admin_views.tests`), which is how
//! `runtests.py` takes labels.

use super::logs;

/// How SWE-bench runs and reads a repository's tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoDefaults {
    /// The log parser ([`logs::PARSERS`]).
    pub log_parser: &'static str,
    /// The test command, run from the repository's root, with `{tests}` where the test
    /// directives go ([`fill_command`]).
    pub test_command: String,
    /// Commands SWE-bench runs in the same shell before the tests (`eval_commands`:
    /// Django's older versions need a UTF-8 locale).
    pub eval_setup: Vec<&'static str>,
    /// The Python SWE-bench builds this repository's version with, when a version is
    /// given (for an image built from scratch).
    pub python: Option<&'static str>,
    /// Whether SWE-bench specifies this repository (otherwise these are the defaults
    /// for any pytest project).
    pub known: bool,
}

/// SWE-bench's plain pytest command.
const PYTEST: &str = "pytest -rA {tests}";

/// The defaults for `repo` (`owner/name`, any case) at `version` (SWE-bench's
/// `version` field, such as `3.0` or `v5.3`); an unknown repository gets pytest with
/// `-rA`.
pub fn defaults(repo: &str, version: Option<&str>) -> RepoDefaults {
    let repo = repo.to_ascii_lowercase();
    let v = version.and_then(parse_version);
    let Some((log_parser, test_command)) = parser_and_command(&repo, v) else {
        return RepoDefaults {
            log_parser: "pytest",
            test_command: "python3 -m pytest -rA -p no:cacheprovider {tests}".to_string(),
            eval_setup: Vec::new(),
            python: None,
            known: false,
        };
    };
    RepoDefaults {
        log_parser,
        test_command: test_command.to_string(),
        eval_setup: if repo == "django/django" {
            django_setup(v)
        } else {
            Vec::new()
        },
        python: v.and_then(|v| python(&repo, v)),
        known: true,
    }
}

/// SWE-bench's parser and test command for a repository it specifies.
fn parser_and_command(repo: &str, v: Option<(u32, u32)>) -> Option<(&'static str, &'static str)> {
    Some(match repo {
        "astropy/astropy" if v.is_some_and(|v| v < (3, 0)) => (
            "pytest_v2",
            "pytest -rA -vv -o console_output_style=classic --tb=no {tests}",
        ),
        "astropy/astropy" | "scikit-learn/scikit-learn" => ("pytest_v2", PYTEST),
        "django/django" if v == Some((1, 9)) => {
            ("django", "./tests/runtests.py --verbosity 2 {tests}")
        }
        "django/django" => (
            "django",
            "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 {tests}",
        ),
        "matplotlib/matplotlib" => ("matplotlib", PYTEST),
        "mwaskom/seaborn" => ("seaborn", "pytest --no-header -rA {tests}"),
        "psf/requests" | "pylint-dev/pylint" | "pydicom/pydicom" => ("pytest_options", PYTEST),
        "marshmallow-code/marshmallow"
        | "pallets/flask"
        | "pvlib/pvlib-python"
        | "pydata/xarray"
        | "pylint-dev/astroid"
        | "pytest-dev/pytest"
        | "pyvista/pyvista"
        | "sqlfluff/sqlfluff" => ("pytest", PYTEST),
        "sphinx-doc/sphinx" => ("pytest_v2", "tox --current-env -epy39 -v -- {tests}"),
        "sympy/sympy" => (
            "sympy",
            "PYTHONWARNINGS='ignore::UserWarning,ignore::SyntaxWarning' bin/test -C --verbose {tests}",
        ),
        _ => return None,
    })
}

/// The Python SWE-bench builds a repository's version `v` with.
fn python(repo: &str, v: (u32, u32)) -> Option<&'static str> {
    // Each repository's versions from the newest down: the first bound `v` reaches.
    let table: &[((u32, u32), &'static str)] = match repo {
        "astropy/astropy" => &[((5, 3), "3.10"), ((3, 0), "3.9"), ((0, 0), "3.6")],
        "django/django" => &[
            ((5, 0), "3.11"),
            ((4, 1), "3.9"),
            ((4, 0), "3.8"),
            ((3, 0), "3.6"),
            ((0, 0), "3.5"),
        ],
        "matplotlib/matplotlib" => &[
            ((3, 5), "3.11"),
            ((3, 1), "3.8"),
            ((3, 0), "3.7"),
            ((0, 0), "3.5"),
        ],
        "pallets/flask" => &[((2, 2), "3.11"), ((2, 1), "3.10"), ((0, 0), "3.9")],
        "pydicom/pydicom" => &[
            ((2, 4), "3.11"),
            ((2, 3), "3.10"),
            ((2, 1), "3.9"),
            ((1, 4), "3.8"),
            ((0, 0), "3.6"),
        ],
        "pydata/xarray" => &[((0, 0), "3.10")],
        "scikit-learn/scikit-learn" => &[((1, 0), "3.9"), ((0, 0), "3.6")],
        "sphinx-doc/sphinx" => &[((8, 0), "3.10"), ((0, 0), "3.9")],
        "marshmallow-code/marshmallow"
        | "mwaskom/seaborn"
        | "psf/requests"
        | "pvlib/pvlib-python"
        | "pylint-dev/astroid"
        | "pylint-dev/pylint"
        | "pytest-dev/pytest"
        | "pyvista/pyvista"
        | "sqlfluff/sqlfluff"
        | "sympy/sympy" => &[((0, 0), "3.9")],
        _ => &[],
    };
    table.iter().find(|(from, _)| v >= *from).map(|(_, p)| *p)
}

/// SWE-bench's `eval_commands` for a Django version: a UTF-8 locale for 1.7 to 3.2.
fn django_setup(v: Option<(u32, u32)>) -> Vec<&'static str> {
    match v {
        Some(x) if ((1, 7)..(3, 0)).contains(&x) => vec![
            "export LANG=en_US.UTF-8",
            "export LC_ALL=en_US.UTF-8",
            "export PYTHONIOENCODING=utf8",
            "export LANGUAGE=en_US:en",
        ],
        Some(x) if ((3, 0)..(4, 0)).contains(&x) => vec![
            "sed -i '/en_US.UTF-8/s/^# //g' /etc/locale.gen && locale-gen",
            "export LANG=en_US.UTF-8",
            "export LANGUAGE=en_US:en",
            "export LC_ALL=en_US.UTF-8",
        ],
        _ => Vec::new(),
    }
}

/// `3.0`, `v5.3`, `2022.03` → (major, minor); `None` for anything else.
fn parse_version(v: &str) -> Option<(u32, u32)> {
    let v = v.trim().trim_start_matches('v');
    let mut parts = v.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next().map_or(Some(0), |m| m.parse().ok())?;
    Some((major, minor))
}

/// File endings SWE-bench never passes to a test command (`NON_TEST_EXTS`; `csv` has no
/// dot there).
const NON_TEST_EXTS: [&str; 11] = [
    ".json", ".png", "csv", ".txt", ".md", ".jpg", ".jpeg", ".pkl", ".yml", ".yaml", ".toml",
];

/// SWE-bench's `get_test_directives`: what the test command is given for the files the
/// test patch touches, in the patch's order (see the module's doc).
pub fn test_directives(repo: &str, test_patch: &str) -> Vec<String> {
    let repo = repo.to_ascii_lowercase();
    if repo == "swe-bench/humaneval" {
        return vec!["test.py".to_string()];
    }
    const HEADER: &str = "diff --git a/";
    let mut out = Vec::new();
    for line in test_patch.split('\n') {
        // `diff --git a/.* b/(.*)`: anywhere in the line, the rest after its last ` b/`.
        let Some(at) = line.find(HEADER) else {
            continue;
        };
        let rest = &line[at + HEADER.len()..];
        let Some(b) = rest.rfind(" b/") else {
            continue;
        };
        let path = &rest[b + 3..];
        if NON_TEST_EXTS.iter().any(|e| path.ends_with(e)) {
            continue;
        }
        let directive = if repo == "django/django" {
            let p = path.strip_suffix(".py").unwrap_or(path);
            let p = p.strip_prefix("tests/").unwrap_or(p);
            p.replace('/', ".")
        } else {
            path.to_string()
        };
        out.push(directive);
    }
    out
}

/// `template` with `{tests}` replaced by the directives, each quoted for a POSIX shell
/// (SWE-bench joins them unquoted; quoting changes nothing for ordinary paths and keeps
/// an odd one a single argument).
pub fn fill_command(template: &str, directives: &[String]) -> String {
    let quoted: Vec<String> = directives
        .iter()
        .map(|d| format!("'{}'", d.replace('\'', r"'\''")))
        .collect();
    template.replace("{tests}", &quoted.join(" "))
}

/// Whether the parser named `parser` can ever report every one of an instance's
/// expected tests as passing; `Err` with the reason, naming an example id, when it
/// cannot (a `pytest` instance none of whose ids is a `path::name` node id, a `django`
/// instance with pytest ids or unittest's dotted ids, a `unittest` id that is neither
/// a name as unittest prints it nor a dotted id, such as a docstring or a subtest's
/// name, a `sympy` id that is not a bare `test_…` name, a `pytest` id with a space in
/// it). Meant for submit time: such an instance would score 0 whatever the agent did.
pub fn parseable(
    parser: &str,
    fail_to_pass: &[String],
    pass_to_pass: &[String],
) -> Result<(), String> {
    let Some(name) = logs::canonical(parser) else {
        return Err(format!(
            "`{parser}` is not a log parser: use one of {:?}",
            logs::PARSERS
        ));
    };
    for id in fail_to_pass.iter().chain(pass_to_pass) {
        if let Some(why) = logs::unreportable(name, id) {
            return Err(why);
        }
    }
    let pytest_family = logs::PYTEST_FAMILY.contains(&name);
    let mut all = fail_to_pass.iter().chain(pass_to_pass);
    if pytest_family
        && let Some(first) = fail_to_pass.first()
        && !all.any(|id| id.contains("::"))
    {
        return Err(format!(
            "none of the instance's tests is a pytest node id (`path::name`), e.g. `{first}`, \
             but the `{name}` parser reads pytest's output: name the parser of the runner these \
             ids come from (`django`, `sympy`, `unittest`)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
