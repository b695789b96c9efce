//! The model side of an agent program's episode: the per-episode OpenAI-compatible
//! endpoint, and the training samples assembled from its calls.
//!
//! An agent written elsewhere sends whole conversations; the policy must still be
//! trained on the tokens it saw and produced. Each call is answered token-in,
//! token-out, like a turn of the built-in loop ([`super::generation`]: the same backend
//! session, weight-update holds, aborts and version tags):
//!
//! - A chat request whose messages are an earlier call's conversation, then the answer
//!   that call got, then new messages (tool results, a user message) is a
//!   continuation: its prompt is that call's prompt and output tokens, exactly as they
//!   were, followed by the new messages as the chat template renders them after a turn
//!   ([`super::render::TurnGlue`]). The answer is never tokenized again from the
//!   agent's copy of it.
//! - Any other chat request (the first, a compacted history, a sub-agent's own
//!   conversation, an edited one) is rendered afresh.
//! - A completion request's prompt is the agent's tokens, or its text tokenized.
//!
//! Calls are then assembled into samples the way AReaL and Agent Lightning do: a call
//! whose prompt extends a sample's whole token sequence is appended to it (the new
//! prompt tokens with loss mask 0, the output with 1); otherwise it starts a sample.
//! Each call says which happened (`merge`), and why a new sample began. A chat call
//! also carries the drift check of its request: whether rendering and tokenizing its
//! messages afresh gives the tokens it was sent, so a trainer that re-tokenizes sees
//! where it would differ.
//!
//! Nothing a program sends can end its own job. A request vLLM would refuse is refused
//! with a 400 naming the field ([`openai`]), before it reaches the backend; a call the
//! endpoint fails on in any other way (a panic included) is refused too. A refused call
//! is recorded with the first bytes of its body and its length, never the whole body,
//! and counts toward the episode's cap on refused calls: the call that reaches it ends
//! the episode, which is then graded as it stands. A program that keeps sending calls
//! it cannot get answered so neither runs until its deadline nor grows its record.
//!
//! The pieces: `record` (what each call leaves for the trainer), `chat` and
//! `completion` (the two kinds of model call), `samples` (how calls join samples);
//! this module holds the endpoint itself, its refusals, one call's generation and the
//! episode's end.

use std::sync::Arc;

use futures::FutureExt;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::episode::{EpisodeLimits, Parser, TurnGuard};
use super::generation::{self, GenStop, TurnSource};
use super::model::ModelFiles;
use super::openai::{self, ApiError};
use super::trajectory::{self, Drift, FinishReason, Trajectory};
use crate::backends::generate::{Generated, Generator};
use crate::backends::wire::Sampling;
use crate::policy::PolicyWatch;

mod chat;
mod completion;
mod record;
mod samples;
#[cfg(test)]
mod tests;

use chat::{ChatMemo, DriftCheck};
pub use record::{Merge, ModelCall};

/// What an agent program's episode is about, for its endpoint.
#[derive(Debug, Clone)]
pub struct ProgramEpisode {
    /// The model's tokenizer and chat template.
    pub model: Arc<ModelFiles>,
    /// The model's name, which `/v1/models` lists.
    pub model_name: String,
    /// How tool calls are read from the model's text.
    pub parser: Parser,
    /// The task's sampling parameters (the agent's own are not used).
    pub sampling: Sampling,
    /// `max_turns` caps the calls; `max_tokens` the context; `max_new_tokens` a call.
    pub limits: EpisodeLimits,
    /// The refused calls the episode allows: the one that reaches this ends it.
    pub max_refused_calls: usize,
    /// Extra variables for the chat template.
    pub template_args: serde_json::Map<String, Value>,
    /// Whether tool results are tokenized as plain text.
    pub observations_as_text: bool,
    /// When the episode must end.
    pub deadline: tokio::time::Instant,
    /// The current policy version, which each call's tokens are tagged with.
    pub policy: PolicyWatch,
}

/// An answer for the endpoint to send.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// The HTTP status.
    pub status: u16,
    /// The `content-type`.
    pub content_type: String,
    /// The body.
    pub body: String,
}

impl Answer {
    fn error(e: &ApiError) -> Self {
        Answer {
            status: e.status,
            content_type: "application/json".into(),
            body: e.body(),
        }
    }
}

/// Why the episode cannot go on.
#[derive(Debug)]
pub enum EndpointStop {
    /// The job is no longer wanted.
    Cancelled,
    /// The program's calls were refused as often as the episode allows: the episode
    /// ends here, and is graded as it stands.
    Refusals,
    /// No backend could answer.
    Backend(String),
    /// The deadline passed while a call generated.
    Timeout,
}

/// How many of the latest chat calls a request may continue: an agent's calls go on
/// The refused calls an episode allows when its task sets no `max_refused_calls`.
pub const DEFAULT_MAX_REFUSED_CALLS: usize = 16;

/// The most bytes of a refused call's body its record keeps.
pub const REFUSED_BODY_HEAD: usize = 2048;

/// The endpoint of one episode: it answers calls and keeps their record.
pub struct Endpoint {
    ep: ProgramEpisode,
    /// The task's sampling, plus the model's stop tokens.
    sampling: Sampling,
    calls: Vec<ModelCall>,
    /// Per answered chat call, by call index.
    memos: Vec<(usize, ChatMemo)>,
    samples: Vec<Trajectory>,
    /// Calls answered with tokens (the calls the task's `max_turns` counts).
    answered: usize,
    /// Calls refused (counted against `max_refused_calls`).
    refusals: usize,
    /// The limit that refused a call, when one did.
    refused: Option<FinishReason>,
    /// Drift checks still running, by call index.
    drifts: Vec<(usize, DriftCheck)>,
    switches: Vec<trajectory::BackendSwitch>,
}

impl Endpoint {
    /// The endpoint of `ep`.
    pub fn new(ep: ProgramEpisode) -> Self {
        let mut sampling = ep.sampling.clone();
        for &id in &ep.model.stop_ids {
            if !sampling.stop_token_ids.contains(&id) {
                sampling.stop_token_ids.push(id);
            }
        }
        Endpoint {
            ep,
            sampling,
            calls: Vec::new(),
            memos: Vec::new(),
            samples: Vec::new(),
            answered: 0,
            refusals: 0,
            refused: None,
            drifts: Vec::new(),
            switches: Vec::new(),
        }
    }

    /// The calls so far.
    pub fn calls(&self) -> &[ModelCall] {
        &self.calls
    }

    /// Answers one HTTP request of the agent. An error the agent made is its answer
    /// (4xx); an episode that cannot go on is the `Err`, with the answer to send first.
    /// A panic while serving it is caught and the call refused: whatever the program
    /// sent, the job goes on.
    pub async fn serve(
        &mut self,
        method: &str,
        path: &str,
        body: &str,
        llm: &mut dyn Generator,
        guard: &dyn TurnGuard,
    ) -> Result<Answer, (EndpointStop, Answer)> {
        let served = std::panic::AssertUnwindSafe(self.route(method, path, body, llm, guard))
            .catch_unwind()
            .await;
        let panic = match served {
            Ok(answered) => return answered,
            Err(panic) => panic,
        };
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        tracing::error!(
            panic = %what,
            method,
            path = openai::head(path, 200),
            "serving an agent program's call panicked: the call is refused"
        );
        let e = ApiError::new(
            400,
            format!("the endpoint failed on this request ({what}); it is refused"),
            None,
        );
        let route = match route_of(path) {
            "/chat/completions" => "chat.completions",
            "/completions" => "completions",
            other => openai::head(other, 200),
        }
        .to_string();
        self.refuse(&route, body, None, e)
    }

    async fn route(
        &mut self,
        method: &str,
        path: &str,
        body: &str,
        llm: &mut dyn Generator,
        guard: &dyn TurnGuard,
    ) -> Result<Answer, (EndpointStop, Answer)> {
        let route = route_of(path);
        match (method, route) {
            ("GET", "/models") => Ok(Answer {
                status: 200,
                content_type: "application/json".into(),
                body: openai::models(&self.ep.model_name),
            }),
            ("POST", "/chat/completions") => self.chat(body, llm, guard).await,
            ("POST", "/completions") => self.completion(body, llm, guard).await,
            // Not a model call: answered, not recorded (it cost nothing).
            (_, "/models" | "/chat/completions" | "/completions") => Ok(Answer::error(
                &ApiError::new(405, format!("{method} is not allowed on {route}"), None),
            )),
            _ => Ok(Answer::error(&ApiError::new(
                404,
                format!(
                    "{method} {path} is not served here; this endpoint serves POST /v1/chat/completions, POST /v1/completions and GET /v1/models"
                ),
                None,
            ))),
        }
    }

    /// Refuses a call, recording it (its body's first bytes and its length, never the
    /// whole body) and counting it toward the episode's cap; `limit`, when a limit
    /// refused it, becomes the episode's finish reason if nothing else ends it. The
    /// call that reaches the cap ends the episode (the `Err`).
    fn refuse(
        &mut self,
        route: &str,
        body: &str,
        limit: Option<FinishReason>,
        e: ApiError,
    ) -> Result<Answer, (EndpointStop, Answer)> {
        if limit.is_some() {
            self.refused = limit;
        }
        self.refusals += 1;
        let (n, cap) = (self.refusals, self.ep.max_refused_calls);
        let last = n >= cap;
        let e = if last {
            ApiError::new(
                e.status,
                format!(
                    "refused call {n} of the {cap} this episode allows, so the episode ends here: {}",
                    e.message
                ),
                e.param,
            )
        } else {
            e
        };
        self.calls.push(ModelCall {
            route: route.into(),
            sample: None,
            turn: None,
            merge: None,
            reason: Some(e.message.clone()),
            observation_tokens: 0,
            prompt_tokens: 0,
            drift: None,
            continues: None,
            request: json!({"bytes": body.len(), "head": openai::head(body, REFUSED_BODY_HEAD)}),
            reply: e.to_json(),
            finish_reason: None,
        });
        let answer = Answer::error(&e);
        if last {
            tracing::warn!(
                refused = n,
                "the agent program's calls were refused as often as its episode allows: the episode ends"
            );
            return Err((EndpointStop::Refusals, answer));
        }
        Ok(answer)
    }

    fn call_limit(&self) -> Option<ApiError> {
        let max = self.ep.limits.max_turns;
        (self.answered >= max).then(|| {
            ApiError::new(
                400,
                format!("this episode's {max} model calls are spent (the task's max_turns)"),
                None,
            )
        })
    }

    /// Generates one call's tokens after `prompt`. The inner `Err` is an answer that
    /// refuses the call (a limit); the outer one ends the episode.
    #[allow(clippy::too_many_arguments)]
    async fn generate(
        &mut self,
        route: &str,
        body: &str,
        prompt: &[u32],
        asked: Option<u64>,
        stop: Vec<String>,
        llm: &mut dyn Generator,
        guard: &dyn TurnGuard,
    ) -> Result<Result<(Generated, u64, generation::TurnVersions), Answer>, (EndpointStop, Answer)>
    {
        let max = self.ep.limits.max_tokens;
        let room = max.saturating_sub(prompt.len());
        if room == 0 {
            let e = context_full(route, prompt.len(), max);
            let limit = Some(FinishReason::ContextLength);
            return self.refuse(route, body, limit, e).map(Err);
        }
        let mut sampling = self.sampling.clone();
        if let Some(a) = asked {
            sampling.max_tokens = Some(sampling.max_tokens.map_or(a, |m| m.min(a)));
        }
        sampling.stop.extend(stop);
        let source = TurnSource {
            policy: &self.ep.policy,
            deadline: self.ep.deadline,
            sampling: &sampling,
            max_new_tokens: self.ep.limits.max_new_tokens,
        };
        let turn = self.answered;
        let r = generation::generate_turn(&source, llm, guard, prompt, turn, room).await;
        self.switches.extend(llm.take_switches());
        match r {
            Ok(std::ops::ControlFlow::Continue(g)) => {
                self.answered += 1;
                Ok(Ok(g))
            }
            Ok(std::ops::ControlFlow::Break(FinishReason::ContextLength)) => {
                let e = context_full(route, prompt.len(), max);
                let limit = Some(FinishReason::ContextLength);
                self.refuse(route, body, limit, e).map(Err)
            }
            Ok(std::ops::ControlFlow::Break(FinishReason::Timeout)) => Err((
                EndpointStop::Timeout,
                Answer::error(&ApiError::new(504, "the episode's time limit passed", None)),
            )),
            // Nothing generated within the call's limit (none is left to it).
            Ok(std::ops::ControlFlow::Break(reason)) => {
                let e = ApiError::bad(
                    "max_tokens",
                    format!(
                        "no token can be generated for this call ({})",
                        reason.as_str()
                    ),
                );
                self.refuse(route, body, None, e).map(Err)
            }
            Err(GenStop::Cancelled) => Err((
                EndpointStop::Cancelled,
                Answer::error(&ApiError::new(503, "the episode was cancelled", None)),
            )),
            Err(GenStop::Backend(m)) => {
                let answer = Answer::error(&ApiError::new(503, m.clone(), None));
                Err((EndpointStop::Backend(m), answer))
            }
        }
    }

    fn ended(&self, g: &Generated) -> bool {
        g.generation
            .token_ids
            .last()
            .is_some_and(|t| self.ep.model.stop_ids.contains(t))
    }

    /// The call's text: its tokens decoded, without the end-of-turn token.
    fn decode(&self, g: &Generated) -> String {
        let ids = &g.generation.token_ids;
        let body = if self.ended(g) {
            &ids[..ids.len() - 1]
        } else {
            &ids[..]
        };
        self.ep.model.tokenizer.decode(body).unwrap_or_default()
    }

    /// The episode's record once the program ended: the sample of its last answered
    /// call as the trajectory, every sample, every call. `reason` is why it ended;
    /// a program that exited after a limit refused one of its calls ended for that limit.
    pub async fn finish(mut self, ended: ProgramEnd) -> ProgramRun {
        for (index, check) in std::mem::take(&mut self.drifts) {
            let drift = match check.await {
                Ok(Ok(d)) => d,
                Ok(Err(e)) => Drift::unchecked(e),
                Err(e) => Drift::unchecked(format!("the check did not finish: {e}")),
            };
            // Looked up, not indexed: a call cut short by a panic may have left its
            // check without its record.
            if let Some(call) = self.calls.get_mut(index) {
                call.drift = Some(drift);
            }
        }
        let reason = match ended {
            ProgramEnd::Timeout => FinishReason::Timeout,
            ProgramEnd::Exited => self.refused.unwrap_or(FinishReason::Exited),
            ProgramEnd::Refused => self.refused.unwrap_or(FinishReason::RefusedCalls),
        };
        let main = self
            .calls
            .iter()
            .rev()
            .find_map(|c| c.sample)
            .unwrap_or_default();
        let answer = self
            .calls
            .iter()
            .rev()
            .find(|c| c.sample.is_some())
            .map(|c| {
                c.reply
                    .get("content")
                    .or_else(|| c.reply.get("text"))
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string()
            });
        for (i, s) in self.samples.iter_mut().enumerate() {
            s.finish_reason = Some(reason);
            s.drift = self
                .calls
                .iter()
                .rev()
                .find(|c| c.sample == Some(i))
                .and_then(|c| c.drift.clone());
            if i == main {
                s.answer = answer.clone();
                s.backend_switches = std::mem::take(&mut self.switches);
            }
        }
        let trajectory = self.samples.get(main).cloned().unwrap_or_else(|| {
            let mut t = Trajectory::new(Vec::new(), &self.ep.model_name, Vec::new());
            t.finish_reason = Some(reason);
            t
        });
        ProgramRun {
            trajectory,
            samples: self.samples,
            calls: self.calls,
        }
    }
}

/// How the agent program's run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgramEnd {
    /// It exited (whatever its status).
    Exited,
    /// The episode's deadline passed.
    Timeout,
    /// Its calls were refused as often as the episode allows
    /// ([`EndpointStop::Refusals`]): it was stopped with its sandbox.
    Refused,
}

/// An agent program's episode, for the trainer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProgramRun {
    /// The sample holding the last answered call, as a trajectory (what a trainer that
    /// takes one sample per episode trains on).
    #[serde(flatten)]
    pub trajectory: Trajectory,
    /// Every sample, in the order they began.
    pub samples: Vec<Trajectory>,
    /// Every call, in order.
    pub calls: Vec<ModelCall>,
}

/// The refusal of a call whose prompt leaves no room in the episode's context.
fn context_full(route: &str, prompt: usize, max: usize) -> ApiError {
    ApiError::bad(
        if route == "completions" {
            "prompt"
        } else {
            "messages"
        },
        format!(
            "This model's maximum context length is {max} tokens (the task's max_tokens). However, your prompt contains {prompt} input tokens: no room to generate"
        ),
    )
}

/// The route of a request's path: without its query, trailing `/` and `/v1`.
fn route_of(path: &str) -> &str {
    let route = path
        .split('?')
        .next()
        .unwrap_or_default()
        .trim_end_matches('/');
    route.strip_prefix("/v1").unwrap_or(route)
}
