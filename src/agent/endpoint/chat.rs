//! Chat calls: a request whose messages go on from an earlier call's conversation and
//! answer continues that call's tokens exactly; any other is rendered afresh. The
//! continuation's drift check (does a fresh render give the same tokens?) runs beside
//! the call.

use std::time::Instant;

use serde_json::{Value, json};

use super::{Answer, Endpoint, EndpointStop, Merge, ModelCall};
use crate::agent::episode::{TurnGuard, encode_between_turns, encode_conversation};
use crate::agent::model::ModelFiles;
use crate::agent::openai::{self, ApiError};
use crate::agent::parse;
use crate::agent::render::TurnGlue;
use crate::agent::trajectory::{self, Drift, FinishReason};
use crate::backends::generate::Generator;
use crate::backends::wire::Finish;

/// from its last one, or from one of the few conversations it interleaves (sub-agents);
/// a continuation of an older call is rendered afresh (and is then a sample of its own).
const MEMOS: usize = 16;

/// A chat call's conversation as later calls may continue it.
pub(super) struct ChatMemo {
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
}

/// The drift check of a continuation, running beside the call.
pub(super) type DriftCheck = tokio::task::JoinHandle<Result<Drift, String>>;

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
/// its end-of-turn token) up to the next generation prompt, with `new` in between, and
/// whether that generation prompt opens the model's reasoning (a template may open it
/// in a conversation's first generation prompt and not after tool outputs).
fn between_calls(
    model: &ModelFiles,
    args: &serde_json::Map<String, Value>,
    as_text: bool,
    tools: Option<&[Value]>,
    past: &[Value],
    new: &[Value],
    ended: bool,
) -> Result<(Vec<u32>, bool), String> {
    let template = model.template_for(tools.is_some());
    let glue =
        TurnGlue::new(template, &model.stop_tokens(), tools, args).map_err(|e| e.to_string())?;
    let (ids, text) = encode_between_turns(&glue, model, past, new, ended, as_text)?;
    Ok((ids, parse::opens_reasoning(&text)))
}

impl Endpoint {
    pub(super) async fn chat(
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
            let mut parsed = parse::parse_turn(self.ep.parser, &text, prompt.reasoning_open);
            parse::give_ids(self.ep.parser, &mut parsed, self.calls.len());
            reply_with_calls(&parsed, &text)
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
            },
        ));
        if self.memos.len() > MEMOS {
            self.memos.remove(0);
        }
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
        let ended = memo.ended;
        let (glue_model, glue_args, glue_tools) = (model.clone(), args.clone(), tools.clone());
        let new = templated[past.len()..].to_vec();
        let (ids, reasoning_open) = tokio::task::spawn_blocking(move || {
            let tools = glue_tools.as_deref();
            let (obs, open) =
                between_calls(&glue_model, &glue_args, as_text, tools, &past, &new, ended)?;
            Ok::<_, String>(([before, obs].concat(), open))
        })
        .await
        .map_err(|e| e.to_string())??;
        // Whether a fresh render gives the same tokens is checked beside the call, not in
        // its way: the agent waits for the answer, not for the check.
        let (ours, rendered) = (ids.clone(), templated.clone());
        // Against the whole render tokenized in one go, as a trainer re-rendering the
        // conversation tokenizes it (see `episode::drift_check`).
        let drift = tokio::task::spawn_blocking(move || {
            let (fresh, _) = fresh_prompt(&model, &args, false, tools.as_deref(), &rendered)?;
            Ok(trajectory::compare(&ours, &fresh, &[], &[]))
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
/// wrote). Each call has its id ([`parse::give_ids`]): the model's own where its format
/// writes one, else one in the shape the model's template accepts.
fn reply_with_calls(parsed: &parse::ParsedTurn, text: &str) -> Value {
    if parsed.calls.is_empty() || parsed.calls.iter().any(Result::is_err) {
        return json!({"role": "assistant", "content": text});
    }
    let calls: Vec<Value> = parsed
        .calls
        .iter()
        .filter_map(|c| c.as_ref().ok())
        .map(|c| {
            let arguments = c
                .raw_arguments
                .clone()
                .unwrap_or_else(|| c.arguments.to_string());
            json!({"id": c.id, "type": "function",
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
