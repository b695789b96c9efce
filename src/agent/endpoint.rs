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

use std::sync::Arc;
use std::time::Instant;

use futures::FutureExt;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::episode::{EpisodeLimits, Parser, TurnGuard, encode_between_turns, encode_conversation};
use super::generation::{self, GenStop, TurnSource, finish_name};
use super::model::ModelFiles;
use super::openai::{self, ApiError};
use super::parse;
use super::render::TurnGlue;
use super::trajectory::{self, Drift, FinishReason, Trajectory, Turn};
use crate::backends::generate::{Generated, Generator};
use crate::backends::wire::{Finish, Sampling};
use crate::domain::duration_us;
use crate::policy::PolicyWatch;

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

/// How a call's tokens joined the samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Merge {
    /// The episode's first call: it starts the first sample.
    First,
    /// Its prompt extends a sample's whole sequence: appended to it.
    Extends,
    /// Its prompt extends no sample: it starts one (see the call's `reason`).
    New,
}

/// One call an agent program made to its endpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelCall {
    /// `chat.completions` or `completions`.
    pub route: String,
    /// The sample its tokens are in (absent for a refused call).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample: Option<usize>,
    /// Its turn in that sample's `turns`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn: Option<usize>,
    /// How its tokens joined the samples.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merge: Option<Merge>,
    /// Why it started a sample of its own, or why it was refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Tokens between the sample's sequence and this call's output (the new messages,
    /// rendered), for a call that extends a sample.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub observation_tokens: usize,
    /// The prompt's length.
    pub prompt_tokens: usize,
    /// For a chat call: whether its messages, rendered and tokenized afresh, give the
    /// prompt it was sent (absent for the first call of a fresh render, which is that).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drift: Option<Drift>,
    /// The earlier call whose conversation and answer this chat call's messages go on
    /// from (its prompt continues that call's tokens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continues: Option<usize>,
    /// The request body as the agent sent it; for a call that `continues` another,
    /// `messages` holds only what follows that call's conversation and answer (so a
    /// long episode's record grows with its calls, not with their square). For a
    /// refused call, `{"bytes": <the body's length>, "head": <its first bytes>}`: a
    /// refused body may be anything up to the endpoint's limit, and is not kept whole.
    pub request: Value,
    /// What it was answered: the assistant message (chat) or `{"text": ...}`, or the
    /// error.
    pub reply: Value,
    /// The OpenAI finish reason it was answered with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<String>,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
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
/// from its last one, or from one of the few conversations it interleaves (sub-agents);
/// a continuation of an older call is rendered afresh (and is then a sample of its own).
const MEMOS: usize = 16;

/// The refused calls an episode allows when its task sets no `max_refused_calls`.
pub const DEFAULT_MAX_REFUSED_CALLS: usize = 16;

/// The most bytes of a refused call's body its record keeps.
pub const REFUSED_BODY_HEAD: usize = 2048;

/// A chat call's conversation as later calls may continue it.
struct ChatMemo {
    /// The request's messages, reduced ([`openai::essence`]).
    essence: Vec<Value>,
    /// The messages as the template saw them.
    messages: Vec<Value>,
    /// The tools offered (a change of tools changes the system prompt).
    tools: Option<Vec<Value>>,
    /// The answer, reduced.
    reply: Value,
    /// The answer as the template renders it.
    reply_message: Value,
    prompt_ids: Vec<u32>,
    output_ids: Vec<u32>,
    /// Whether the output ended with an end-of-turn token.
    ended: bool,
    /// Whether its generation prompt opened the model's reasoning: the same for a call
    /// that continues it (same template, tools and arguments).
    reasoning_open: bool,
}

/// The drift check of a continuation, running beside the call.
type DriftCheck = tokio::task::JoinHandle<Result<Drift, String>>;

/// How a chat call's prompt was made.
struct ChatPrompt {
    ids: Vec<u32>,
    /// The call it continues, when it does.
    continues: Option<usize>,
    /// The messages that call's conversation and answer cover.
    skip: usize,
    /// Why it does not, when it does not.
    fresh_reason: Option<String>,
    /// A continuation's drift check.
    drift: Option<DriftCheck>,
    reasoning_open: bool,
    /// The request's messages reduced ([`openai::essence`]), kept for the calls that
    /// may continue this one.
    essence: Vec<Value>,
    /// The request's messages as the template saw them, kept likewise.
    templated: Vec<Value>,
}

/// The prompt of `messages` rendered afresh and tokenized (tool results as plain text
/// when `as_text`), and whether its generation prompt opens the model's reasoning.
fn fresh_prompt(
    model: &ModelFiles,
    args: &serde_json::Map<String, Value>,
    as_text: bool,
    tools: Option<&[Value]>,
    messages: &[Value],
) -> Result<(Vec<u32>, bool), String> {
    let (ids, text) = encode_conversation(model, messages, tools, true, args, as_text)?;
    Ok((ids, parse::opens_reasoning(&text)))
}

/// The tokens the template writes after the model's turn ending `past` (`ended`: with
/// its end-of-turn token) up to the next generation prompt, with `new` in between.
fn between_calls(
    model: &ModelFiles,
    args: &serde_json::Map<String, Value>,
    as_text: bool,
    tools: Option<&[Value]>,
    past: &[Value],
    new: &[Value],
    ended: bool,
) -> Result<Vec<u32>, String> {
    let template = model.template_for(tools.is_some());
    let glue = TurnGlue::new(template, &model.eos_token, tools, args).map_err(|e| e.to_string())?;
    encode_between_turns(&glue, model, past, new, ended, as_text)
}

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

    async fn chat(
        &mut self,
        body: &str,
        llm: &mut dyn Generator,
        guard: &dyn TurnGuard,
    ) -> Result<Answer, (EndpointStop, Answer)> {
        const ROUTE: &str = "chat.completions";
        let t_call = Instant::now();
        let vocab = self.ep.model.tokenizer.vocab_size();
        let checked = openai::parse::<openai::ChatRequest>(body)
            .and_then(|req| req.check(vocab).map(|stop| (req, stop)));
        let (req, stop) = match checked {
            Ok(r) => r,
            Err(e) => return self.refuse(ROUTE, body, None, e),
        };
        if let Some(e) = self.call_limit() {
            return self.refuse(ROUTE, body, Some(FinishReason::MaxTurns), e);
        }
        let tools = req.tools.clone().filter(|t| !t.is_empty());
        let mut prompt = match self.chat_prompt(&req.messages, tools.clone()).await {
            Ok(p) => p,
            Err(message) => {
                let e = ApiError::bad(
                    "messages",
                    format!("the model's chat template cannot render this conversation: {message}"),
                );
                return self.refuse(ROUTE, body, None, e);
            }
        };
        let limit = req
            .max_completion_tokens
            .or(req.max_tokens)
            .and_then(|m| u64::try_from(m).ok());
        let g = match self
            .generate(ROUTE, body, &prompt.ids, limit, stop, llm, guard)
            .await?
        {
            Ok(g) => g,
            Err(answer) => return Ok(answer),
        };
        // Read as a tree only now: a refused body is never kept whole.
        let mut request: Value = serde_json::from_str(body).unwrap_or(Value::Null);
        let (generated, llm_us, versions) = g;
        let text = self.decode(&generated);
        let cut = generated.generation.finish == Finish::Length && !self.ended(&generated);
        let message = if tools.is_some() {
            let parsed = parse::parse_turn(self.ep.parser, &text, prompt.reasoning_open);
            reply_with_calls(&parsed, &text, self.calls.len())
        } else {
            json!({"role": "assistant", "content": text})
        };
        let with_calls = message.get("tool_calls").is_some();
        let finish = openai::finish_reason(cut, with_calls);
        let index = self.calls.len();
        let ended = self.ended(&generated);
        let output_ids = generated.generation.token_ids.clone();
        let (sample, turn, merge, obs, diverges) =
            self.assemble(&prompt.ids, generated, llm_us, versions, &text, t_call);
        let reason = (merge == Merge::New).then(|| new_sample_reason(&prompt, diverges));
        if let Some(check) = prompt.drift.take() {
            self.drifts.push((index, check));
        }
        self.samples[sample].messages = req
            .messages
            .iter()
            .cloned()
            .chain([message.clone()])
            .collect();
        let completion_tokens = output_ids.len();
        if prompt.continues.is_some() {
            request["messages"] = Value::Array(req.messages[prompt.skip..].to_vec());
        }
        self.remember(index, &mut prompt, tools, &message, output_ids, ended);
        self.calls.push(ModelCall {
            route: ROUTE.into(),
            sample: Some(sample),
            turn: Some(turn),
            merge: Some(merge),
            reason,
            observation_tokens: obs,
            prompt_tokens: prompt.ids.len(),
            drift: None,
            continues: prompt.continues,
            request,
            reply: message.clone(),
            finish_reason: Some(finish.into()),
        });
        let id = format!("chatcmpl-{index}");
        let (body, content_type) = openai::chat_reply(
            &id,
            &self.ep.model_name,
            &message,
            finish,
            openai::usage(prompt.ids.len(), completion_tokens),
            req.stream.unwrap_or(false),
        );
        Ok(Answer {
            status: 200,
            content_type,
            body,
        })
    }

    /// Keeps chat call `index`'s conversation (taken from `prompt`) and answer for the
    /// calls that may continue it (the last [`MEMOS`]).
    fn remember(
        &mut self,
        index: usize,
        prompt: &mut ChatPrompt,
        tools: Option<Vec<Value>>,
        message: &Value,
        output_ids: Vec<u32>,
        ended: bool,
    ) {
        self.memos.push((
            index,
            ChatMemo {
                essence: std::mem::take(&mut prompt.essence),
                messages: std::mem::take(&mut prompt.templated),
                tools,
                reply: openai::essence(message),
                reply_message: openai::for_template(message),
                prompt_ids: prompt.ids.clone(),
                output_ids,
                ended,
                reasoning_open: prompt.reasoning_open,
            },
        ));
        if self.memos.len() > MEMOS {
            self.memos.remove(0);
        }
    }

    async fn completion(
        &mut self,
        body: &str,
        llm: &mut dyn Generator,
        guard: &dyn TurnGuard,
    ) -> Result<Answer, (EndpointStop, Answer)> {
        const ROUTE: &str = "completions";
        let t_call = Instant::now();
        let vocab = self.ep.model.tokenizer.vocab_size();
        let checked = openai::parse::<openai::CompletionRequest>(body)
            .and_then(|req| req.check(vocab).map(|stop| (req, stop)));
        let (req, stop) = match checked {
            Ok(r) => r,
            Err(e) => return self.refuse(ROUTE, body, None, e),
        };
        if let Some(e) = self.call_limit() {
            return self.refuse(ROUTE, body, Some(FinishReason::MaxTurns), e);
        }
        let openai::CompletionRequest {
            prompt,
            max_tokens,
            stream,
            ..
        } = req;
        let ids = match prompt {
            openai::Prompt::Tokens(ids) => Ok(ids),
            // A long text takes a while to tokenize: not on the runtime's threads.
            openai::Prompt::Text(text) => {
                let model = self.ep.model.clone();
                tokio::task::spawn_blocking(move || model.tokenizer.encode(&text))
                    .await
                    .map_err(|e| e.to_string())
                    .and_then(|r| r.map_err(|e| e.to_string()))
            }
            // Refused by the check above; kept total.
            openai::Prompt::Batch(_) | openai::Prompt::Invalid(_) => Ok(Vec::new()),
        };
        let ids = match ids {
            Ok(ids) if !ids.is_empty() => ids,
            Ok(_) => {
                let e = ApiError::bad("prompt", "must not be empty");
                return self.refuse(ROUTE, body, None, e);
            }
            Err(why) => return self.refuse(ROUTE, body, None, ApiError::bad("prompt", why)),
        };
        let asked = max_tokens.and_then(|m| u64::try_from(m).ok());
        let (generated, llm_us, versions) = match self
            .generate(ROUTE, body, &ids, asked, stop, llm, guard)
            .await?
        {
            Ok(g) => g,
            Err(answer) => return Ok(answer),
        };
        let request: Value = serde_json::from_str(body).unwrap_or(Value::Null);
        let all = generated.generation.token_ids.clone();
        let text = self.ep.model.tokenizer.decode(&all).unwrap_or_default();
        let cut = generated.generation.finish == Finish::Length;
        let finish = openai::finish_reason(cut, false);
        let index = self.calls.len();
        let (sample, turn, merge, obs, diverges) =
            self.assemble(&ids, generated, llm_us, versions, &text, t_call);
        let reason = (merge == Merge::New).then(|| match diverges {
            Some(at) => format!("its prompt extends no earlier call's tokens (it differs from the last sample's at token {at})"),
            None => "its prompt extends no earlier call's tokens".to_string(),
        });
        self.calls.push(ModelCall {
            route: ROUTE.into(),
            sample: Some(sample),
            turn: Some(turn),
            merge: Some(merge),
            reason,
            observation_tokens: obs,
            prompt_tokens: ids.len(),
            drift: None,
            continues: None,
            request,
            reply: json!({"text": text}),
            finish_reason: Some(finish.into()),
        });
        let (body, content_type) = openai::completion_reply(
            &format!("cmpl-{index}"),
            &self.ep.model_name,
            &text,
            finish,
            openai::usage(ids.len(), all.len()),
            stream.unwrap_or(false),
        );
        Ok(Answer {
            status: 200,
            content_type,
            body,
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

    /// The prompt of a chat call: a continuation of an earlier call's tokens where the
    /// messages continue its conversation, else a fresh render.
    async fn chat_prompt(
        &self,
        messages: &[Value],
        tools: Option<Vec<Value>>,
    ) -> Result<ChatPrompt, String> {
        let essence: Vec<Value> = messages.iter().map(openai::essence).collect();
        let templated: Vec<Value> = messages.iter().map(openai::for_template).collect();
        let mut continues = None;
        let mut fresh_reason = None;
        // The latest call whose conversation and answer this one goes on from.
        for (index, memo) in self.memos.iter().rev() {
            let k = memo.essence.len();
            if memo.tools == tools
                && essence.len() > k + 1
                && essence[..k] == memo.essence[..]
                && essence[k] == memo.reply
            {
                continues = Some(*index);
                break;
            }
        }
        if continues.is_none() {
            fresh_reason = Some(match self.memos.last() {
                None if self.samples.is_empty() => "the episode's first call".to_string(),
                None => "no earlier chat call".to_string(),
                Some((index, memo)) => why_not_continued(*index, memo, &essence, tools.as_ref()),
            });
        }
        let model = self.ep.model.clone();
        let args = self.ep.template_args.clone();
        let as_text = self.ep.observations_as_text;
        let Some(memo) = continues
            .and_then(|c| self.memos.iter().find(|(i, _)| *i == c))
            .map(|(_, m)| m)
        else {
            let rendered = templated.clone();
            let (ids, reasoning_open) = tokio::task::spawn_blocking(move || {
                fresh_prompt(&model, &args, as_text, tools.as_deref(), &rendered)
            })
            .await
            .map_err(|e| e.to_string())??;
            return Ok(ChatPrompt {
                ids,
                continues,
                skip: 0,
                fresh_reason,
                drift: None,
                reasoning_open,
                essence,
                templated,
            });
        };
        let mut past = memo.messages.clone();
        past.push(memo.reply_message.clone());
        let skip = past.len();
        let before = [memo.prompt_ids.clone(), memo.output_ids.clone()].concat();
        let (ended, reasoning_open) = (memo.ended, memo.reasoning_open);
        let (glue_model, glue_args, glue_tools) = (model.clone(), args.clone(), tools.clone());
        let new = templated[past.len()..].to_vec();
        let ids = tokio::task::spawn_blocking(move || {
            let tools = glue_tools.as_deref();
            let obs = between_calls(&glue_model, &glue_args, as_text, tools, &past, &new, ended)?;
            Ok::<_, String>([before, obs].concat())
        })
        .await
        .map_err(|e| e.to_string())??;
        // Whether a fresh render gives the same tokens is checked beside the call, not in
        // its way: the agent waits for the answer, not for the check.
        let (ours, rendered) = (ids.clone(), templated.clone());
        let drift = tokio::task::spawn_blocking(move || {
            let (fresh, _) = fresh_prompt(&model, &args, as_text, tools.as_deref(), &rendered)?;
            Ok(trajectory::compare(&ours, &fresh, &[]))
        });
        Ok(ChatPrompt {
            ids,
            continues,
            skip,
            fresh_reason,
            drift: Some(drift),
            reasoning_open,
            essence,
            templated,
        })
    }

    /// Puts a call's tokens into the samples; returns the sample, the turn's index in
    /// it, the verdict, the observation tokens before the call's output, and (for a
    /// new sample) where its prompt leaves the last sample's tokens.
    fn assemble(
        &mut self,
        prompt: &[u32],
        generated: Generated,
        llm_us: u64,
        versions: generation::TurnVersions,
        text: &str,
        t_call: Instant,
    ) -> (usize, usize, Merge, usize, Option<usize>) {
        let found = self.samples.iter().rposition(|s| {
            s.len() <= prompt.len()
                && s.prompt_ids[..] == prompt[..s.prompt_ids.len()]
                && s.response_ids[..] == prompt[s.prompt_ids.len()..s.len()]
        });
        let diverges = match found {
            Some(_) => None,
            None => self.samples.last().map(|s| {
                let all = s.all_ids();
                all.iter()
                    .zip(prompt)
                    .position(|(a, b)| a != b)
                    .unwrap_or(all.len().min(prompt.len()))
            }),
        };
        let (index, merge, obs) = match found {
            Some(i) => {
                let s = &mut self.samples[i];
                let obs = &prompt[s.len()..];
                s.push_observation(obs);
                if let Some(last) = s.turns.last_mut() {
                    last.observation_range = [last.model_range[1], s.response_ids.len()];
                }
                (i, Merge::Extends, obs.len())
            }
            None => {
                let merge = if self.samples.is_empty() {
                    Merge::First
                } else {
                    Merge::New
                };
                self.samples.push(Trajectory::new(
                    prompt.to_vec(),
                    &self.ep.model_name,
                    Vec::new(),
                ));
                (self.samples.len() - 1, merge, 0)
            }
        };
        let Generated {
            generation: g,
            backend,
            logprobs_mode,
            backend_wait,
        } = generated;
        let s = &mut self.samples[index];
        let start = s.response_ids.len();
        s.push_model(&g.token_ids, &g.logprobs);
        let mut from = start;
        for &(len, version) in &versions.spans {
            if let Some(v) = version {
                s.note_policy_version(v, from, from + len);
            }
            from += len;
        }
        s.backend = backend.clone();
        s.note_logprobs_mode(logprobs_mode);
        let wall = duration_us(t_call.elapsed());
        let waited = duration_us(backend_wait);
        s.turns.push(Turn {
            text: text.to_string(),
            model_range: [start, s.response_ids.len()],
            observation_range: [s.response_ids.len(); 2],
            tools: Vec::new(),
            backend,
            generation_finish: finish_name(g.finish).to_string(),
            llm_latency_us: llm_us,
            backend_wait_us: waited,
            tool_latency_us: 0,
            overhead_us: wall.saturating_sub(waited),
            cached_prompt_tokens: g.cached_prompt_tokens,
            prompt_tokens: prompt.len(),
            logprobs_mode,
            policy_version: versions.sent(),
            policy_version_end: versions.changed(),
            continued: u32::try_from(versions.parts - 1).unwrap_or(u32::MAX),
        });
        (index, s.turns.len() - 1, merge, obs, diverges)
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

/// Why a chat call started a sample of its own.
fn new_sample_reason(prompt: &ChatPrompt, diverges: Option<usize>) -> String {
    match (&prompt.fresh_reason, diverges) {
        (Some(r), Some(at)) => {
            format!("{r}; its prompt differs from the last sample's tokens at token {at}")
        }
        (Some(r), None) => r.clone(),
        (None, _) => format!(
            "it continues call {}, whose sample another call has continued since: a branch",
            prompt.continues.unwrap_or_default()
        ),
    }
}

/// Why a chat request does not continue the last call's conversation.
fn why_not_continued(
    index: usize,
    memo: &ChatMemo,
    essence: &[Value],
    tools: Option<&Vec<Value>>,
) -> String {
    let k = memo.essence.len();
    if let Some(i) = memo.essence.iter().zip(essence).position(|(a, b)| a != b) {
        return format!(
            "its message {i} differs from call {index}'s conversation (history edited or replaced)"
        );
    }
    if essence.len() <= k {
        return format!("it has fewer messages than call {index}'s conversation");
    }
    if essence[k] != memo.reply {
        return format!("its message {k} is not the answer call {index} was given");
    }
    if memo.tools.as_ref() != tools {
        return format!("the tools offered differ from call {index}'s");
    }
    format!("nothing follows call {index}'s answer")
}

/// The assistant message for a call's text with tools offered: the calls that parsed
/// as OpenAI `tool_calls` (arguments as a JSON string) and the text around them; the
/// whole text as content when a call did not parse (the agent then sees what the model
/// wrote).
fn reply_with_calls(parsed: &parse::ParsedTurn, text: &str, call: usize) -> Value {
    if parsed.calls.is_empty() || parsed.calls.iter().any(Result::is_err) {
        return json!({"role": "assistant", "content": text});
    }
    let calls: Vec<Value> = parsed
        .calls
        .iter()
        .filter_map(|c| c.as_ref().ok())
        .enumerate()
        .map(|(i, c)| {
            let arguments = c
                .raw_arguments
                .clone()
                .unwrap_or_else(|| c.arguments.to_string());
            json!({"id": format!("call_{call}_{i}"), "type": "function",
                   "function": {"name": c.name, "arguments": arguments}})
        })
        .collect();
    let content = if parsed.content.is_empty() {
        Value::Null
    } else {
        Value::String(parsed.content.clone())
    };
    json!({"role": "assistant", "content": content, "tool_calls": calls})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::episode::AlwaysWanted;
    use crate::backends::generate::GenerateError;
    use crate::backends::wire::Generation;
    use crate::domain::backend::LogprobsMode;
    use crate::scripted::demo;
    use async_trait::async_trait;

    /// Answers each request with the next scripted text and the end-of-turn token;
    /// records the prompts.
    struct Script {
        model: Arc<ModelFiles>,
        texts: Vec<String>,
        prompts: Vec<Vec<u32>>,
    }

    #[async_trait]
    impl Generator for Script {
        async fn generate(
            &mut self,
            prompt_ids: &[u32],
            _sampling: &Sampling,
            _turn: usize,
        ) -> Result<Generated, GenerateError> {
            let text = self.texts[self.prompts.len()].clone();
            self.prompts.push(prompt_ids.to_vec());
            let mut ids = self.model.tokenizer.encode(&text).unwrap();
            ids.push(self.model.eos_id);
            let logprobs = (0..ids.len()).map(|i| -(i as f32) / 8.0).collect();
            Ok(Generated {
                generation: Generation {
                    token_ids: ids,
                    logprobs,
                    finish: Finish::Stop,
                    cached_prompt_tokens: None,
                    text: None,
                    after_pause: false,
                    weight_versions: None,
                },
                backend: "b0".into(),
                logprobs_mode: LogprobsMode::Raw,
                backend_wait: std::time::Duration::ZERO,
            })
        }

        fn take_switches(&mut self) -> Vec<trajectory::BackendSwitch> {
            Vec::new()
        }
    }

    fn endpoint(model: &Arc<ModelFiles>) -> Endpoint {
        Endpoint::new(ProgramEpisode {
            model: model.clone(),
            model_name: "demo".into(),
            parser: Parser::Hermes,
            sampling: Sampling::default(),
            limits: EpisodeLimits {
                max_turns: 10,
                max_tokens: 4096,
                max_new_tokens: 256,
                tool_timeout: std::time::Duration::from_secs(1),
                stop_without_tool_call: true,
                max_observation_bytes: 1024,
            },
            max_refused_calls: DEFAULT_MAX_REFUSED_CALLS,
            template_args: serde_json::Map::new(),
            observations_as_text: true,
            deadline: tokio::time::Instant::now() + std::time::Duration::from_secs(60),
            policy: PolicyWatch::at_version(None),
        })
    }

    const CALL: &str =
        "<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": \"ls\"}}\n</tool_call>";

    fn tools() -> Value {
        json!([{"type": "function", "function": {"name": "bash", "parameters": {"type": "object",
            "properties": {"command": {"type": "string"}}}}}])
    }

    async fn chat(e: &mut Endpoint, llm: &mut Script, messages: &[Value]) -> Value {
        let body = json!({"model": "x", "messages": messages, "tools": tools()}).to_string();
        let a = e
            .serve("POST", "/v1/chat/completions", &body, llm, &AlwaysWanted)
            .await
            .unwrap();
        assert_eq!(a.status, 200, "{}", a.body);
        serde_json::from_str::<Value>(&a.body).unwrap()["choices"][0]["message"].clone()
    }

    #[tokio::test]
    async fn continuations_join_a_sample_token_exact_and_a_branch_starts_another() {
        let model = Arc::new(demo::model_files(demo::CHATML_TEMPLATE, &[CALL]).unwrap());
        let mut llm = Script {
            model: model.clone(),
            texts: vec![CALL.into(), "Done.".into(), "Other.".into()],
            prompts: Vec::new(),
        };
        let mut e = endpoint(&model);
        let opening = vec![json!({"role": "user", "content": "List the files."})];
        let first = chat(&mut e, &mut llm, &opening).await;
        assert_eq!(
            first["tool_calls"][0]["function"]["arguments"],
            "{\"command\":\"ls\"}"
        );
        let id = first["tool_calls"][0]["id"].as_str().unwrap().to_string();
        let mut convo = opening.clone();
        convo.push(first.clone());
        convo.push(json!({"role": "tool", "tool_call_id": id, "content": "a.py\nb.py"}));
        chat(&mut e, &mut llm, &convo).await;
        // The second prompt is the first prompt and output, then the tool result's tokens.
        let (p0, p1) = (llm.prompts[0].clone(), llm.prompts[1].clone());
        let out0 = e.samples[0].turns[0].model_range;
        assert_eq!(&p1[..p0.len()], &p0[..]);
        assert_eq!(
            &p1[p0.len()..p0.len() + out0[1]],
            &e.samples[0].response_ids[..out0[1]]
        );
        // Its record keeps only what followed call 0's conversation and answer.
        assert_eq!(e.calls[1].continues, Some(0));
        assert_eq!(e.calls[1].request["messages"].as_array().unwrap().len(), 1);
        assert_eq!(e.calls[1].request["messages"][0]["role"], "tool");
        // The same continuation again is a branch off call 0: a sample of its own.
        chat(&mut e, &mut llm, &convo).await;
        let merges: Vec<_> = e.calls.iter().map(|c| c.merge.unwrap()).collect();
        assert_eq!(merges, [Merge::First, Merge::Extends, Merge::New]);
        assert!(
            e.calls[2].reason.as_deref().unwrap().contains("a branch"),
            "{:?}",
            e.calls[2]
        );
        assert_eq!(e.samples.len(), 2);
        assert_eq!(e.samples[1].prompt_ids, llm.prompts[2]);
        let s = &e.samples[0];
        assert_eq!(s.all_ids()[..p1.len()], p1[..]);
        assert!(crate::agent::episode::mask_matches_turns(s));
        // The continuation renders afresh to the same tokens with this template (the
        // check runs beside the calls, and is in by the end).
        let run = e.finish(ProgramEnd::Exited).await;
        let drift = run.calls[1].drift.as_ref().unwrap();
        assert!(drift.identical, "{drift:?}");
    }

    #[tokio::test]
    async fn completions_merge_by_tokens_and_limits_refuse_calls() {
        let model = Arc::new(demo::model_files(demo::CHATML_TEMPLATE, &[]).unwrap());
        let mut llm = Script {
            model: model.clone(),
            texts: vec!["One.".into(), "Two.".into()],
            prompts: Vec::new(),
        };
        let mut e = endpoint(&model);
        e.ep.limits.max_turns = 2;
        let serve = |body: Value| body.to_string();
        let a = e
            .serve(
                "POST",
                "/v1/completions",
                &serve(json!({"prompt": [5, 6, 7]})),
                &mut llm,
                &AlwaysWanted,
            )
            .await
            .unwrap();
        assert_eq!(a.status, 200, "{}", a.body);
        let mut next = vec![5, 6, 7];
        next.extend(&e.samples[0].response_ids);
        next.extend([8, 9]);
        e.serve(
            "POST",
            "/v1/completions",
            &serve(json!({"prompt": next})),
            &mut llm,
            &AlwaysWanted,
        )
        .await
        .unwrap();
        assert_eq!(e.samples.len(), 1);
        assert_eq!(e.calls[1].merge, Some(Merge::Extends));
        assert_eq!(e.calls[1].observation_tokens, 2);
        assert_eq!(
            &e.samples[0].loss_mask[e.samples[0].turns[0].model_range[1]..][..2],
            &[0, 0]
        );
        let refused = e
            .serve(
                "POST",
                "/v1/completions",
                &serve(json!({"prompt": [1]})),
                &mut llm,
                &AlwaysWanted,
            )
            .await
            .unwrap();
        assert_eq!(refused.status, 400);
        assert!(
            refused.body.contains("model calls are spent"),
            "{}",
            refused.body
        );
        let bad = e
            .serve(
                "POST",
                "/v1/completions",
                &serve(json!({"prompt": [1], "n": 3})),
                &mut llm,
                &AlwaysWanted,
            )
            .await
            .unwrap();
        assert!(
            bad.status == 400 && bad.body.contains("\"param\":\"n\""),
            "{}",
            bad.body
        );
        let missing = e
            .serve("GET", "/v1/embeddings", "", &mut llm, &AlwaysWanted)
            .await
            .unwrap();
        assert_eq!(missing.status, 404);
        let run = e.finish(ProgramEnd::Exited).await;
        assert_eq!(run.trajectory.finish_reason, Some(FinishReason::MaxTurns));
        assert_eq!(run.calls.len(), 4, "the refused calls are recorded");
        assert_eq!(run.calls[3].reply["error"]["param"], "n");
    }

    async fn serve(e: &mut Endpoint, llm: &mut Script, body: &str) -> Answer {
        e.serve("POST", "/v1/completions", body, llm, &AlwaysWanted)
            .await
            .unwrap_or_else(|(stop, _)| panic!("the episode ended: {stop:?}"))
    }

    /// Requests vLLM refuses (and that once panicked the job or failed it) are 400s the
    /// program reads; their records are short whatever the body; none reaches the
    /// backend.
    #[tokio::test]
    async fn malformed_calls_are_refused_and_recorded_short() {
        let model = Arc::new(demo::model_files(demo::CHATML_TEMPLATE, &[]).unwrap());
        let mut llm = Script {
            model: model.clone(),
            texts: vec!["One.".into()],
            prompts: Vec::new(),
        };
        let mut e = endpoint(&model);
        let vocab = model.tokenizer.vocab_size() as u64;
        let huge = "x".repeat(4 << 20);
        for (body, param) in [
            // It panicked RUN ("a turn has a part"), and the job was run again.
            (json!({"prompt": [5, 6], "max_tokens": 0}), "max_tokens"),
            // The backend refused it, which failed the job.
            (json!({"prompt": [5, vocab]}), "prompt"),
            (json!({"prompt": [5], "stop": [""]}), "stop"),
            (json!({"prompt": [5], "user": huge}), ""),
            (json!({"prompt": [5], "max_tokens": huge}), "max_tokens"),
        ] {
            let mut body = body.to_string();
            if param.is_empty() {
                // A body past its JSON (trailing bytes) is not a request.
                body.push_str(" trailing");
            }
            let a = serve(&mut e, &mut llm, &body).await;
            assert_eq!(a.status, 400, "{}", a.body);
            let j: Value = serde_json::from_str(&a.body).unwrap();
            assert_eq!(j["error"]["type"], "BadRequestError", "{j}");
            if !param.is_empty() {
                assert_eq!(j["error"]["param"], param, "{j}");
            }
            assert!(a.body.len() < 4096, "{}", a.body.len());
        }
        assert!(llm.prompts.is_empty(), "a refused call reached the backend");
        assert_eq!(
            serve(&mut e, &mut llm, &json!({"prompt": [5, 6]}).to_string())
                .await
                .status,
            200
        );
        let run = e.finish(ProgramEnd::Exited).await;
        assert_eq!(run.trajectory.finish_reason, Some(FinishReason::Exited));
        assert_eq!(run.calls.len(), 6);
        for c in &run.calls[..5] {
            assert_eq!(c.sample, None);
            let head = c.request["head"].as_str().unwrap();
            assert!(head.len() <= REFUSED_BODY_HEAD, "{}", head.len());
            assert!(c.request["bytes"].as_u64().unwrap() >= head.len() as u64);
        }
        assert!(run.calls[3].request["bytes"].as_u64().unwrap() > 4 << 20);
        assert_eq!(run.calls[5].merge, Some(Merge::First));
        let record = serde_json::to_string(&run).unwrap();
        assert!(record.len() < 64 << 10, "{}", record.len());
    }

    /// The call that reaches the cap on refused calls ends the episode, for its own
    /// reason unless a limit refused a call.
    #[tokio::test]
    async fn refused_calls_are_capped() {
        let model = Arc::new(demo::model_files(demo::CHATML_TEMPLATE, &[]).unwrap());
        let mut llm = Script {
            model: model.clone(),
            texts: Vec::new(),
            prompts: Vec::new(),
        };
        let mut e = endpoint(&model);
        e.ep.max_refused_calls = 3;
        let bad = json!({"prompt": [5], "n": 0}).to_string();
        for _ in 0..2 {
            assert_eq!(serve(&mut e, &mut llm, &bad).await.status, 400);
        }
        // Not a model call: neither recorded nor counted.
        let missing = e
            .serve("POST", "/v1/embeddings", "{}", &mut llm, &AlwaysWanted)
            .await
            .unwrap();
        assert_eq!(missing.status, 404);
        let wrong = e
            .serve("GET", "/v1/completions", "", &mut llm, &AlwaysWanted)
            .await
            .unwrap();
        assert_eq!(wrong.status, 405);
        let Err((EndpointStop::Refusals, last)) = e
            .serve("POST", "/v1/completions", &bad, &mut llm, &AlwaysWanted)
            .await
        else {
            panic!("the third refused call did not end the episode");
        };
        assert_eq!(last.status, 400);
        assert!(last.body.contains("the episode ends here"), "{}", last.body);
        let run = e.finish(ProgramEnd::Refused).await;
        assert_eq!(run.calls.len(), 3);
        assert_eq!(
            run.trajectory.finish_reason,
            Some(FinishReason::RefusedCalls)
        );
    }

    /// A call the endpoint panics on (here: the generator has no answer scripted) is
    /// refused, not the end of the job.
    #[tokio::test]
    async fn a_panic_while_serving_is_a_refused_call() {
        let model = Arc::new(demo::model_files(demo::CHATML_TEMPLATE, &[]).unwrap());
        let mut llm = Script {
            model: model.clone(),
            texts: Vec::new(),
            prompts: Vec::new(),
        };
        let mut e = endpoint(&model);
        let a = serve(&mut e, &mut llm, &json!({"prompt": [5, 6]}).to_string()).await;
        assert_eq!(a.status, 400, "{}", a.body);
        assert!(a.body.contains("the endpoint failed"), "{}", a.body);
        let run = e.finish(ProgramEnd::Exited).await;
        assert_eq!(run.calls.len(), 1);
        assert_eq!(run.calls[0].route, "completions");
    }
}
