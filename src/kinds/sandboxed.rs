//! The stage steps every sandboxed task kind shares.
//!
//! INIT starts the job's sandbox on its node and checks its tools answer; RUN connects
//! to it (or sends the job back to INIT when it is gone or half-used by an earlier
//! attempt), works in it, exports the workspace's changes and stops it; EVAL applies the
//! changes to a *fresh* sandbox from the same spec, so the agent cannot have tampered
//! with the checks, and runs the task's check command. `shell` and `agent` differ only
//! in what RUN does in between.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{EvalOutput, InitOutput, Route, SpecError, StageContext, StageError};
use crate::model::{Job, Stage};
use crate::sandbox::client::SandboxClient;
use crate::sandbox::protocol::{ExportArgs, ExportResult};
use crate::sandbox::{NodeSandboxes, Purpose, SandboxError, SandboxSpec};

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

impl Check {
    /// Checks the command is there.
    pub fn validate(&self, prefix: &str) -> Result<(), SpecError> {
        if self.command.trim().is_empty() {
            return Err(SpecError {
                path: format!("{prefix}.command"),
                message: "must not be empty".into(),
            });
        }
        Ok(())
    }
}

/// The generation of the RUN sandbox this stage entry's INIT made (its claim attempt).
pub fn run_generation(job: &Job) -> i64 {
    job.init_output
        .as_ref()
        .and_then(|o| o["sandbox"]["generation"].as_i64())
        .unwrap_or(-1)
}

/// Maps a sandbox failure to what the worker should do with the stage.
pub fn stage_error(context: &str, e: SandboxError) -> StageError {
    match e {
        SandboxError::Setup(_) | SandboxError::Config(_) | SandboxError::Tool(_) => {
            StageError::Failed(format!("{context}: {e}"))
        }
        _ => StageError::Transient(format!("{context}: {e}")),
    }
}

/// INIT: starts the job's sandbox from `spec` and checks the interpreter answers.
pub async fn init(
    sandboxes: &NodeSandboxes,
    ctx: &StageContext,
    spec: &SandboxSpec,
) -> Result<InitOutput, StageError> {
    let sb = sandboxes
        .start(&ctx.job.id, spec, Purpose::Run, None, ctx.job.attempts)
        .await
        .map_err(|e| stage_error("cannot start the sandbox", e))?;
    // The shell answered before the sandbox counted as started; check the interpreter
    // too. A sandbox without Python is still usable for bash and file tools, so this is
    // reported rather than fatal.
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

/// RUN's start: a client of the job's sandbox, or the reason to go back to INIT.
pub async fn connect(
    sandboxes: &NodeSandboxes,
    ctx: &StageContext,
) -> Result<SandboxClient, StageError> {
    let job_id = &ctx.job.id;
    let generation = run_generation(&ctx.job);
    if ctx.job.stage_attempts > 1 {
        // An earlier attempt may have changed the sandbox before it died: going on from
        // there would not be the episode the task describes.
        sandboxes
            .remove(job_id, Purpose::Run, Some(generation))
            .await;
        return Err(StageError::Restart(
            "an earlier RUN attempt stopped part-way through; starting again from a fresh sandbox"
                .into(),
        ));
    }
    match sandboxes.connect(job_id, generation).await {
        Ok(c) => Ok(c),
        Err(e @ SandboxError::Unavailable(_)) => Err(StageError::Transient(e.to_string())),
        Err(e) => Err(StageError::Restart(format!(
            "the job's sandbox is gone ({e}); starting again from INIT"
        ))),
    }
}

/// RUN's sandbox died: remove what is left and send the job back to INIT.
pub async fn lost(sandboxes: &NodeSandboxes, job: &Job, why: String) -> StageError {
    sandboxes
        .remove(&job.id, Purpose::Run, Some(run_generation(job)))
        .await;
    StageError::Restart(format!("{why}; starting again from INIT"))
}

/// RUN's end: exports the workspace's changes and stops the sandbox.
pub async fn finish(
    sandboxes: &NodeSandboxes,
    job: &Job,
    client: SandboxClient,
) -> Result<ExportResult, StageError> {
    let export = client
        .export(&ExportArgs::default())
        .await
        .map_err(|e| stage_error("cannot export the workspace", e));
    drop(client);
    sandboxes
        .remove(&job.id, Purpose::Run, Some(run_generation(job)))
        .await;
    export
}

/// EVAL: applies RUN's exported changes to a fresh sandbox from `spec` (with `env`
/// added) and turns the exit code of `check` into the reward.
pub async fn eval(
    sandboxes: &NodeSandboxes,
    ctx: &StageContext,
    spec: &SandboxSpec,
    check: &Check,
    env: BTreeMap<String, String>,
) -> Result<EvalOutput, StageError> {
    let job_id = &ctx.job.id;
    let changes: Option<ExportResult> = ctx
        .job
        .run_output
        .as_ref()
        .and_then(|o| serde_json::from_value(o["export"].clone()).ok());
    let mut spec = spec.clone();
    spec.env.extend(env);
    let sb = sandboxes
        .start(
            job_id,
            &spec,
            Purpose::Eval,
            changes.as_ref(),
            ctx.job.attempts,
        )
        .await
        .map_err(|e| stage_error("cannot start the evaluation sandbox", e))?;
    let checked = sb
        .client
        .bash(
            &check.command,
            Some(Duration::from_millis(check.timeout_ms)),
        )
        .await;
    drop(sb);
    sandboxes
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

/// Removes the sandbox the ending stage held, and only that one: a stale attempt (whose
/// lease lapsed while a newer one took over) must not remove the newer one's.
pub async fn cleanup(sandboxes: &NodeSandboxes, job: &Job) {
    match job.stage {
        Stage::Init => {
            sandboxes
                .remove(&job.id, Purpose::Run, Some(job.attempts))
                .await
        }
        Stage::Run => {
            sandboxes
                .remove(&job.id, Purpose::Run, Some(run_generation(job)))
                .await
        }
        Stage::Eval => {
            sandboxes
                .remove(&job.id, Purpose::Eval, Some(job.attempts))
                .await
        }
    }
}
