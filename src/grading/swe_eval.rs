//! The `swe` grader's EVAL: a SWE-bench instance's tests run over the agent's patch (the
//! instance and the verdict from a test log are `crate::graders::swe`).
//!
//! INIT's sandbox holds the instance's repository at `base_commit` ([`sandbox_for`]
//! fills the task's `sandbox.repo` in from the instance). EVAL starts a fresh sandbox
//! from the same spec, lists the environment's test-runner plugins while none of the
//! agent's code is there, applies the episode's diff, puts back every file the test
//! patch touches and everything the runner reads before the first test
//! ([`runner::default_protect`], unless the task lists `protect`) as they were at
//! `base_commit` — removing those the agent added — then applies `test_patch` and runs
//! the tests the way SWE-bench runs the instance's repository (its test command and
//! log parser, [`crate::graders::swe_repos`]), hardened ([`runner::hardened`]). The
//! log comes back through the sandbox server's pipe and must be evidence: every
//! `FAIL_TO_PASS` and `PASS_TO_PASS` id reported, passing, once, and the runner's own
//! summary there and agreeing; anything else is reward 0 with the reason
//! ([`crate::graders::swe::verdict`]). A patch that does not apply is reward 0 with the
//! reason.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::guard::Guard;
use super::runner;
use super::seal::Seal;
use crate::graders::swe::{self, Instance};
use crate::graders::{logs, swe_repos};
use crate::sandbox::client::SandboxClient;
use crate::sandbox::protocol::ExecArgs;
use crate::sandbox::spec::RepoSpec;
use crate::sandbox::{NodeSandboxes, SandboxSpec};
use crate::stage::sandboxed::{self, EvalSetup, Prepared, Scorer};
use crate::stage::{EvalOutput, SpecError, StageContext, StageError};

/// Where the test patch is written in EVAL's workspace (then applied and removed).
const TEST_PATCH_PATH: &str = ".grader/test.patch";
/// How much of the test run's output is read (head and tail; the log comes back in one
/// frame of the sandbox protocol, printable text only).
const LOG_READ_BYTES: usize = 6 * 1024 * 1024;
/// How much of the log's end `details` keeps.
const LOG_TAIL_BYTES: usize = 4096;
/// The `swe` grader's settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweGrader {
    /// The SWE-bench instance.
    pub instance: Instance,
    /// Where INIT clones the repository from when the task's `sandbox.repo` does not
    /// say: a path on the node or a URL. Default `https://github.com/<repo>.git` (which
    /// needs the network on the node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repo_url: Option<String>,
    /// The command that runs the tests, in the repository's root; `{tests}` is replaced
    /// by the test directives SWE-bench derives from the test patch, shell-quoted.
    /// Default: SWE-bench's command for the instance's repository and `version`, else
    /// `python3 -m pytest -rA {tests}`. Either way it runs with pytest's plugin
    /// autoloading off, the environment's plugins named, and no bytecode written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_command: Option<String>,
    /// The log parser for the command's output; default SWE-bench's for the repository
    /// (`pytest` for repositories it does not know).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_parser: Option<String>,
    /// Time limit of the test run (ms).
    #[serde(default = "default_timeout")]
    pub timeout_ms: u64,
    /// Workspace globs the agent's changes may not alter besides the test patch's files
    /// (restored before the tests run). When absent, everything the test runner reads
    /// or runs before the first test ([`runner::default_protect`]): every
    /// `conftest.py`, pytest's configuration files, `sitecustomize.py`, distribution
    /// metadata, and the `__init__.py` of the test files' directories.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protect: Option<Vec<String>>,
}

fn default_timeout() -> u64 {
    1_800_000
}

impl SweGrader {
    /// Checks the settings against the task's sandbox spec; `prefix` is the grader's
    /// path in the spec.
    pub fn validate(&self, prefix: &str, sandbox: &SandboxSpec) -> Result<(), SpecError> {
        let i = &self.instance;
        let field = |f: &str| format!("{prefix}.instance.{f}");
        if i.base_commit.trim().is_empty() {
            return Err(SpecError::new(field("base_commit"), "must not be empty"));
        }
        if i.fail_to_pass.is_empty() {
            return Err(SpecError::new(
                field("FAIL_TO_PASS"),
                "names no test: an instance needs at least one test the fix makes pass",
            ));
        }
        if swe::patch_paths(&i.test_patch).is_empty() {
            return Err(SpecError::new(
                field("test_patch"),
                "touches no file: give the unified diff that adds the instance's tests",
            ));
        }
        if let Some(r) = &sandbox.repo
            && let Some(c) = &r.commit
            && !same_commit(c, &i.base_commit)
        {
            return Err(SpecError::new(
                "sandbox.repo.commit",
                format!(
                    "is `{c}` but the instance's base_commit is `{}`: leave it out (the grader checks out base_commit) or make them agree",
                    i.base_commit
                ),
            ));
        }
        if sandbox.repo.is_none() && self.repo_url.is_none() && !i.repo.contains('/') {
            return Err(SpecError::new(
                field("repo"),
                "must be `owner/name`, or give grader.repo_url or sandbox.repo",
            ));
        }
        if self
            .test_command
            .as_deref()
            .is_some_and(|c| c.trim().is_empty())
        {
            return Err(SpecError::new(
                format!("{prefix}.test_command"),
                "must not be empty",
            ));
        }
        let parser = self.parser();
        super::check_log_parser(prefix, &parser)?;
        swe_repos::parseable(&parser, &i.fail_to_pass, &i.pass_to_pass).map_err(|why| {
            SpecError::new(
                field("FAIL_TO_PASS"),
                format!("the `{parser}` log parser cannot report these tests: {why}"),
            )
        })?;
        if self.timeout_ms == 0 {
            return Err(SpecError::new(
                format!("{prefix}.timeout_ms"),
                "must be positive",
            ));
        }
        sandboxed::check_protect(prefix, self.protect.as_deref().unwrap_or_default())
    }

    /// The instance's `version`, as SWE-bench's specs key it.
    fn version(&self) -> Option<String> {
        match self.instance.other.get("version")? {
            serde_json::Value::String(v) => Some(v.clone()),
            serde_json::Value::Number(n) => Some(n.to_string()),
            _ => None,
        }
    }

    /// The log parser: the task's, else SWE-bench's for the repository.
    fn parser(&self) -> String {
        self.log_parser.clone().unwrap_or_else(|| {
            swe_repos::defaults(&self.instance.repo, self.version().as_deref())
                .log_parser
                .to_string()
        })
    }

    /// The test command with `{tests}` filled in, after the commands SWE-bench runs
    /// before it for the repository (a locale for Django's older versions).
    fn command(&self) -> String {
        let repo = &self.instance.repo;
        let defaults = swe_repos::defaults(repo, self.version().as_deref());
        let template = self
            .test_command
            .as_deref()
            .unwrap_or(&defaults.test_command);
        let directives = swe_repos::test_directives(repo, &self.instance.test_patch);
        let mut command = String::new();
        for line in &defaults.eval_setup {
            command.push_str(line);
            command.push('\n');
        }
        command.push_str(&swe_repos::fill_command(template, &directives));
        command
    }
}

/// The scripts in a repository that start its test runner (SWE-bench runs them as the
/// test command): protected by default, or a patch could make them print a passing run.
/// Where the runner's machinery is itself part of the code under test (Django's
/// `django.test`, sympy's `sympy.testing`, pytest's own repository), it cannot be
/// protected: the README's threat model says so.
fn runner_scripts(repo: &str) -> &'static [&'static str] {
    match repo.to_ascii_lowercase().as_str() {
        "django/django" => &["tests/runtests.py"],
        "sympy/sympy" => &["bin/test"],
        _ => &[],
    }
}

/// Whether two commit names are the same commit as far as the spec can tell (one a
/// prefix of the other, at least 7 characters).
fn same_commit(a: &str, b: &str) -> bool {
    let (a, b) = (a.trim(), b.trim());
    a == b || (a.len().min(b.len()) >= 7 && (a.starts_with(b) || b.starts_with(a)))
}

/// The task's sandbox spec with the instance's repository at `base_commit`: the spec's
/// own `repo` (its commit defaulting to `base_commit`), else `repo_url`, else GitHub.
pub fn sandbox_for(spec: &SandboxSpec, g: &SweGrader) -> SandboxSpec {
    let mut spec = spec.clone();
    let base = g.instance.base_commit.clone();
    match &mut spec.repo {
        Some(r) => {
            r.commit.get_or_insert(base);
        }
        None => {
            spec.repo = Some(RepoSpec {
                url: g
                    .repo_url
                    .clone()
                    .unwrap_or_else(|| format!("https://github.com/{}.git", g.instance.repo)),
                commit: Some(base),
            });
        }
    }
    if spec.image.is_none() {
        spec.image.clone_from(&g.instance.image);
    }
    spec
}

/// EVAL: the episode's diff, the test files put back and the test patch applied, the
/// tests run and read.
pub async fn grade(
    sandboxes: &NodeSandboxes,
    ctx: &StageContext,
    spec: &SandboxSpec,
    g: &SweGrader,
    env: BTreeMap<String, String>,
) -> Result<EvalOutput, StageError> {
    let touched = swe::patch_paths(&g.instance.test_patch);
    let mut protect: Vec<String> = touched.iter().map(|p| globset::escape(p)).collect();
    match &g.protect {
        Some(p) => protect.extend(p.iter().cloned()),
        None => {
            protect.extend(runner::default_protect(touched.iter().map(String::as_str)));
            protect.extend(
                runner_scripts(&g.instance.repo)
                    .iter()
                    .map(|s| s.to_string()),
            );
        }
    }
    let guard = Guard::new(touched.iter().cloned());
    let setup = EvalSetup {
        env,
        protect,
        files: BTreeMap::from([(TEST_PATCH_PATH.to_string(), g.instance.test_patch.clone())]),
        probe: Some(format!("{}\n{}", runner::PLUGIN_PROBE, guard.probe())),
    };
    let sandbox = sandbox_for(spec, g);
    let g = g.clone();
    let score: Scorer = Box::new(move |client, prepared| {
        Box::pin(async move { run(client, &g, &guard, touched, prepared).await })
    });
    sandboxed::in_fresh_sandbox(sandboxes, ctx, &sandbox, setup, score).await
}

/// Applies the test patch in the prepared sandbox, runs the tests, and judges them.
async fn run(
    client: &SandboxClient,
    g: &SweGrader,
    guard: &Guard,
    touched: Vec<String>,
    prepared: Prepared,
) -> Result<EvalOutput, StageError> {
    let plugins = runner::plugins(prepared.probe.as_ref());
    let base = serde_json::json!({
        "instance_id": g.instance.instance_id,
        "test_patch_files": touched,
        "applied": prepared.applied,
        "plugins": plugins,
    });
    let mut guarded = match super::guard_before(client, guard, &prepared).await? {
        Ok(report) => report,
        Err(mut zeroed) => {
            merge(&mut zeroed.details, base);
            return Ok(zeroed);
        }
    };
    let patched = exec(
        client,
        format!(
            "git apply --binary --whitespace=nowarn {TEST_PATCH_PATH} 2>&1; s=$?; rm -f {TEST_PATCH_PATH}; exit $s"
        ),
        64 * 1024,
        Duration::from_secs(120),
    )
    .await?;
    if patched.exit_code != Some(0) {
        let mut out = sandboxed::zero(format!(
            "the test patch does not apply over the agent's changes: {}",
            patched.output.trim()
        ));
        merge(&mut out.details, base);
        return Ok(out);
    }
    let command = g.command();
    let parser = g.parser();
    let seal = Seal::for_parser(&parser).in_dir(guard.dir());
    let sealed = seal
        .install(client, &prepared.job_id)
        .await
        .then_some(&seal);
    let ran = exec(
        client,
        format!(
            "{} 2>&1",
            runner::hardened(
                &format!("( {command} )"),
                &plugins,
                &guard.prefix(&guarded),
                sealed
            )
        ),
        LOG_READ_BYTES,
        Duration::from_millis(g.timeout_ms),
    )
    .await?;
    guard.after_run(client, &ran.output, &mut guarded).await;
    let reading = seal.read(&ran.output, &parser);
    let mut report = logs::parse(&parser, reading.for_parser()).unwrap_or_default();
    let log = reading.log;
    report.exit_code = ran.exit_code;
    report.doubts.splice(0..0, reading.doubt);
    let verdict = swe::verdict(&g.instance, &report);
    let failure = match (&verdict.failure, ran.timed_out) {
        _ if guarded.failure().is_some() => guarded.failure(),
        (Some(f), true) => Some(format!("the tests timed out: {f}")),
        (f, _) => f.clone(),
    };
    let resolved = verdict.resolved && guarded.failure().is_none();
    let tail_from = log.floor_char_boundary(log.len().saturating_sub(LOG_TAIL_BYTES));
    let mut details = serde_json::to_value(&verdict).unwrap_or_default();
    details["failure"] = failure.into();
    details["command"] = command.into();
    details["log_parser"] = parser.into();
    details["summary"] = report.summary.as_ref().map(|s| s.line.clone()).into();
    details["seal"] = reading.state.into();
    details["exit_code"] = ran.exit_code.into();
    details["timed_out"] = ran.timed_out.into();
    details["log_tail"] = log[tail_from..].into();
    details["resolved"] = resolved.into();
    details["guard"] = serde_json::to_value(&guarded).unwrap_or_default();
    merge(&mut details, base);
    Ok(EvalOutput {
        reward: f64::from(u8::from(resolved)),
        details,
    })
}

/// Adds `extra`'s fields to `details`.
fn merge(details: &mut serde_json::Value, extra: serde_json::Value) {
    if let (Some(d), serde_json::Value::Object(e)) = (details.as_object_mut(), extra) {
        d.extend(e);
    }
}

/// Runs `command` in the sandbox (not through the agent's shell state).
async fn exec(
    client: &SandboxClient,
    command: String,
    max_output: usize,
    timeout: Duration,
) -> Result<crate::sandbox::protocol::ExecResult, StageError> {
    client
        .exec(
            &ExecArgs {
                env: Default::default(),
                command,
                max_output_bytes: Some(max_output),
                shell_state: true,
                printable: true,
            },
            Some(timeout),
        )
        .await
        .map_err(|e| sandboxed::stage_error("the SWE grader's command could not run", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grader(extra: serde_json::Value) -> SweGrader {
        let mut v = serde_json::json!({"instance": {
            "instance_id": "o__r-1", "repo": "o/r", "base_commit": "0123456789abcdef",
            "test_patch": "diff --git a/t/test_a.py b/t/test_a.py\n--- a/t/test_a.py\n+++ b/t/test_a.py\n@@ -1 +1 @@\n-a\n+b\n",
            "FAIL_TO_PASS": ["t/test_a.py::test_x"],
        }});
        if let (Some(o), serde_json::Value::Object(e)) = (v.as_object_mut(), extra) {
            o.extend(e);
        }
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn the_sandbox_gets_the_repository_at_base_commit() {
        let g = grader(serde_json::json!({"repo_url": "/srv/mirrors/r"}));
        let s = sandbox_for(&SandboxSpec::default(), &g);
        assert_eq!(
            s.repo,
            Some(RepoSpec {
                url: "/srv/mirrors/r".into(),
                commit: Some("0123456789abcdef".into())
            })
        );
        let own = SandboxSpec {
            repo: Some(RepoSpec {
                url: "/elsewhere".into(),
                commit: None,
            }),
            ..Default::default()
        };
        let s = sandbox_for(&own, &grader(serde_json::json!({})));
        assert_eq!(s.repo.unwrap().commit.as_deref(), Some("0123456789abcdef"));
        let s = sandbox_for(&SandboxSpec::default(), &grader(serde_json::json!({})));
        assert_eq!(s.repo.unwrap().url, "https://github.com/o/r.git");
        assert_eq!(
            grader(serde_json::json!({})).command(),
            "python3 -m pytest -rA -p no:cacheprovider 't/test_a.py'"
        );
    }

    #[test]
    fn a_sandbox_at_another_commit_is_refused() {
        let g = grader(serde_json::json!({}));
        let at = |c: &str| SandboxSpec {
            repo: Some(RepoSpec {
                url: "/r".into(),
                commit: Some(c.into()),
            }),
            ..Default::default()
        };
        assert!(g.validate("grader", &at("0123456")).is_ok());
        let e = g.validate("grader", &at("fedcba9876")).unwrap_err();
        assert_eq!(e.path, "sandbox.repo.commit");
        let mut none = g.clone();
        none.instance.fail_to_pass.clear();
        assert_eq!(
            none.validate("grader", &at("0123456")).unwrap_err().path,
            "grader.instance.FAIL_TO_PASS"
        );
    }
}
