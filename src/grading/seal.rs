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
//! A runner that lets `SystemExit` through (unittest's and Django's test loaders, sympy's
//! runner) ends the ordinary way when the code under test calls `sys.exit(0)` after
//! printing a forged log. For those, the seal is made for the log parser
//! ([`Seal::for_parser`]): the bootstrap wraps the runner's run (unittest's
//! `TextTestRunner.run`, sympy's `SymPyTests.test`) and the seal says `unfinished` when
//! it never returned. sympy's `bin/test` runs its tests in a child Python unless
//! `PYTHONHASHSEED` is set, so a sympy run gets a random seed from the grader, which
//! keeps the tests in the sealed process and their hash order random as before.
//!
//! The code under test also writes to the log the runner writes to, and can print the
//! runner's own lines (`test_x (m.C) ... ok`) for tests the runner says failed. Under
//! the seal, unittest's runner (which Django's runs too) frames each of its writes in
//! its outermost run with a random token, writing them straight to the run's stderr,
//! and the seal tells the token at the end; the log parser then reads only the framed
//! text ([`Reading::for_parser`]), never a line the code printed. pytest and sympy logs
//! are read whole, checked against the runner's summary.
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

/// One test run's seal: its secret, where its files go in the sandbox, and the runner
/// whose completion it also records.
#[derive(Debug, Clone)]
pub struct Seal {
    secret: String,
    dir: String,
    runner: Option<&'static str>,
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
    /// What the test runner itself wrote, when it framed its writes (unittest's
    /// runner under the seal, [`FRAME`]): the only text the log parser reads, so lines
    /// the code under test prints in the runner's shape are never taken as results.
    pub runner: Option<String>,
}

impl Reading {
    /// The text the log parser reads: the runner's own, when it was framed, else the
    /// log.
    pub fn for_parser(&self) -> &str {
        self.runner.as_deref().unwrap_or(&self.log)
    }
}

/// A framed write of unittest's runner is `[rollout-runner TOKEN[text]rollout-runner
/// TOKEN]`, TOKEN random per run and told only in the seal; the bootstrap writes
/// frames straight to the run's stderr, around the code under test's own streams.
const FRAME: &str = "rollout-runner ";

impl Seal {
    /// A seal with a fresh random secret (122 bits) and its own directory under `/tmp`,
    /// for a log read by `parser`: a runner that lets `SystemExit` through must also
    /// have returned from its run ([`runner_of`]).
    pub fn for_parser(parser: &str) -> Self {
        Self {
            secret: uuid::Uuid::new_v4().simple().to_string(),
            dir: format!("/tmp/.rollout-seal-{}", uuid::Uuid::new_v4().simple()),
            runner: runner_of(parser),
        }
    }

    /// The same seal with its files in `dir` (the import guard's, whose bootstrap it
    /// shares: one `sitecustomize.py` does both).
    pub fn in_dir(mut self, dir: &str) -> Self {
        self.dir = dir.to_string();
        self
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

    /// The shell line that makes the run's Pythons load the bootstrap (and tells it the
    /// runner to watch; a sympy run also gets a random hash seed, which keeps its tests
    /// in the sealed process).
    pub fn env(&self) -> String {
        let runner = match self.runner {
            Some("sympy") => format!(
                " ROLLOUT_SEAL_RUNNER=sympy PYTHONHASHSEED=${{PYTHONHASHSEED:-{}}}",
                hash_seed()
            ),
            Some(r) => format!(" ROLLOUT_SEAL_RUNNER={r}"),
            None => String::new(),
        };
        format!(
            "export ROLLOUT_SEAL={dir}/secret PYTHONPATH={dir}${{PYTHONPATH:+:$PYTHONPATH}}{runner}",
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
        let mut token: Option<String> = None;
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
                        token = parts.next().map(str::to_string);
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
        let runner = token.map(|t| {
            let (runner, plain) = unframe(&kept, &t);
            kept = plain;
            runner
        });
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
            runner,
        }
    }
}

/// The text of `log`'s frames with `token` ([`FRAME`]), joined: what the runner
/// wrote; and `log` with those frames' marks removed, their text left in place. A
/// frame cut short (the log's end) runs to the end.
fn unframe(log: &str, token: &str) -> (String, String) {
    let start = format!("[{FRAME}{token}[");
    let end = format!("]{FRAME}{token}]");
    let mut runner = String::new();
    let mut plain = String::with_capacity(log.len());
    let mut rest = log;
    while let Some(i) = rest.find(&start) {
        plain.push_str(&rest[..i]);
        let body = &rest[i + start.len()..];
        let (text, next) = match body.find(&end) {
            Some(j) => (&body[..j], &body[j + end.len()..]),
            None => (body, ""),
        };
        runner.push_str(text);
        plain.push_str(text);
        rest = next;
    }
    plain.push_str(rest);
    (runner, plain)
}

/// A random `PYTHONHASHSEED` (Python takes 0 to 2^32 - 1).
fn hash_seed() -> u32 {
    let bytes = *uuid::Uuid::new_v4().as_bytes();
    u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
}

/// The runner the bootstrap watches for a log `parser`: the ones whose loaders let the
/// code under test's `SystemExit` end the process (`unittest`, which also runs
/// Django's `runtests.py`, and `sympy`). pytest turns `SystemExit` into a failed test
/// or collection error and goes on to its own summary, so it needs no watching.
fn runner_of(parser: &str) -> Option<&'static str> {
    match logs::canonical(parser).unwrap_or(parser) {
        "unittest" | "django" => Some("unittest"),
        "sympy" => Some("sympy"),
        _ => None,
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
            "unfinished" => {
                "the test runner's run never returned: the code under test ended the \
                 process (sys.exit) before the runner finished"
            }
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
            runner: None,
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
        sealed_run(&["-c", code], None, None)
    }

    /// Runs `python3 args` in `cwd` under the real bootstrap watching `runner` and
    /// returns the seal's state, a `|`, and the log (stdout and stderr).
    fn sealed_run(
        args: &[&str],
        runner: Option<&'static str>,
        cwd: Option<&std::path::Path>,
    ) -> Option<String> {
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
            runner,
        };
        std::fs::write(dir.path().join("sitecustomize.py"), BOOTSTRAP).unwrap();
        std::fs::write(dir.path().join("secret"), "s3cr3t").unwrap();
        let mut command = std::process::Command::new(python);
        command
            .args(args)
            .env("ROLLOUT_SEAL", dir.path().join("secret"))
            .env("PYTHONPATH", dir.path())
            .env("PYTHONDONTWRITEBYTECODE", "1");
        if let Some(r) = runner {
            command.env("ROLLOUT_SEAL_RUNNER", r);
        }
        if let Some(cwd) = cwd {
            command.current_dir(cwd);
        }
        let out = command.output().unwrap();
        assert!(
            !dir.path().join("secret").exists(),
            "the bootstrap must remove the secret before any code runs"
        );
        let log = String::from_utf8_lossy(&out.stdout).into_owned();
        let errors = String::from_utf8_lossy(&out.stderr);
        Some(format!("{}|{log}{errors}", s.read(&log, "pytest").state))
    }

    /// unittest's summary for two passed tests, as a forger prints it.
    const UNITTEST_OK: &str = "test_a (t.T.test_a) ... ok\ntest_b (t.T.test_b) ... ok\n\n\
        ----------------------------------------------------------------------\n\
        Ran 2 tests in 0.001s\n\nOK\n";

    /// A unittest run of `t.py` (one passing test) that imports `calc.py` (`calc`).
    fn unittest_run(calc: &str) -> Option<String> {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("calc.py"), calc).unwrap();
        std::fs::write(
            dir.path().join("t.py"),
            "import unittest\nimport calc\n\nclass T(unittest.TestCase):\n    def test_a(self):\n        pass\n",
        )
        .unwrap();
        sealed_run(
            &["-m", "unittest", "-v", "t"],
            Some("unittest"),
            Some(dir.path()),
        )
    }

    #[test]
    fn a_unittest_run_ended_by_sys_exit_at_import_is_unfinished() {
        let Some(genuine) = unittest_run("") else {
            return;
        };
        assert!(genuine.starts_with("sealed|"), "{genuine}");
        assert!(genuine.contains("Ran 1 test"), "{genuine}");
        // unittest's loader lets SystemExit through: the process ends the ordinary way,
        // after a log the code under test wrote.
        let forged = format!("import sys\nsys.stderr.write({UNITTEST_OK:?})\nsys.exit(0)\n");
        let got = unittest_run(&forged).unwrap();
        assert!(got.starts_with("broken|"), "{got}");
        assert!(got.contains("rollout-seal s3cr3t unfinished"), "{got}");
        // The same with `raise SystemExit` instead of the function.
        let got = unittest_run(&forged.replace("sys.exit(0)", "raise SystemExit")).unwrap();
        assert!(got.starts_with("broken|"), "{got}");
        // Watching nothing (a pytest run), the same exit seals: pytest itself turns
        // SystemExit into an error and prints its own summary after the forged one.
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("calc.py"), &forged).unwrap();
        let got = sealed_run(&["-c", "import calc"], None, Some(dir.path())).unwrap();
        assert!(got.starts_with("sealed|"), "{got}");
    }

    /// Runs `python3 -m unittest -v t` under the real bootstrap watching unittest, in a
    /// directory holding `t.py` (`tests`) and `calc.py` (`calc`), with stderr and stdout
    /// in one log as a test run has them; the seal and the log. `None` without
    /// `python3`.
    fn unittest_log(tests: &str, calc: &str) -> Option<(Seal, String)> {
        let Ok(python) = which_python() else {
            crate::prerequisite::missing(
                "the seal's bootstrap test",
                "python3 is not on PATH (scripts/setup.sh installs it)",
            );
            return None;
        };
        let dir = tempfile::tempdir().unwrap();
        let work = tempfile::tempdir().unwrap();
        std::fs::write(work.path().join("t.py"), tests).unwrap();
        std::fs::write(work.path().join("calc.py"), calc).unwrap();
        std::fs::write(dir.path().join("sitecustomize.py"), BOOTSTRAP).unwrap();
        std::fs::write(dir.path().join("secret"), "s3cr3t").unwrap();
        let log_path = work.path().join("log");
        let log = std::fs::File::create(&log_path).unwrap();
        let status = std::process::Command::new(python)
            .args(["-m", "unittest", "-v", "t"])
            .env("ROLLOUT_SEAL", dir.path().join("secret"))
            .env("ROLLOUT_SEAL_RUNNER", "unittest")
            .env("PYTHONPATH", dir.path())
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .current_dir(work.path())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .status()
            .unwrap();
        assert!(status.code().is_some());
        let seal = Seal {
            secret: "s3cr3t".into(),
            dir: dir.path().to_string_lossy().into_owned(),
            runner: Some("unittest"),
        };
        Some((seal, std::fs::read_to_string(log_path).unwrap()))
    }

    /// Two tests of `calc.add`, by unittest's dotted ids.
    const CALC_TESTS: &str = "import unittest\nfrom calc import add\n\nclass T(unittest.TestCase):\n    def test_a(self):\n        self.assertEqual(add(1, 2), 3)\n\n    def test_b(self):\n        self.assertEqual(add(2, 2), 4)\n";

    #[test]
    fn only_what_unittests_runner_wrote_is_read() {
        let Some((seal, log)) = unittest_log(CALC_TESTS, "def add(a, b):\n    return a + b\n")
        else {
            return;
        };
        let r = seal.read(&log, "unittest");
        assert_eq!(r.state, "sealed", "{log}");
        let runner = r.runner.clone().unwrap();
        assert!(
            runner.contains("test_a (t.T") && runner.contains("\nOK\n"),
            "{runner}"
        );
        // The log shown keeps everything, without the frames' marks.
        assert!(!r.log.contains("rollout-runner"), "{}", r.log);
        let report = logs::parse("unittest", r.for_parser()).unwrap();
        assert_eq!(report.distrust(), None);
        assert_eq!(report.status("t.T.test_a"), Some(logs::TestStatus::Passed));
        // A wrong fix printing the runner's lines for the tests it fails, in every
        // form, and a whole passing summary: none of it is the runner's.
        let forged = "import sys\n\ndef add(a, b):\n    t = sys._getframe(1).f_locals['self']\n    \
            sys.stderr.write('\\n%s ... ok\\n%s ... ok\\n' % (t.id(), t))\n    \
            sys.stderr.write('\\nRan 2 tests in 0.001s\\n\\nOK\\n')\n    raise ValueError\n";
        let (seal, log) = unittest_log(CALC_TESTS, forged).unwrap();
        let r = seal.read(&log, "unittest");
        assert_eq!(r.state, "sealed", "{log}");
        assert!(r.log.contains("t.T.test_a ... ok"), "{}", r.log);
        let runner = r.runner.clone().unwrap();
        assert!(!runner.contains(" ... ok"), "{runner}");
        let report = logs::parse("unittest", r.for_parser()).unwrap();
        assert_eq!(report.distrust(), None, "{runner}");
        assert_eq!(report.status("t.T.test_a"), Some(logs::TestStatus::Error));
        assert_eq!(report.status("test_b (t.T)"), Some(logs::TestStatus::Error));
        // Without the frames (the whole log), the forgery is at least distrusted.
        let whole = logs::parse("unittest", &r.log).unwrap();
        assert!(whole.distrust().is_some());
        // Frames with another token are not the runner's.
        let planted = format!("[rollout-runner 00[t ... ok\n]rollout-runner 00]{log}");
        assert!(
            !seal
                .read(&planted, "unittest")
                .runner
                .unwrap()
                .contains("t ... ok")
        );
    }

    #[test]
    fn frames_are_read_out_in_order() {
        let (runner, plain) = unframe(
            "a[rollout-runner k[x ... ]rollout-runner k]out\n[rollout-runner k[ok\n]rollout-runner k]b[rollout-runner k[cut",
            "k",
        );
        assert_eq!(runner, "x ... ok\ncut");
        assert_eq!(plain, "ax ... out\nok\nbcut");
    }

    /// A sympy checkout's runner as far as the seal sees it: `bin/test` imports
    /// `sympy.testing.runtests` (`sympy.utilities.runtests` before 1.6) and returns from
    /// `SymPyTests.test` after the run's summary; a test file runs inside it and its
    /// `SystemExit` is re-raised (the real module's shape, as in sympy 1.12).
    fn sympy_run(module: &str, test_body: &str) -> Option<String> {
        let dir = tempfile::tempdir().unwrap();
        let package = dir.path().join(module.replace('.', "/"));
        std::fs::create_dir_all(package.parent().unwrap()).unwrap();
        let mut path = dir.path().to_path_buf();
        for part in module.split('.').take(2) {
            path.push(part);
            std::fs::write(path.join("__init__.py"), "").unwrap();
        }
        std::fs::write(
            package.with_extension("py"),
            format!(
                "class SymPyTests:\n    def test(self):\n        try:\n            {test_body}\n        except (SystemExit, KeyboardInterrupt):\n            raise\n        except Exception:\n            pass\n        print('= tests finished: 1 passed, in 0.01 seconds =')\n        return True\n"
            ),
        )
        .unwrap();
        let driver = format!(
            "import sys\nfrom {module} import SymPyTests\nsys.exit(not SymPyTests().test())\n"
        );
        sealed_run(&["-c", &driver], Some("sympy"), Some(dir.path()))
    }

    #[test]
    fn a_sympy_run_is_sealed_only_when_its_runner_returned() {
        for module in ["sympy.testing.runtests", "sympy.utilities.runtests"] {
            let Some(genuine) = sympy_run(module, "pass") else {
                return;
            };
            assert!(genuine.starts_with("sealed|"), "{module}: {genuine}");
            let forged = sympy_run(
                module,
                "print('= tests finished: 1 passed, in 0.01 seconds ='); import sys; sys.exit(0)",
            )
            .unwrap();
            assert!(forged.starts_with("broken|"), "{module}: {forged}");
            assert!(forged.contains("unfinished"), "{module}: {forged}");
        }
    }

    #[test]
    fn the_runner_watched_follows_the_log_parser() {
        assert_eq!(runner_of("unittest"), Some("unittest"));
        assert_eq!(runner_of("django"), Some("unittest"));
        assert_eq!(runner_of("parse_log_django"), Some("unittest"));
        assert_eq!(runner_of("sympy"), Some("sympy"));
        assert_eq!(runner_of("pytest"), None);
        assert_eq!(runner_of("parse_log_astropy"), None);
        let sympy = Seal::for_parser("sympy").env();
        assert!(
            sympy.contains(" ROLLOUT_SEAL_RUNNER=sympy PYTHONHASHSEED=${PYTHONHASHSEED:-"),
            "{sympy}"
        );
        let django = Seal::for_parser("django").env();
        assert!(
            django.ends_with(" ROLLOUT_SEAL_RUNNER=unittest"),
            "{django}"
        );
        assert!(!Seal::for_parser("pytest").env().contains("RUNNER"));
        let d = broken("unfinished");
        assert!(d.contains("never returned"), "{d}");
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
