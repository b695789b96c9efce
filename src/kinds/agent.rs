//! The `agent` task kind: a multi-turn episode of the policy model in a sandbox.
//!
//! INIT starts the job's sandbox; RUN takes a backend from the pool (the one its prompt
//! group uses, when that one has room), runs the episode ([`crate::agent::episode`])
//! with the sandbox's tools, exports the workspace's changes and stops the sandbox; EVAL
//! grades the episode with the task's grader ([`crate::grading`]): a check command in a
//! fresh sandbox holding the changes (with the final answer in `$ROLLOUT_ANSWER`), the
//! final answer against a math ground truth, or a program against test cases. RUN's output is the trajectory (`prompt_ids`, `response_ids`, `loss_mask`,
//! `logprobs`, turns, finish reason, backend, drift verdict) plus `export`.
//!
//! ```json
//! {"kind": "agent", "group_id": "p7", "spec": {
//!   "messages": [{"role": "user", "content": "Fix add() in add.py, then call finish."}],
//!   "tools": ["bash", "python", "file", "finish"],
//!   "sandbox": {"files": {"add.py": "def add(a, b):\n    return a - b\n"}},
//!   "sampling": {"temperature": 1.0},
//!   "limits": {"max_turns": 8},
//!   "check": {"command": "python3 -c 'import add; assert add.add(2, 3) == 5'"}
//! }}
//! ```
//!
//! An episode that cannot go on because no backend answers fails the job with the
//! partial trajectory in its result; a sandbox that dies sends the job back to INIT; an
//! episode that reaches its deadline ends normally (`finish_reason: "timeout"`) and is
//! scored.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::agent::episode::{self, Episode, EpisodeError, EpisodeLimits, Parser, TurnGuard};
use crate::agent::model::{ModelCache, ModelFiles};
use crate::agent::replay::{self, Replayer};
use crate::agent::tools::TOOL_NAMES;
use crate::backends::client::InferenceClient;
use crate::backends::generate::Generator;
use crate::backends::session::{BackendSession, SessionError, SessionJob};
use crate::backends::wire::Sampling;
use crate::config::Settings;
use crate::domain::{Job, Stage, Status};
use crate::grading::{self, Grader};
use crate::sandbox::{NodeSandboxes, SandboxSpec};
use crate::stage::sandboxed::{self, Check};
use crate::stage::{EvalOutput, InitOutput, SpecError, StageContext, StageError, TaskKind};
use crate::store::{BackendStore, JobStore};

/// An `agent` task's `spec`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentSpec {
    /// The opening conversation: OpenAI-style messages (`role`, `content`).
    pub messages: Vec<serde_json::Value>,
    /// Tools offered to the model; all of them when absent.
    #[serde(default = "all_tools")]
    pub tools: Vec<String>,
    /// The sandbox.
    #[serde(default)]
    pub sandbox: SandboxSpec,
    /// The model (a registered backend's `model`); any backend's when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Sampling parameters passed to the backend (`max_tokens` is set per turn).
    #[serde(default)]
    pub sampling: Sampling,
    /// `auto` (from the model's template), or a parser's name (`hermes`, `bash_block`,
    /// `deepseek_r1`, `qwen3_coder`, `glm45`, `llama3_json`, `pythonic`, `mistral`, `kimi_k2`, `gpt_oss`: see
    /// `Parser::ALL`);
    /// `agent.parser` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parser: Option<String>,
    /// Limits; each one absent takes the `agent.*` default.
    #[serde(default)]
    pub limits: AgentLimits,
    /// Whether tool output is tokenized as plain text, so it can never become a special
    /// token; `agent.observations_as_text` (on) when absent.
    #[serde(default)]
    pub observations_as_text: Option<bool>,
    /// Extra variables for the chat template (e.g. `{"enable_thinking": false}`).
    #[serde(default)]
    pub template_args: serde_json::Map<String, serde_json::Value>,
    /// What EVAL runs to score the result: a command whose exit status 0 is reward 1
    /// (the same as `grader: {"type": "command", ...}`). Give this or `grader`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check: Option<Check>,
    /// How EVAL scores the result: `{"type": "math" | "code" | "command", ...}` (see
    /// [`crate::grading`]). Give this or `check`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grader: Option<Grader>,
    /// Replays job `replay_of`'s recording instead of calling a backend: its model
    /// turns are played back, the tools run for real, and `replay` in the result says
    /// where the run first left the recording (`rollout replay` sets it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_of: Option<String>,
    /// Permits `replay_of` to name a job of another batch (a replay shows the
    /// recording in its result, so it is scoped to its own batch otherwise).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub replay_across_batches: bool,
}

fn all_tools() -> Vec<String> {
    TOOL_NAMES.iter().map(|s| s.to_string()).collect()
}

/// Per-task limits; absent ones come from the `agent` settings.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentLimits {
    /// Model turns at most.
    pub max_turns: Option<usize>,
    /// Prompt and response tokens at most (the context length).
    pub max_tokens: Option<usize>,
    /// Tokens at most in one turn.
    pub max_new_tokens: Option<usize>,
    /// The episode's wall-clock limit (ms).
    pub timeout_ms: Option<u64>,
    /// One tool call's limit (ms).
    pub tool_timeout_ms: Option<u64>,
    /// Whether a turn without a tool call ends the episode.
    pub stop_without_tool_call: Option<bool>,
    /// The longest observation (bytes).
    pub max_observation_bytes: Option<usize>,
    /// For an agent program: the refused model calls its episode allows (the call
    /// that reaches this ends the episode, which is graded as it stands).
    pub max_refused_calls: Option<usize>,
}

/// The `agent` kind, bound to this node's sandboxes and the backend pool.
pub struct Agent {
    sandboxes: Arc<NodeSandboxes>,
    /// The backend pool's registrations and assignments.
    backends: Arc<dyn BackendStore>,
    /// Whether a running episode's claim still holds (asked at turn boundaries).
    jobs: Arc<dyn JobStore>,
    settings: Arc<Settings>,
    client: InferenceClient,
    models: ModelCache,
    /// The current policy version, which every model token is tagged with.
    policy: crate::policy::PolicyWatch,
}

impl Agent {
    /// An `agent` kind using `sandboxes`, the pool in `backends`, `jobs` to see whether an
    /// episode is still wanted, and `settings`' defaults; model tokens are tagged with
    /// `policy`'s current version.
    pub fn new(
        sandboxes: Arc<NodeSandboxes>,
        backends: Arc<dyn BackendStore>,
        jobs: Arc<dyn JobStore>,
        settings: Arc<Settings>,
        policy: crate::policy::PolicyWatch,
    ) -> Self {
        let client = InferenceClient::new((&settings.pool).into());
        Agent {
            sandboxes,
            backends,
            jobs,
            settings,
            client,
            models: ModelCache::new(crate::agent::tools::schemas()),
            policy,
        }
    }

    /// The limits of `spec`, defaults filled in; the deadline is also kept inside the
    /// RUN stage's timeout, so a long episode ends as `timeout` (and is scored) rather
    /// than being cut off by the stage timeout (and failed).
    pub(super) fn limits(&self, l: &AgentLimits) -> (EpisodeLimits, Duration) {
        let d = &self.settings.agent;
        let limits = EpisodeLimits {
            max_turns: l.max_turns.unwrap_or(d.max_turns),
            max_tokens: l.max_tokens.unwrap_or(d.max_tokens),
            max_new_tokens: l.max_new_tokens.unwrap_or(d.max_new_tokens),
            tool_timeout: Duration::from_millis(l.tool_timeout_ms.unwrap_or(d.tool_timeout_ms)),
            stop_without_tool_call: l.stop_without_tool_call.unwrap_or(d.stop_without_tool_call),
            max_observation_bytes: l.max_observation_bytes.unwrap_or(d.max_observation_bytes),
        };
        let stage = self.settings.stages.run.timeout_ms;
        let inside_stage = stage.saturating_sub((stage / 10).max(2_000));
        let timeout = l.timeout_ms.unwrap_or(d.timeout_ms).min(inside_stage);
        (limits, Duration::from_millis(timeout))
    }
}

impl Agent {
    /// The job's backend session. While backends of the model are registered but none is
    /// healthy (all restarting, say) it waits for one, with backoff, until the episode's
    /// deadline; when none is registered at all the task cannot run, and says so.
    pub(super) async fn open_session(
        &self,
        job: SessionJob,
        deadline: tokio::time::Instant,
        ctx: &StageContext,
    ) -> Result<BackendSession, StageError> {
        let mut delays = crate::retry::backend_wait();
        let mut warned = false;
        loop {
            let opened = BackendSession::open(
                self.backends.clone(),
                self.jobs.clone(),
                self.client.clone(),
                job.clone(),
                self.settings.pool.policy(),
                ctx.cancel.clone(),
            )
            .await;
            let why = match opened {
                Ok(s) => return Ok(s),
                // The database may answer next time: retry the stage with backoff.
                Err(e @ SessionError::Store(_)) => {
                    return Err(StageError::Transient(e.to_string()));
                }
                Err(SessionError::NoBackend(why)) => why,
            };
            let registered = self
                .backends
                .backends()
                .await
                .map_err(|e| StageError::Transient(e.to_string()))?
                .iter()
                .any(|b| job.model.as_ref().is_none_or(|m| *m == b.spec.model));
            if !registered {
                return Err(StageError::Failed(format!(
                    "no inference backend is registered{}; register one (`rollout backends add`, \
                     POST /v1/backends, or [[backends]] in the configuration)",
                    job.model
                        .as_ref()
                        .map(|m| format!(" for model `{m}`"))
                        .unwrap_or_default()
                )));
            }
            let backoff = delays.next().unwrap_or(Duration::from_secs(5));
            if tokio::time::Instant::now() + backoff >= deadline {
                return Err(StageError::Failed(format!(
                    "{why}; none came back within the episode's time limit"
                )));
            }
            if !warned {
                tracing::warn!(reason = %why, "waiting for a healthy backend");
                warned = true;
            }
            tokio::time::sleep(backoff).await;
        }
    }
}

/// Where a job's prompt group is placed together (`batch/group`, and `@v<N>` under
/// policy version N): a group's samples share a backend so they share its prefix cache,
/// and that cache is per version (the cache salt), so after a weight update the group's
/// next samples are placed afresh, by load, rather than sent to a home whose cache of
/// them no longer counts.
pub(super) fn group_key(
    batch_id: &str,
    group_id: Option<&str>,
    version: Option<i64>,
) -> Option<String> {
    let group = group_id?;
    Some(match version {
        Some(v) => format!("{batch_id}/{group}@v{v}"),
        None => format!("{batch_id}/{group}"),
    })
}

/// Checks a `replay_of` job id, and that `replay_across_batches` comes with one.
pub(super) fn validate_replay_of(of: Option<&str>, across_batches: bool) -> Result<(), SpecError> {
    match of {
        Some(id) if id.trim().is_empty() || id.len() > 256 || id.chars().any(char::is_control) => {
            Err(SpecError::new(
                "replay_of",
                "must be the id of a finished job",
            ))
        }
        None if across_batches => Err(SpecError::new(
            "replay_across_batches",
            "permits a replay of another batch's job: it needs `replay_of`",
        )),
        _ => Ok(()),
    }
}

/// Where an episode's model turns come from: the backend pool, or a recording.
pub(super) enum ModelSide {
    /// The job's backend session.
    Live(Box<BackendSession>),
    /// Job `of`'s recording played back.
    Replay {
        /// The job replayed.
        of: String,
        /// Its RUN output.
        recorded: serde_json::Value,
        /// The player.
        replayer: Replayer,
    },
}

impl ModelSide {
    /// The generator the episode calls.
    pub(super) fn generator(&mut self) -> &mut dyn Generator {
        match self {
            ModelSide::Live(s) => s.as_mut(),
            ModelSide::Replay { replayer, .. } => replayer,
        }
    }
}

/// Checks what an episode's model side is given (the parser, sampling, template
/// arguments, model and limits) for an `agent` or `agent_program` task.
pub(super) fn validate_model_side(
    parser: &Option<String>,
    sampling: &Sampling,
    template_args: &serde_json::Map<String, serde_json::Value>,
    model: Option<&str>,
    limits: &AgentLimits,
) -> Result<(), SpecError> {
    if let Some(p) = parser
        && !Parser::is_name(p)
    {
        return Err(SpecError::new("parser", Parser::expected()));
    }
    // What vLLM and SGLang both accept, refused here rather than by every request.
    if sampling.seed.is_some_and(|v| v > i64::MAX as u64) {
        return Err(SpecError::new(
            "sampling.seed",
            "must fit in a signed 64-bit integer (vLLM and SGLang refuse larger seeds)",
        ));
    }
    if let Some(c) = &sampling.structured_outputs {
        c.check()
            .map_err(|m| SpecError::new("sampling.structured_outputs", m))?;
    }
    // A turn allowed no token would ask the backend nothing.
    if sampling.max_tokens == Some(0) {
        return Err(SpecError::new("sampling.max_tokens", "must be above 0"));
    }
    if sampling.top_k.is_some_and(|k| k < -1) {
        return Err(SpecError::new(
            "sampling.top_k",
            "must be -1 or 0 (no cut-off) or a positive number",
        ));
    }
    if let Some(name) = crate::agent::template::RESERVED_ARGS
        .iter()
        .find(|n| template_args.contains_key(**n))
    {
        return Err(SpecError::new(
            format!("template_args.{name}"),
            "is set by the service for every render (transformers refuses it as a \
             template argument too); remove it",
        ));
    }
    if model.is_some_and(|m| m.trim().is_empty()) {
        return Err(SpecError::new("model", "must not be empty when given"));
    }
    let l = limits;
    for (name, v) in [
        ("max_turns", l.max_turns.map(|v| v as u64)),
        ("max_tokens", l.max_tokens.map(|v| v as u64)),
        ("max_new_tokens", l.max_new_tokens.map(|v| v as u64)),
        ("timeout_ms", l.timeout_ms),
        ("tool_timeout_ms", l.tool_timeout_ms),
        (
            "max_observation_bytes",
            l.max_observation_bytes.map(|v| v as u64),
        ),
        ("max_refused_calls", l.max_refused_calls.map(|v| v as u64)),
    ] {
        if v == Some(0) {
            return Err(SpecError::new(format!("limits.{name}"), "must be above 0"));
        }
    }
    Ok(())
}

fn spec_of(job: &Job) -> Result<AgentSpec, StageError> {
    SpecError::parse(&job.task["spec"]).map_err(|e| StageError::Failed(format!("bad spec: {e}")))
}

/// Reads the job's status at turn boundaries: it is wanted while this claim still holds
/// its RUN stage. A database hiccup does not stop the episode.
pub(super) struct StillClaimed {
    pub(super) jobs: Arc<dyn JobStore>,
    pub(super) job_id: String,
    pub(super) epoch: i64,
    pub(super) attempt: i64,
}

#[async_trait]
impl TurnGuard for StillClaimed {
    async fn still_wanted(&self) -> bool {
        match self.jobs.job(&self.job_id).await {
            Ok(Some(j)) => {
                j.status == Status::Running
                    && j.stage == Stage::Run
                    && j.epoch == self.epoch
                    && j.attempts == self.attempt
            }
            Ok(None) => false,
            Err(_) => true,
        }
    }
}

#[async_trait]
impl TaskKind for Agent {
    fn name(&self) -> &'static str {
        "agent"
    }

    fn validate(&self, spec: &serde_json::Value) -> Result<(), SpecError> {
        let s: AgentSpec = SpecError::parse(spec)?;
        if s.messages.is_empty() {
            return Err(SpecError::new("messages", "must hold at least one message"));
        }
        for (i, m) in s.messages.iter().enumerate() {
            if !m["role"].is_string() {
                return Err(SpecError::new(
                    format!("messages[{i}].role"),
                    "every message needs a `role` string",
                ));
            }
        }
        if s.limits.max_refused_calls.is_some() {
            return Err(SpecError::new(
                "limits.max_refused_calls",
                "applies to an agent program's model calls; the built-in loop makes none that can be refused",
            ));
        }
        for (i, t) in s.tools.iter().enumerate() {
            if !TOOL_NAMES.contains(&t.as_str()) {
                return Err(SpecError::new(
                    format!("tools[{i}]"),
                    format!("unknown tool `{t}`: use {}", TOOL_NAMES.join(", ")),
                ));
            }
        }
        validate_model_side(
            &s.parser,
            &s.sampling,
            &s.template_args,
            s.model.as_deref(),
            &s.limits,
        )?;
        validate_replay_of(s.replay_of.as_deref(), s.replay_across_batches)?;
        s.sandbox.validate("sandbox", self.sandboxes.settings())?;
        grading::validate_choice(s.check.as_ref(), s.grader.as_ref(), &s.sandbox)
    }

    async fn init(&self, ctx: &StageContext) -> Result<InitOutput, StageError> {
        let spec = spec_of(&ctx.job)?;
        let sandbox = grading::sandbox_for(&spec.sandbox, spec.grader.as_ref());
        sandboxed::init(&self.sandboxes, ctx, &sandbox).await
    }

    async fn run(&self, ctx: &StageContext) -> Result<serde_json::Value, StageError> {
        let spec = spec_of(&ctx.job)?;
        let job = &ctx.job;
        let (limits, timeout) = self.limits(&spec.limits);
        let deadline = tokio::time::Instant::now() + timeout;
        let client = sandboxed::connect(&self.sandboxes, ctx).await?;
        let (mut side, model, model_name) = self
            .model_side(
                ctx,
                spec.model.as_ref(),
                spec.replay_of.as_deref(),
                spec.replay_across_batches,
                deadline,
            )
            .await?;
        let name = spec
            .parser
            .as_deref()
            .unwrap_or(&self.settings.agent.parser);
        let (parser, _) = crate::agent::parse::choose(name, &model)
            .map_err(|e| StageError::Failed(format!("model `{model_name}`: {e}")))?;
        let ep = Episode {
            model,
            model_name,
            messages: spec.messages.clone(),
            tools: spec.tools.clone(),
            parser,
            sampling: spec.sampling.clone(),
            limits,
            template_args: spec.template_args.clone(),
            observations_as_text: spec
                .observations_as_text
                .unwrap_or(self.settings.agent.observations_as_text),
            deadline,
            policy: self.policy.clone(),
        };
        let guard = StillClaimed {
            jobs: self.jobs.clone(),
            job_id: job.id.clone(),
            epoch: job.epoch,
            attempt: job.attempts,
        };
        let result = episode::run(&ep, side.generator(), &client, &guard).await;
        let trajectory = match result {
            Ok(t) => t,
            Err(EpisodeError::Setup(m)) => return Err(StageError::Failed(m)),
            Err(EpisodeError::Cancelled) => {
                // The worker notices the same at its next lease renewal; stop now.
                return Err(StageError::Transient(
                    "the job is no longer held by this worker".into(),
                ));
            }
            Err(EpisodeError::Sandbox { message, partial }) => {
                drop(client);
                let partial = serde_json::to_value(partial).unwrap_or_default();
                return sandboxed::died(&self.sandboxes, job, message, partial).await;
            }
            Err(
                EpisodeError::Backend { message, partial }
                | EpisodeError::Template { message, partial },
            ) => {
                // The worker's cleanup stops the sandbox.
                drop(client);
                return Err(StageError::FailedWith {
                    message,
                    output: serde_json::to_value(partial).unwrap_or_default(),
                });
            }
        };
        tracing::info!(
            turns = trajectory.turns.len(),
            finish_reason = ?trajectory.finish_reason,
            tokens = trajectory.len(),
            backend = %trajectory.backend,
            "episode ended"
        );
        let mut out = serde_json::to_value(&trajectory).unwrap_or_default();
        if let ModelSide::Replay {
            of,
            recorded,
            replayer,
        } = &side
        {
            let mut report =
                replayer.report(of, |ids| ep.model.tokenizer.decode(ids).unwrap_or_default());
            report.tool_divergence = replay::first_tool_divergence(recorded, &trajectory);
            out["replay"] = serde_json::to_value(report).unwrap_or_default();
        }
        sandboxed::finish_into(&self.sandboxes, job, client, out).await
    }

    async fn eval(&self, ctx: &StageContext) -> Result<EvalOutput, StageError> {
        let spec = spec_of(&ctx.job)?;
        self.grade(
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
        sandboxed::cleanup(&self.sandboxes, job).await
    }
}

impl Agent {
    /// EVAL of an episode: `check` or `grader` on RUN's output, the final answer in
    /// `$ROLLOUT_ANSWER`, the finish reason among the details.
    pub(super) async fn grade(
        &self,
        ctx: &StageContext,
        sandbox: &SandboxSpec,
        check: Option<&Check>,
        grader: Option<&Grader>,
    ) -> Result<EvalOutput, StageError> {
        let run = ctx.job.run_output.as_ref();
        let answer = run
            .and_then(|o| o["answer"].as_str())
            .unwrap_or_default()
            .replace('\0', "");
        let env = BTreeMap::from([("ROLLOUT_ANSWER".to_string(), answer)]);
        let chosen = grading::for_eval(check, grader)?;
        let response = grading::agent_response(run);
        let mut out = grading::eval(&self.sandboxes, ctx, sandbox, &chosen, response, env).await?;
        if let Some(reason) = run.map(|o| o["finish_reason"].clone()) {
            out.details["finish_reason"] = reason;
        }
        Ok(out)
    }

    /// The model side of a RUN, its model's files and name: a backend session for the
    /// job (`model`'s, or any), or, for a replay, job `replay_of`'s recording played back
    /// with the files of the backend it ran on (registered still; it is not called),
    /// when the job may replay it (its own batch's, or `across_batches`).
    pub(super) async fn model_side(
        &self,
        ctx: &StageContext,
        model: Option<&String>,
        replay_of: Option<&str>,
        across_batches: bool,
        deadline: tokio::time::Instant,
    ) -> Result<(ModelSide, Arc<ModelFiles>, String), StageError> {
        let job = &ctx.job;
        if let Some(of) = replay_of {
            return self.recording(of, &job.batch_id, across_batches).await;
        }
        let session_job = SessionJob {
            job_id: job.id.clone(),
            group_key: group_key(
                &job.batch_id,
                job.group_id.as_deref(),
                self.policy.current(),
            ),
            model: model.cloned(),
            node: ctx.node.clone(),
        };
        let session = self.open_session(session_job, deadline, ctx).await?;
        let backend = session.backend().clone();
        let files = self
            .models
            .get(Path::new(&backend.tokenizer))
            .await
            .map_err(|e| {
                StageError::Failed(format!(
                    "cannot load the model files of backend `{}`: {e}",
                    backend.id
                ))
            })?;
        Ok((ModelSide::Live(Box::new(session)), files, backend.model))
    }

    /// Job `of`'s recording, to replay in batch `batch` (checked again here: a task
    /// that reached RUN without the gateway's check must not read another batch's
    /// recording either).
    async fn recording(
        &self,
        of: &str,
        batch: &str,
        across_batches: bool,
    ) -> Result<(ModelSide, Arc<ModelFiles>, String), StageError> {
        let transient = |e: crate::store::StoreError| StageError::Transient(e.to_string());
        let original = self.jobs.job(of).await.map_err(transient)?;
        if let Some(j) = &original {
            replay::check_scope(j, batch, across_batches)
                .map_err(|e| StageError::Failed(format!("replay_of: {e}")))?;
        }
        let recorded = original
            .and_then(|j| j.run_output)
            .filter(|o| o.get("turns").is_some() || o.get("calls").is_some())
            .ok_or_else(|| {
                StageError::Failed(format!(
                    "replay_of: job `{of}` has no recorded episode (no such job, or it never finished its RUN stage)"
                ))
            })?;
        let calls =
            replay::recorded_calls(&recorded).map_err(|e| StageError::Failed(e.to_string()))?;
        let name = recorded["model"].as_str().unwrap_or_default().to_string();
        let backend_id = recorded["backend"].as_str().unwrap_or_default();
        let backends = self.backends.backends().await.map_err(transient)?;
        let backend = backends
            .iter()
            .find(|b| b.spec.id == backend_id)
            .or_else(|| backends.iter().find(|b| b.spec.model == name))
            .ok_or_else(|| {
                StageError::Failed(format!(
                    "replaying needs the model's files: register a backend of model `{name}` \
                     (it is not called; only its tokenizer and chat template are read)"
                ))
            })?;
        let files = self
            .models
            .get(Path::new(&backend.spec.tokenizer))
            .await
            .map_err(|e| {
                StageError::Failed(format!("cannot load the model files of `{name}`: {e}"))
            })?;
        let side = ModelSide::Replay {
            of: of.to_string(),
            recorded,
            replayer: Replayer::new(calls),
        };
        Ok((side, files, name))
    }

    /// This node's sandboxes.
    pub(super) fn sandboxes(&self) -> &Arc<NodeSandboxes> {
        &self.sandboxes
    }

    /// The job store (whether an episode is still wanted).
    pub(super) fn jobs(&self) -> &Arc<dyn JobStore> {
        &self.jobs
    }

    /// The service's settings.
    pub(super) fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The current policy version.
    pub(super) fn policy(&self) -> &crate::policy::PolicyWatch {
        &self.policy
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_groups_placement_is_per_policy_version() {
        assert_eq!(group_key("b", Some("p3"), None).as_deref(), Some("b/p3"));
        assert_eq!(
            group_key("b", Some("p3"), Some(4)).as_deref(),
            Some("b/p3@v4")
        );
        assert_eq!(group_key("b", None, Some(4)), None);
    }
}
