//! The `shell` task kind: a sandbox episode without a model.
//!
//! INIT builds the sandbox from the task's `sandbox` spec (files or a repository, setup
//! commands) on its node; RUN replays a fixed list of tool calls through the sandbox
//! server, recording each observation and its latency, then exports the workspace's
//! changes and stops the sandbox; EVAL applies those changes to a fresh sandbox from the
//! same spec and turns the exit code of the task's `check` command into the reward (1 on
//! success, 0 otherwise). It exercises every piece the agent loop uses, so it is the
//! end-to-end test of sandboxes and the shape of a scripted environment.
//!
//! ```json
//! {"kind": "shell", "spec": {
//!   "sandbox": {"files": {"add.py": "def add(a, b):\n    return a - b\n"}},
//!   "steps": [
//!     {"tool": "file", "args": {"command": "str_replace", "path": "add.py",
//!                               "old_str": "a - b", "new_str": "a + b"}},
//!     {"tool": "bash", "args": {"command": "python3 -c 'import add; print(add.add(2, 3))'"}}
//!   ],
//!   "check": {"command": "python3 -c 'import add; assert add.add(2, 3) == 5'"}
//! }}
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::{EvalOutput, InitOutput, Route, SpecError, StageContext, StageError, TaskKind};
use crate::model::{Job, Stage};
use crate::sandbox::protocol::{
    BashArgs, ExportArgs, ExportResult, FileArgs, PythonArgs, Response,
};
use crate::sandbox::{NodeSandboxes, Purpose, SandboxError, SandboxSpec};

/// A `shell` task's `spec`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShellSpec {
    /// The sandbox.
    #[serde(default)]
    pub sandbox: SandboxSpec,
    /// Tool calls RUN makes, in order.
    #[serde(default)]
    pub steps: Vec<Step>,
    /// What EVAL runs to score the result.
    pub check: Check,
}

/// One tool call.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    /// `bash`, `python`, `file`, `export` or `ping`.
    pub tool: String,
    /// The tool's arguments, as in the sandbox protocol.
    #[serde(default)]
    pub args: serde_json::Value,
    /// The call's timeout (ms); the tool's default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

/// The scoring command.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Check {
    /// Shell command run in a fresh sandbox holding the agent's changes; exit code 0
    /// means reward 1.
    pub command: String,
    /// Its timeout (ms).
    #[serde(default = "default_check_timeout")]
    pub timeout_ms: u64,
}

fn default_check_timeout() -> u64 {
    300_000
}

/// What RUN records for one step.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StepRecord {
    /// The tool called.
    pub tool: String,
    /// Whether the call produced a result (a non-zero exit code still does).
    pub ok: bool,
    /// The tool's result, or its error.
    pub observation: serde_json::Value,
    /// Round trip of the call as RUN saw it (µs).
    pub latency_us: u64,
}

/// The `shell` kind, bound to this node's sandboxes.
pub struct Shell {
    sandboxes: Arc<NodeSandboxes>,
}

impl Shell {
    /// A `shell` kind using `sandboxes`.
    pub fn new(sandboxes: Arc<NodeSandboxes>) -> Self {
        Shell { sandboxes }
    }
}

/// The generation of the RUN sandbox this stage entry's INIT made (its claim attempt).
fn run_generation(job: &Job) -> i64 {
    job.init_output
        .as_ref()
        .and_then(|o| o["sandbox"]["generation"].as_i64())
        .unwrap_or(-1)
}

fn spec_of(job: &Job) -> Result<ShellSpec, StageError> {
    SpecError::parse(&job.task["spec"]).map_err(|e| StageError::Failed(format!("bad spec: {e}")))
}

/// Maps a sandbox failure to what the worker should do with the stage.
fn stage_error(context: &str, e: SandboxError) -> StageError {
    match e {
        SandboxError::Setup(_) | SandboxError::Config(_) | SandboxError::Tool(_) => {
            StageError::Failed(format!("{context}: {e}"))
        }
        _ => StageError::Transient(format!("{context}: {e}")),
    }
}

/// Checks one step's arguments against the tool's argument type.
fn check_step(i: usize, step: &Step) -> Result<(), SpecError> {
    fn parse<T: serde::de::DeserializeOwned>(
        i: usize,
        v: &serde_json::Value,
    ) -> Result<(), SpecError> {
        SpecError::parse::<T>(v).map(|_| ()).map_err(|e| SpecError {
            path: format!(
                "steps[{i}].args{}{}",
                if e.path.is_empty() { "" } else { "." },
                e.path
            ),
            message: e.message,
        })
    }
    match step.tool.as_str() {
        "bash" => parse::<BashArgs>(i, &step.args),
        "python" => parse::<PythonArgs>(i, &step.args),
        "file" => parse::<FileArgs>(i, &step.args),
        "export" => parse::<ExportArgs>(i, &step.args),
        "ping" => Ok(()),
        other => Err(SpecError {
            path: format!("steps[{i}].tool"),
            message: format!("unknown tool `{other}`: use bash, python, file, export or ping"),
        }),
    }
}

#[async_trait]
impl TaskKind for Shell {
    fn name(&self) -> &'static str {
        "shell"
    }

    fn validate(&self, spec: &serde_json::Value) -> Result<(), SpecError> {
        let s: ShellSpec = SpecError::parse(spec)?;
        s.sandbox.validate("sandbox")?;
        for (i, step) in s.steps.iter().enumerate() {
            check_step(i, step)?;
        }
        if s.check.command.trim().is_empty() {
            return Err(SpecError {
                path: "check.command".into(),
                message: "must not be empty".into(),
            });
        }
        Ok(())
    }

    async fn init(&self, ctx: &StageContext) -> Result<InitOutput, StageError> {
        let spec = spec_of(&ctx.job)?;
        let sb = self
            .sandboxes
            .start(
                &ctx.job.id,
                &spec.sandbox,
                Purpose::Run,
                None,
                ctx.job.attempts,
            )
            .await
            .map_err(|e| stage_error("cannot start the sandbox", e))?;
        // The shell answered before the sandbox counted as started; check the interpreter
        // too. A sandbox without Python is still usable for bash and file steps, so this
        // is reported rather than fatal.
        let python = match sb
            .client
            .python("pass", Some(Duration::from_secs(60)))
            .await
        {
            Ok(r) => serde_json::json!({"engine": r.engine}),
            Err(e) => serde_json::json!({"error": e.to_string()}),
        };
        Ok(InitOutput {
            output: serde_json::json!({
                "sandbox": {
                    "node": sb.label.node,
                    "backend": sb.label.backend.as_str(),
                    "ready_ms": sb.ready_after.as_secs_f64() * 1000.0,
                    "python": python,
                    "generation": ctx.job.attempts,
                }
            }),
            route: Route::ThisNode,
        })
    }

    async fn run(&self, ctx: &StageContext) -> Result<serde_json::Value, StageError> {
        let spec = spec_of(&ctx.job)?;
        let job_id = &ctx.job.id;
        let generation = run_generation(&ctx.job);
        if ctx.job.stage_attempts > 1 {
            // An earlier attempt may have changed the sandbox before it died: replaying
            // the steps there would not be the episode the task describes.
            self.sandboxes
                .remove(job_id, Purpose::Run, Some(generation))
                .await;
            return Err(StageError::Restart(
                "an earlier RUN attempt stopped part-way through; starting again from a fresh sandbox".into(),
            ));
        }
        let client = match self.sandboxes.connect(job_id, generation).await {
            Ok(c) => c,
            Err(e @ SandboxError::Unavailable(_)) => {
                return Err(StageError::Transient(e.to_string()));
            }
            Err(e) => {
                return Err(StageError::Restart(format!(
                    "the job's sandbox is gone ({e}); starting again from INIT"
                )));
            }
        };
        let mut steps = Vec::with_capacity(spec.steps.len());
        for step in &spec.steps {
            let t0 = Instant::now();
            let resp = client
                .call(
                    &step.tool,
                    step.args.clone(),
                    step.timeout_ms.map(Duration::from_millis),
                )
                .await;
            let latency_us = t0.elapsed().as_micros() as u64;
            let resp: Response = match resp {
                Ok(r) => r,
                Err(e @ (SandboxError::Closed | SandboxError::Io(_))) => {
                    self.sandboxes
                        .remove(job_id, Purpose::Run, Some(generation))
                        .await;
                    return Err(StageError::Restart(format!(
                        "the sandbox died during step {} ({e}); starting again from INIT",
                        steps.len() + 1
                    )));
                }
                Err(e) => return Err(stage_error("tool call failed", e)),
            };
            steps.push(StepRecord {
                tool: step.tool.clone(),
                ok: resp.ok,
                observation: match (resp.result, resp.error) {
                    (Some(r), _) => r,
                    (None, Some(e)) => serde_json::to_value(e).unwrap_or_default(),
                    (None, None) => serde_json::Value::Null,
                },
                latency_us,
            });
        }
        let export = client
            .export(&ExportArgs::default())
            .await
            .map_err(|e| stage_error("cannot export the workspace", e))?;
        drop(client);
        self.sandboxes
            .remove(job_id, Purpose::Run, Some(generation))
            .await;
        Ok(serde_json::json!({"steps": steps, "export": export}))
    }

    async fn eval(&self, ctx: &StageContext) -> Result<EvalOutput, StageError> {
        let spec = spec_of(&ctx.job)?;
        let job_id = &ctx.job.id;
        let changes: Option<ExportResult> = ctx
            .job
            .run_output
            .as_ref()
            .and_then(|o| serde_json::from_value(o["export"].clone()).ok());
        let sb = self
            .sandboxes
            .start(
                job_id,
                &spec.sandbox,
                Purpose::Eval,
                changes.as_ref(),
                ctx.job.attempts,
            )
            .await
            .map_err(|e| stage_error("cannot start the evaluation sandbox", e))?;
        let checked = sb
            .client
            .bash(
                &spec.check.command,
                Some(Duration::from_millis(spec.check.timeout_ms)),
            )
            .await;
        drop(sb);
        self.sandboxes
            .remove(job_id, Purpose::Eval, Some(ctx.job.attempts))
            .await;
        let r = checked.map_err(|e| stage_error("the check command could not run", e))?;
        let passed = r.exit_code == Some(0) && !r.timed_out;
        Ok(EvalOutput {
            reward: if passed { 1.0 } else { 0.0 },
            details: serde_json::json!({
                "exit_code": r.exit_code,
                "timed_out": r.timed_out,
                "output": r.output,
            }),
        })
    }

    fn restart_on_hand_back(&self) -> bool {
        true
    }

    /// Removes the sandbox the ending stage held, and only that one: a stale attempt
    /// (whose lease lapsed while a newer one took over) must not remove the newer one's.
    async fn cleanup(&self, job: &Job) {
        match job.stage {
            Stage::Init => {
                self.sandboxes
                    .remove(&job.id, Purpose::Run, Some(job.attempts))
                    .await
            }
            Stage::Run => {
                self.sandboxes
                    .remove(&job.id, Purpose::Run, Some(run_generation(job)))
                    .await
            }
            Stage::Eval => {
                self.sandboxes
                    .remove(&job.id, Purpose::Eval, Some(job.attempts))
                    .await
            }
        }
    }
}
