//! The requests the stand-in refuses, and the error bodies it refuses them with, in the
//! words and shapes of the real servers (vLLM 0.32's nested `{"error": {…}}` naming the
//! parameter, SGLang's `{"error": {"message"}}`): the service's handling of a refusal
//! (what it retries, what it reports) is only tested if the refusal looks like the real
//! one. Checked against the real vLLM in `tests/pipeline/real_vllm.rs`.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::{ScriptedConfig, Shared};

/// vLLM 0.32's error answer: `{"error": {"message", "type", "param", "code"}}`.
pub(crate) fn vllm_error(
    status: StatusCode,
    kind: &str,
    message: String,
    param: Option<&str>,
) -> Response {
    let body = serde_json::json!({"error": {
        "message": message, "type": kind, "param": param, "code": status.as_u16(),
    }});
    (status, Json(body)).into_response()
}

/// A 400 answer in the shape the server of `format` uses: vLLM's (naming the parameter
/// at fault, when there is one), SGLang's `{"error": {"message": …}}`.
fn bad_request_at(format: &str, message: String, param: Option<&str>) -> Response {
    if format == "sglang" {
        let body = serde_json::json!({"error": {"message": message}});
        return (StatusCode::BAD_REQUEST, Json(body)).into_response();
    }
    vllm_error(StatusCode::BAD_REQUEST, "BadRequestError", message, param)
}

/// A 400 answer in `format`'s shape, naming no parameter.
pub(crate) fn bad_request_in(format: &str, message: String) -> Response {
    bad_request_at(format, message, None)
}

/// A 400 answer in vLLM's shape, naming no parameter.
pub(crate) fn bad_request(message: String) -> Response {
    bad_request_in("vllm", message)
}

/// vLLM's refusal of a parameter, with its `(parameter=…, value=…)` suffix.
fn bad_param(param: &str, value: impl std::fmt::Display, message: &str) -> Response {
    bad_request_at(
        "vllm",
        format!("{message} (parameter={param}, value={value})"),
        Some(param),
    )
}

/// vLLM's check of `cache_salt` (the same in 0.32 and 0.33): a non-empty string of at
/// most 128 characters without `@`, `/`, `\` or NUL. The messages are the real
/// server's, doubled backslash and parameter suffix included (`tests/pipeline/real_vllm.rs`).
pub(crate) fn refuse_cache_salt(salt: Option<&str>) -> Option<Response> {
    let salt = salt?;
    let message = if salt.is_empty() {
        "Parameter 'cache_salt' must be a non-empty string if provided. (parameter=cache_salt)"
    } else if salt.chars().count() > 128 || salt.contains(['@', '/', '\\', '\0']) {
        "Parameter 'cache_salt' must be at most 128 characters and must not contain '@', '/', '\\\\', or NUL. (parameter=cache_salt)"
    } else {
        return None;
    };
    Some(bad_request_at("vllm", message.into(), Some("cache_salt")))
}

/// The refusal the real server of `format` gives sampling parameters it refuses: a
/// seed outside int64 (both), `top_k` below -1 (both) or 0 (SGLang; vLLM takes 0 as
/// "no cut-off"). `None` when they are fine.
pub(crate) fn refuse_sampling(
    format: &str,
    top_k: Option<i64>,
    seed: Option<&serde_json::Number>,
) -> Option<Response> {
    if let Some(k) = top_k
        && (k < -1 || (k == 0 && format == "sglang"))
    {
        let why = if format == "sglang" {
            format!("top_k must be -1 (disable) or at least 1, got {k}.")
        } else {
            format!("top_k must be 0 (disable), or at least 1, got {k}.")
        };
        return Some(bad_request_in(format, why));
    }
    if let Some(seed) = seed
        && seed.as_i64().is_none()
    {
        if format == "vllm" {
            // vLLM 0.32 checks the range with pydantic, and says so in its words.
            let (kind, msg, key, bound) = if seed.as_f64().is_some_and(|v| v < 0.0) {
                (
                    "greater_than_equal",
                    "greater than or equal to",
                    "ge",
                    i64::MIN,
                )
            } else {
                ("less_than_equal", "less than or equal to", "le", i64::MAX)
            };
            return Some(vllm_error(
                StatusCode::BAD_REQUEST,
                "Bad Request",
                format!(
                    "1 validation error:\n  {{'type': '{kind}', 'loc': 'body.seed', 'msg': 'Input should be {msg} {bound}', 'input': '{seed}', 'ctx': {{'{key}': {bound}}}}}"
                ),
                Some("body.seed"),
            ));
        }
        return Some(bad_request_in(
            format,
            format!("seed must be an integer in [-2**63, 2**63 - 1], got {seed}."),
        ));
    }
    None
}

/// How many tokens a request may generate, or the refusal the real server of `format`
/// gives it. vLLM 0.32 cuts `max_tokens` (16 when absent) to the room the prompt
/// leaves, and refuses a prompt that leaves none, a `max_tokens` of 0 and one above
/// the context. SGLang (`max_new_tokens` 128 when absent) refuses a prompt and
/// `max_new_tokens` that together exceed the context.
pub(crate) fn room(
    cfg: &ScriptedConfig,
    prompt: usize,
    asked: Option<usize>,
    format: &str,
) -> Result<usize, Box<Response>> {
    let ctx = cfg.max_model_len;
    if format == "sglang" {
        let max_tokens = asked.unwrap_or(128);
        if let Some(r) = refuse_length(cfg, prompt, max_tokens) {
            return Err(Box::new(r));
        }
        return Ok(max_tokens);
    }
    let at_least_one = || {
        Box::new(bad_param(
            "max_tokens",
            0,
            "max_tokens must be at least 1, got 0.",
        ))
    };
    match asked {
        Some(0) => return Err(at_least_one()),
        Some(m) if m > ctx => {
            return Err(Box::new(bad_param(
                "max_tokens",
                m,
                &format!(
                    "max_tokens={m} cannot be greater than max_model_len={ctx}. Please request fewer output tokens."
                ),
            )));
        }
        _ => {}
    }
    if prompt > ctx {
        return Err(Box::new(bad_param(
            "input_tokens",
            prompt,
            &format!(
                "This model's maximum context length is {ctx} tokens. However, your prompt contains {prompt} input tokens, which exceeds this limit even without any output tokens. Please reduce the length of the input prompt."
            ),
        )));
    }
    match asked.unwrap_or(16).min(ctx - prompt) {
        0 => Err(at_least_one()),
        n => Ok(n),
    }
}

/// SGLang's refusal of a prompt of `prompt` tokens and `max_tokens` that together
/// exceed the context, in its words (tokenizer_manager's length check); `None` when
/// they fit.
fn refuse_length(cfg: &ScriptedConfig, prompt: usize, max_tokens: usize) -> Option<Response> {
    let ctx = cfg.max_model_len;
    if prompt + max_tokens <= ctx {
        return None;
    }
    let message = if prompt >= ctx {
        format!(
            "The input ({prompt} tokens) is longer than the model's context length ({ctx} tokens)."
        )
    } else {
        format!(
            "Requested token count exceeds the model's maximum context length of {ctx} tokens. You requested a total of {} tokens: {prompt} tokens from the input messages and {max_tokens} tokens for the completion. Please reduce the number of tokens in the input messages or the completion to fit within the limit.",
            prompt + max_tokens,
        )
    };
    Some(bad_request_in("sglang", message))
}

/// vLLM's refusal of token IDs the model does not have, in the prompt or in
/// `stop_token_ids`.
pub(crate) fn refuse_unknown_ids(
    cfg: &ScriptedConfig,
    prompt: &[u32],
    stop_token_ids: &[u32],
) -> Result<(), Box<Response>> {
    let vocab = cfg.model.tokenizer.vocab_size();
    let known = |id: &u32| usize::try_from(*id).is_ok_and(|i| i < vocab);
    if let Some(id) = prompt.iter().find(|id| !known(id)) {
        return Err(Box::new(bad_request(format!(
            "Token id {id} is out of vocabulary"
        ))));
    }
    let unknown: Vec<u32> = stop_token_ids
        .iter()
        .copied()
        .filter(|id| !known(id))
        .collect();
    if !unknown.is_empty() {
        return Err(Box::new(bad_param(
            "stop_token_ids",
            format!("{unknown:?}"),
            &format!(
                "token_id(s) {unknown:?} in stop_token_ids contain out-of-vocab token ids. Vocabulary size: {vocab}"
            ),
        )));
    }
    Ok(())
}

/// vLLM 0.33 refuses a request that arrives during an `abort` or `wait` pause.
pub(crate) fn refuse_while_paused(s: &Shared, format: &str) -> Option<Response> {
    (format == "vllm" && !s.cfg.pause_holds_new && s.pause.refusing()).then(|| {
        vllm_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailableError",
            "Generation is paused. Please retry after it resumes.".into(),
            None,
        )
    })
}

/// The prompt's token IDs, refused when empty, as both servers refuse an empty prompt.
pub(crate) fn non_empty(ids: Vec<u32>, field: &str) -> Result<Vec<u32>, String> {
    if ids.is_empty() {
        Err(format!("{field} must be a non-empty list of token IDs"))
    } else {
        Ok(ids)
    }
}
