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
//!
//! A sandbox that dies under a stage is asked why ([`NodeSandboxes::cause_of_death`]).
//! The infrastructure's faults (the node shutting down, the host out of memory) send the
//! job back to INIT for a fresh sandbox. An episode that ended its own sandbox (`kill -9
//! -1`, its own memory limit) is over: it is scored 0 with that reason, never run again,
//! so breaking the sandbox is neither a free re-roll of a bad episode nor a way to have a
//! sampling group thrown away. The same holds in EVAL for graded code that kills the
//! evaluation sandbox. A task whose setup ends its own sandbox fails its stage at once
//! (see `NodeSandboxes::start`): setup is the task's, and would end the same way again.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{EvalOutput, InitOutput, Route, SpecError, StageContext, StageError};
use crate::domain::{Job, Stage};
use crate::sandbox::client::SandboxClient;
use crate::sandbox::protocol::{
    ApplyArgs, ErrorCode, ExecArgs, ExecResult, ExportArgs, ExportResult,
};
use crate::sandbox::{Death, NodeSandboxes, Purpose, SandboxError, SandboxSpec};

/// Where RUN's output says the episode ended its own sandbox (read by every grader).
pub const SANDBOX_ENDED: &str = "sandbox_ended";

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
        SandboxError::NoAnswer(_) | SandboxError::Stopped(_) => {
            StageError::Transient(format!("{context}: {STOPPED_ANSWERING} ({e})"))
        }
        _ => StageError::Transient(format!("{context}: {e}")),
    }
}

/// What [`stage_error`] says of a sandbox server that stopped answering (stopped, or
/// starved by what runs beside it), so that EVAL can tell it from other faults.
const STOPPED_ANSWERING: &str = "the sandbox stopped answering";

/// Whether `e` is [`stage_error`]'s for a server that stopped answering.
fn stopped_answering(e: &StageError) -> bool {
    matches!(e, StageError::Transient(m) if m.contains(STOPPED_ANSWERING))
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

/// RUN's sandbox died under the episode (`why`): when the infrastructure killed it, the
/// job goes back to INIT ([`lost`]); when the episode did, the episode is over and
/// `output` (the episode so far) is RUN's output, marked [`SANDBOX_ENDED`] with no
/// export, for EVAL to score 0.
pub async fn died(
    sandboxes: &NodeSandboxes,
    job: &Job,
    why: String,
    mut output: serde_json::Value,
) -> Result<serde_json::Value, StageError> {
    match sandboxes
        .cause_of_death(&job.id, Purpose::Run, run_generation(job))
        .await
    {
        Death::Infrastructure(cause) => Err(lost(sandboxes, job, format!("{why}: {cause}")).await),
        Death::Workload => {
            sandboxes
                .remove(&job.id, Purpose::Run, Some(run_generation(job)))
                .await;
            let reason = format!("the episode ended its own sandbox ({why})");
            tracing::warn!(job_id = %job.id, reason, "scoring the episode as it stands");
            output["export"] = serde_json::Value::Null;
            output[SANDBOX_ENDED] = reason.into();
            Ok(output)
        }
    }
}

/// The reason RUN's output gives for an episode that ended its own sandbox, if it did.
pub fn sandbox_ended(job: &Job) -> Option<&str> {
    job.run_output.as_ref()?[SANDBOX_ENDED].as_str()
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
) -> Result<Result<ExportResult, NoExport>, StageError> {
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
        Ended::Refused(e) => Err(NoExport::Refused(format!(
            "cannot export the workspace's changes: {e}"
        ))),
        Ended::Gone(e) => {
            let why = format!(
                "the sandbox failed at the end of the episode, before its changes were exported ({e})"
            );
            let cause = sandboxes
                .cause_of_death(&job.id, Purpose::Run, run_generation(job))
                .await;
            match cause {
                Death::Infrastructure(cause) => {
                    return Err(lost(sandboxes, job, format!("{why}: {cause}")).await);
                }
                Death::Workload => Err(NoExport::SandboxEnded(format!(
                    "the episode ended its own sandbox ({why})"
                ))),
            }
        }
    };
    sandboxes
        .remove(&job.id, Purpose::Run, Some(run_generation(job)))
        .await;
    if let Err(e) = &export {
        tracing::warn!(job_id = %job.id, error = %e, "no export; the episode is kept and will score 0");
    }
    Ok(export)
}

/// Why an episode has no export: it is kept, and scores 0 with this reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoExport {
    /// The sandbox refused it (too large, a diff git refused).
    #[error("{0}")]
    Refused(String),
    /// The episode ended its own sandbox before the export.
    #[error("{0}")]
    SandboxEnded(String),
}

/// Ends RUN of a sandboxed kind: exports the workspace's changes into `out` (see
/// [`record_export`]) and stops the sandbox; a failure keeps `out` in the error, so
/// what RUN produced is not lost.
pub async fn finish_into(
    sandboxes: &NodeSandboxes,
    job: &Job,
    client: SandboxClient,
    mut out: serde_json::Value,
) -> Result<serde_json::Value, StageError> {
    match finish(sandboxes, job, client).await {
        Ok(export) => {
            record_export(&mut out, export);
            Ok(out)
        }
        Err(e) => Err(e.keeping(out)),
    }
}

/// Puts RUN's export (or why there is none) into its output under `export` /
/// `export_error` (or [`SANDBOX_ENDED`]).
pub fn record_export(out: &mut serde_json::Value, export: Result<ExportResult, NoExport>) {
    match export {
        Ok(e) => out["export"] = serde_json::to_value(e).unwrap_or_default(),
        Err(NoExport::Refused(e)) => {
            out["export"] = serde_json::Value::Null;
            out["export_error"] = e.into();
        }
        Err(NoExport::SandboxEnded(e)) => {
            out["export"] = serde_json::Value::Null;
            out[SANDBOX_ENDED] = e.into();
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
    /// A command run after setup and before the changes are applied, to learn about the
    /// environment the task built while none of the agent's code is there (which test
    /// runner plugins it has); its result goes to the scorer.
    pub probe: Option<String>,
}

/// What the scoring step is given besides the sandbox.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The job's id, for the scorer's log lines.
    pub job_id: String,
    /// What `apply` reported.
    pub applied: serde_json::Value,
    /// The probe's result, when [`EvalSetup::probe`] asked for one and it ran.
    pub probe: Option<ExecResult>,
}

/// The scoring step run in EVAL's prepared sandbox: given its client and what was
/// prepared, the reward. It owns what it needs (the future borrows only the client).
pub type Scorer = Box<
    dyn for<'a> FnOnce(
            &'a SandboxClient,
            Prepared,
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
    let probe = match &setup.probe {
        Some(command) => probe(&sb.client, command, job_id).await,
        None => None,
    };
    let args = ApplyArgs {
        changes: changes.unwrap_or(ExportResult::Files { files: Vec::new() }),
        protect: setup.protect,
        files: setup.files,
    };
    let scored = match apply(&sb.client, &args).await {
        Ok(Ok(applied)) => match score(
            &sb.client,
            Prepared {
                job_id: job_id.clone(),
                applied,
                probe,
            },
        )
        .await
        {
            // The graded code ran in there: if the sandbox is gone, or its server
            // stopped answering (the graded code stopped it, or took its CPU or memory),
            // ask why.
            Err(e) if stopped_answering(&e) || sb.client.ping().await.is_err() => {
                match sandboxes
                    .cause_of_death(job_id, Purpose::Eval, ctx.job.attempts)
                    .await
                {
                    Death::Workload => Ok(zero(format!(
                        "the graded code ended its own evaluation sandbox ({e})"
                    ))),
                    Death::Infrastructure(cause) => {
                        Err(StageError::Transient(format!("{e}: {cause}")))
                    }
                }
            }
            other => other,
        },
        Ok(Err(zeroed)) => Ok(zeroed),
        Err(e) => Err(e),
    };
    drop(sb);
    sandboxes
        .remove(job_id, Purpose::Eval, Some(ctx.job.attempts))
        .await;
    scored
}

/// Runs the probe command (from the shell's state, as the check will run); `None`, with
/// a warning, when it cannot.
async fn probe(client: &SandboxClient, command: &str, job_id: &str) -> Option<ExecResult> {
    let args = ExecArgs {
        env: Default::default(),
        command: command.to_string(),
        max_output_bytes: Some(64 * 1024),
        shell_state: true,
        printable: true,
    };
    match client.exec(&args, Some(Duration::from_secs(120))).await {
        Ok(r) => Some(r),
        Err(e) => {
            tracing::warn!(job_id, error = %e, "the evaluation sandbox's probe could not run");
            None
        }
    }
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
