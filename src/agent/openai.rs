//! The OpenAI API as the model endpoint of an agent program speaks it: the requests it
//! takes (`/v1/chat/completions`, `/v1/completions`, `/v1/models`) and the answers it
//! gives, in the shapes the `openai` SDK and LiteLLM parse.
//!
//! Only what decides the tokens is used from a request: the messages (or the prompt),
//! the tools offered, the stop strings and a lower `max_tokens`. The sampling
//! parameters are the task's, not the agent's: the trainer decides how the policy
//! samples, and an agent's own `temperature: 0` would make its group uniform. A
//! request for several choices (`n` above 1) is refused, since each would be a sample
//! of its own. Streaming is answered as the server-sent events of one chunk holding the
//! whole answer, then `[DONE]`: the tokens are generated in one request either way.
//!
//! Every field vLLM's server knows is still checked as vLLM checks it (its type, its
//! range, what it needs with it), used or not: a request vLLM would refuse with a 400
//! is refused here with a 400 naming the field, in vLLM's error shape, before any of
//! it reaches the backend or the episode's record. An agent program is code the
//! service did not write, so nothing it sends may end its own job: a request the
//! backend would refuse (a token ID outside the vocabulary, `max_tokens: 0`) would
//! otherwise fail or restart the job instead of telling the program what was wrong.

use std::collections::HashSet;

use serde::Deserialize;
use serde::de::{self, Deserializer, IgnoredAny, SeqAccess, Visitor};
use serde_json::{Map, Value, json};

/// The most characters of an error's message (a serde message quotes the value it
/// could not read, which may be megabytes of the request).
const MAX_MESSAGE_CHARS: usize = 1024;

/// The most characters of an error's `param` (a path may hold a map key the program
/// chose).
const MAX_PARAM_CHARS: usize = 256;

/// The most log-probabilities per token vLLM's server gives (its `max_logprobs`).
const MAX_LOGPROBS: i64 = 20;

/// A request the endpoint refuses, as vLLM's server refuses one.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// The HTTP status, also the body's `code`.
    pub status: u16,
    /// What went wrong, for the agent's log (at most [`MAX_MESSAGE_CHARS`]).
    pub message: String,
    /// The request field at fault, when one is (`messages[2].role`).
    pub param: Option<String>,
}

impl ApiError {
    /// An error with `status`, its message and field cut to a bounded length.
    pub fn new(status: u16, message: impl Into<String>, param: Option<String>) -> Self {
        ApiError {
            status,
            message: clip(message.into(), MAX_MESSAGE_CHARS),
            param: param.map(|p| clip(p, MAX_PARAM_CHARS)),
        }
    }

    /// A 400 for `param`.
    pub fn bad(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(400, message, Some(param.into()))
    }

    /// The error's `type`, vLLM's name for its status.
    pub fn kind(&self) -> &'static str {
        match self.status {
            400 => "BadRequestError",
            404 => "NotFoundError",
            405 => "MethodNotAllowedError",
            413 => "RequestEntityTooLargeError",
            500 => "InternalServerError",
            503 => "ServiceUnavailableError",
            504 => "GatewayTimeoutError",
            _ => "Error",
        }
    }

    /// The JSON of the body, vLLM's shape:
    /// `{"error": {"message", "type", "param", "code"}}` with the status as `code`.
    pub fn to_json(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind(),
            "param": self.param,
            "code": self.status,
        }})
    }

    /// The body, as text.
    pub fn body(&self) -> String {
        self.to_json().to_string()
    }
}

/// `s` cut to at most `max` characters, marked with `…` when cut.
fn clip(s: String, max: usize) -> String {
    match s.char_indices().nth(max) {
        None => s,
        Some((at, _)) => format!("{}…", &s[..at]),
    }
}

/// The first bytes of `s`, at most `max`, ending on a character boundary.
pub fn head(s: &str, max: usize) -> &str {
    &s[..s.floor_char_boundary(max)]
}

/// A `/v1/chat/completions` request: what decides the tokens, and every other field
/// vLLM reads, typed so that a value of the wrong type is refused naming it.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    /// The conversation.
    pub messages: Vec<Value>,
    /// The model name the agent asked for (any is served: an episode has one model,
    /// and an agent configured with another name must not lose its episode for it).
    #[serde(default)]
    pub model: Option<String>,
    /// The tools offered (OpenAI function schemas).
    #[serde(default)]
    pub tools: Option<Vec<Value>>,
    /// Which tool the model must call (checked, not enforced: the task decides
    /// sampling).
    #[serde(default)]
    pub tool_choice: Option<Value>,
    /// Lowers the per-call token limit.
    #[serde(default)]
    pub max_tokens: Option<i64>,
    /// The newer name of `max_tokens`.
    #[serde(default)]
    pub max_completion_tokens: Option<i64>,
    /// Stop strings (one, or a list).
    #[serde(default)]
    pub stop: Option<Value>,
    /// Choices asked for; only 1 is served.
    #[serde(default)]
    pub n: Option<i64>,
    /// Whether the answer comes as server-sent events.
    #[serde(default)]
    pub stream: Option<bool>,
    /// Streaming options (only with `stream`).
    #[serde(default)]
    pub stream_options: Option<Map<String, Value>>,
    /// Whether log-probabilities are asked for.
    #[serde(default)]
    pub logprobs: Option<bool>,
    /// How many alternatives per token.
    #[serde(default)]
    pub top_logprobs: Option<i64>,
    /// The output's format (checked, not enforced).
    #[serde(default)]
    pub response_format: Option<Map<String, Value>>,
    /// Whether several tool calls may come in one answer.
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    /// The end user, for the provider's logs.
    #[serde(default)]
    pub user: Option<String>,
    /// vLLM's: whether the template adds the assistant's opening (always, here).
    #[serde(default)]
    pub add_generation_prompt: Option<bool>,
    /// vLLM's: whether the last message is continued (not served).
    #[serde(default)]
    pub continue_final_message: Option<bool>,
    /// vLLM's: whether the last message is echoed (not served).
    #[serde(default)]
    pub echo: Option<bool>,
    /// Sampling knobs the task decides; checked only.
    #[serde(default)]
    pub temperature: Option<f64>,
    /// See `temperature`.
    #[serde(default)]
    pub top_p: Option<f64>,
    /// See `temperature`.
    #[serde(default)]
    pub top_k: Option<i64>,
    /// See `temperature`.
    #[serde(default)]
    pub min_p: Option<f64>,
    /// See `temperature`.
    #[serde(default)]
    pub presence_penalty: Option<f64>,
    /// See `temperature`.
    #[serde(default)]
    pub frequency_penalty: Option<f64>,
    /// See `temperature`.
    #[serde(default)]
    pub repetition_penalty: Option<f64>,
    /// See `temperature`.
    #[serde(default)]
    pub seed: Option<i64>,
    /// See `temperature`.
    #[serde(default)]
    pub min_tokens: Option<i64>,
    /// See `temperature`.
    #[serde(default)]
    pub logit_bias: Option<Map<String, Value>>,
}

/// A `/v1/completions` request.
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    /// The prompt: text, or token IDs (used as they are).
    pub prompt: Prompt,
    /// The model name the agent asked for (any is served).
    #[serde(default)]
    pub model: Option<String>,
    /// Lowers the per-call token limit.
    #[serde(default)]
    pub max_tokens: Option<i64>,
    /// Stop strings.
    #[serde(default)]
    pub stop: Option<Value>,
    /// Choices asked for; only 1 is served.
    #[serde(default)]
    pub n: Option<i64>,
    /// Candidates generated per choice; only 1 is served.
    #[serde(default)]
    pub best_of: Option<i64>,
    /// Whether the answer comes as server-sent events.
    #[serde(default)]
    pub stream: Option<bool>,
    /// Streaming options (only with `stream`).
    #[serde(default)]
    pub stream_options: Option<Map<String, Value>>,
    /// How many log-probabilities per token.
    #[serde(default)]
    pub logprobs: Option<i64>,
    /// Whether the prompt is echoed before the completion (not served).
    #[serde(default)]
    pub echo: Option<bool>,
    /// Text after the completion (vLLM does not serve it either).
    #[serde(default)]
    pub suffix: Option<String>,
    /// The end user.
    #[serde(default)]
    pub user: Option<String>,
    /// Sampling knobs the task decides; checked only.
    #[serde(default)]
    pub temperature: Option<f64>,
    /// See `temperature`.
    #[serde(default)]
    pub top_p: Option<f64>,
    /// See `temperature`.
    #[serde(default)]
    pub top_k: Option<i64>,
    /// See `temperature`.
    #[serde(default)]
    pub min_p: Option<f64>,
    /// See `temperature`.
    #[serde(default)]
    pub presence_penalty: Option<f64>,
    /// See `temperature`.
    #[serde(default)]
    pub frequency_penalty: Option<f64>,
    /// See `temperature`.
    #[serde(default)]
    pub repetition_penalty: Option<f64>,
    /// See `temperature`.
    #[serde(default)]
    pub seed: Option<i64>,
    /// See `temperature`.
    #[serde(default)]
    pub min_tokens: Option<i64>,
    /// See `temperature`.
    #[serde(default)]
    pub logit_bias: Option<Map<String, Value>>,
}

/// The sampling knobs both routes take, which the task decides: checked as vLLM
/// checks them, then not used.
struct Knobs<'a> {
    temperature: Option<f64>,
    top_p: Option<f64>,
    top_k: Option<i64>,
    min_p: Option<f64>,
    presence_penalty: Option<f64>,
    frequency_penalty: Option<f64>,
    repetition_penalty: Option<f64>,
    min_tokens: Option<i64>,
    logit_bias: Option<&'a Map<String, Value>>,
    n: Option<i64>,
    stream: Option<bool>,
    stream_options: bool,
    stop: Option<&'a Value>,
}

impl Knobs<'_> {
    /// Checks the knobs (`max_tokens` is the call's limit, named `max_name`, when
    /// given); the stop strings.
    fn check(
        &self,
        max_tokens: Option<i64>,
        max_name: &str,
        vocab: usize,
    ) -> Result<Vec<String>, ApiError> {
        if let Some(m) = max_tokens
            && m < 1
        {
            return Err(ApiError::bad(
                max_name,
                format!("{max_name} must be at least 1, got {m}."),
            ));
        }
        one_choice(self.n)?;
        if let Some(t) = self.temperature
            && (t.is_nan() || t < 0.0)
        {
            return Err(ApiError::bad(
                "temperature",
                format!("temperature must be non-negative, got {t}."),
            ));
        }
        if let Some(p) = self.top_p
            && (p.is_nan() || p <= 0.0 || p > 1.0)
        {
            return Err(ApiError::bad(
                "top_p",
                format!("top_p must be in (0, 1], got {p}."),
            ));
        }
        if let Some(k) = self.top_k
            && k < -1
        {
            return Err(ApiError::bad(
                "top_k",
                format!("top_k must be 0 (disable), or at least 1, got {k}."),
            ));
        }
        if let Some(p) = self.min_p
            && !(0.0..=1.0).contains(&p)
        {
            return Err(ApiError::bad(
                "min_p",
                format!("min_p must be in [0, 1], got {p}."),
            ));
        }
        for (name, v) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if let Some(p) = v
                && !(-2.0..=2.0).contains(&p)
            {
                return Err(ApiError::bad(
                    name,
                    format!("{name} must be in [-2, 2], got {p}."),
                ));
            }
        }
        if let Some(p) = self.repetition_penalty
            && (p.is_nan() || p <= 0.0)
        {
            return Err(ApiError::bad(
                "repetition_penalty",
                format!("repetition_penalty must be greater than zero, got {p}."),
            ));
        }
        if let Some(m) = self.min_tokens {
            if m < 0 {
                return Err(ApiError::bad(
                    "min_tokens",
                    format!("min_tokens must be greater than or equal to 0, got {m}."),
                ));
            }
            if let Some(max) = max_tokens
                && m > max
            {
                return Err(ApiError::bad(
                    "min_tokens",
                    format!("min_tokens must be less than or equal to max_tokens={max}, got {m}."),
                ));
            }
        }
        if let Some(bias) = self.logit_bias {
            check_logit_bias(bias, vocab)?;
        }
        if self.stream_options && self.stream != Some(true) {
            return Err(ApiError::bad(
                "stream_options",
                "Stream options can only be defined when `stream=True`.",
            ));
        }
        stop_strings(self.stop)
    }
}

/// `logit_bias`: token IDs of the vocabulary (as strings) to numbers.
fn check_logit_bias(bias: &Map<String, Value>, vocab: usize) -> Result<(), ApiError> {
    let mut unknown = Vec::new();
    for (k, v) in bias {
        let Ok(id) = k.trim().parse::<u64>() else {
            return Err(ApiError::bad(
                "logit_bias",
                format!("`{k}` is not a token ID: logit_bias maps token IDs to biases"),
            ));
        };
        if !v.is_number() {
            return Err(ApiError::bad(format!("logit_bias.{k}"), "must be a number"));
        }
        if !usize::try_from(id).is_ok_and(|i| i < vocab) {
            unknown.push(id);
        }
    }
    if unknown.is_empty() {
        return Ok(());
    }
    Err(ApiError::bad(
        "logit_bias",
        format!(
            "token_id(s) {unknown:?} in logit_bias contain out-of-vocab token ids. Vocabulary size: {vocab}"
        ),
    ))
}

impl ChatRequest {
    /// Checks the request as vLLM's server does (and what this endpoint does not
    /// serve); the stop strings.
    pub fn check(&self, vocab: usize) -> Result<Vec<String>, ApiError> {
        let (max, max_name) = match (self.max_completion_tokens, self.max_tokens) {
            (Some(m), _) => (Some(m), "max_completion_tokens"),
            (None, m) => (m, "max_tokens"),
        };
        let stop = Knobs {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            repetition_penalty: self.repetition_penalty,
            min_tokens: self.min_tokens,
            logit_bias: self.logit_bias.as_ref(),
            n: self.n,
            stream: self.stream,
            stream_options: self.stream_options.is_some(),
            stop: self.stop.as_ref(),
        }
        .check(max, max_name, vocab)?;
        if let Some(k) = self.top_logprobs {
            if k < 0 {
                return Err(ApiError::bad(
                    "top_logprobs",
                    "`top_logprobs` must be a positive value.",
                ));
            }
            if k > MAX_LOGPROBS {
                return Err(ApiError::bad(
                    "top_logprobs",
                    format!(
                        "Requested sample logprobs of {k}, which is greater than max allowed: {MAX_LOGPROBS}"
                    ),
                ));
            }
            if k > 0 && self.logprobs != Some(true) {
                return Err(ApiError::bad(
                    "top_logprobs",
                    "when using `top_logprobs`, `logprobs` must be set to true.",
                ));
            }
        }
        for (name, set) in [
            ("echo", self.echo == Some(true)),
            (
                "continue_final_message",
                self.continue_final_message == Some(true),
            ),
            (
                "add_generation_prompt",
                self.add_generation_prompt == Some(false),
            ),
        ] {
            if set {
                return Err(ApiError::bad(
                    name,
                    format!(
                        "`{name}` is not served by this endpoint: every call is answered with a new assistant message"
                    ),
                ));
            }
        }
        if let Some(f) = &self.response_format {
            check_response_format(f)?;
        }
        check_tools(self.tools.as_deref(), self.tool_choice.as_ref())?;
        check_messages(&self.messages)?;
        Ok(stop)
    }
}

impl CompletionRequest {
    /// Checks the request as vLLM's server does (and what this endpoint does not
    /// serve), the prompt's token IDs against the vocabulary; the stop strings.
    pub fn check(&self, vocab: usize) -> Result<Vec<String>, ApiError> {
        let stop = Knobs {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            repetition_penalty: self.repetition_penalty,
            min_tokens: self.min_tokens,
            logit_bias: self.logit_bias.as_ref(),
            n: self.n,
            stream: self.stream,
            stream_options: self.stream_options.is_some(),
            stop: self.stop.as_ref(),
        }
        .check(self.max_tokens, "max_tokens", vocab)?;
        match self.best_of {
            None | Some(1) => {}
            Some(b) if b < 1 => {
                return Err(ApiError::bad(
                    "best_of",
                    format!("best_of must be at least 1, got {b}."),
                ));
            }
            Some(_) => {
                return Err(ApiError::bad(
                    "best_of",
                    "only one candidate per request is served (each would be a sample of its own); send best_of = 1",
                ));
            }
        }
        if let Some(k) = self.logprobs {
            if k < 0 {
                return Err(ApiError::bad(
                    "logprobs",
                    "`logprobs` must be a positive value.",
                ));
            }
            if k > MAX_LOGPROBS {
                return Err(ApiError::bad(
                    "logprobs",
                    format!(
                        "Requested sample logprobs of {k}, which is greater than max allowed: {MAX_LOGPROBS}"
                    ),
                ));
            }
        }
        if self.echo == Some(true) {
            return Err(ApiError::bad(
                "echo",
                "`echo` is not served by this endpoint: the answer holds the completion only",
            ));
        }
        if self.suffix.is_some() {
            return Err(ApiError::bad("suffix", "suffix is not currently supported"));
        }
        self.prompt.check(vocab)?;
        Ok(stop)
    }
}

/// What a completion request's prompt is. It is read straight from the request's
/// text (a list of a million token IDs is a list of a million integers, not of a
/// million JSON values), and what is not served is kept only as far as saying why.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// Text, to be tokenized.
    Text(String),
    /// Token IDs, used as they are.
    Tokens(Vec<u32>),
    /// Several prompts (texts, or lists of IDs): how many.
    Batch(usize),
    /// A list that is neither: why.
    Invalid(String),
}

impl Prompt {
    /// Refuses a prompt that is not one text or one non-empty list of the model's token
    /// IDs.
    fn check(&self, vocab: usize) -> Result<(), ApiError> {
        match self {
            Prompt::Text(_) => Ok(()),
            Prompt::Tokens(ids) if ids.is_empty() => {
                Err(ApiError::bad("prompt", "must not be empty"))
            }
            Prompt::Tokens(ids) => match ids
                .iter()
                .find(|&&id| !usize::try_from(id).is_ok_and(|i| i < vocab))
            {
                Some(id) => Err(ApiError::bad(
                    "prompt",
                    format!("Token id {id} is out of vocabulary"),
                )),
                None => Ok(()),
            },
            Prompt::Batch(n) => Err(ApiError::bad(
                "prompt",
                format!(
                    "holds {n} prompts; one text or one list of token IDs is served (a batch of prompts is not: each would be a sample of its own)"
                ),
            )),
            Prompt::Invalid(why) => Err(ApiError::bad("prompt", why.clone())),
        }
    }
}

impl<'de> Deserialize<'de> for Prompt {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(PromptVisitor)
    }
}

struct PromptVisitor;

impl<'de> Visitor<'de> for PromptVisitor {
    type Value = Prompt;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a text or a list of token IDs")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Prompt, E> {
        Ok(Prompt::Text(v.to_string()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Prompt, E> {
        Ok(Prompt::Text(v))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Prompt, A::Error> {
        let mut ids = Vec::new();
        let (mut texts, mut lists) = (0usize, 0usize);
        let mut first_text = None;
        let mut invalid = None;
        while let Some(item) = seq.next_element::<Item>()? {
            let why = match item {
                Item::Id(v) => match u32::try_from(v) {
                    Ok(id) => {
                        ids.push(id);
                        None
                    }
                    Err(_) => Some(format!("Token id {v} is out of vocabulary")),
                },
                Item::Negative(v) => Some(format!("a token ID cannot be negative (got {v})")),
                Item::Text(t) => {
                    texts += 1;
                    first_text.get_or_insert(t);
                    None
                }
                Item::List => {
                    lists += 1;
                    None
                }
                Item::Other(what) => Some(format!(
                    "a list prompt holds token IDs (or texts), not {what}"
                )),
            };
            if invalid.is_none() {
                invalid = why;
            }
        }
        let kinds = usize::from(!ids.is_empty()) + usize::from(texts > 0) + usize::from(lists > 0);
        Ok(if let Some(why) = invalid {
            Prompt::Invalid(why)
        } else if kinds > 1 {
            Prompt::Invalid("a list prompt holds token IDs only, or texts only".into())
        } else if texts + lists > 1 {
            Prompt::Batch(texts + lists)
        } else if lists == 1 {
            Prompt::Batch(1)
        } else if let Some(t) = first_text {
            Prompt::Text(t)
        } else {
            Prompt::Tokens(ids)
        })
    }
}

/// One item of a list prompt, kept only as far as the prompt needs it.
enum Item {
    Id(u64),
    Negative(i64),
    Text(String),
    /// A nested list (a prompt of a batch), skipped.
    List,
    /// Anything else, named.
    Other(&'static str),
}

impl<'de> Deserialize<'de> for Item {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ItemVisitor)
    }
}

struct ItemVisitor;

impl<'de> Visitor<'de> for ItemVisitor {
    type Value = Item;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a token ID or a text")
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Item, E> {
        Ok(Item::Id(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Item, E> {
        Ok(u64::try_from(v).map_or(Item::Negative(v), Item::Id))
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Item, E> {
        Ok(Item::Other("a number with a fraction"))
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Item, E> {
        Ok(Item::Other("a boolean"))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Item, E> {
        Ok(Item::Other("null"))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Item, E> {
        Ok(Item::Text(v.to_string()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Item, E> {
        Ok(Item::Text(v))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Item, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Item::List)
    }

    fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Item, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Item::Other("an object"))
    }
}

/// Parses a request body, naming what is wrong (the field, as a path, in `param`).
pub fn parse<T: serde::de::DeserializeOwned>(body: &str) -> Result<T, ApiError> {
    if body.trim().is_empty() {
        return Err(ApiError::new(
            400,
            "the request has no body: send the request as JSON",
            None,
        ));
    }
    let de = &mut serde_json::Deserializer::from_str(body);
    let parsed: T = serde_path_to_error::deserialize(&mut *de).map_err(|e| {
        let at = e.path().to_string();
        let param = (at != "." && !at.is_empty()).then_some(at);
        let message = match &param {
            Some(at) => format!("`{at}`: {}", e.inner()),
            None => format!("the request body is not valid JSON here: {}", e.inner()),
        };
        ApiError::new(400, message, param)
    })?;
    de.end().map_err(|e| {
        ApiError::new(
            400,
            format!("the request body is not valid JSON: {e}"),
            None,
        )
    })?;
    Ok(parsed)
}

/// The stop strings of a request (`"stop": "x"` or `["x", "y"]`; none empty, as vLLM
/// requires).
pub fn stop_strings(stop: Option<&Value>) -> Result<Vec<String>, ApiError> {
    let strings = match stop {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| ApiError::bad("stop", "must be a string or a list of strings"))
            })
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(ApiError::bad(
                "stop",
                "must be a string or a list of strings",
            ));
        }
    };
    if strings.iter().any(String::is_empty) {
        return Err(ApiError::bad(
            "stop",
            "stop cannot contain an empty string.",
        ));
    }
    Ok(strings)
}

/// Refuses `n` other than 1.
pub fn one_choice(n: Option<i64>) -> Result<(), ApiError> {
    match n {
        None | Some(1) => Ok(()),
        Some(n) if n < 1 => Err(ApiError::bad(
            "n",
            format!("n must be at least 1, got {n}."),
        )),
        Some(_) => Err(ApiError::bad(
            "n",
            "only one choice per request is served (each choice would be a sample of its own); send n = 1",
        )),
    }
}

/// `response_format`: one of the formats vLLM knows, with its schema when it needs one.
fn check_response_format(f: &Map<String, Value>) -> Result<(), ApiError> {
    match f.get("type").and_then(Value::as_str) {
        Some("text" | "json_object" | "structural_tag") => Ok(()),
        Some("json_schema") if f.get("json_schema").is_some_and(Value::is_object) => Ok(()),
        Some("json_schema") => Err(ApiError::bad(
            "response_format.json_schema",
            "a `json_schema` response format needs its `json_schema` object",
        )),
        _ => Err(ApiError::bad(
            "response_format.type",
            "must be `text`, `json_object`, `json_schema` or `structural_tag`",
        )),
    }
}

/// The tools offered (function schemas) and the tool choice, as vLLM checks them.
fn check_tools(tools: Option<&[Value]>, choice: Option<&Value>) -> Result<(), ApiError> {
    let mut names = Vec::new();
    for (i, t) in tools.unwrap_or_default().iter().enumerate() {
        let at = |f: &str| format!("tools[{i}]{f}");
        let Some(o) = t.as_object() else {
            return Err(ApiError::bad(
                at(""),
                "must be a tool: {\"type\": \"function\", \"function\": {\"name\": ...}}",
            ));
        };
        if o.get("type").is_some_and(|k| k != "function") {
            return Err(ApiError::bad(at(".type"), "must be `function`"));
        }
        let Some(f) = o.get("function").and_then(Value::as_object) else {
            return Err(ApiError::bad(at(".function"), "must be an object"));
        };
        match f.get("name").and_then(Value::as_str) {
            Some(name) if !name.is_empty() => names.push(name),
            _ => {
                return Err(ApiError::bad(
                    at(".function.name"),
                    "every tool needs a `name` string",
                ));
            }
        }
        if f.get("description")
            .is_some_and(|d| !d.is_string() && !d.is_null())
        {
            return Err(ApiError::bad(
                at(".function.description"),
                "must be a string",
            ));
        }
        if f.get("parameters")
            .is_some_and(|p| !p.is_object() && !p.is_null())
        {
            return Err(ApiError::bad(
                at(".function.parameters"),
                "must be a JSON schema object",
            ));
        }
    }
    let named = match choice {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::String(c)) if c == "none" => return Ok(()),
        Some(Value::String(c)) if c == "auto" || c == "required" => None,
        Some(Value::Object(o)) => match o.get("function").and_then(|f| f.get("name")) {
            Some(Value::String(name)) => Some(name.as_str()),
            _ => {
                return Err(ApiError::bad(
                    "tool_choice.function.name",
                    "a named tool choice needs the function's `name`",
                ));
            }
        },
        Some(_) => {
            return Err(ApiError::bad(
                "tool_choice",
                "must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}",
            ));
        }
    };
    if names.is_empty() {
        return Err(ApiError::bad(
            "tool_choice",
            "When using `tool_choice`, `tools` must be set.",
        ));
    }
    if let Some(name) = named
        && !names.contains(&name)
    {
        return Err(ApiError::bad(
            "tool_choice",
            "The tool specified in `tool_choice` does not match any of the specified `tools`",
        ));
    }
    Ok(())
}

/// The conversation: messages with a role, content a template can render (text, as a
/// string or text parts), well-formed tool calls, and tool results that answer a call
/// an earlier assistant message made. A result for a call the model never made is
/// refused (as OpenAI refuses it; vLLM would render it): its tokens would train the
/// policy on an answer to a question it did not ask.
fn check_messages(messages: &[Value]) -> Result<(), ApiError> {
    if messages.is_empty() {
        return Err(ApiError::bad("messages", "must hold at least one message"));
    }
    let mut call_ids: HashSet<&str> = HashSet::new();
    for (i, m) in messages.iter().enumerate() {
        let at = |f: &str| format!("messages[{i}]{f}");
        let Some(o) = m.as_object() else {
            return Err(ApiError::bad(
                at(""),
                "must be a message: an object with a `role` and its `content`",
            ));
        };
        let role = match o.get("role") {
            Some(Value::String(r)) if !r.is_empty() => r.as_str(),
            _ => {
                return Err(ApiError::bad(
                    at(".role"),
                    "every message needs a `role` string",
                ));
            }
        };
        check_content(o.get("content")).map_err(|(f, why)| ApiError::bad(at(&f), why))?;
        if o.get("name")
            .is_some_and(|n| !n.is_string() && !n.is_null())
        {
            return Err(ApiError::bad(at(".name"), "must be a string"));
        }
        check_calls(o.get("tool_calls"), &mut call_ids)
            .map_err(|(f, why)| ApiError::bad(at(&format!(".tool_calls{f}")), why))?;
        match o.get("tool_call_id") {
            None | Some(Value::Null) => {}
            Some(Value::String(id)) if role != "tool" || call_ids.contains(id.as_str()) => {}
            Some(Value::String(id)) => {
                return Err(ApiError::bad(
                    at(".tool_call_id"),
                    format!(
                        "`{id}` is the id of no tool call of an earlier assistant message: a tool result answers a call the model made"
                    ),
                ));
            }
            Some(_) => return Err(ApiError::bad(at(".tool_call_id"), "must be a string")),
        }
    }
    if messages.last().is_some_and(|m| m["role"] == "assistant") {
        return Err(ApiError::bad(
            "messages",
            "the conversation ends with an assistant message; continuing a message is not served",
        ));
    }
    Ok(())
}

/// A message's content: absent, null, text, or a list of text parts; else the path
/// below the message at fault and why.
fn check_content(content: Option<&Value>) -> Result<(), (String, &'static str)> {
    match content {
        None | Some(Value::Null | Value::String(_)) => Ok(()),
        Some(Value::Array(parts)) => match parts.iter().position(|p| {
            p.get("type").and_then(Value::as_str) != Some("text")
                || !p.get("text").is_some_and(Value::is_string)
        }) {
            None => Ok(()),
            Some(j) => Err((
                format!(".content[{j}]"),
                "only text parts are served ({\"type\": \"text\", \"text\": ...}): this endpoint's model reads text",
            )),
        },
        Some(_) => Err((
            ".content".into(),
            "must be a string, a list of text parts, or null",
        )),
    }
}

/// A message's `tool_calls`: absent, null, or a list of calls, each a function with a
/// name, its arguments a string (or an object), its id a string (kept in `ids`, for
/// the tool results that answer it); else the path below `tool_calls` and why.
fn check_calls<'a>(
    calls: Option<&'a Value>,
    ids: &mut HashSet<&'a str>,
) -> Result<(), (String, &'static str)> {
    let calls = match calls {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Array(calls)) => calls,
        Some(_) => return Err((String::new(), "must be a list of tool calls")),
    };
    for (j, c) in calls.iter().enumerate() {
        let at = |f: &str| format!("[{j}]{f}");
        let Some(call) = c.as_object() else {
            return Err((at(""), "must be a tool call object"));
        };
        let Some(f) = call.get("function").and_then(Value::as_object) else {
            return Err((at(".function"), "must be an object"));
        };
        if !f.get("name").is_some_and(Value::is_string) {
            return Err((at(".function.name"), "every call needs a `name` string"));
        }
        if f.get("arguments")
            .is_some_and(|a| !(a.is_string() || a.is_object() || a.is_null()))
        {
            return Err((
                at(".function.arguments"),
                "must be the arguments as a JSON string",
            ));
        }
        match call.get("id") {
            None | Some(Value::Null) => {}
            Some(Value::String(id)) => {
                ids.insert(id.as_str());
            }
            Some(_) => return Err((at(".id"), "must be a string")),
        }
        if call.get("type").is_some_and(|t| t != "function") {
            return Err((at(".type"), "must be `function`"));
        }
    }
    Ok(())
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
        let joined = Value::String(texts.join("\n"));
        if let Some(o) = m.as_object_mut() {
            o.insert("content".into(), joined);
        }
    }
    let no_calls = m
        .get("tool_calls")
        .and_then(Value::as_array)
        .is_some_and(Vec::is_empty);
    if no_calls && let Some(o) = m.as_object_mut() {
        o.remove("tool_calls");
    }
    if let Some(calls) = m.get_mut("tool_calls").and_then(Value::as_array_mut) {
        // Read with `get_mut`, never indexed: indexing a call that is not an object
        // (or a `function` that is not one) would panic.
        for f in calls
            .iter_mut()
            .filter_map(|c| c.get_mut("function"))
            .filter_map(Value::as_object_mut)
        {
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
            f.insert("arguments".into(), parsed);
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
    fn prompts_are_read_without_a_tree_and_refused_naming_why() {
        let vocab = 100;
        let prompt = |body: &str| parse::<CompletionRequest>(body).map(|r| r.prompt);
        assert_eq!(
            prompt(r#"{"prompt": [1, 2, 3]}"#).unwrap(),
            Prompt::Tokens(vec![1, 2, 3])
        );
        assert_eq!(
            prompt(r#"{"prompt": ["a"]}"#).unwrap(),
            Prompt::Text("a".into())
        );
        assert_eq!(
            prompt(r#"{"prompt": ["a", "b"]}"#).unwrap(),
            Prompt::Batch(2)
        );
        assert_eq!(
            prompt(r#"{"prompt": [[1], [2]]}"#).unwrap(),
            Prompt::Batch(2)
        );
        for (body, says) in [
            (r#"{"prompt": [1, -2]}"#, "negative"),
            (r#"{"prompt": [1, 2.5]}"#, "fraction"),
            (r#"{"prompt": [1, "a"]}"#, "only"),
            (r#"{"prompt": [1, 4294967296]}"#, "out of vocabulary"),
            (
                r#"{"prompt": [1, 100]}"#,
                "Token id 100 is out of vocabulary",
            ),
            (r#"{"prompt": []}"#, "empty"),
            (r#"{"prompt": [{"a": 1}]}"#, "an object"),
        ] {
            let e = parse::<CompletionRequest>(body)
                .unwrap()
                .check(vocab)
                .unwrap_err();
            assert_eq!(e.param.as_deref(), Some("prompt"), "{body}");
            assert!(e.message.contains(says), "{body}: {}", e.message);
        }
        let e = parse::<CompletionRequest>(r#"{"prompt": 3}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("prompt"), "{e:?}");
    }

    /// Malformed chat requests: fields set on a good request (one user message), and
    /// the field each refusal names.
    fn malformed_chats() -> Vec<(String, String)> {
        let user = json!({"role": "user", "content": "hi"});
        let call = json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]});
        let tools = json!([{"type": "function", "function": {"name": "bash"}}]);
        let result = |id: Value| json!({"role": "tool", "tool_call_id": id, "content": "x"});
        let then = |m: Value| json!([user, m, {"role": "user", "content": "x"}]);
        let calls = |c: Value| then(json!({"role": "assistant", "tool_calls": c}));
        // In several tables: one would pass `json!`'s recursion limit.
        let tables = [
            json!([
                [{"max_tokens": 0}, "max_tokens"],
                [{"max_completion_tokens": -1}, "max_completion_tokens"],
                [{"max_tokens": "ten"}, "max_tokens"],
                [{"max_tokens": 1.5}, "max_tokens"],
                [{"n": 2}, "n"],
                [{"n": 0}, "n"],
                [{"temperature": -0.5}, "temperature"],
                [{"temperature": "hot"}, "temperature"],
                [{"top_p": 0}, "top_p"],
                [{"top_p": 1.5}, "top_p"],
                [{"top_k": -2}, "top_k"],
                [{"min_p": 2}, "min_p"],
            ]),
            json!([
                [{"presence_penalty": 3}, "presence_penalty"],
                [{"frequency_penalty": -3}, "frequency_penalty"],
                [{"repetition_penalty": 0}, "repetition_penalty"],
                [{"seed": u64::MAX}, "seed"],
                [{"min_tokens": -1}, "min_tokens"],
                [{"max_tokens": 2, "min_tokens": 3}, "min_tokens"],
                [{"logit_bias": {"5": "x"}}, "logit_bias.5"],
                [{"logit_bias": {"999": 1}}, "logit_bias"],
                [{"logit_bias": {"x": 1}}, "logit_bias"],
                [{"stop": 3}, "stop"],
                [{"stop": [""]}, "stop"],
                [{"stream": "yes"}, "stream"],
            ]),
            json!([
                [{"stream_options": {"include_usage": true}}, "stream_options"],
                [{"logprobs": 1}, "logprobs"],
                [{"top_logprobs": 3}, "top_logprobs"],
                [{"top_logprobs": -1}, "top_logprobs"],
                [{"response_format": {"type": "yaml"}}, "response_format.type"],
                [{"response_format": "json"}, "response_format"],
                [{"user": 7}, "user"],
                [{"model": 7}, "model"],
                [{"echo": true}, "echo"],
                [{"continue_final_message": true}, "continue_final_message"],
                [{"add_generation_prompt": false}, "add_generation_prompt"],
            ]),
            json!([
                [{"tools": {"bash": 1}}, "tools"],
                [{"tools": [7]}, "tools[0]"],
                [{"tools": [{"type": "function"}]}, "tools[0].function"],
                [{"tools": [{"function": {"name": ""}}]}, "tools[0].function.name"],
                [{"tools": [{"type": "retrieval", "function": {"name": "x"}}]}, "tools[0].type"],
                [{"tool_choice": "auto"}, "tool_choice"],
                [{"tool_choice": "sometimes"}, "tool_choice"],
                [{"tools": tools, "tool_choice": {"type": "function", "function": {"name": "python"}}}, "tool_choice"],
            ]),
            json!([
                [{"messages": []}, "messages"],
                [{"messages": "hi"}, "messages"],
                [{"messages": ["hi"]}, "messages[0]"],
                [{"messages": [{"content": "hi"}]}, "messages[0].role"],
                [{"messages": [{"role": 3, "content": "hi"}]}, "messages[0].role"],
                [{"messages": [{"role": "user", "content": 3}]}, "messages[0].content"],
                [{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "messages[0].content[0]"],
                [{"messages": [{"role": "user", "content": "hi", "name": 1}]}, "messages[0].name"],
                [{"messages": [user, {"role": "assistant", "content": "x"}]}, "messages"],
            ]),
            json!([
                [{"messages": calls(json!("bash"))}, "messages[1].tool_calls"],
                [{"messages": calls(json!(["bash"]))}, "messages[1].tool_calls[0]"],
                [{"messages": calls(json!([{"function": "bash"}]))}, "messages[1].tool_calls[0].function"],
                [{"messages": calls(json!([{"function": {"arguments": "{}"}}]))}, "messages[1].tool_calls[0].function.name"],
                [{"messages": calls(json!([{"function": {"name": "x", "arguments": 3}}]))}, "messages[1].tool_calls[0].function.arguments"],
                [{"messages": [user, call, result(json!("nope"))]}, "messages[2].tool_call_id"],
                [{"messages": [user, result(json!("c1"))]}, "messages[1].tool_call_id"],
                [{"messages": [user, call, result(json!(5))]}, "messages[2].tool_call_id"],
            ]),
        ];
        tables
            .iter()
            .flat_map(|t| t.as_array().unwrap().clone())
            .map(|c| {
                let mut r = json!({"model": "m", "messages": [user]});
                for (k, v) in c[0].as_object().unwrap() {
                    r[k] = v.clone();
                }
                (r.to_string(), c[1].as_str().unwrap().to_string())
            })
            .collect()
    }

    /// Every field vLLM's server reads, wrong, is a 400 naming it, in vLLM's shape.
    #[test]
    fn malformed_fields_are_refused_naming_them() {
        let cases = malformed_chats();
        for (body, field) in &cases {
            let e = parse::<ChatRequest>(body)
                .and_then(|r| r.check(100).map(|_| ()))
                .expect_err(body);
            assert_eq!(e.status, 400, "{body}");
            assert_eq!(e.param.as_deref(), Some(field.as_str()), "{body}: {e:?}");
            let j: Value = serde_json::from_str(&e.body()).unwrap();
            assert_eq!(j["error"]["type"], "BadRequestError", "{j}");
            assert_eq!(j["error"]["code"], 400, "{j}");
            assert_eq!(j["error"]["param"], field.as_str(), "{j}");
            assert!(
                j["error"]["message"]
                    .as_str()
                    .is_some_and(|m| !m.is_empty())
            );
        }
        // Every field well formed passes.
        let ok = json!({"messages": [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "bash", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "x"}],
            "tools": [{"type": "function", "function": {"name": "bash"}}],
            "tool_choice": {"type": "function", "function": {"name": "bash"}},
            "max_tokens": 1, "temperature": 0, "top_p": 1, "n": 1, "stop": ["x"], "seed": -1,
            "logprobs": true, "top_logprobs": 2, "stream": true, "stream_options": {"include_usage": true}});
        let r: ChatRequest = parse(&ok.to_string()).unwrap();
        assert_eq!(r.check(100).unwrap(), vec!["x"]);
        // Completions' own fields.
        for (body, field) in [
            (r#"{"prompt": [1], "max_tokens": 0}"#, "max_tokens"),
            (r#"{"prompt": [1], "best_of": 2}"#, "best_of"),
            (r#"{"prompt": [1], "logprobs": 21}"#, "logprobs"),
            (r#"{"prompt": [1], "echo": true}"#, "echo"),
            (r#"{"prompt": [1], "suffix": "x"}"#, "suffix"),
            (r#"{"prompt": [1], "stop": [1]}"#, "stop"),
        ] {
            let e = parse::<CompletionRequest>(body)
                .and_then(|r| r.check(100).map(|_| ()))
                .expect_err(body);
            assert_eq!(e.param.as_deref(), Some(field), "{body}: {e:?}");
        }
    }

    #[test]
    fn bodies_that_are_not_requests_are_refused_and_messages_stay_short() {
        for body in [
            "",
            "  ",
            "{",
            "[1, 2]",
            "null",
            "{} x",
            "{\"messages\": [] } }",
        ] {
            let e = parse::<ChatRequest>(body).unwrap_err();
            assert_eq!(e.status, 400, "{body:?}");
        }
        // A message quoting a huge value is cut.
        let huge = json!({"messages": [], "max_tokens": "x".repeat(1 << 20)}).to_string();
        let e = parse::<ChatRequest>(&huge).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("max_tokens"));
        assert!(e.body().len() < 2 * MAX_MESSAGE_CHARS, "{}", e.body().len());
        assert_eq!(head("aé", 2), "a");
        assert_eq!(head("abc", 8), "abc");
    }

    #[test]
    fn malformed_calls_reach_no_index_that_panics() {
        for m in [
            json!({"role": "assistant", "tool_calls": ["x", 3, null]}),
            json!({"role": "assistant", "tool_calls": [{"function": "bash"}]}),
            json!({"role": "assistant", "tool_calls": [{"function": ["a"]}]}),
            json!("just text"),
            json!({"role": "user", "content": [1, {"text": 2}]}),
        ] {
            let _ = for_template(&m);
            let _ = essence(&m);
        }
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
