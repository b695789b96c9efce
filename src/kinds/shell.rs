//! The `shell` task kind: a sandbox episode without a model.
//!
//! INIT builds the sandbox from the task's `sandbox` spec (files or a repository, setup
//! commands) on its node; RUN replays a fixed list of tool calls through the sandbox
//! server, recording each observation and its latency, then exports the workspace's
//! changes and stops the sandbox; EVAL grades the result with the task's grader
//! ([`crate::grading`]): by default the exit code of its `check` command, run in a fresh
//! sandbox from the same spec holding those changes (1 on success, 0 otherwise). It
//! exercises every piece the agent loop uses, so it is the end-to-end test of sandboxes
//! and the shape of a scripted environment.
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

use crate::domain::{Job, duration_us};
use crate::grading::{self, Grader};
use crate::sandbox::protocol::{BashArgs, ExportArgs, FileArgs, PythonArgs, Response};
use crate::sandbox::{NodeSandboxes, SandboxError, SandboxSpec};
use crate::stage::sandboxed::{self, Check};
use crate::stage::{EvalOutput, InitOutput, SpecError, StageContext, StageError, TaskKind};

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
    /// What EVAL runs to score the result: a command whose exit status 0 is reward 1
    /// (the same as `grader: {"type": "command", ...}`). Give this or `grader`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check: Option<Check>,
    /// How EVAL scores the result: `{"type": "math" | "code" | "command", ...}` (see
    /// [`crate::grading`]). Give this or `check`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grader: Option<Grader>,
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

fn spec_of(job: &Job) -> Result<ShellSpec, StageError> {
    SpecError::parse(&job.task["spec"]).map_err(|e| StageError::Failed(format!("bad spec: {e}")))
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
        s.sandbox.validate("sandbox", self.sandboxes.settings())?;
        for (i, step) in s.steps.iter().enumerate() {
            check_step(i, step)?;
        }
        grading::validate_choice(s.check.as_ref(), s.grader.as_ref(), &s.sandbox)
    }

    async fn init(&self, ctx: &StageContext) -> Result<InitOutput, StageError> {
        let spec = spec_of(&ctx.job)?;
        let sandbox = grading::sandbox_for(&spec.sandbox, spec.grader.as_ref());
        sandboxed::init(&self.sandboxes, ctx, &sandbox).await
    }

    async fn run(&self, ctx: &StageContext) -> Result<serde_json::Value, StageError> {
        let spec = spec_of(&ctx.job)?;
        let client = sandboxed::connect(&self.sandboxes, ctx).await?;
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
            let latency_us = duration_us(t0.elapsed());
            let resp: Response = match resp {
                Ok(r) => r,
                // A server that stopped answering while the stage is fine (`kill -STOP
                // -1`, its CPU or memory taken by the episode's own processes) is the
                // episode's doing as much as one that died: scored, not re-rolled,
                // unless the node says otherwise (`died` asks).
                Err(
                    e @ (SandboxError::Closed
                    | SandboxError::Io(_)
                    | SandboxError::NoAnswer(_)
                    | SandboxError::Stopped(_)),
                ) => {
                    let what = match e {
                        SandboxError::NoAnswer(_) | SandboxError::Stopped(_) => "stopped answering",
                        _ => "died",
                    };
                    let why = format!("the sandbox {what} during step {} ({e})", steps.len() + 1);
                    let so_far = serde_json::json!({"steps": steps});
                    return sandboxed::died(&self.sandboxes, &ctx.job, why, so_far).await;
                }
                Err(e) => return Err(sandboxed::stage_error("tool call failed", e)),
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
        let out = serde_json::json!({"steps": steps});
        sandboxed::finish_into(&self.sandboxes, &ctx.job, client, out).await
    }

    async fn eval(&self, ctx: &StageContext) -> Result<EvalOutput, StageError> {
        let spec = spec_of(&ctx.job)?;
        let chosen = grading::for_eval(spec.check.as_ref(), spec.grader.as_ref())?;
        // The response a math grader reads: the last step's output.
        let response = ctx.job.run_output.as_ref().and_then(|o| {
            let text = o["steps"].as_array()?.last()?["observation"]["output"].as_str()?;
            Some(grading::Response {
                text: text.to_string(),
                is_answer: false,
            })
        });
        grading::eval(
            &self.sandboxes,
            ctx,
            &spec.sandbox,
            &chosen,
            response,
            Default::default(),
        )
        .await
    }

    fn restart_on_hand_back(&self) -> bool {
        true
    }

    /// Removes the sandbox the ending stage held, and only that one.
    async fn cleanup(&self, job: &Job) {
        sandboxed::cleanup(&self.sandboxes, job).await
    }
}
