//! The stage steps every sandboxed task kind shares.
//!
//! INIT starts the job's sandbox on its node and checks its tools answer; RUN connects
//! to it (or sends the job back to INIT when it is gone or half-used by an earlier
//! attempt), works in it, exports the workspace's changes and stops it; EVAL starts a
//! *fresh* sandbox from the same spec, runs its setup before any of the agent's code is
//! there, has the sandbox server apply the changes and put back the task's protected
//! files, and runs the task's check command as a process whose exit status comes from the
//! kernel. `shell` and `agent` differ only in what RUN does in between.
//!
//! Whatever the agent did, a finished episode is scored: changes that cannot be exported
//! (too large, the sandbox gone) or applied (`git apply` refuses them) give reward 0 with
//! the reason in `details`, never a failed job without its trajectory.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{EvalOutput, InitOutput, Route, SpecError, StageContext, StageError};
use crate::domain::{Job, Stage};
use crate::sandbox::client::SandboxClient;
use crate::sandbox::protocol::{ApplyArgs, ErrorCode, ExecArgs, ExportArgs, ExportResult};
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
    /// Workspace paths the agent's changes may not alter (globs: `*` within a path
    /// segment, `**` across them), e.g. `["tests/**"]`: EVAL puts them back as they were
    /// after setup, as SWE-bench restores its test files.
    #[serde(default)]
    pub protect: Vec<String>,
    /// Files only the check sees (hidden tests): relative path → content, written into
    /// EVAL's workspace after the agent's changes, replacing whatever is there.
    #[serde(default)]
    pub files: BTreeMap<String, String>,
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
        crate::sandbox::spec::check_file_paths(&format!("{prefix}.files"), self.files.keys())?;
        check_protect(prefix, &self.protect)
    }
}

/// Checks `prefix.protect`'s globs (the check command's and the code grader's).
pub fn check_protect(prefix: &str, protect: &[String]) -> Result<(), SpecError> {
    for (i, p) in protect.iter().enumerate() {
        if let Err(e) = crate::sandbox::server::export::check_pattern(p) {
            return Err(SpecError::new(
                format!("{prefix}.protect[{i}]"),
                format!("not a valid glob: {e}"),
            ));
        }
    }
    Ok(())
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
        .start(&ctx.job.id, spec, Purpose::Run, ctx.job.attempts)
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
///
/// The inner result is the episode's: the changes, or why the sandbox refused them (too
/// large, a diff git refused): the episode is over and is kept, and EVAL scores it 0 with
/// that reason. The outer error is the machine's: the sandbox died before it answered
/// (a node shutting down signals every process of its job, sandboxes included), or git
/// could not run in it even after a few tries. That is never the agent's doing, so it
/// never becomes a 0 to train on: the job starts again from INIT (see [`lost`]); the
/// caller keeps the episode with [`StageError::keeping`] for when the restarts are used
/// up.
pub async fn finish(
    sandboxes: &NodeSandboxes,
    job: &Job,
    client: SandboxClient,
) -> Result<Result<ExportResult, String>, StageError> {
    use backon::Retryable;
    /// One export attempt: retried only on `Err` (the server's own fault).
    enum Ended {
        Exported(ExportResult),
        Refused(String),
        Gone(String),
    }
    let ended = (|| async {
        match client.export(&ExportArgs::default()).await {
            Ok(Ok(e)) => Ok(Ended::Exported(e)),
            Ok(Err(e)) if e.code == ErrorCode::Internal => Err(e.message),
            Ok(Err(e)) => Ok(Ended::Refused(e.message)),
            Err(e) => Ok(Ended::Gone(e.to_string())),
        }
    })
    .retry(
        backon::ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(200))
            .with_max_times(3),
    )
    .notify(|e, after| {
        tracing::warn!(job_id = %job.id, error = %e, ?after, "export failed on the machine's side; trying again");
    })
    .await
    .unwrap_or_else(|e| Ended::Gone(format!("git could not run in the sandbox: {e}")));
    drop(client);
    let export = match ended {
        Ended::Exported(e) => Ok(e),
        Ended::Refused(e) => Err(format!("cannot export the workspace's changes: {e}")),
        Ended::Gone(e) => {
            let why = format!(
                "the sandbox failed at the end of the episode, before its changes were exported ({e})"
            );
            return Err(lost(sandboxes, job, why).await);
        }
    };
    sandboxes
        .remove(&job.id, Purpose::Run, Some(run_generation(job)))
        .await;
    if let Err(e) = &export {
        tracing::warn!(job_id = %job.id, error = %e, "the sandbox refused the export; the episode is kept and will score 0");
    }
    Ok(export)
}

/// Puts RUN's export (or why there is none) into its output under `export` /
/// `export_error`.
pub fn record_export(out: &mut serde_json::Value, export: Result<ExportResult, String>) {
    match export {
        Ok(e) => out["export"] = serde_json::to_value(e).unwrap_or_default(),
        Err(e) => {
            out["export"] = serde_json::Value::Null;
            out["export_error"] = e.into();
        }
    }
}

/// Reward 0 for an episode whose changes could not be scored, with the reason.
/// Reward 0 with the reason in `details.error`.
pub fn zero(reason: String) -> EvalOutput {
    EvalOutput {
        reward: 0.0,
        details: serde_json::json!({ "error": reason }),
    }
}

/// What EVAL's fresh sandbox gets besides the agent's changes.
#[derive(Debug, Clone, Default)]
pub struct EvalSetup {
    /// Environment added to the sandbox spec's.
    pub env: BTreeMap<String, String>,
    /// Workspace globs the changes may not alter (restored after applying).
    pub protect: Vec<String>,
    /// Files written after the changes (hidden tests, test inputs, a program taken from
    /// the answer), replacing whatever the changes put there.
    pub files: BTreeMap<String, String>,
}

/// The scoring step run in EVAL's prepared sandbox: given its client and what `apply`
/// reported, the reward. It owns what it needs (the future borrows only the client).
pub type Scorer = Box<
    dyn for<'a> FnOnce(
            &'a SandboxClient,
            serde_json::Value,
        ) -> futures::future::BoxFuture<'a, Result<EvalOutput, StageError>>
        + Send,
>;

/// EVAL in a sandbox: starts a fresh one from `spec` (with `setup.env` added) and runs
/// its setup, applies RUN's exported changes in it (restoring protected files, then
/// writing `setup.files`), runs `score`, and removes the sandbox. Changes that cannot be
/// exported or applied are reward 0 with the reason, not a failed job.
pub async fn in_fresh_sandbox(
    sandboxes: &NodeSandboxes,
    ctx: &StageContext,
    spec: &SandboxSpec,
    setup: EvalSetup,
    score: Scorer,
) -> Result<EvalOutput, StageError> {
    let job_id = &ctx.job.id;
    let run = ctx.job.run_output.as_ref();
    if let Some(e) = run.and_then(|o| o["export_error"].as_str()) {
        return Ok(zero(e.to_string()));
    }
    let changes: Option<ExportResult> =
        run.and_then(|o| serde_json::from_value(o["export"].clone()).ok());
    let mut spec = spec.clone();
    spec.env.extend(setup.env);
    let sb = sandboxes
        .start(job_id, &spec, Purpose::Eval, ctx.job.attempts)
        .await
        .map_err(|e| stage_error("cannot start the evaluation sandbox", e))?;
    let args = ApplyArgs {
        changes: changes.unwrap_or(ExportResult::Files { files: Vec::new() }),
        protect: setup.protect,
        files: setup.files,
    };
    let scored = match apply(&sb.client, &args).await {
        Ok(Ok(applied)) => score(&sb.client, applied).await,
        Ok(Err(zeroed)) => Ok(zeroed),
        Err(e) => Err(e),
    };
    drop(sb);
    sandboxes
        .remove(job_id, Purpose::Eval, Some(ctx.job.attempts))
        .await;
    scored
}

/// EVAL with a check command: [`in_fresh_sandbox`], then the kernel-reported exit
/// status of `check` is the reward.
pub async fn eval(
    sandboxes: &NodeSandboxes,
    ctx: &StageContext,
    spec: &SandboxSpec,
    check: &Check,
    env: BTreeMap<String, String>,
) -> Result<EvalOutput, StageError> {
    let setup = EvalSetup {
        env,
        protect: check.protect.clone(),
        files: check.files.clone(),
    };
    let check = check.clone();
    let score: Scorer = Box::new(move |client, applied| {
        Box::pin(async move { run_check(client, &check, applied).await })
    });
    in_fresh_sandbox(sandboxes, ctx, spec, setup, score).await
}

/// Applies the changes: what `apply` reported, or reward 0 when they cannot be applied.
async fn apply(
    client: &SandboxClient,
    args: &ApplyArgs,
) -> Result<Result<serde_json::Value, EvalOutput>, StageError> {
    match client.apply(args).await {
        Ok(Ok(r)) => Ok(Ok(serde_json::to_value(r).unwrap_or_default())),
        Ok(Err(e)) if matches!(e.code, ErrorCode::ToolFailed | ErrorCode::TooLarge) => {
            Ok(Err(zero(format!(
                "the agent's changes could not be applied: {}",
                e.message
            ))))
        }
        // The machine's fault (git could not start or hung): EVAL again, never a 0.
        Ok(Err(e)) if e.code == ErrorCode::Internal => Err(StageError::Transient(format!(
            "cannot apply the changes: {}",
            e.message
        ))),
        Ok(Err(e)) => Err(stage_error(
            "cannot apply the changes",
            SandboxError::Tool(e),
        )),
        Err(e) => Err(stage_error("cannot apply the changes", e)),
    }
}

/// Runs the check command in a prepared EVAL sandbox.
async fn run_check(
    client: &SandboxClient,
    check: &Check,
    applied: serde_json::Value,
) -> Result<EvalOutput, StageError> {
    let r = client
        .exec(
            &ExecArgs {
                command: check.command.clone(),
                max_output_bytes: None,
                shell_state: true,
            },
            Some(Duration::from_millis(check.timeout_ms)),
        )
        .await
        .map_err(|e| stage_error("the check command could not run", e))?;
    let passed = r.exit_code == Some(0) && !r.timed_out;
    Ok(EvalOutput {
        reward: if passed { 1.0 } else { 0.0 },
        details: serde_json::json!({
            "exit_code": r.exit_code,
            "signal": r.signal,
            "timed_out": r.timed_out,
            "output": r.output,
            "applied": applied,
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
