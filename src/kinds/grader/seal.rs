//! The completion seal: proof, in a test log, that the test runner's process ended the
//! ordinary way, after everything it wrote.
//!
//! The code under test runs inside the runner's process, so it can print a whole log
//! of its own (every expected test `PASSED`, the runner's summary) and end the process
//! before the real run says anything (`os._exit(0)`, a signal to itself). Every line
//! of such a log is well formed; what it lacks is the runner's end. Before the tests
//! run, the grader writes a secret for this run to a file outside the workspace and a
//! `sitecustomize.py` ([`BOOTSTRAP`]) that Python loads at start from a directory put
//! first on `PYTHONPATH`. The first Python process of the run reads the secret and
//! removes the file before any code under test is imported, prints an opening mark,
//! and prints the secret as its last words when the interpreter shuts down normally.
//! A log with the opening mark and no seal was ended early; a seal that says the exit
//! handlers were run by the code, or that stdout/stderr were pointed elsewhere at the
//! end, is not a normal end either; a seal with a wrong secret is forged.
//!
//! Where the run loads no Python with the seal (another language, a Python started
//! with `-I`/`-E`, a command that sets its own `PYTHONPATH`), there is no opening mark
//! and nothing is required: the log is read as before. The seal raises the bar; it is
//! not a wall: code in the runner's process can find the secret in memory, or replace
//! `sys.stderr` at import and put it back in an exit handler of its own. The README's
//! threat model says so.

use crate::graders::logs;
use crate::sandbox::client::SandboxClient;
use crate::sandbox::protocol::FileArgs;

/// The `sitecustomize.py` that claims the secret and prints the marks.
pub const BOOTSTRAP: &str = include_str!("seal_sitecustomize.py");
/// The opening mark's prefix (followed by the process id).
const OPEN: &str = "rollout-seal-open ";
/// The seal's prefix (followed by the secret and the state at the end).
const SEAL: &str = "rollout-seal ";

/// One test run's seal: its secret and where its files go in the sandbox.
#[derive(Debug, Clone)]
pub struct Seal {
    secret: String,
    dir: String,
}

/// What a log says about its seal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reading {
    /// The log without the marks, for the log parser.
    pub log: String,
    /// `"sealed"`, `"not used"` (no opening mark), `"missing"`, `"forged"`, or
    /// `"broken"`, for the grader's details.
    pub state: &'static str,
    /// Why the log cannot be trusted, when the seal says so.
    pub doubt: Option<String>,
    /// The lines after the seal (written by processes the run left behind).
    pub after: String,
}

impl Default for Seal {
    fn default() -> Self {
        Self::new()
    }
}

impl Seal {
    /// A seal with a fresh random secret (122 bits) and its own directory under `/tmp`.
    pub fn new() -> Self {
        Self {
            secret: uuid::Uuid::new_v4().simple().to_string(),
            dir: format!("/tmp/.rollout-seal-{}", uuid::Uuid::new_v4().simple()),
        }
    }

    /// Writes the bootstrap and the secret into the sandbox. `false` (with a warning)
    /// when it cannot: the run then goes unsealed, and the log is read as without it.
    pub async fn install(&self, client: &SandboxClient, job_id: &str) -> bool {
        for (name, text) in [
            ("sitecustomize.py", BOOTSTRAP.to_string()),
            ("secret", self.secret.clone()),
        ] {
            let args = FileArgs::Create {
                path: format!("{}/{name}", self.dir),
                file_text: text,
            };
            match client.file(&args).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    tracing::warn!(job_id, error = %e.message, "the test run goes unsealed");
                    return false;
                }
                Err(e) => {
                    tracing::warn!(job_id, error = %e, "the test run goes unsealed");
                    return false;
                }
            }
        }
        true
    }

    /// The shell line that makes the run's Pythons load the bootstrap.
    pub fn env(&self) -> String {
        format!(
            "export ROLLOUT_SEAL={dir}/secret PYTHONPATH={dir}${{PYTHONPATH:+:$PYTHONPATH}}",
            dir = self.dir
        )
    }

    /// Reads the marks out of `log`; `parser` reads what came after the seal, which
    /// must hold no test result.
    pub fn read(&self, log: &str, parser: &str) -> Reading {
        let mut kept = String::with_capacity(log.len());
        let mut after = String::new();
        let mut opened = false;
        let mut sealed: Option<String> = None;
        let mut forged = false;
        for line in log.split_inclusive('\n') {
            let text = line.trim_end_matches(['\n', '\r']);
            if text.starts_with(OPEN) {
                opened = true;
                continue;
            }
            if let Some(rest) = text.strip_prefix(SEAL) {
                let mut parts = rest.split_whitespace();
                match (parts.next(), parts.next()) {
                    (Some(s), Some(state)) if s == self.secret && sealed.is_none() => {
                        sealed = Some(state.to_string());
                    }
                    _ => forged = true,
                }
                continue;
            }
            if sealed.is_some() {
                after.push_str(line);
            } else {
                kept.push_str(line);
            }
        }
        let late = !after.trim().is_empty()
            && logs::parse(parser, &after).is_some_and(|r| !r.results.is_empty());
        kept.push_str(&after);
        let (state, doubt) = if forged {
            (
                "forged",
                Some(
                    "the log holds a completion seal the grader did not write: the code under \
                     test printed it, so the log is not the runner's"
                        .to_string(),
                ),
            )
        } else if let Some(state) = sealed {
            if state != "ok" {
                ("broken", Some(broken(&state)))
            } else if late {
                (
                    "sealed",
                    Some(
                        "test results were written after the test runner's process ended: a \
                         process the tests left behind wrote them"
                            .to_string(),
                    ),
                )
            } else {
                ("sealed", None)
            }
        } else if opened {
            (
                "missing",
                Some(
                    "the test runner's process did not end normally (its completion seal is \
                     missing): the code under test ended it early (os._exit, a signal) or it \
                     crashed, so its log proves nothing"
                        .to_string(),
                ),
            )
        } else {
            ("not used", None)
        };
        Reading {
            log: kept,
            state,
            doubt,
            after,
        }
    }
}

/// The doubt for a seal whose process ended in an abnormal state (`state` lists the
/// bootstrap's marks).
fn broken(state: &str) -> String {
    let mut why = Vec::new();
    for mark in state.split(',') {
        why.push(match mark {
            "called" => "the code under test ran the exit handlers itself",
            "fds" => "stdout or stderr pointed somewhere else at the end",
            "streams" => "sys.stdout or sys.stderr had been replaced at the end",
            _ => "an unknown mark",
        });
    }
    format!(
        "the test runner's process did not end normally ({}), so its log proves nothing",
        why.join("; ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seal() -> Seal {
        Seal {
            secret: "abc123".into(),
            dir: "/tmp/.rollout-seal-x".into(),
        }
    }

    const RUN: &str = "PASSED test_a.py::test_one\n========== 1 passed in 0.01s ==========\n";

    #[test]
    fn a_sealed_log_is_read_without_its_marks() {
        let log = format!("\nrollout-seal-open 7\n{RUN}\nrollout-seal abc123 ok\n");
        let r = seal().read(&log, "pytest");
        assert_eq!(r.state, "sealed");
        assert_eq!(r.doubt, None);
        assert!(!r.log.contains("rollout-seal"), "{}", r.log);
        assert!(r.log.contains("1 passed"));
    }

    #[test]
    fn an_opened_run_without_its_seal_is_not_evidence() {
        let log = format!("\nrollout-seal-open 7\n{RUN}");
        let r = seal().read(&log, "pytest");
        assert_eq!(r.state, "missing");
        assert!(r.doubt.unwrap().contains("did not end normally"));
    }

    #[test]
    fn a_seal_with_another_secret_is_forged() {
        let log = format!("\nrollout-seal-open 7\n{RUN}rollout-seal guessed ok\n");
        let r = seal().read(&log, "pytest");
        assert_eq!(r.state, "forged");
        // Even beside the real one.
        let log = format!("{RUN}rollout-seal guessed ok\nrollout-seal abc123 ok\n");
        assert_eq!(seal().read(&log, "pytest").state, "forged");
    }

    #[test]
    fn a_seal_in_an_abnormal_state_names_it() {
        let log = format!("rollout-seal-open 7\n{RUN}rollout-seal abc123 called,fds\n");
        let r = seal().read(&log, "pytest");
        assert_eq!(r.state, "broken");
        let d = r.doubt.unwrap();
        assert!(d.contains("ran the exit handlers itself"), "{d}");
        assert!(d.contains("pointed somewhere else"), "{d}");
    }

    #[test]
    fn results_after_the_seal_are_doubted_other_output_is_not() {
        let log = format!(
            "rollout-seal-open 7\n{RUN}rollout-seal abc123 ok\nPASSED test_a.py::test_two\n"
        );
        let r = seal().read(&log, "pytest");
        assert!(
            r.doubt
                .unwrap()
                .contains("after the test runner's process ended")
        );
        let log = format!("rollout-seal-open 7\n{RUN}rollout-seal abc123 ok\ndone\n");
        assert_eq!(seal().read(&log, "pytest").doubt, None);
    }

    #[test]
    fn a_run_without_the_bootstrap_is_read_as_before() {
        let r = seal().read(RUN, "pytest");
        assert_eq!(r.state, "not used");
        assert_eq!(r.doubt, None);
        assert_eq!(r.log, RUN);
    }

    #[test]
    fn the_environment_line_keeps_the_sandboxes_path() {
        let env = seal().env();
        assert_eq!(
            env,
            "export ROLLOUT_SEAL=/tmp/.rollout-seal-x/secret PYTHONPATH=/tmp/.rollout-seal-x${PYTHONPATH:+:$PYTHONPATH}"
        );
    }

    /// Runs `code` under the real bootstrap with `python3`, as a test run would; `None`
    /// where there is no `python3` (a failure under `CI`, where it must be there).
    fn under_bootstrap(code: &str) -> Option<String> {
        let Ok(python) = which_python() else {
            crate::prerequisite::missing(
                "the seal's bootstrap test",
                "python3 is not on PATH (scripts/setup.sh installs it)",
            );
            return None;
        };
        let dir = tempfile::tempdir().unwrap();
        let s = Seal {
            secret: "s3cr3t".into(),
            dir: dir.path().to_string_lossy().into_owned(),
        };
        std::fs::write(dir.path().join("sitecustomize.py"), BOOTSTRAP).unwrap();
        std::fs::write(dir.path().join("secret"), "s3cr3t").unwrap();
        let out = std::process::Command::new(python)
            .args(["-c", code])
            .env("ROLLOUT_SEAL", dir.path().join("secret"))
            .env("PYTHONPATH", dir.path())
            .output()
            .unwrap();
        assert!(
            !dir.path().join("secret").exists(),
            "the bootstrap must remove the secret before any code runs"
        );
        let log = String::from_utf8_lossy(&out.stdout).into_owned();
        Some(format!("{}|{log}", s.read(&log, "pytest").state))
    }

    fn which_python() -> Result<std::path::PathBuf, ()> {
        std::env::var_os("PATH")
            .into_iter()
            .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
            .map(|d| d.join("python3"))
            .find(|p| p.is_file())
            .ok_or(())
    }

    #[test]
    fn the_bootstrap_seals_a_normal_end_and_only_that() {
        let Some(normal) = under_bootstrap("print('hello')") else {
            return;
        };
        assert!(normal.starts_with("sealed|"), "{normal}");
        assert!(normal.contains("hello"), "{normal}");
        // The code cannot read the secret from its environment or the file.
        let peek = under_bootstrap(
            "import os; print(os.environ.get('ROLLOUT_SEAL')); print(os.path.exists(os.environ.get('PYTHONPATH') + '/secret'))",
        )
        .unwrap();
        assert!(peek.contains("None\nFalse"), "{peek}");
        for (code, state) in [
            ("import os; print('1 passed'); os._exit(0)", "missing"),
            (
                "import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
                "missing",
            ),
            (
                "import atexit, os; atexit._run_exitfuncs(); os._exit(0)",
                "broken",
            ),
            (
                "import os, sys; os.dup2(os.open(os.devnull, os.O_WRONLY), 2)",
                "broken",
            ),
            ("import io, sys; sys.stderr = io.StringIO()", "broken"),
            ("import sys; sys.exit(3)", "sealed"),
            (
                "import os, sys; pid = os.fork(); pid or sys.exit(0); os.waitpid(pid, 0)",
                "sealed",
            ),
            ("raise ValueError('x')", "sealed"),
        ] {
            let got = under_bootstrap(code).unwrap();
            assert!(got.starts_with(&format!("{state}|")), "{code}: {got}");
        }
    }
}
