//! The OpenAI API as the model endpoint of an agent program speaks it: the requests it
//! takes (`/v1/chat/completions`, `/v1/completions`, `/v1/models`) and the answers it
//! gives, in the shapes the `openai` SDK and LiteLLM parse.
//!
//! Only what decides the tokens is read from a request: the messages (or the prompt),
//! the tools offered, the stop strings and a lower `max_tokens`. The sampling
//! parameters are the task's, not the agent's: the trainer decides how the policy
//! samples, and an agent's own `temperature: 0` would make its group uniform. A
//! request for several choices (`n` above 1) is refused, since each would be a sample
//! of its own. Streaming is answered as the server-sent events of one chunk holding the
//! whole answer, then `[DONE]`: the tokens are generated in one request either way.

use serde::Deserialize;
use serde_json::{Value, json};

/// A request the endpoint refuses, as an OpenAI-style error.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: u16,
    /// The error's `code` (and `type`).
    pub code: &'static str,
    /// What went wrong, for the agent's log.
    pub message: String,
    /// The request field at fault, when one is.
    pub param: Option<&'static str>,
}

impl ApiError {
    /// A 400 for `param`.
    pub fn bad(param: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status: 400,
            code: "invalid_request_error",
            message: message.into(),
            param: Some(param),
        }
    }

    /// The JSON body (`{"error": {...}}`).
    pub fn body(&self) -> String {
        json!({"error": {
            "message": self.message,
            "type": self.code,
            "code": self.code,
            "param": self.param,
        }})
        .to_string()
    }
}

/// A `/v1/chat/completions` request, as far as it decides the tokens.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    /// The conversation.
    pub messages: Vec<Value>,
    /// The model name the agent asked for (any is served: an episode has one model).
    #[serde(default)]
    pub model: Option<String>,
    /// The tools offered (OpenAI function schemas).
    #[serde(default)]
    pub tools: Option<Vec<Value>>,
    /// Lowers the per-call token limit.
    #[serde(default)]
    pub max_tokens: Option<u64>,
    /// The newer name of `max_tokens`.
    #[serde(default)]
    pub max_completion_tokens: Option<u64>,
    /// Stop strings (one, or a list).
    #[serde(default)]
    pub stop: Option<Value>,
    /// Choices asked for; only 1 is served.
    #[serde(default)]
    pub n: Option<u64>,
    /// Whether the answer comes as server-sent events.
    #[serde(default)]
    pub stream: Option<bool>,
}

/// A `/v1/completions` request.
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    /// The prompt: text, or token IDs (used as they are).
    pub prompt: Value,
    /// The model name the agent asked for.
    #[serde(default)]
    pub model: Option<String>,
    /// Lowers the per-call token limit.
    #[serde(default)]
    pub max_tokens: Option<u64>,
    /// Stop strings.
    #[serde(default)]
    pub stop: Option<Value>,
    /// Choices asked for; only 1 is served.
    #[serde(default)]
    pub n: Option<u64>,
    /// Whether the answer comes as server-sent events.
    #[serde(default)]
    pub stream: Option<bool>,
}

/// What a completion request's prompt is.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// Text, to be tokenized.
    Text(String),
    /// Token IDs, used as they are.
    Tokens(Vec<u32>),
}

impl CompletionRequest {
    /// The prompt, or why it cannot be served.
    pub fn prompt(&self) -> Result<Prompt, ApiError> {
        match &self.prompt {
            Value::String(s) => Ok(Prompt::Text(s.clone())),
            Value::Array(items) if items.len() == 1 && items[0].is_string() => Ok(Prompt::Text(
                items[0].as_str().unwrap_or_default().to_string(),
            )),
            Value::Array(items) if !items.is_empty() && items.iter().all(Value::is_u64) => items
                .iter()
                .map(|v| {
                    v.as_u64()
                        .and_then(|t| u32::try_from(t).ok())
                        .ok_or_else(|| ApiError::bad("prompt", "a token ID is out of range"))
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Prompt::Tokens),
            _ => Err(ApiError::bad(
                "prompt",
                "must be one text or one list of token IDs (a batch of prompts is not served: each would be a sample of its own)",
            )),
        }
    }
}

/// Parses a request body, naming what is wrong.
pub fn parse<T: serde::de::DeserializeOwned>(body: &str) -> Result<T, ApiError> {
    let de = &mut serde_json::Deserializer::from_str(body);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let at = e.path().to_string();
        ApiError {
            status: 400,
            code: "invalid_request_error",
            message: format!(
                "the request body is not valid here (at `{at}`): {}",
                e.inner()
            ),
            param: None,
        }
    })
}

/// The stop strings of a request (`"stop": "x"` or `["x", "y"]`).
pub fn stop_strings(stop: Option<&Value>) -> Result<Vec<String>, ApiError> {
    match stop {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| ApiError::bad("stop", "must be a string or a list of strings"))
            })
            .collect(),
        Some(_) => Err(ApiError::bad(
            "stop",
            "must be a string or a list of strings",
        )),
    }
}

/// Refuses `n` above 1.
pub fn one_choice(n: Option<u64>) -> Result<(), ApiError> {
    match n {
        None | Some(1) => Ok(()),
        Some(_) => Err(ApiError::bad(
            "n",
            "only one choice per request is served (each choice would be a sample of its own); send n = 1",
        )),
    }
}

/// A message as templates are given it, as vLLM 0.32 gives it to them: the text parts
/// of a content list joined with newlines into one string; an empty `tool_calls` list
/// dropped (so a template takes its plain assistant path); and each call's `arguments`
/// given as a JSON string parsed into the object it encodes (absent, empty or not JSON:
/// an empty object, so a conversation whose history holds a malformed call goes on).
pub fn for_template(message: &Value) -> Value {
    let mut m = message.clone();
    if let Some(parts) = m.get("content").and_then(Value::as_array) {
        let texts: Vec<&str> = parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect();
        m["content"] = Value::String(texts.join("\n"));
    }
    let no_calls = m
        .get("tool_calls")
        .and_then(Value::as_array)
        .is_some_and(Vec::is_empty);
    if no_calls && let Some(o) = m.as_object_mut() {
        o.remove("tool_calls");
    }
    if let Some(calls) = m.get_mut("tool_calls").and_then(Value::as_array_mut) {
        for call in calls {
            let f = &mut call["function"];
            let parsed = match f.get("arguments") {
                Some(Value::Object(_)) => continue,
                Some(Value::String(s)) if !s.is_empty() => match serde_json::from_str::<Value>(s) {
                    Ok(v) => v,
                    Err(_) => Value::Object(serde_json::Map::new()),
                },
                Some(Value::Null | Value::String(_)) | None => {
                    Value::Object(serde_json::Map::new())
                }
                Some(other) => other.clone(),
            };
            f["arguments"] = parsed;
        }
    }
    m
}

/// A message reduced to what a chat template renders from it, for telling whether an
/// agent sent back the conversation it was answered in: role, text (absent, null and
/// empty alike), the calls' names and arguments (as values, however they were
/// spaced), a tool result's name. Ids, `refusal`, annotations and the like are left
/// out: the SDKs add or drop them.
pub fn essence(message: &Value) -> Value {
    let m = for_template(message);
    let text = match m.get("content") {
        Some(Value::String(s)) => s.clone(),
        _ => String::new(),
    };
    let calls: Vec<Value> = m
        .get("tool_calls")
        .and_then(Value::as_array)
        .map(|calls| {
            calls
                .iter()
                .map(|c| json!([c["function"]["name"], c["function"]["arguments"]]))
                .collect()
        })
        .unwrap_or_default();
    json!([m.get("role"), text.trim(), calls, m.get("name")])
}

/// The OpenAI finish reason of a call.
pub fn finish_reason(cut: bool, with_calls: bool) -> &'static str {
    if cut {
        "length"
    } else if with_calls {
        "tool_calls"
    } else {
        "stop"
    }
}

/// Token counts of a call.
pub fn usage(prompt: usize, completion: usize) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion})
}

/// A chat completion answer; as server-sent events when `stream`.
pub fn chat_reply(
    id: &str,
    model: &str,
    message: &Value,
    finish: &str,
    usage: Value,
    stream: bool,
) -> (String, String) {
    let created = created();
    if stream {
        let mut delta = message.clone();
        if let Some(calls) = delta.get_mut("tool_calls").and_then(Value::as_array_mut) {
            for (i, c) in calls.iter_mut().enumerate() {
                c["index"] = json!(i);
            }
        }
        let chunk = json!({
            "id": id, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": null}],
            "usage": usage,
        });
        return (sse(&[chunk]), "text/event-stream".into());
    }
    let body = json!({
        "id": id, "object": "chat.completion", "created": created, "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": null}],
        "usage": usage,
    });
    (body.to_string(), "application/json".into())
}

/// A text completion answer; as server-sent events when `stream`.
pub fn completion_reply(
    id: &str,
    model: &str,
    text: &str,
    finish: &str,
    usage: Value,
    stream: bool,
) -> (String, String) {
    let body = json!({
        "id": id, "object": "text_completion", "created": created(), "model": model,
        "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": null}],
        "usage": usage,
    });
    if stream {
        return (sse(&[body]), "text/event-stream".into());
    }
    (body.to_string(), "application/json".into())
}

/// The model list: the episode's one model.
pub fn models(model: &str) -> String {
    json!({"object": "list", "data": [{"id": model, "object": "model", "created": created(), "owned_by": "rollout"}]})
        .to_string()
}

fn sse(chunks: &[Value]) -> String {
    let mut out = String::new();
    for c in chunks {
        out.push_str("data: ");
        out.push_str(&c.to_string());
        out.push_str("\n\n");
    }
    out.push_str("data: [DONE]\n\n");
    out
}

fn created() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conversation_sent_back_is_recognised_however_the_sdk_reshapes_it() {
        let ours = json!({"role": "assistant", "content": "",
            "tool_calls": [{"id": "call_0_0", "type": "function",
                "function": {"name": "bash", "arguments": "{\"command\":\"ls\"}"}}]});
        let back = json!({"role": "assistant", "content": null, "refusal": null,
            "tool_calls": [{"id": "call_0_0", "type": "function",
                "function": {"name": "bash", "arguments": "{\"command\": \"ls\"}"}}]});
        assert_eq!(essence(&ours), essence(&back));
        let edited = json!({"role": "assistant", "content": null,
            "tool_calls": [{"id": "call_0_0", "type": "function",
                "function": {"name": "bash", "arguments": "{\"command\": \"ls -la\"}"}}]});
        assert_ne!(essence(&ours), essence(&edited));
        let parts = json!({"role": "user", "content": [{"type": "text", "text": "hi"}]});
        assert_eq!(
            essence(&parts),
            essence(&json!({"role": "user", "content": "hi"}))
        );
    }

    #[test]
    fn messages_reach_the_template_as_vllm_hands_them_over() {
        let parts = json!({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]});
        assert_eq!(for_template(&parts)["content"], "a\nb");
        let empty = json!({"role": "assistant", "content": "x", "tool_calls": []});
        assert!(for_template(&empty).get("tool_calls").is_none());
        let calls = json!({"role": "assistant", "tool_calls": [
            {"type": "function", "function": {"name": "a", "arguments": "{\"x\": 1}"}},
            {"type": "function", "function": {"name": "b", "arguments": "not json"}},
            {"type": "function", "function": {"name": "c", "arguments": ""}},
        ]});
        let t = for_template(&calls);
        assert_eq!(t["tool_calls"][0]["function"]["arguments"], json!({"x": 1}));
        assert_eq!(t["tool_calls"][1]["function"]["arguments"], json!({}));
        assert_eq!(t["tool_calls"][2]["function"]["arguments"], json!({}));
    }

    #[test]
    fn prompts_and_refusals() {
        let r: CompletionRequest = parse(r#"{"prompt": [1, 2, 3]}"#).unwrap();
        assert_eq!(r.prompt().unwrap(), Prompt::Tokens(vec![1, 2, 3]));
        let r: CompletionRequest = parse(r#"{"prompt": ["a", "b"]}"#).unwrap();
        assert_eq!(r.prompt().unwrap_err().param, Some("prompt"));
        assert_eq!(one_choice(Some(2)).unwrap_err().param, Some("n"));
        assert_eq!(stop_strings(Some(&json!("x"))).unwrap(), vec!["x"]);
        let e = parse::<ChatRequest>(r#"{"messages": 3}"#).unwrap_err();
        assert!(e.message.contains("messages"), "{}", e.message);
    }

    #[test]
    fn a_streamed_answer_is_one_chunk_then_done() {
        let m = json!({"role": "assistant", "content": "hi"});
        let (body, ct) = chat_reply("c1", "m", &m, "stop", usage(3, 1), true);
        assert_eq!(ct, "text/event-stream");
        assert!(body.ends_with("data: [DONE]\n\n"));
        let first: Value =
            serde_json::from_str(body.lines().next().unwrap().strip_prefix("data: ").unwrap())
                .unwrap();
        assert_eq!(first["choices"][0]["delta"]["content"], "hi");
    }
}
