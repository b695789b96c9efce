//! A task's grader: what EVAL does with a finished episode to give it a reward and
//! say why, named by `type` in the task's `grader`:
//!
//! - `command` (the same as the older `check` field): a shell command in a fresh
//!   sandbox holding the agent's changes; exit status 0 is reward 1.
//! - `math`: the final answer of the episode (the `finish` tool's answer, else the last
//!   model text after any `<think>` block; for `shell` tasks the last step's output)
//!   compared with `answer` by [`crate::graders::math`], in the EVAL worker's own
//!   process: no sandbox, well under a millisecond.
//! - `code`: the program the agent wrote (a workspace file, or the last fenced code
//!   block of its answer written to `program.path`) run in a fresh sandbox against
//!   stdin/stdout `cases`, each under `time_limit_ms` and `memory_limit_mb`, and/or
//!   unit-test files run by `test_command` with the results read from its log; reward
//!   all-pass (1 or 0) or the fraction passed, the first failure's diff in `details`.
//! - `swe`: a SWE-bench instance's tests run over the agent's patch in a fresh sandbox,
//!   the test files put back first; 1 iff every named test passes ([`swe_eval`]).
//!
//! A bad answer or a hostile program is never a failed job: it gets reward 0 with the
//! reason in `details`.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub mod guard;
pub mod runner;
pub mod seal;
pub mod swe_eval;

use crate::graders::code::{
    OutputMatch, first_difference, last_code_block, output_matches, verdict_of_run,
};
use crate::graders::{logs, math};
use crate::sandbox::client::SandboxClient;
use crate::sandbox::protocol::ExecArgs;
use crate::sandbox::{NodeSandboxes, SandboxSpec};
use crate::stage::sandboxed::{self, Check, EvalSetup, Scorer};
use crate::stage::{EvalOutput, SpecError, StageContext, StageError};
use guard::Guard;

/// A grader, by `type`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Grader {
    /// Exit status of a command in a fresh sandbox.
    Command(Check),
    /// A math answer against the ground truth.
    Math(MathGrader),
    /// A program against test cases and/or unit tests.
    Code(CodeGrader),
    /// A repository patch against a SWE-bench instance's tests.
    Swe(swe_eval::SweGrader),
}

/// The `math` grader's settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MathGrader {
    /// The ground truth as a dataset writes it: `\frac{1}{2}`, `(1, 2)`, `x \le 3`, `B`.
    pub answer: String,
}

/// The `code` grader's settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CodeGrader {
    /// The command that runs the program on one case, reading stdin and writing stdout
    /// (`python3 solution.py`); needed with `cases`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
    /// Stdin/stdout cases.
    #[serde(default)]
    pub cases: Vec<IoCase>,
    /// How a case's output is compared: `tokens` (default), `lines` or `exact`.
    #[serde(default)]
    pub output_match: OutputMatch,
    /// Unit-test files written into the workspace after the agent's changes (relative
    /// path → content), replacing whatever the agent put there.
    #[serde(default)]
    pub tests: BTreeMap<String, String>,
    /// The command that runs the unit tests (`python3 -m pytest -rA tests`); its log is
    /// read by `log_parser`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_command: Option<String>,
    /// The log parser for `test_command`'s output (`pytest`).
    #[serde(default = "default_log_parser")]
    pub log_parser: String,
    /// Take the program from the answer's last fenced code block instead of the
    /// workspace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub program: Option<ProgramFromAnswer>,
    /// Time limit of one case (ms).
    #[serde(default = "default_time_limit")]
    pub time_limit_ms: u64,
    /// Time limit of the whole `test_command` (ms).
    #[serde(default = "default_test_timeout")]
    pub test_timeout_ms: u64,
    /// Address-space limit of the program (MiB), per case and for the tests.
    #[serde(default = "default_memory_limit")]
    pub memory_limit_mb: u64,
    /// `all` (1 when every case and test passes, else 0) or `fraction` (the share that
    /// pass).
    #[serde(default)]
    pub reward: RewardMode,
    /// Workspace globs the agent's changes may not alter (restored before grading).
    /// When absent, the test runner's configuration and start-up files
    /// ([`runner::default_protect`]: every `conftest.py`, pytest's configuration files,
    /// the `__init__.py` of the test files' directories, …); a list given here replaces
    /// that default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protect: Option<Vec<String>>,
}

fn default_log_parser() -> String {
    "pytest".into()
}
fn default_time_limit() -> u64 {
    2_000
}
fn default_test_timeout() -> u64 {
    60_000
}
fn default_memory_limit() -> u64 {
    512
}

/// One stdin/stdout case.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IoCase {
    /// A name for `details` (its index when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The program's standard input.
    #[serde(default)]
    pub stdin: String,
    /// The expected standard output. Never written into the sandbox.
    pub stdout: String,
}

/// Where a program written in the answer goes.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProgramFromAnswer {
    /// Workspace path the code block is written to (`solution.py`).
    pub path: String,
    /// The block's language tag to prefer (`python`); any block when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
}

/// How passing cases become a reward.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RewardMode {
    /// 1 when everything passes, else 0.
    #[default]
    All,
    /// The fraction that passes.
    Fraction,
}

/// A task's grader from its `check` (a command, the older spelling) or `grader`: one
/// of the two, checked at submit time.
fn chosen(check: Option<&Check>, grader: Option<&Grader>) -> Result<Grader, SpecError> {
    match (check, grader) {
        (Some(c), None) => Ok(Grader::Command(c.clone())),
        (None, Some(g)) => Ok(g.clone()),
        (Some(_), Some(_)) => Err(SpecError::new(
            "grader",
            "give either `check` (a command) or `grader`, not both",
        )),
        (None, None) => Err(SpecError::new(
            "grader",
            "missing: give `grader` ({\"type\": \"math\" | \"code\" | \"swe\" | \"command\", ...}) or `check`",
        )),
    }
}

/// Submit-time check of a task's grading: one of `check` and `grader`, and its settings
/// against the task's `sandbox` (errors name `check.…` or `grader.…`).
pub fn validate_choice(
    check: Option<&Check>,
    grader: Option<&Grader>,
    sandbox: &SandboxSpec,
) -> Result<(), SpecError> {
    let prefix = if check.is_some() { "check" } else { "grader" };
    chosen(check, grader)?.validate(prefix, sandbox)
}

/// The sandbox INIT starts for a task: its `sandbox` spec, with the repository of a
/// `swe` grader's instance checked out at its `base_commit`.
pub fn sandbox_for(spec: &SandboxSpec, grader: Option<&Grader>) -> SandboxSpec {
    match grader {
        Some(Grader::Swe(g)) => swe_eval::sandbox_for(spec, g),
        _ => spec.clone(),
    }
}

/// The grader EVAL uses; a spec that names none (checked at submit, so only a stored
/// job from an older version) fails the job.
pub fn for_eval(check: Option<&Check>, grader: Option<&Grader>) -> Result<Grader, StageError> {
    chosen(check, grader).map_err(|e| StageError::Failed(format!("bad spec: {e}")))
}

impl Grader {
    /// Checks the settings (against the task's `sandbox`); `prefix` is the field's path
    /// in the spec.
    pub fn validate(&self, prefix: &str, sandbox: &SandboxSpec) -> Result<(), SpecError> {
        match self {
            Grader::Command(c) => c.validate(prefix),
            Grader::Math(m) => {
                if m.answer.trim().is_empty() {
                    return Err(SpecError::new(
                        format!("{prefix}.answer"),
                        "must not be empty",
                    ));
                }
                Ok(())
            }
            Grader::Code(c) => c.validate(prefix),
            Grader::Swe(g) => g.validate(prefix, sandbox),
        }
    }

    /// Its `type`, for logs and `details`.
    pub fn kind(&self) -> &'static str {
        match self {
            Grader::Command(_) => "command",
            Grader::Math(_) => "math",
            Grader::Code(_) => "code",
            Grader::Swe(_) => "swe",
        }
    }
}

impl CodeGrader {
    fn validate(&self, prefix: &str) -> Result<(), SpecError> {
        if self.cases.is_empty() && self.test_command.is_none() {
            return Err(SpecError::new(
                format!("{prefix}.cases"),
                "give stdin/stdout `cases`, a `test_command` (with `tests`), or both",
            ));
        }
        if !self.cases.is_empty() && self.run.as_deref().is_none_or(|r| r.trim().is_empty()) {
            return Err(SpecError::new(
                format!("{prefix}.run"),
                "needed with `cases`: the command that runs the program (`python3 solution.py`)",
            ));
        }
        if !self.tests.is_empty() && self.test_command.is_none() {
            return Err(SpecError::new(
                format!("{prefix}.test_command"),
                "needed with `tests`: the command that runs them",
            ));
        }
        check_log_parser(prefix, &self.log_parser)?;
        if self.time_limit_ms == 0 || self.test_timeout_ms == 0 || self.memory_limit_mb == 0 {
            return Err(SpecError::new(
                format!("{prefix}.time_limit_ms"),
                "limits must be positive",
            ));
        }
        crate::sandbox::spec::check_file_paths(&format!("{prefix}.tests"), self.tests.keys())?;
        if let Some(p) = &self.program {
            crate::sandbox::spec::check_file_paths(
                &format!("{prefix}.program.path"),
                std::iter::once(&p.path),
            )?;
        }
        sandboxed::check_protect(prefix, self.protect.as_deref().unwrap_or_default())
    }
}

/// What an episode said last, for the graders that read it (`math`, and `code` taking
/// its program from the answer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The text.
    pub text: String,
    /// Whether the text is the final answer itself (the `finish` tool's answer) rather
    /// than a response the answer is to be found in: a bare `0.5` given to `finish` is
    /// an answer, the same words ending a chat turn are not a marked one.
    pub is_answer: bool,
}

/// Checks `prefix.log_parser` names a parser of [`logs::PARSERS`] (the code and SWE
/// graders').
fn check_log_parser(prefix: &str, name: &str) -> Result<(), SpecError> {
    if logs::canonical(name).is_some() {
        return Ok(());
    }
    Err(SpecError::new(
        format!("{prefix}.log_parser"),
        format!("unknown parser `{name}`: use one of {:?}", logs::PARSERS),
    ))
}

/// The response a math grader reads from an agent episode's RUN output: the `finish`
/// tool's answer, else the last turn's text after its thinking. A turn cut off inside
/// its thinking has said nothing final: an answer boxed while thinking is not one.
pub fn agent_response(run: Option<&serde_json::Value>) -> Option<Response> {
    let run = run?;
    if let Some(a) = run["answer"].as_str() {
        return Some(Response {
            text: a.to_string(),
            is_answer: true,
        });
    }
    let text = run["turns"].as_array()?.last()?["text"].as_str()?;
    let text = match (text.rfind("</think>"), text.contains("<think>")) {
        (Some(at), _) => text[at + "</think>".len()..].to_string(),
        (None, true) => String::new(),
        (None, false) => text.to_string(),
    };
    Some(Response {
        text,
        is_answer: false,
    })
}

/// EVAL with `grader`: `response` is the episode's final text (for `math`, and for
/// `code` taking its program from the answer); `env` is added to the sandbox's.
pub async fn eval(
    sandboxes: &NodeSandboxes,
    ctx: &StageContext,
    spec: &SandboxSpec,
    grader: &Grader,
    response: Option<Response>,
    env: BTreeMap<String, String>,
) -> Result<EvalOutput, StageError> {
    if let Some(why) = sandboxed::sandbox_ended(&ctx.job) {
        let mut out = sandboxed::zero(why.to_string());
        out.details["grader"] = grader.kind().into();
        return Ok(out);
    }
    let mut out = match grader {
        Grader::Command(check) => grade_command(sandboxes, ctx, spec, check, env).await?,
        Grader::Math(m) => grade_math(m, response.as_ref()),
        Grader::Code(c) => {
            let text = response.as_ref().map(|r| r.text.as_str());
            grade_code(sandboxes, ctx, spec, c, text, env).await?
        }
        Grader::Swe(g) => swe_eval::grade(sandboxes, ctx, spec, g, env).await?,
    };
    out.details["grader"] = grader.kind().into();
    Ok(out)
}

/// The `command` grader: [`sandboxed::in_fresh_sandbox`] with the import guard
/// ([`guard`]: the check's hidden `files` count as the workspace's own), then the
/// kernel-reported exit status of `check` is the reward; a module the guard refused
/// makes it 0.
async fn grade_command(
    sandboxes: &NodeSandboxes,
    ctx: &StageContext,
    spec: &SandboxSpec,
    check: &Check,
    env: BTreeMap<String, String>,
) -> Result<EvalOutput, StageError> {
    let guard = Guard::new(check.files.keys().cloned());
    let setup = EvalSetup {
        env,
        protect: check.protect.clone(),
        files: check.files.clone(),
        probe: Some(guard.probe()),
    };
    let check = check.clone();
    let score: Scorer = Box::new(move |client, prepared| {
        Box::pin(async move { run_check(client, &check, &guard, prepared).await })
    });
    sandboxed::in_fresh_sandbox(sandboxes, ctx, spec, setup, score).await
}

/// Runs the check command in a prepared EVAL sandbox, under the import guard.
async fn run_check(
    client: &SandboxClient,
    check: &Check,
    guard: &Guard,
    prepared: sandboxed::Prepared,
) -> Result<EvalOutput, StageError> {
    let mut report = match guard_before(client, guard, &prepared).await? {
        Ok(report) => report,
        Err(zeroed) => return Ok(zeroed),
    };
    let r = client
        .exec(
            &ExecArgs {
                env: Default::default(),
                command: format!("{}{}", guard.prefix(&report), check.command),
                max_output_bytes: None,
                shell_state: true,
                printable: false,
            },
            Some(Duration::from_millis(check.timeout_ms)),
        )
        .await
        .map_err(|e| sandboxed::stage_error("the check command could not run", e))?;
    guard.after_run(client, &r.output, &mut report).await;
    let failure = match (r.timed_out, r.exit_code, r.signal) {
        _ if report.failure().is_some() => report.failure(),
        (true, _, _) => Some(format!("the check timed out after {} ms", check.timeout_ms)),
        (false, Some(0), _) => None,
        (false, Some(code), _) => Some(format!("the check exited with status {code}")),
        (false, None, Some(sig)) => Some(format!("the check was killed by signal {sig}")),
        (false, None, None) => Some("the check did not report an exit status".to_string()),
    };
    Ok(EvalOutput {
        reward: if failure.is_none() { 1.0 } else { 0.0 },
        details: serde_json::json!({
            "failure": failure,
            "exit_code": r.exit_code,
            "signal": r.signal,
            "timed_out": r.timed_out,
            "output": r.output,
            "applied": prepared.applied,
            "guard": report,
        }),
    })
}

/// The code grader: the program from the answer (when `program` says so), the cases'
/// inputs and the test files written after the agent's changes, then the cases and tests
/// run in the fresh sandbox.
async fn grade_code(
    sandboxes: &NodeSandboxes,
    ctx: &StageContext,
    spec: &SandboxSpec,
    c: &CodeGrader,
    response: Option<&str>,
    env: BTreeMap<String, String>,
) -> Result<EvalOutput, StageError> {
    let mut files = c.tests.clone();
    if let Some(p) = &c.program {
        let Some(code) = response.and_then(|r| last_code_block(r, p.language.as_deref())) else {
            return Ok(sandboxed::zero(
                "the answer holds no closed fenced code block to run".into(),
            ));
        };
        files.insert(p.path.clone(), code);
    }
    for (i, case) in c.cases.iter().enumerate() {
        files.insert(input_path(i), case.stdin.clone());
    }
    let protect = c
        .protect
        .clone()
        .unwrap_or_else(|| runner::default_protect(c.tests.keys().map(String::as_str)));
    let guard = Guard::new(files.keys().cloned());
    let probe = match c.test_command {
        Some(_) => format!("{}\n{}", runner::PLUGIN_PROBE, guard.probe()),
        None => guard.probe(),
    };
    let setup = EvalSetup {
        env,
        protect,
        files,
        probe: Some(probe),
    };
    let c = c.clone();
    let score: Scorer = Box::new(move |client, prepared| {
        Box::pin(async move { run_code(client, &c, &guard, prepared).await })
    });
    sandboxed::in_fresh_sandbox(sandboxes, ctx, spec, setup, score).await
}

fn grade_math(m: &MathGrader, response: Option<&Response>) -> EvalOutput {
    let Some(response) = response else {
        return sandboxed::zero("the episode produced no final text to grade".into());
    };
    let verdict = if response.is_answer {
        math::grade_answer(&response.text, &m.answer)
    } else {
        math::grade(&response.text, &m.answer)
    };
    EvalOutput {
        reward: if verdict.correct { 1.0 } else { 0.0 },
        details: serde_json::to_value(&verdict).unwrap_or_default(),
    }
}

/// Where case `i`'s input is written in the workspace.
fn input_path(i: usize) -> String {
    format!(".grader/case-{i}.in")
}

/// `command` under the memory limit (`ulimit -v`), with `redirects` (`< in 2> err`).
fn limited(command: &str, memory_mb: u64, redirects: &str) -> String {
    let kb = memory_mb.saturating_mul(1024);
    format!("ulimit -v {kb} 2>/dev/null; ( {command} ) {redirects}")
}

/// Running totals of a code grade.
#[derive(Default)]
struct Tally {
    passed: usize,
    total: usize,
    /// The first failure, in words.
    failure: Option<String>,
}

impl Tally {
    fn fail(&mut self, why: impl FnOnce() -> String) {
        self.failure.get_or_insert_with(why);
    }
}

async fn run_code(
    client: &SandboxClient,
    c: &CodeGrader,
    guard: &Guard,
    prepared: sandboxed::Prepared,
) -> Result<EvalOutput, StageError> {
    let mut report = match guard_before(client, guard, &prepared).await? {
        Ok(report) => report,
        Err(zeroed) => return Ok(zeroed),
    };
    let applied = prepared.applied;
    let prefix = guard.prefix(&report);
    let mut tally = Tally::default();
    let mut cases = Vec::new();
    for (i, case) in c.cases.iter().enumerate() {
        let name = case.name.clone().unwrap_or_else(|| format!("case {i}"));
        tally.total += 1;
        if tally.failure.is_some() && c.reward == RewardMode::All {
            cases.push(serde_json::json!({"name": name, "skipped": "an earlier case failed"}));
            continue;
        }
        cases.push(run_case(client, c, i, case, &name, &prefix, &mut tally).await?);
    }
    let tests = match &c.test_command {
        Some(_) if tally.failure.is_some() && c.reward == RewardMode::All => {
            serde_json::json!({"skipped": "a case failed"})
        }
        Some(cmd) => {
            let plugins = runner::plugins(prepared.probe.as_ref());
            let run = TestRun {
                command: cmd,
                plugins: &plugins,
                guard,
                prefix: &prefix,
                job_id: &prepared.job_id,
            };
            run_tests(client, c, run, &mut tally).await?
        }
        None => serde_json::Value::Null,
    };
    guard
        .after_run(
            client,
            tests["log"].as_str().unwrap_or_default(),
            &mut report,
        )
        .await;
    if let Some(why) = report.failure() {
        tally.total = tally.total.max(1);
        tally.passed = 0;
        tally.failure = Some(why);
    }
    let reward = match c.reward {
        RewardMode::All => f64::from(u8::from(tally.failure.is_none() && tally.total > 0)),
        RewardMode::Fraction if tally.total > 0 => tally.passed as f64 / tally.total as f64,
        RewardMode::Fraction => 0.0,
    };
    Ok(EvalOutput {
        reward,
        details: serde_json::json!({
            "passed": tally.passed,
            "total": tally.total,
            "failure": tally.failure,
            "cases": cases,
            "tests": tests,
            "applied": applied,
            "guard": report,
        }),
    })
}

/// The import guard's steps before a graded run ([`guard`]): its sweep of the applied
/// changes and, when the sandbox has a Python, its bootstrap written. The report, or
/// the 0 to give when the changes add a module the run may not load.
async fn guard_before(
    client: &SandboxClient,
    guard: &Guard,
    prepared: &sandboxed::Prepared,
) -> Result<Result<guard::Report, EvalOutput>, StageError> {
    let report = guard
        .sweep(client, Guard::python(prepared.probe.as_ref()))
        .await?;
    if let Some(why) = report.failure() {
        let mut out = sandboxed::zero(why);
        out.details["guard"] = serde_json::to_value(&report).unwrap_or_default();
        out.details["applied"] = prepared.applied.clone();
        return Ok(Err(out));
    }
    if report.python.is_some() {
        guard.install_bootstrap(client).await?;
    }
    Ok(Ok(report))
}

/// Runs case `i` under the limits and judges its output: its entry for `details`.
async fn run_case(
    client: &SandboxClient,
    c: &CodeGrader,
    i: usize,
    case: &IoCase,
    name: &str,
    guard: &str,
    tally: &mut Tally,
) -> Result<serde_json::Value, StageError> {
    let err_path = format!(".grader/case-{i}.err");
    let run = c.run.as_deref().unwrap_or_default();
    // Enough for the expected output and some; more means wrong, without shipping it.
    let cap = case.stdout.len().saturating_mul(2).saturating_add(4096);
    let r = client
        .exec(
            &ExecArgs {
                env: Default::default(),
                command: format!(
                    "{guard}{}",
                    limited(
                        run,
                        c.memory_limit_mb,
                        &format!("< {} 2> {err_path}", input_path(i)),
                    )
                ),
                max_output_bytes: Some(cap),
                shell_state: true,
                printable: false,
            },
            Some(Duration::from_millis(c.time_limit_ms)),
        )
        .await
        .map_err(|e| sandboxed::stage_error("a test case could not run", e))?;
    let stderr = if r.exit_code == Some(0) && !r.timed_out {
        String::new()
    } else {
        tail(client, &err_path).await
    };
    let why = match verdict_of_run(r.exit_code, r.signal, r.timed_out, &stderr) {
        Some(v) => Some(v.to_string()),
        None if r.omitted_bytes > 0 => Some("output far longer than expected".into()),
        None if output_matches(&case.stdout, &r.output, c.output_match) => None,
        None => Some(format!(
            "wrong answer: {}",
            first_difference(&case.stdout, &r.output)
        )),
    };
    let ms = r.elapsed_us / 1000;
    Ok(match why {
        None => {
            tally.passed += 1;
            serde_json::json!({"name": name, "passed": true, "ms": ms})
        }
        Some(why) => {
            tally.fail(|| format!("{name}: {why}"));
            serde_json::json!({
                "name": name, "passed": false, "verdict": why, "ms": ms,
                "exit_code": r.exit_code, "signal": r.signal, "stderr": stderr,
            })
        }
    })
}

/// A code grader's unit-test run: its command, the environment's pytest plugins, and
/// the import guard it runs under (`prefix` is the guard's environment line).
struct TestRun<'a> {
    command: &'a str,
    plugins: &'a [String],
    guard: &'a Guard,
    prefix: &'a str,
    job_id: &'a str,
}

/// How much of a test run's output the code grader reads (head and tail).
const TEST_LOG_BYTES: usize = 4 * 1024 * 1024;

/// Runs the unit tests (with the runner [`runner::hardened`]) and reads their results
/// from the log: its entry for `details`. The log must be evidence: the runner's own
/// summary there and agreeing with the per-test lines, no test reported with two
/// outcomes, and, when the task gave the test files, no test the files do not define.
/// A log that fails any of that, or names no test, is one failure with the reason.
async fn run_tests(
    client: &SandboxClient,
    c: &CodeGrader,
    run: TestRun<'_>,
    tally: &mut Tally,
) -> Result<serde_json::Value, StageError> {
    let TestRun {
        command: cmd,
        plugins,
        guard,
        prefix,
        job_id,
    } = run;
    let seal = seal::Seal::for_parser(&c.log_parser).in_dir(guard.dir());
    let sealed = seal.install(client, job_id).await.then_some(&seal);
    let r = client
        .exec(
            &ExecArgs {
                env: Default::default(),
                command: limited(
                    &runner::hardened(cmd, plugins, prefix, sealed),
                    c.memory_limit_mb,
                    "2>&1",
                ),
                max_output_bytes: Some(TEST_LOG_BYTES),
                shell_state: true,
                printable: true,
            },
            Some(Duration::from_millis(c.test_timeout_ms)),
        )
        .await
        .map_err(|e| sandboxed::stage_error("the test command could not run", e))?;
    let reading = seal.read(&r.output, &c.log_parser);
    let mut report = logs::parse(&c.log_parser, reading.for_parser()).unwrap_or_default();
    report.exit_code = r.exit_code;
    report.doubts.splice(0..0, reading.doubt);
    let unknown = unknown_tests(&c.tests, report.results.keys());
    let distrust = report.distrust().or_else(|| {
        (!unknown.is_empty()).then(|| {
            format!(
                "the log names tests the task's test files do not define: {}",
                list(&unknown)
            )
        })
    });
    let failed: Vec<&String> = report
        .results
        .iter()
        .filter(|(_, s)| !s.passed() && **s != logs::TestStatus::Skipped)
        .map(|(n, _)| n)
        .collect();
    let ok = report.results.values().filter(|s| s.passed()).count();
    if let Some(why) = &distrust {
        tally.total += 1;
        tally.fail(|| format!("the test log cannot be trusted: {why}"));
    } else if ok + failed.len() == 0 {
        tally.total += 1;
        tally.fail(|| {
            if r.timed_out {
                "the tests timed out before reporting a result".into()
            } else {
                "the test log reports no test results (did the program end the test run?)".into()
            }
        });
    } else {
        tally.total += ok + failed.len();
        tally.passed += ok;
        if let Some(f) = failed.first() {
            tally.fail(|| format!("test {f} failed"));
        }
    }
    Ok(serde_json::json!({
        "results": report.results,
        "summary": report.summary.as_ref().map(|s| s.line.clone()),
        "distrust": distrust,
        "plugins": plugins,
        "seal": reading.state,
        "exit_code": r.exit_code,
        "timed_out": r.timed_out,
        "log": reading.log,
    }))
}

/// At most the first ten of `names`, comma-separated, with how many more there are.
fn list(names: &[String]) -> String {
    let mut out = names
        .iter()
        .take(10)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > 10 {
        out.push_str(&format!(" and {} more", names.len() - 10));
    }
    out
}

/// The reported test ids that the task's own test files (`tests`, path → source) do
/// not define: a pytest id's file must be one of them and each of its names (classes,
/// then the function, parameters aside) a `class` or `def` in that file; another
/// runner's id must start with a `def` of one of them; a file's own path (a module
/// that failed to import) is known. Empty when the task gave no test files (nothing to
/// know them by).
fn unknown_tests<'a>(
    tests: &BTreeMap<String, String>,
    reported: impl Iterator<Item = &'a String>,
) -> Vec<String> {
    if tests.is_empty() {
        return Vec::new();
    }
    let defined: BTreeMap<&str, std::collections::BTreeSet<&str>> = tests
        .iter()
        .map(|(path, source)| (path.trim_start_matches("./"), python_names(source)))
        .collect();
    let known = |id: &str| -> bool {
        if defined.contains_key(id.trim_start_matches("./")) {
            // A whole file (pytest's id of a module that failed to import).
            return true;
        }
        match id.split_once("::") {
            Some((file, rest)) => {
                let Some(names) = defined.get(file.trim_start_matches("./")) else {
                    return false;
                };
                let rest = rest.split('[').next().unwrap_or(rest);
                rest.split("::").all(|n| names.contains(n))
            }
            None => {
                let first = id.split([' ', '(', '.']).next().unwrap_or(id);
                defined.values().any(|names| names.contains(first))
            }
        }
    };
    reported.filter(|id| !known(id)).cloned().collect()
}

/// The names Python source defines with `def`/`async def`/`class` at any indentation.
fn python_names(source: &str) -> std::collections::BTreeSet<&str> {
    source
        .lines()
        .filter_map(|line| {
            let t = line.trim_start();
            let t = t.strip_prefix("async ").map(str::trim_start).unwrap_or(t);
            let rest = t
                .strip_prefix("def ")
                .or_else(|| t.strip_prefix("class "))?;
            let rest = rest.trim_start();
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            (end > 0).then(|| &rest[..end])
        })
        .collect()
}

/// The last 2 KiB of a file in the workspace (a case's stderr), or nothing.
async fn tail(client: &SandboxClient, path: &str) -> String {
    let args = ExecArgs {
        env: Default::default(),
        command: format!("tail -c 2048 {path} 2>/dev/null"),
        max_output_bytes: Some(4096),
        shell_state: false,
        printable: false,
    };
    match client.exec(&args, Some(Duration::from_secs(10))).await {
        Ok(r) => r.output,
        Err(_) => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_response_is_the_finish_answer_else_the_last_text_after_thinking() {
        let run = |answer: Option<&str>, last: &str| serde_json::json!({"answer": answer, "turns": [{"text": "\\boxed{1}"}, {"text": last}]});
        let r = |v: serde_json::Value| agent_response(Some(&v)).unwrap().text;
        let finish = agent_response(Some(&run(Some("42"), "x"))).unwrap();
        assert_eq!((finish.text.as_str(), finish.is_answer), ("42", true));
        // A bare answer given to finish is graded as the answer; ending a turn, it is not
        // a marked one.
        let m = MathGrader {
            answer: "\\frac12".into(),
        };
        assert_eq!(grade_math(&m, Some(&finish)).reward, 0.0);
        let half = |is_answer| Response {
            text: "0.5".into(),
            is_answer,
        };
        assert_eq!(grade_math(&m, Some(&half(true))).reward, 1.0);
        assert_eq!(grade_math(&m, Some(&half(false))).reward, 0.0);
        let hedged = Response {
            text: "\\boxed{0.5} or \\boxed{2}".into(),
            is_answer: true,
        };
        assert_eq!(grade_math(&m, Some(&hedged)).reward, 0.0);
        assert_eq!(
            r(run(None, "<think>maybe \\boxed{3}</think>So \\boxed{4}")),
            "So \\boxed{4}"
        );
        assert_eq!(r(run(None, "plain \\boxed{5}")), "plain \\boxed{5}");
        // Cut off while thinking: nothing final was said.
        assert_eq!(r(run(None, "<think>it is \\boxed{6} or")), "");
        assert_eq!(agent_response(None), None);
    }

    #[test]
    fn only_tests_the_task_files_define_are_known() {
        let tests = BTreeMap::from([(
            "tests/test_a.py".to_string(),
            "import pytest\n\nclass TestA:\n    def test_x(self):\n        pass\n\n@pytest.mark.parametrize('n', [1])\nasync def test_y(n):\n    pass\n".to_string(),
        )]);
        let ids = [
            "tests/test_a.py::TestA::test_x",
            "tests/test_a.py::test_y[1]",
            "tests/test_a.py::test_made_up",
            "tests/test_b.py::test_y",
            "tests/test_a.py::TestB::test_x",
            "test_y (tests.test_a)",
            "test_other (tests.test_a.TestA)",
            "tests/test_a.py",
        ]
        .map(String::from);
        assert_eq!(
            unknown_tests(&tests, ids.iter()),
            [
                "tests/test_a.py::test_made_up",
                "tests/test_b.py::test_y",
                "tests/test_a.py::TestB::test_x",
                "test_other (tests.test_a.TestA)"
            ]
        );
        assert!(unknown_tests(&BTreeMap::new(), ids.iter()).is_empty());
        assert_eq!(
            list(&(0..12).map(|i| i.to_string()).collect::<Vec<_>>()),
            "0, 1, 2, 3, 4, 5, 6, 7, 8, 9 and 2 more"
        );
    }

    #[test]
    fn graders_parse_by_type_and_refuse_unknown_fields() {
        let g: Grader =
            serde_json::from_value(serde_json::json!({"type": "command", "command": "true"}))
                .unwrap();
        assert_eq!(g.kind(), "command");
        let g: Grader =
            serde_json::from_value(serde_json::json!({"type": "math", "answer": "1"})).unwrap();
        assert_eq!(g.kind(), "math");
        assert!(
            serde_json::from_value::<Grader>(
                serde_json::json!({"type": "math", "answer": "1", "anwser": "2"})
            )
            .is_err()
        );
        assert!(
            serde_json::from_value::<Grader>(
                serde_json::json!({"type": "code", "cases": [], "time_limit": 5})
            )
            .is_err()
        );
    }
}
