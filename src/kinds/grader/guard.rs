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
//!   nothing of the workspace on its path): an agent-added module entry is refused
//!   when it is an extension module (compiled code the grader cannot read), when an
//!   expected module of the same name sits in the same directory (a package beside a
//!   restored or hidden module), or when it sits in a directory that can be on the
//!   path (the root, or any directory that is not a regular package) under a name the
//!   standard library, an installed package or another directory of the workspace
//!   already gives. Any refusal scores 0 with the paths and reasons: the graded run
//!   never starts.
//! - **What the run imports** (the bootstrap's finder, `seal_sitecustomize.py`): the
//!   run's Pythons are in safe-path mode (`PYTHONSAFEPATH`, Python 3.11+), so the
//!   working directory or script directory is not put first on the path; the
//!   bootstrap puts it after the standard library instead, so the repository's own
//!   modules import as before and none of them can shadow the standard library (nor
//!   an installed package, unless it was there before the agent: the sweep refuses
//!   the agent's). A finder
//!   first on `sys.meta_path` applies the same rules to every module the run imports
//!   from the workspace (so a file written during the run, or a directory a runner
//!   puts first, is held to them too) and records a refusal, which scores 0 with the
//!   module named. On a Python older than 3.11 the finder is what stands in for safe
//!   path: a shadow of the runner is refused when `-m` resolves it.
//!
//! What the guard does not claim: the code under test itself (a module the tests are
//! meant to import) runs inside the runner's process and can patch it; that is the
//! seal's and the log checks' part, and the README's threat model says what remains.

use std::collections::BTreeSet;
use std::time::Duration;

use super::super::StageError;
use super::super::sandboxed;
use crate::sandbox::client::SandboxClient;
use crate::sandbox::protocol::{ExecArgs, ExecResult, FileArgs};

/// The probe and sweep, as one Python script (`probe DIR` / `sweep DIR FILES`).
pub const SCRIPT: &str = include_str!("guard.py");
/// The line the probe prints with the sandbox's Python version and the workspace.
const PYTHON_LINE: &str = "rollout-guard-python ";
/// A refusal's line: the path and why, tab-separated (the sweep's and the finder's).
const REFUSED_LINE: &str = "rollout-guard-refused\t";

/// One EVAL's guard: the directory its files live in (outside the workspace) and the
/// paths the grader writes into the workspace itself.
#[derive(Debug, Clone)]
pub struct Guard {
    dir: String,
    grader_files: Vec<String>,
}

/// A module entry refused: where, and why.
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
    /// Module entries refused, by the sweep or while the run imported.
    pub refused: Vec<Refusal>,
}

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
    /// outside it, for the sandbox's first `python3` (or `python`); it prints nothing
    /// where there is no Python, and the guard is then off ([`Guard::python`]).
    pub fn probe(&self) -> String {
        format!(
            "mkdir -p {dir} && cat > {dir}/guard.py <<'ROLLOUT_GUARD_EOF'\n{SCRIPT}\nROLLOUT_GUARD_EOF\nfor py in python3 python; do command -v \"$py\" >/dev/null 2>&1 || continue; \"$py\" {dir}/guard.py probe {dir} 2>/dev/null; break; done; true",
            dir = self.dir
        )
    }

    /// The sandbox's Python version from the probe's output (`3.11`), or `None` when it
    /// has none (nothing to guard).
    pub fn python(probe: Option<&ExecResult>) -> Option<String> {
        probe?
            .output
            .lines()
            .find_map(|l| l.strip_prefix(PYTHON_LINE))
            .and_then(|rest| rest.split_whitespace().next())
            .map(str::to_string)
    }

    /// Whether a Python version (`3.11`) has safe-path mode.
    fn has_safe_path(version: &str) -> bool {
        let mut it = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
        let (major, minor) = (it.next().unwrap_or(0), it.next().unwrap_or(0));
        (major, minor) >= (3, 11)
    }

    /// Runs the sweep (after the changes are applied): the report, its refusals those
    /// of the agent's module entries that would shadow something. `python` is what
    /// [`Guard::python`] found; without one the report is empty and nothing ran. A
    /// sweep that cannot run is the machine's fault (the stage is tried again); one
    /// that fails on what the workspace holds is a refusal of its own.
    pub async fn sweep(
        &self,
        client: &SandboxClient,
        python: Option<String>,
    ) -> Result<Report, StageError> {
        let Some(version) = python else {
            return Ok(Report::default());
        };
        let files = serde_json::to_string(&self.grader_files).unwrap_or_else(|_| "[]".into());
        let command = format!(
            "for py in python3 python; do command -v \"$py\" >/dev/null 2>&1 || continue; \"$py\" -I -S {dir}/guard.py sweep {dir} {files}; exit $?; done",
            dir = self.dir,
            files = shell_quote(&files),
        );
        let r = client
            .exec(&grader_exec(command), Some(Duration::from_secs(300)))
            .await
            .map_err(|e| sandboxed::stage_error("the import guard's sweep could not run", e))?;
        let mut refused = refusals(&r.output);
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
            refused,
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

    /// Adds the refusals the run's finder recorded (its lines in `output`, and its file
    /// in the guard's directory) to `report`.
    pub async fn after_run(&self, client: &SandboxClient, output: &str, report: &mut Report) {
        let mut found: BTreeSet<Refusal> = report.refused.drain(..).collect();
        found.extend(refusals(output));
        let file = run(
            client,
            format!("cat {}/refused 2>/dev/null; true", self.dir),
        )
        .await;
        if let Some(r) = file {
            found.extend(refusals(&r.output));
        }
        report.refused = found.into_iter().collect();
    }
}

/// The refusals among `output`'s lines.
pub fn refusals(output: &str) -> Vec<Refusal> {
    let mut out: Vec<Refusal> = output
        .lines()
        .filter_map(|l| l.strip_prefix(REFUSED_LINE))
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
