//! The `agent_program` task kind: an agent written elsewhere (on the `openai` SDK,
//! LiteLLM, mini-swe-agent, …) runs as the episode, trained token-exact.
//!
//! INIT prepares the sandbox as for `agent` (files, repository, setup). RUN opens the
//! sandbox's model endpoint (an HTTP listener on the sandbox's own loopback, relayed
//! over the sandbox socket: the sandbox keeps no network), starts the task's `command`
//! in the workspace with `OPENAI_BASE_URL`, `OPENAI_API_BASE` and `OPENAI_API_KEY`
//! pointing at it (and `ROLLOUT_MODEL` naming the model), and answers the program's
//! calls token-in, token-out against the backend pool ([`crate::agent::endpoint`]) until
//! it exits. The key is the episode's own, made afresh for each run: nothing else is
//! answered. The program is a command like any tool's: it runs in the sandbox, under
//! its limits, and whatever it leaves running is ended with it. Its calls are capped
//! by the task's limits (`max_turns` calls, `max_tokens` of context, `max_new_tokens`
//! per call) and the episode's deadline kills it. Nothing the program sends ends its
//! job: a malformed call is a 400 it can read, recorded short; the call that reaches
//! `max_refused_calls` refused ones ends the episode (the program is stopped with its
//! sandbox, the workspace exported as it stands). EVAL grades the workspace's changes
//! (and the last answer, as `$ROLLOUT_ANSWER`) as for `agent`.
//!
//! ```json
//! {"kind": "agent_program", "spec": {
//!   "command": "python3 agent.py",
//!   "sandbox": {"files": {"agent.py": "...", "add.py": "def add(a, b):\n    return a - b\n"}},
//!   "limits": {"max_turns": 8},
//!   "check": {"command": "python3 -c 'import add; assert add.add(2, 3) == 5'"}
//! }}
//! ```
//!
//! RUN's output is the trajectory of the sample holding the last call, plus `samples`
//! (every sample the calls made), `calls` (each call's request, reply, sample and merge
//! verdict), `program` (its exit status and output) and `export`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::agent::{self, Agent, AgentLimits, ModelSide, StillClaimed};
use crate::agent::endpoint::{
    DEFAULT_MAX_REFUSED_CALLS, Endpoint, EndpointStop, ProgramEnd, ProgramEpisode,
};
use crate::backends::generate::Generator;
use crate::backends::wire::Sampling;
use crate::domain::Job;
use crate::grading::{self, Grader};
use crate::sandbox::protocol::ExecResult;
use crate::sandbox::protocol::{EndpointReplyArgs, ExecArgs};
use crate::sandbox::{SandboxClient, SandboxError, SandboxSpec};
use crate::stage::sandboxed::{self, Check};
use crate::stage::{EvalOutput, InitOutput, SpecError, StageContext, StageError, TaskKind};

/// How long one `endpoint_next` waits before it is asked again (the program's end is
/// noticed between waits at the latest).
const POLL: Duration = Duration::from_secs(5);

/// The program's output kept in the result (head and tail).
const DEFAULT_OUTPUT_BYTES: usize = 64 << 10;

/// An `agent_program` task's `spec`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProgramSpec {
    /// The agent's command, run by bash in the workspace (`python3 agent.py`), starting
    /// from the environment the setup left in the shell (an activated venv carries).
    pub command: String,
    /// More variables for the command.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The sandbox.
    #[serde(default)]
    pub sandbox: SandboxSpec,
    /// The model (a registered backend's `model`); any backend's when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Sampling parameters; the program's own (`temperature` in its requests) are not
    /// used: the trainer decides how the policy samples.
    #[serde(default)]
    pub sampling: Sampling,
    /// How tool calls are read from the model's text when a request offers tools:
    /// one of `Parser::ALL`'s names; `agent.parser` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parser: Option<String>,
    /// Limits: `max_turns` caps the program's model calls, `max_tokens` a call's
    /// context, `max_new_tokens` a call's output, `timeout_ms` the program's run,
    /// `max_refused_calls` the calls refused before the episode ends (16 when absent).
    #[serde(default)]
    pub limits: AgentLimits,
    /// Whether tool results in the program's messages are tokenized as plain text;
    /// `agent.observations_as_text` when absent.
    #[serde(default)]
    pub observations_as_text: Option<bool>,
    /// Extra variables for the chat template.
    #[serde(default)]
    pub template_args: serde_json::Map<String, serde_json::Value>,
    /// The most bytes of the program's output kept in the result (64 KiB when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_bytes: Option<usize>,
    /// What EVAL runs to score the result (as for `agent`). Give this or `grader`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check: Option<Check>,
    /// How EVAL scores the result (as for `agent`). Give this or `check`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grader: Option<Grader>,
    /// Replays job `replay_of`'s recording: the program runs again, its calls are
    /// answered with the recorded tokens, and `replay` in the result says where its
    /// requests first left the recording (`rollout replay` sets it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_of: Option<String>,
    /// Permits `replay_of` to name a job of another batch (a replay shows the
    /// recording in its result, so it is scoped to its own batch otherwise).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub replay_across_batches: bool,
}

/// The `agent_program` kind: the `agent` kind's sandboxes, backends and grading, with
/// the task's own program in place of the built-in loop.
pub struct AgentProgram {
    agent: Arc<Agent>,
}

impl AgentProgram {
    /// The kind, sharing `agent`'s sandboxes, backend pool, models and policy.
    pub fn new(agent: Arc<Agent>) -> Self {
        AgentProgram { agent }
    }
}

impl AgentProgram {
    /// What the endpoint of `spec`'s episode needs, defaults filled in; the parser
    /// chosen from the model's template unless the spec or the settings name one.
    fn episode(
        &self,
        spec: &ProgramSpec,
        model: Arc<crate::agent::model::ModelFiles>,
        model_name: &str,
        limits: crate::agent::episode::EpisodeLimits,
        deadline: tokio::time::Instant,
    ) -> Result<ProgramEpisode, StageError> {
        let settings = &self.agent.settings().agent;
        let name = spec.parser.as_deref().unwrap_or(&settings.parser);
        let (parser, _) = crate::agent::parse::choose(name, &model)
            .map_err(|e| StageError::Failed(format!("model `{model_name}`: {e}")))?;
        Ok(ProgramEpisode {
            model,
            model_name: model_name.to_string(),
            parser,
            sampling: spec.sampling.clone(),
            limits,
            max_refused_calls: spec
                .limits
                .max_refused_calls
                .unwrap_or(DEFAULT_MAX_REFUSED_CALLS),
            template_args: spec.template_args.clone(),
            observations_as_text: spec
                .observations_as_text
                .unwrap_or(settings.observations_as_text),
            deadline,
            policy: self.agent.policy().clone(),
        })
    }
}

fn spec_of(job: &Job) -> Result<ProgramSpec, StageError> {
    SpecError::parse(&job.task["spec"]).map_err(|e| StageError::Failed(format!("bad spec: {e}")))
}

#[async_trait]
impl TaskKind for AgentProgram {
    fn name(&self) -> &'static str {
        "agent_program"
    }

    fn validate(&self, spec: &serde_json::Value) -> Result<(), SpecError> {
        let s: ProgramSpec = SpecError::parse(spec)?;
        if s.command.trim().is_empty() {
            return Err(SpecError::new("command", "must name the agent's command"));
        }
        for (name, set) in [
            ("tool_timeout_ms", s.limits.tool_timeout_ms.is_some()),
            (
                "stop_without_tool_call",
                s.limits.stop_without_tool_call.is_some(),
            ),
            (
                "max_observation_bytes",
                s.limits.max_observation_bytes.is_some(),
            ),
        ] {
            if set {
                return Err(SpecError::new(
                    format!("limits.{name}"),
                    "applies to the built-in loop's tools; an agent program runs its own",
                ));
            }
        }
        if s.max_output_bytes == Some(0) {
            return Err(SpecError::new("max_output_bytes", "must be above 0"));
        }
        if let Some(k) = s
            .env
            .keys()
            .find(|k| k.is_empty() || k.contains('=') || k.contains('\0'))
        {
            return Err(SpecError::new(
                format!("env.{k}"),
                "is not a valid variable name",
            ));
        }
        agent::validate_model_side(
            &s.parser,
            &s.sampling,
            &s.template_args,
            s.model.as_deref(),
            &s.limits,
        )?;
        agent::validate_replay_of(s.replay_of.as_deref(), s.replay_across_batches)?;
        s.sandbox
            .validate("sandbox", self.agent.sandboxes().settings())?;
        grading::validate_choice(s.check.as_ref(), s.grader.as_ref(), &s.sandbox)
    }

    async fn init(&self, ctx: &StageContext) -> Result<InitOutput, StageError> {
        let spec = spec_of(&ctx.job)?;
        let sandbox = grading::sandbox_for(&spec.sandbox, spec.grader.as_ref());
        sandboxed::init(self.agent.sandboxes(), ctx, &sandbox).await
    }

    async fn run(&self, ctx: &StageContext) -> Result<serde_json::Value, StageError> {
        let spec = spec_of(&ctx.job)?;
        let job = &ctx.job;
        let a = &self.agent;
        let (limits, timeout) = a.limits(&spec.limits);
        let deadline = tokio::time::Instant::now() + timeout;
        let client = sandboxed::connect(a.sandboxes(), ctx).await?;
        let (mut side, model, model_name) = a
            .model_side(
                ctx,
                spec.model.as_ref(),
                spec.replay_of.as_deref(),
                spec.replay_across_batches,
                deadline,
            )
            .await?;
        let mut endpoint =
            Endpoint::new(self.episode(&spec, model.clone(), &model_name, limits, deadline)?);
        let guard = StillClaimed {
            jobs: a.jobs().clone(),
            job_id: job.id.clone(),
            epoch: job.epoch,
            attempt: job.attempts,
        };
        let (port, key) = match open_endpoint(&client).await {
            Ok(opened) => opened,
            // The server answered and refused: it is not one that serves the endpoint
            // (an older `rollout-sandbox` in the image, say); a restart would not help.
            Err(e @ SandboxError::Tool(_)) => {
                return Err(StageError::Failed(format!(
                    "the sandbox's server cannot open a model endpoint ({e}); agent programs need this release's rollout-sandbox"
                )));
            }
            Err(e) => {
                drop(client);
                let why = format!("the sandbox's model endpoint did not open: {e}");
                return sandboxed::died(a.sandboxes(), job, why, json!({})).await;
            }
        };
        let args = program_args(&spec, port, &key, &model_name);
        tracing::info!(port, command = %spec.command, "agent program starting");
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let driven = drive(
            &client,
            &args,
            left,
            &mut endpoint,
            side.generator(),
            &guard,
            &ctx.cancel,
        )
        .await;
        let exit = match driven {
            Driven::Exited(r) => Some(r),
            // The program is not waited for: its sandbox's stop ends it, after the
            // workspace is exported as it stands.
            Driven::Refusals => None,
            Driven::Cancelled => {
                return Err(StageError::Transient(
                    "the job is no longer held by this worker".into(),
                ));
            }
            Driven::Backend(message) => {
                // The worker's cleanup stops the sandbox.
                drop(client);
                let output = partial(endpoint).await;
                return Err(StageError::FailedWith { message, output });
            }
            Driven::Sandbox(e) => {
                drop(client);
                let why = format!("the sandbox stopped answering while the agent program ran: {e}");
                return sandboxed::died(a.sandboxes(), job, why, partial(endpoint).await).await;
            }
        };
        let how = match &exit {
            Some(r) if r.timed_out => ProgramEnd::Timeout,
            Some(_) => ProgramEnd::Exited,
            None => ProgramEnd::Refused,
        };
        let run = endpoint.finish(how).await;
        tracing::info!(
            calls = run.calls.len(),
            samples = run.samples.len(),
            exit_code = ?exit.as_ref().and_then(|r| r.exit_code),
            finish_reason = ?run.trajectory.finish_reason,
            "agent program ended"
        );
        let mut out = serde_json::to_value(&run).unwrap_or_default();
        if let ModelSide::Replay { of, replayer, .. } = &side {
            let report = replayer.report(of, |ids| model.tokenizer.decode(ids).unwrap_or_default());
            out["replay"] = serde_json::to_value(report).unwrap_or_default();
        }
        out["program"] = program_record(exit);
        sandboxed::finish_into(a.sandboxes(), job, client, out).await
    }

    async fn eval(&self, ctx: &StageContext) -> Result<EvalOutput, StageError> {
        let spec = spec_of(&ctx.job)?;
        self.agent
            .grade(
                ctx,
                &spec.sandbox,
                spec.check.as_ref(),
                spec.grader.as_ref(),
            )
            .await
    }

    fn restart_on_hand_back(&self) -> bool {
        true
    }

    async fn cleanup(&self, job: &Job) {
        sandboxed::cleanup(self.agent.sandboxes(), job).await
    }
}

/// Opens the sandbox's model endpoint with a key of its own (two random UUIDs, 244
/// random bits, new for every run); its port and the key.
async fn open_endpoint(client: &SandboxClient) -> Result<(u16, String), SandboxError> {
    let key = format!(
        "rollout-{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    );
    let port = client.endpoint_open(&key).await?;
    Ok((port, key))
}

/// The program's command with the endpoint's address and key in its environment.
fn program_args(spec: &ProgramSpec, port: u16, key: &str, model: &str) -> ExecArgs {
    let base = format!("http://127.0.0.1:{port}/v1");
    let mut env = spec.env.clone();
    for (k, v) in [
        ("OPENAI_BASE_URL", base.as_str()),
        ("OPENAI_API_BASE", base.as_str()),
        ("OPENAI_API_KEY", key),
        ("ROLLOUT_MODEL", model),
    ] {
        env.insert(k.to_string(), v.to_string());
    }
    ExecArgs {
        command: spec.command.clone(),
        max_output_bytes: Some(spec.max_output_bytes.unwrap_or(DEFAULT_OUTPUT_BYTES)),
        shell_state: true,
        env,
        ..Default::default()
    }
}

/// How the program's run went.
enum Driven {
    /// It ended (exited, or was killed at the deadline).
    Exited(ExecResult),
    /// Its calls were refused as often as the episode allows: it is not waited for.
    Refusals,
    /// The job is no longer wanted.
    Cancelled,
    /// No backend could answer a call.
    Backend(String),
    /// The sandbox stopped answering.
    Sandbox(SandboxError),
}

/// Runs the program and answers its calls until it ends (or the job's `cancel` fires):
/// the exec and the endpoint's polls share the one connection to the sandbox.
async fn drive(
    client: &SandboxClient,
    args: &ExecArgs,
    left: Duration,
    endpoint: &mut Endpoint,
    llm: &mut dyn Generator,
    guard: &StillClaimed,
    cancel: &tokio_util::sync::CancellationToken,
) -> Driven {
    let exec = client.exec(args, Some(left));
    tokio::pin!(exec);
    loop {
        let call = tokio::select! {
            // The job was cancelled (or handed back) while the program ran its own tools.
            () = cancel.cancelled() => return Driven::Cancelled,
            r = &mut exec => return match r {
                Ok(r) => Driven::Exited(r),
                Err(e) => Driven::Sandbox(e),
            },
            next = client.endpoint_next(POLL) => match next {
                Ok(Some(call)) => call,
                Ok(None) => continue,
                Err(e) => return Driven::Sandbox(e),
            },
        };
        let served = endpoint
            .serve(&call.method, &call.path, &call.body, llm, guard)
            .await;
        let (answer, stop) = match served {
            Ok(answer) => (answer, None),
            Err((stop, answer)) => (answer, Some(stop)),
        };
        let reply = EndpointReplyArgs {
            id: call.id,
            status: answer.status,
            content_type: Some(answer.content_type),
            body: answer.body,
        };
        if let Err(e) = client.endpoint_reply(&reply).await {
            return Driven::Sandbox(e);
        }
        match stop {
            // The deadline kills the program: its exec ends next.
            None | Some(EndpointStop::Timeout) => {}
            Some(EndpointStop::Cancelled) => return Driven::Cancelled,
            Some(EndpointStop::Refusals) => return Driven::Refusals,
            Some(EndpointStop::Backend(message)) => return Driven::Backend(message),
        }
    }
}

/// The result's `program`: how the program ended (none: it was not waited for, the
/// episode having ended at its refused calls).
fn program_record(exit: Option<ExecResult>) -> serde_json::Value {
    match exit {
        Some(exit) => json!({
            "exit_code": exit.exit_code,
            "signal": exit.signal,
            "timed_out": exit.timed_out,
            "output": exit.output,
            "omitted_bytes": exit.omitted_bytes,
        }),
        None => json!({
            "exit_code": null,
            "signal": null,
            "timed_out": false,
            "output": null,
            "stopped": "its model calls were refused as often as the episode allows (limits.max_refused_calls): it was stopped with its sandbox, without its output",
        }),
    }
}

/// What a failed run keeps: the calls and samples so far, no finish reason.
async fn partial(endpoint: Endpoint) -> serde_json::Value {
    let run = endpoint.finish(ProgramEnd::Exited).await;
    let mut output = serde_json::to_value(&run).unwrap_or_default();
    if let Some(o) = output.as_object_mut() {
        o.remove("finish_reason");
    }
    for s in output["samples"].as_array_mut().into_iter().flatten() {
        if let Some(o) = s.as_object_mut() {
            o.remove("finish_reason");
        }
    }
    output
}
