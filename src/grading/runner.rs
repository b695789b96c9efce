//! How the code and SWE graders run a test runner so that the code under test cannot
//! configure it: the files the runner reads before any test are protected, its plugins
//! are the environment's and nothing else, bytecode is not trusted, and its log comes
//! back through the sandbox server's pipe.
//!
//! - **Configuration.** pytest reads `pytest.ini`, `.pytest.ini`, `pytest.toml`,
//!   `.pytest.toml`, `pyproject.toml`, `tox.ini` and `setup.cfg` in the directory of
//!   the tests or any above it, and runs every `conftest.py` on the way; Python runs
//!   `sitecustomize.py`/`usercustomize.py` found on its path at start, and a test
//!   directory's `__init__.py` when the tests are imported as a package. Each of those
//!   is code or configuration that runs before the first test, so [`default_protect`]
//!   puts them all back as the task's setup left them (removing ones the agent added).
//!   The repository's own configuration is kept, as SWE-bench runs with it (its
//!   `addopts`, markers and plugins' options), rather than replaced by the grader's.
//! - **Plugins.** pytest loads every `pytest11` entry point of every distribution on
//!   its path, and the workspace is on that path: a `*.dist-info` directory the agent
//!   made there is a plugin. Autoloading is turned off and the environment's plugins
//!   are named with `-p`, as listed by [`PLUGIN_PROBE`] in the evaluation sandbox after
//!   setup, before any of the agent's changes are there.
//! - **Bytecode.** The sandbox server's `apply` removes all bytecode; the run is told
//!   not to write any (`PYTHONDONTWRITEBYTECODE`), and pytest's cache plugin is off.
//! - **The log.** The command runs through `exec` (a session without a terminal, its
//!   output on a pipe held by the server), never into a file the tests could append to,
//!   and its Python is sealed ([`super::seal`]): a run ended before the runner's own end
//!   is told from one that finished.
//!
//! What this cannot close: the code under test runs inside the runner's process, so a
//! module the tests import can patch the runner itself. The log's own consistency
//! (the runner's summary present and agreeing with the per-test lines, every expected
//! id reported once, the seal) catches the crude forms of that; the README's threat
//! model says what remains.

use std::collections::BTreeSet;

use super::seal::Seal;
use crate::sandbox::protocol::ExecResult;

/// File names a Python test run reads or runs before the first test, wherever they are
/// in the workspace.
const RUNNER_FILES: &[&str] = &[
    "conftest.py",
    "pytest.ini",
    ".pytest.ini",
    "pytest.toml",
    ".pytest.toml",
    "pyproject.toml",
    "setup.cfg",
    "tox.ini",
    "sitecustomize.py",
    "usercustomize.py",
];

/// The protect globs a code or SWE grader uses when its task lists none: every
/// [`RUNNER_FILES`] name at any depth, distribution metadata made in the workspace,
/// and the `__init__.py` of each test directory holding a test file: the file's own
/// directory and those above it up to the topmost one named like a test directory
/// (`tests`, `test`, `testing`, `unit_tests`, …), which run when the tests are
/// imported as a package. A package's own `__init__.py` above its `tests` is code
/// under test (a fix may change it) and is not protected.
pub fn default_protect<'a>(test_files: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let mut globs: Vec<String> = RUNNER_FILES
        .iter()
        .flat_map(|f| [f.to_string(), format!("**/{f}")])
        .collect();
    globs.extend(
        ["**/*.dist-info/**", "**/*.egg-info/**", "**/*.egg-link"]
            .iter()
            .map(|s| s.to_string()),
    );
    let mut inits = BTreeSet::new();
    for file in test_files {
        let dirs: Vec<&std::path::Path> = std::path::Path::new(file)
            .ancestors()
            .skip(1)
            .filter(|d| !d.as_os_str().is_empty())
            .collect();
        let Some(top) = dirs.iter().rposition(|d| is_test_dir(d)) else {
            continue;
        };
        for d in &dirs[..=top] {
            inits.insert(format!(
                "{}/__init__.py",
                globset::escape(&d.to_string_lossy())
            ));
        }
    }
    globs.extend(inits);
    globs
}

/// Whether a directory's name says it holds tests.
fn is_test_dir(dir: &std::path::Path) -> bool {
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    name.starts_with("test") || name.ends_with("tests") || name.ends_with("_test")
}

/// The marker before each plugin module [`PLUGIN_PROBE`] prints.
const PLUGIN_LINE: &str = "rollout-pytest-plugin ";

/// A command listing the modules of the environment's pytest plugins (`pytest11`
/// entry points), one per line after [`PLUGIN_LINE`]. Run after setup and before the
/// agent's changes, it sees the environment the task built; it prints nothing where
/// there is no Python or no plugin.
pub const PLUGIN_PROBE: &str = r#"for py in python3 python; do command -v "$py" >/dev/null 2>&1 || continue; "$py" - <<'EOF' 2>/dev/null; break; done; true
mods = set()
try:
    from importlib.metadata import entry_points
    eps = entry_points()
    eps = eps.select(group="pytest11") if hasattr(eps, "select") else eps.get("pytest11", [])
    mods = {ep.value.split(":")[0].strip() for ep in eps}
except Exception:
    try:
        import pkg_resources
        mods = {ep.module_name for ep in pkg_resources.iter_entry_points("pytest11")}
    except Exception:
        pass
for m in sorted(mods):
    print("rollout-pytest-plugin " + m)
EOF
"#;

/// The plugin modules a [`PLUGIN_PROBE`] run found (only well-formed module names).
pub fn plugins(probe: Option<&ExecResult>) -> Vec<String> {
    let Some(probe) = probe else {
        return Vec::new();
    };
    let module = |m: &str| {
        !m.is_empty()
            && m.split('.').all(|part| {
                !part.is_empty() && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            })
    };
    let mut out: Vec<String> = probe
        .output
        .lines()
        .filter_map(|l| l.strip_prefix(PLUGIN_LINE))
        .map(str::trim)
        .filter(|m| module(m))
        .map(str::to_string)
        .collect();
    out.sort();
    out.dedup();
    out
}

/// `command` with the run's environment set first: plugin autoloading off, the
/// environment's `plugins` and no cache plugin in `PYTEST_ADDOPTS` (added to any the
/// sandbox sets), no bytecode written, the import guard's line (`guard`, from
/// [`super::guard::Guard::prefix`]: safe-path mode and the bootstrap's directory), and
/// the run's Pythons loading the `seal`'s bootstrap when there is one
/// ([`super::seal`]).
pub fn hardened(command: &str, plugins: &[String], guard: &str, seal: Option<&Seal>) -> String {
    let mut addopts = String::from("-p no:cacheprovider");
    for p in plugins {
        addopts.push_str(" -p ");
        addopts.push_str(p);
    }
    let seal = seal.map(|s| format!("{}\n", s.env())).unwrap_or_default();
    format!(
        "export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 PYTHONDONTWRITEBYTECODE=1 PYTEST_ADDOPTS=\"${{PYTEST_ADDOPTS:+$PYTEST_ADDOPTS }}{addopts}\"\n{guard}{seal}{command}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_cover_runner_files_anywhere_and_test_packages() {
        let globs = default_protect([
            "tests/unit/test_a.py",
            "test_top.py",
            "pkg/sub/tests/test_b.py",
            "pkg/test_c.py",
        ]);
        for g in [
            "conftest.py",
            "**/conftest.py",
            "**/pytest.ini",
            "**/tox.ini",
            "**/setup.cfg",
            "**/pyproject.toml",
            "**/pytest.toml",
            "**/*.dist-info/**",
            "tests/unit/__init__.py",
            "tests/__init__.py",
            "pkg/sub/tests/__init__.py",
        ] {
            assert!(globs.iter().any(|x| x == g), "{g} missing from {globs:?}");
        }
        // The package's own code above its tests, and the root, are not the tests'.
        for g in [
            "tests/unit/test_a.py",
            "pkg/sub/__init__.py",
            "pkg/__init__.py",
            "__init__.py",
        ] {
            assert!(!globs.iter().any(|x| x == g), "{g} in {globs:?}");
        }
    }

    #[test]
    fn the_probe_gives_module_names_only() {
        let probe = ExecResult {
            output: "noise\nrollout-pytest-plugin xdist.plugin\nrollout-pytest-plugin pytest_cov.plugin\nrollout-pytest-plugin bad name; rm -rf /\nrollout-pytest-plugin xdist.plugin\n".into(),
            exit_code: Some(0),
            signal: None,
            omitted_bytes: 0,
            timed_out: false,
            elapsed_us: 0,
        };
        assert_eq!(plugins(Some(&probe)), ["pytest_cov.plugin", "xdist.plugin"]);
        assert!(plugins(None).is_empty());
        let cmd = hardened("pytest -rA t.py", &plugins(Some(&probe)), "", None);
        assert!(cmd.contains("PYTEST_DISABLE_PLUGIN_AUTOLOAD=1"), "{cmd}");
        assert!(
            cmd.contains("-p no:cacheprovider -p pytest_cov.plugin -p xdist.plugin\""),
            "{cmd}"
        );
        assert!(cmd.ends_with("\npytest -rA t.py"));
    }
}
