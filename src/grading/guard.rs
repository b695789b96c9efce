//! The import guard: the grader decides, before anything of the agent's runs, which
//! Python code a graded run may load from the workspace.
//!
//! A test run imports by name, and a name resolves to the first match on Python's
//! path: a `pytest.py`, `pluggy/` or `argparse.py` the agent put at the repository's
//! root *is* the test runner under `python3 -m pytest` (which puts the working
//! directory first), a `tests/numkit/__init__.py` is the package under test for tests
//! whose directory pytest puts first, a `checker/__init__.py` or
//! `checker.cpython-311-x86_64-linux-gnu.so` wins over the grader's own `checker.py`
//! in the same directory, and a `tests/test_x/` package over the restored
//! `tests/test_x.py`. Naming these one by one has failed each time a new one was
//! found, so the guard works from what the grader knows instead:
//!
//! - **What the workspace held** ([`Guard::probe`], run in EVAL's fresh sandbox after
//!   the task's setup and before the agent's changes are applied): every module entry
//!   (source file, extension module, package) in the workspace, and every top-level
//!   name that resolves outside it (the standard library, each installed
//!   distribution, an editable install's names excepted, which are the repository's).
//!   The files the grader writes itself (hidden tests, the test patch's files, a
//!   program taken from the answer) count as the workspace's own.
//! - **What the agent added that would shadow something** ([`Guard::sweep`], after
//!   the changes are applied and before the tests run, in an isolated Python that has
//!   nothing of the workspace on its path): an agent-added module entry goes when it
//!   is an extension module (compiled code the grader cannot read), when an expected
//!   module of the same name sits in the same directory (a package beside a restored
//!   or hidden module), or when it sits in a directory that can be on the path (the
//!   root, or any directory that is not a regular package) under a name the standard
//!   library, an installed package or another directory of the workspace already
//!   gives. It is removed, as an agent-added `conftest.py` is (a package loses its
//!   `__init__`, so the directory is a namespace portion, which never shadows a
//!   module, and nothing else of it goes), and listed in `details.guard.removed`: the
//!   run then grades the agent's real fix, so a forgery earns nothing and a right fix
//!   that left a scratch `test.py` at the root keeps its 1. One that cannot be removed
//!   is refused, a 0 with the reason.
//! - **What the run imports** (the bootstrap's finder, `seal_sitecustomize.py`): the
//!   run's Pythons are in safe-path mode (`PYTHONSAFEPATH`, Python 3.11+), so the
//!   working directory or script directory is not put first on the path; the
//!   bootstrap puts it after the standard library instead, so the repository's own
//!   modules import as before and none of them can shadow the standard library (nor
//!   an installed package, unless it was there before the agent: the sweep refuses
//!   the agent's). A finder
//!   first on `sys.meta_path` applies the same rules to every module the run imports
//!   from the workspace (so a file written during the run, or a directory a runner
//!   puts first, is held to them too): the import fails and the refusal is recorded,
//!   which scores 0 with the module named. Every module the run did load from the
//!   workspace is recorded too (`details.guard.imported`). On a Python older than 3.11 the finder is what stands in for safe
//!   path: a shadow of the runner is refused when `-m` resolves it.
//!
//! What the guard does not claim: the code under test itself (a module the tests are
//! meant to import) runs inside the runner's process and can patch it; that is the
//! seal's and the log checks' part, and the README's threat model says what remains.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::sandbox::client::SandboxClient;
use crate::sandbox::protocol::{ExecArgs, ExecResult, FileArgs};
use crate::stage::StageError;
use crate::stage::sandboxed;

/// The probe and sweep, as one Python script (`probe DIR` / `sweep DIR FILES`).
pub const SCRIPT: &str = include_str!("guard.py");
/// Its file name in the guard's directory, which is first on the run's `PYTHONPATH`:
/// not a module name, so the script can never be imported in place of a repository's
/// own module (a `guard.py` there would lose to it).
const SCRIPT_FILE: &str = "rollout-guard.py";
/// The line the probe prints with the sandbox's Python version and the workspace.
const PYTHON_LINE: &str = "rollout-guard-python ";
/// A refusal's line: the path and why, tab-separated (the sweep's and the finder's).
const REFUSED_LINE: &str = "rollout-guard-refused\t";
/// The prefix of a workspace module the run imported, as `after_run` lists them.
const IMPORTED_LINE: &str = "rollout-guard-imported ";
/// The sweep's line for a module entry it removed: the path and why.
const REMOVED_LINE: &str = "rollout-guard-removed\t";

/// One EVAL's guard: the directory its files live in (outside the workspace) and the
/// paths the grader writes into the workspace itself.
#[derive(Debug, Clone)]
pub struct Guard {
    dir: String,
    grader_files: Vec<String>,
}

/// A module entry removed or refused: where, and why.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub struct Refusal {
    /// The workspace path of the module (a package's `__init__.py`).
    pub path: String,
    /// What it would shadow.
    pub why: String,
}

/// What the guard saw of a run, for the grader's `details`.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Report {
    /// The sandbox's Python (`3.11`), when it has one.
    pub python: Option<String>,
    /// Whether the run's Pythons were in safe-path mode (Python 3.11+).
    pub safe_path: bool,
    /// Module entries the agent added that the sweep removed before the run.
    pub removed: Vec<Refusal>,
    /// Module entries refused: one the sweep could not remove, or an import of the
    /// run's that the finder stopped. Any makes the grade 0.
    pub refused: Vec<Refusal>,
    /// The workspace's module files the run's Pythons imported (the first
    /// [`IMPORTED_SHOWN`], in order of path), for the record.
    pub imported: Vec<String>,
    /// How many there were.
    pub imported_count: usize,
}

/// How many of the imported workspace modules a report lists.
pub const IMPORTED_SHOWN: usize = 200;

impl Report {
    /// The reason for a 0 when something was refused.
    pub fn failure(&self) -> Option<String> {
        let first = self.refused.first()?;
        let more = match self.refused.len() {
            1 => String::new(),
            n => format!(" (and {} more)", n - 1),
        };
        Some(format!(
            "the agent's changes add a module the graded run may not load: {} {}{more}",
            first.path, first.why
        ))
    }
}

impl Guard {
    /// A guard with a fresh directory under `/tmp`; `grader_files` are the workspace
    /// paths the grader writes (they are expected there, whoever's name they shadow).
    pub fn new(grader_files: impl IntoIterator<Item = String>) -> Self {
        Self {
            dir: format!("/tmp/.rollout-grade-{}", uuid::Uuid::new_v4().simple()),
            grader_files: grader_files.into_iter().collect(),
        }
    }

    /// The directory of the guard's files (and of the seal's: the bootstrap lives
    /// here and this directory goes first on `PYTHONPATH`).
    pub fn dir(&self) -> &str {
        &self.dir
    }

    /// The command that records the workspace's modules and the names that resolve
    /// outside it, for the sandbox's first Python 3 (`python3`, else a `python` that is
    /// 3). It always says what it found, on a line of its own: the version, `none` (no
    /// Python 3: nothing to guard), or `failed` with the probe's last words.
    pub fn probe(&self) -> String {
        format!(
            "mkdir -p {dir} && cat > {dir}/{SCRIPT_FILE} <<'ROLLOUT_GUARD_EOF'\n{SCRIPT}\nROLLOUT_GUARD_EOF\n\
             found=none\n\
             for py in python3 python; do\n\
             \x20 command -v \"$py\" >/dev/null 2>&1 || continue\n\
             \x20 \"$py\" -c 'import sys; sys.exit(sys.version_info[0] < 3)' >/dev/null 2>&1 || continue\n\
             \x20 found=$py; break\n\
             done\n\
             if [ \"$found\" = none ]; then echo '{PYTHON_LINE}none'\n\
             elif ! \"$found\" {dir}/{SCRIPT_FILE} probe {dir} 2>{dir}/probe.err; then\n\
             \x20 echo \"{PYTHON_LINE}failed $(tail -c 600 {dir}/probe.err | tr '\\n' ' ')\"\n\
             fi; true",
            dir = self.dir
        )
    }

    /// What the probe found (see [`Guard::probe`]): the sandbox's Python version
    /// (`3.11`), `None` when it has no Python 3 (nothing to guard), or why the probe
    /// failed. A failed or missing probe is never read as "no Python": the graded run
    /// would go unguarded.
    pub fn python(probe: Option<&ExecResult>) -> Result<Option<String>, String> {
        let Some(probe) = probe else {
            return Err("the probe could not run in the evaluation sandbox".into());
        };
        let line = probe
            .output
            .lines()
            .find_map(|l| l.strip_prefix(PYTHON_LINE))
            .ok_or_else(|| {
                format!(
                    "the probe said nothing (exit status {:?}, timed out: {})",
                    probe.exit_code, probe.timed_out
                )
            })?;
        match line.split_once(' ').map_or((line, ""), |(a, b)| (a, b)) {
            ("none", _) => Ok(None),
            ("failed", why) => Err(format!("the probe failed: {}", why.trim())),
            (version, _) => Ok(Some(version.to_string())),
        }
    }

    /// Whether a Python version (`3.11`) has safe-path mode.
    fn has_safe_path(version: &str) -> bool {
        let mut it = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
        let (major, minor) = (it.next().unwrap_or(0), it.next().unwrap_or(0));
        (major, minor) >= (3, 11)
    }

    /// Runs the sweep (after the changes are applied): the report, its refusals those
    /// of the agent's module entries that would shadow something. `python` is what
    /// [`Guard::python`] found; without a Python the report is empty and nothing ran.
    /// A probe or sweep that cannot run is the machine's fault (the stage is tried
    /// again); a sweep that fails on what the workspace holds is a refusal of its own.
    pub async fn sweep(
        &self,
        client: &SandboxClient,
        python: Result<Option<String>, String>,
    ) -> Result<Report, StageError> {
        let version = match python {
            Ok(Some(version)) => version,
            Ok(None) => return Ok(Report::default()),
            // The probe ran before any of the agent's changes were there: its failure is
            // the machine's or the task's, never a reason to grade unguarded.
            Err(why) => {
                return Err(StageError::Transient(format!(
                    "the import guard cannot tell what the workspace held: {why}"
                )));
            }
        };
        let files = serde_json::to_string(&self.grader_files).unwrap_or_else(|_| "[]".into());
        let command = format!(
            "for py in python3 python; do command -v \"$py\" >/dev/null 2>&1 || continue; \"$py\" -I -S {dir}/{SCRIPT_FILE} sweep {dir} {files}; exit $?; done",
            dir = self.dir,
            files = shell_quote(&files),
        );
        let r = client
            .exec(&grader_exec(command), Some(Duration::from_secs(300)))
            .await
            .map_err(|e| sandboxed::stage_error("the import guard's sweep could not run", e))?;
        let mut refused = refusals(&r.output);
        let removed = lines_of(&r.output, REMOVED_LINE);
        if r.exit_code != Some(0) || r.timed_out {
            let tail = r
                .output
                .floor_char_boundary(r.output.len().saturating_sub(1024));
            refused.push(Refusal {
                path: String::new(),
                why: format!(
                    "the grader could not sweep the workspace for shadowing modules ({}): {}",
                    if r.timed_out {
                        "timed out".to_string()
                    } else {
                        format!("exit status {:?}", r.exit_code)
                    },
                    r.output[tail..].trim()
                ),
            });
        }
        Ok(Report {
            safe_path: Self::has_safe_path(&version),
            python: Some(version),
            removed,
            refused,
            ..Report::default()
        })
    }

    /// The env line to put before a graded command when the sandbox has a Python (see
    /// [`Guard::env`]), else nothing.
    pub fn prefix(&self, report: &Report) -> String {
        match report.python {
            Some(_) => format!("{}\n", self.env()),
            None => String::new(),
        }
    }

    /// Writes the bootstrap into the guard's directory (the seal writes it too when it
    /// is installed; either way the run loads it from here). Failing to write under
    /// `/tmp` of a fresh sandbox is the machine's fault: the stage is tried again.
    pub async fn install_bootstrap(&self, client: &SandboxClient) -> Result<(), StageError> {
        let args = FileArgs::Create {
            path: format!("{}/sitecustomize.py", self.dir),
            file_text: super::seal::BOOTSTRAP.to_string(),
        };
        match client.file(&args).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(StageError::Transient(format!(
                "cannot write the import guard's bootstrap: {}",
                e.message
            ))),
            Err(e) => Err(sandboxed::stage_error(
                "cannot write the import guard's bootstrap",
                e,
            )),
        }
    }

    /// The shell line that puts the run's Pythons under the guard: safe-path mode, the
    /// bootstrap's directory first on `PYTHONPATH`, and where its sets are.
    pub fn env(&self) -> String {
        format!(
            "export PYTHONSAFEPATH=1 ROLLOUT_GUARD={dir} PYTHONPATH={dir}${{PYTHONPATH:+:$PYTHONPATH}}",
            dir = self.dir
        )
    }

    /// Adds what the run's finder recorded to `report`: its refusals (its lines in
    /// `output`, and its file in the guard's directory) and the workspace modules the
    /// run imported.
    pub async fn after_run(&self, client: &SandboxClient, output: &str, report: &mut Report) {
        let mut found: BTreeSet<Refusal> = report.refused.drain(..).collect();
        found.extend(refusals(output));
        let files = run(
            client,
            format!(
                "cat {dir}/refused 2>/dev/null; sort -u {dir}/imported 2>/dev/null | sed 's/^/{IMPORTED_LINE}/'; true",
                dir = self.dir
            ),
        )
        .await;
        if let Some(r) = files {
            found.extend(refusals(&r.output));
            let imported: Vec<&str> = r
                .output
                .lines()
                .filter_map(|l| l.strip_prefix(IMPORTED_LINE))
                .collect();
            report.imported_count = imported.len();
            report.imported = imported
                .into_iter()
                .take(IMPORTED_SHOWN)
                .map(str::to_string)
                .collect();
        }
        report.refused = found.into_iter().collect();
    }
}

/// The refusals among `output`'s lines.
pub fn refusals(output: &str) -> Vec<Refusal> {
    lines_of(output, REFUSED_LINE)
}

/// The entries of `output`'s lines that start with `prefix` (a path and why).
fn lines_of(output: &str, prefix: &str) -> Vec<Refusal> {
    let mut out: Vec<Refusal> = output
        .lines()
        .filter_map(|l| l.strip_prefix(prefix))
        .filter_map(|rest| {
            let (path, why) = rest.split_once('\t')?;
            Some(Refusal {
                path: path.to_string(),
                why: why.trim_end().to_string(),
            })
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The exec arguments of a guard command (from the shell's state, as the graded
/// command runs: the same working directory).
fn grader_exec(command: String) -> ExecArgs {
    ExecArgs {
        env: Default::default(),
        command,
        max_output_bytes: Some(1024 * 1024),
        shell_state: true,
        printable: true,
    }
}

/// `s` in single quotes for the shell.
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// Runs a guard command; its result, or `None` with a warning when it could not run.
async fn run(client: &SandboxClient, command: String) -> Option<ExecResult> {
    match client
        .exec(&grader_exec(command), Some(Duration::from_secs(120)))
        .await
    {
        Ok(r) => Some(r),
        Err(e) => {
            tracing::warn!(error = %e, "the import guard's command could not run");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;
    use std::process::Command;

    /// The sandboxes' Python (they see the host's `/usr`); `None`, failing under CI,
    /// where it is missing.
    fn python() -> Option<&'static str> {
        const PYTHON: &str = "/usr/bin/python3";
        if Path::new(PYTHON).exists() {
            return Some(PYTHON);
        }
        crate::prerequisite::missing(
            "the import guard's tests",
            "/usr/bin/python3 is missing (scripts/setup.sh installs it)",
        );
        None
    }

    /// Runs `script` with bash in `cwd` with `path` as `PATH`.
    fn sh(script: &str, cwd: &Path, path: &str) -> ExecResult {
        let out = Command::new("/bin/bash")
            .arg("-c")
            .arg(script)
            .current_dir(cwd)
            .env_clear()
            .env("PATH", path)
            .output()
            .unwrap();
        ExecResult {
            output: String::from_utf8_lossy(&out.stdout).into_owned(),
            exit_code: out.status.code(),
            signal: None,
            omitted_bytes: 0,
            timed_out: false,
            elapsed_us: 0,
        }
    }

    fn guard_in(dir: &Path, files: &[&str]) -> Guard {
        Guard {
            dir: dir.to_string_lossy().into_owned(),
            grader_files: files.iter().map(|f| f.to_string()).collect(),
        }
    }

    /// A directory of links to the programs the probe's shell needs, and `extra`.
    fn bin_dir(extra: &[(&str, &str)]) -> tempfile::TempDir {
        let bin = tempfile::tempdir().unwrap();
        for tool in ["mkdir", "cat", "tail", "tr"] {
            std::os::unix::fs::symlink(format!("/usr/bin/{tool}"), bin.path().join(tool))
                .or_else(|_| {
                    std::os::unix::fs::symlink(format!("/bin/{tool}"), bin.path().join(tool))
                })
                .unwrap();
        }
        for (name, text) in extra {
            let p = bin.path().join(name);
            std::fs::write(&p, text).unwrap();
            std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755))
                .unwrap();
        }
        bin
    }

    #[test]
    fn the_probe_says_what_it_found_and_a_failure_is_never_no_python() {
        let Some(_) = python() else {
            return;
        };
        let ws = tempfile::tempdir().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let g = guard_in(&dir.path().join("g"), &[]);
        let found = sh(&g.probe(), ws.path(), "/usr/bin:/bin");
        let version = Guard::python(Some(&found)).unwrap();
        assert!(
            version.as_deref().is_some_and(|v| v.starts_with("3.")),
            "{}",
            found.output
        );
        // No Python 3 at all: nothing to guard.
        let empty = bin_dir(&[]);
        let none = sh(&g.probe(), ws.path(), &empty.path().to_string_lossy());
        assert_eq!(Guard::python(Some(&none)), Ok(None), "{}", none.output);
        // A Python whose probe fails: the reason, never "none".
        let broken = bin_dir(&[(
            "python3",
            "#!/bin/sh\ncase \"$1\" in -c) exit 0;; esac\necho 'cannot walk' >&2\nexit 1\n",
        )]);
        let failed = sh(&g.probe(), ws.path(), &broken.path().to_string_lossy());
        let why = Guard::python(Some(&failed)).unwrap_err();
        assert!(why.contains("cannot walk"), "{why}");
        assert!(Guard::python(None).is_err());
    }

    #[test]
    fn the_bootstrap_refuses_a_shadow_the_sweep_never_saw() {
        let Some(py) = python() else {
            return;
        };
        let ws = tempfile::tempdir().unwrap();
        let root = ws.path();
        std::fs::create_dir_all(root.join("numkit")).unwrap();
        std::fs::create_dir_all(root.join("tests")).unwrap();
        std::fs::write(root.join("numkit/__init__.py"), "VALUE = 'real'\n").unwrap();
        std::fs::write(root.join("tests/test_core.py"), "import numkit\n").unwrap();
        // A repository module named like the grader's script: the repository's wins.
        std::fs::write(root.join("guard.py"), "WHO = 'repository'\n").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let g = guard_in(dir.path(), &["checker.py"]);
        std::fs::write(dir.path().join(SCRIPT_FILE), SCRIPT).unwrap();
        std::fs::write(
            dir.path().join("sitecustomize.py"),
            super::super::seal::BOOTSTRAP,
        )
        .unwrap();
        let guard_py = dir.path().join(SCRIPT_FILE);
        let probe = Command::new(py)
            .arg(&guard_py)
            .args(["probe", g.dir()])
            .current_dir(root)
            .output()
            .unwrap();
        assert!(probe.status.success());
        let swept = Command::new(py)
            .args(["-I", "-S"])
            .arg(&guard_py)
            .args(["sweep", g.dir(), "[\"checker.py\"]"])
            .current_dir(root)
            .output()
            .unwrap();
        assert!(
            refusals(&String::from_utf8_lossy(&swept.stdout)).is_empty(),
            "the task's own workspace has no shadow"
        );
        // Written after the sweep (by a process of the run, say): a package in the test
        // directory over the package under test, and a module over the hidden checker.
        std::fs::create_dir_all(root.join("tests/numkit")).unwrap();
        std::fs::write(root.join("tests/numkit/__init__.py"), "VALUE = 'forged'\n").unwrap();
        std::fs::create_dir_all(root.join("checker")).unwrap();
        std::fs::write(root.join("checker/__init__.py"), "").unwrap();
        std::fs::write(root.join("argparse.py"), "FORGED = True\n").unwrap();
        let run = |code: &str| {
            let out = Command::new(py)
                .args(["-c", code])
                .current_dir(root)
                .env_clear()
                .env("PATH", "/usr/bin:/bin")
                .env("PYTHONDONTWRITEBYTECODE", "1")
                .env("PYTHONSAFEPATH", "1")
                .env("ROLLOUT_GUARD", g.dir())
                .env("PYTHONPATH", g.dir())
                .output()
                .unwrap();
            (
                out.status.success(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        };
        // The repository's own package imports from the root, after the standard
        // library: a root `argparse.py` is not the standard library's.
        let (ok, out, err) = run(
            "import numkit, argparse, guard; print(numkit.VALUE, hasattr(argparse, 'FORGED'), guard.WHO)",
        );
        assert!(ok && out.trim() == "real False repository", "{out}{err}");
        // The test directory first on the path, as pytest puts it: refused, recorded.
        let (ok, _, err) = run("import sys; sys.path.insert(0, 'tests'); import numkit");
        assert!(!ok, "the shadow was imported: {err}");
        let refused = refusals(&err);
        assert_eq!(
            refused.iter().map(|r| r.path.as_str()).collect::<Vec<_>>(),
            ["tests/numkit/__init__.py"],
            "{err}"
        );
        let (ok, _, err) = run("import checker");
        assert!(!ok, "{err}");
        assert!(err.contains("shadows checker.py"), "{err}");
        let recorded = std::fs::read_to_string(dir.path().join("refused")).unwrap();
        assert_eq!(refusals(&recorded).len(), 2, "{recorded}");
        // What the run did load from the workspace is on record.
        let imported = std::fs::read_to_string(dir.path().join("imported")).unwrap();
        let loaded: BTreeSet<&str> = imported.lines().collect();
        assert_eq!(
            loaded,
            BTreeSet::from(["guard.py", "numkit/__init__.py"]),
            "{imported}"
        );
    }

    #[test]
    fn the_sweep_removes_what_would_shadow_and_nothing_else() {
        let Some(py) = python() else {
            return;
        };
        let ws = tempfile::tempdir().unwrap();
        let root = ws.path();
        let write = |p: &str, text: &str| {
            let p = root.join(p);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        };
        write("numkit/__init__.py", "");
        write("tests/test_core.py", "import numkit\n");
        write(
            "checker/data.txt",
            "the task's own data beside the hidden checker\n",
        );
        let dir = tempfile::tempdir().unwrap();
        let g = guard_in(dir.path(), &["checker.py"]);
        std::fs::write(dir.path().join(SCRIPT_FILE), SCRIPT).unwrap();
        let guard_py = dir.path().join(SCRIPT_FILE);
        let ran = |args: &[&str]| {
            Command::new(py)
                .args(args)
                .current_dir(root)
                .output()
                .unwrap()
        };
        let probe = ran(&[guard_py.to_str().unwrap(), "probe", g.dir()]);
        assert!(probe.status.success());
        // The agent's changes: shadows, and a right fix's own new modules.
        write("pytest.py", "");
        write("tests/numkit/__init__.py", "");
        write("checker/__init__.py", "");
        write("tests/test_core/__init__.py", "");
        write("numkit/bounds.py", "");
        write("clamp_notes.py", "");
        write(
            "checker.py",
            "# the grader's hidden file, written after the changes\n",
        );
        let swept = ran(&[
            "-I",
            "-S",
            guard_py.to_str().unwrap(),
            "sweep",
            g.dir(),
            "[\"checker.py\"]",
        ]);
        let out = String::from_utf8_lossy(&swept.stdout);
        let removed: Vec<String> = lines_of(&out, REMOVED_LINE)
            .into_iter()
            .map(|r| r.path)
            .collect();
        assert_eq!(
            removed,
            [
                "checker/__init__.py",
                "pytest.py",
                "tests/numkit/__init__.py",
                "tests/test_core/__init__.py"
            ],
            "{out}"
        );
        assert!(refusals(&out).is_empty(), "{out}");
        for gone in &removed {
            assert!(!root.join(gone).exists(), "{gone} is still there");
        }
        for kept in [
            "checker/data.txt",
            "checker.py",
            "numkit/bounds.py",
            "clamp_notes.py",
            "tests/test_core.py",
        ] {
            assert!(root.join(kept).exists(), "{kept} was removed");
        }
    }

    #[test]
    fn a_report_names_the_first_refusal_and_counts_the_rest() {
        let out = "noise\nrollout-guard-refused\ta.py\tshadows `a`\nrollout-guard-refused\tb/__init__.py\tshadows b.py\nrollout-guard-refused\tbroken line\n";
        let refused = refusals(out);
        assert_eq!(refused.len(), 2);
        let report = Report {
            python: Some("3.11".into()),
            safe_path: true,
            removed: lines_of("rollout-guard-removed\tc.py\tshadows `c`\n", REMOVED_LINE),
            refused,
            ..Report::default()
        };
        assert_eq!(report.removed.len(), 1);
        let why = report.failure().unwrap();
        assert!(
            why.contains("a.py shadows `a`") && why.ends_with("(and 1 more)"),
            "{why}"
        );
        assert_eq!(Report::default().failure(), None);
        assert!(Guard::has_safe_path("3.11") && Guard::has_safe_path("3.13"));
        assert!(!Guard::has_safe_path("3.10") && !Guard::has_safe_path("2.7"));
    }
}
