//! The inference servers' wire formats, as plain JSON in and out.
//!
//! Token-in, token-out: the prompt goes as token IDs and the answer comes back as the
//! exact token IDs the engine sampled, with one logprob per token. Two formats:
//!
//! - vLLM `POST /v1/completions` with `prompt` as a list of IDs and `logprobs: 1`. The
//!   sampled IDs come from `choices[0].token_ids` (servers that accept
//!   `return_token_ids`) or, on older servers, from `logprobs.tokens` written as
//!   `"token_id:<id>"` (`return_tokens_as_token_ids`). Both flags are sent; a server
//!   ignores the one it does not know. Cached prompt tokens come from
//!   `usage.prompt_tokens_details.cached_tokens` when the server reports them.
//! - SGLang `POST /generate` with `input_ids` and `return_logprob`; IDs and logprobs come
//!   from `meta_info.output_token_logprobs` (`[logprob, id, text]` triples), cached
//!   tokens from `meta_info.cached_tokens`.

use serde::{Deserialize, Serialize};

/// Sampling parameters, passed through to the server.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sampling {
    /// Softmax temperature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// Nucleus sampling mass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    /// Top-k cut-off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<i64>,
    /// Most new tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// Stop strings.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stop: Vec<String>,
    /// Sampling seed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Finish {
    /// An end-of-sequence token or a stop string.
    Stop,
    /// `max_tokens`, or the context length.
    Length,
    /// Anything else the server said (aborted, …).
    Other,
}

/// One generation, token-exact.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Generation {
    /// The sampled token IDs, in order.
    pub token_ids: Vec<u32>,
    /// The logprob of each sampled token, aligned with `token_ids`.
    pub logprobs: Vec<f32>,
    /// Why it ended.
    pub finish: Finish,
    /// Prompt tokens the server found in its prefix cache, when it says.
    pub cached_prompt_tokens: Option<u64>,
    /// The server's own detokenisation, for logs only (never re-encoded).
    pub text: Option<String>,
}

/// An answer that does not have the expected shape.
#[derive(Debug, thiserror::Error)]
#[error("unexpected {server} response: {message}")]
pub struct WireError {
    /// `vLLM` or `SGLang`.
    pub server: &'static str,
    /// What was missing or wrong.
    pub message: String,
}

fn finish_of(reason: Option<&str>) -> Finish {
    match reason {
        Some("stop") | Some("eos") => Finish::Stop,
        Some("length") => Finish::Length,
        _ => Finish::Other,
    }
}

/// The body of a vLLM `/v1/completions` request.
pub fn vllm_request(model: &str, prompt_ids: &[u32], s: &Sampling) -> serde_json::Value {
    let mut body = serde_json::json!({
        "model": model,
        "prompt": prompt_ids,
        "logprobs": 1,
        "return_token_ids": true,
        "return_tokens_as_token_ids": true,
        "skip_special_tokens": false,
        "include_stop_str_in_output": true,
        "stream": false,
    });
    let map = body.as_object_mut().expect("an object");
    if let serde_json::Value::Object(extra) = serde_json::to_value(s).expect("sampling serialises")
    {
        map.extend(extra);
    }
    body
}

/// Reads a vLLM `/v1/completions` response.
pub fn parse_vllm(resp: &serde_json::Value) -> Result<Generation, WireError> {
    let err = |message: String| WireError {
        server: "vLLM",
        message,
    };
    let choice = &resp["choices"][0];
    if choice.is_null() {
        return Err(err("no choices[0]".into()));
    }
    let logprobs: Vec<f32> = choice["logprobs"]["token_logprobs"]
        .as_array()
        .ok_or_else(|| err("no choices[0].logprobs.token_logprobs (send logprobs: 1)".into()))?
        .iter()
        .map(|v| v.as_f64().unwrap_or(f64::NEG_INFINITY) as f32)
        .collect();
    let token_ids: Vec<u32> = if let Some(ids) = choice["token_ids"].as_array() {
        ids.iter()
            .map(|v| v.as_u64().map(|i| i as u32))
            .collect::<Option<_>>()
            .ok_or_else(|| err("choices[0].token_ids holds a non-integer".into()))?
    } else if let Some(tokens) = choice["logprobs"]["tokens"].as_array() {
        tokens
            .iter()
            .map(|t| {
                t.as_str()
                    .and_then(|s| s.strip_prefix("token_id:"))
                    .and_then(|s| s.parse().ok())
            })
            .collect::<Option<_>>()
            .ok_or_else(|| {
                err("logprobs.tokens are not `token_id:<id>` (the server needs return_tokens_as_token_ids or return_token_ids)".into())
            })?
    } else {
        return Err(err(
            "no token IDs: neither choices[0].token_ids nor logprobs.tokens".into(),
        ));
    };
    if token_ids.len() != logprobs.len() {
        return Err(err(format!(
            "{} token IDs but {} logprobs",
            token_ids.len(),
            logprobs.len()
        )));
    }
    Ok(Generation {
        token_ids,
        logprobs,
        finish: finish_of(choice["finish_reason"].as_str()),
        cached_prompt_tokens: resp["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64(),
        text: choice["text"].as_str().map(str::to_string),
    })
}

/// The body of an SGLang `/generate` request.
pub fn sglang_request(prompt_ids: &[u32], s: &Sampling) -> serde_json::Value {
    let mut params = serde_json::Map::new();
    let mut put = |k: &str, v: Option<serde_json::Value>| {
        if let Some(v) = v {
            params.insert(k.into(), v);
        }
    };
    put("temperature", s.temperature.map(Into::into));
    put("top_p", s.top_p.map(Into::into));
    put("top_k", s.top_k.map(Into::into));
    put("max_new_tokens", s.max_tokens.map(Into::into));
    put("sampling_seed", s.seed.map(Into::into));
    if !s.stop.is_empty() {
        put("stop", Some(s.stop.clone().into()));
    }
    put("skip_special_tokens", Some(false.into()));
    serde_json::json!({
        "input_ids": prompt_ids,
        "sampling_params": params,
        "return_logprob": true,
        "stream": false,
    })
}

/// Reads an SGLang `/generate` response.
pub fn parse_sglang(resp: &serde_json::Value) -> Result<Generation, WireError> {
    let err = |message: String| WireError {
        server: "SGLang",
        message,
    };
    let meta = &resp["meta_info"];
    let triples = meta["output_token_logprobs"].as_array().ok_or_else(|| {
        err("no meta_info.output_token_logprobs (send return_logprob: true)".into())
    })?;
    let mut token_ids = Vec::with_capacity(triples.len());
    let mut logprobs = Vec::with_capacity(triples.len());
    for t in triples {
        let id = t[1]
            .as_u64()
            .ok_or_else(|| err("an output_token_logprobs entry has no token ID".into()))?;
        token_ids.push(id as u32);
        logprobs.push(t[0].as_f64().unwrap_or(f64::NEG_INFINITY) as f32);
    }
    if let Some(ids) = resp["output_ids"].as_array()
        && ids.len() == token_ids.len()
        && ids
            .iter()
            .zip(&token_ids)
            .any(|(a, b)| a.as_u64() != Some(u64::from(*b)))
    {
        return Err(err("output_ids and output_token_logprobs disagree".into()));
    }
    let finish = match &meta["finish_reason"] {
        serde_json::Value::Object(o) => finish_of(o.get("type").and_then(|t| t.as_str())),
        serde_json::Value::String(s) => finish_of(Some(s)),
        _ => Finish::Other,
    };
    Ok(Generation {
        token_ids,
        logprobs,
        finish,
        cached_prompt_tokens: meta["cached_tokens"].as_u64(),
        text: resp["text"].as_str().map(str::to_string),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampling() -> Sampling {
        Sampling {
            temperature: Some(0.7),
            top_p: Some(0.95),
            top_k: Some(20),
            max_tokens: Some(64),
            stop: vec!["</tool_call>".into()],
            seed: Some(3),
        }
    }

    #[test]
    fn vllm_requests_carry_ids_and_sampling() {
        let body = vllm_request("policy", &[1, 2, 3], &sampling());
        assert_eq!(body["prompt"], serde_json::json!([1, 2, 3]));
        assert_eq!(body["logprobs"], 1);
        assert_eq!(body["return_token_ids"], true);
        assert_eq!(body["top_k"], 20);
        assert_eq!(body["stop"], serde_json::json!(["</tool_call>"]));
        assert_eq!(body["seed"], 3);
    }

    #[test]
    fn vllm_token_ids_in_either_form() {
        let new = serde_json::json!({
            "choices": [{"text": "hi", "finish_reason": "stop", "token_ids": [7, 8],
                         "logprobs": {"tokens": ["h", "i"], "token_logprobs": [-0.5, -0.25]}}],
            "usage": {"prompt_tokens": 3, "prompt_tokens_details": {"cached_tokens": 2}}
        });
        let g = parse_vllm(&new).unwrap();
        assert_eq!(g.token_ids, vec![7, 8]);
        assert_eq!(g.logprobs, vec![-0.5, -0.25]);
        assert_eq!(g.finish, Finish::Stop);
        assert_eq!(g.cached_prompt_tokens, Some(2));
        let old = serde_json::json!({
            "choices": [{"text": "hi", "finish_reason": "length",
                         "logprobs": {"tokens": ["token_id:7", "token_id:8"], "token_logprobs": [-0.5, -0.25]}}]
        });
        let g = parse_vllm(&old).unwrap();
        assert_eq!(g.token_ids, vec![7, 8]);
        assert_eq!(g.finish, Finish::Length);
        assert_eq!(g.cached_prompt_tokens, None);
        let text_only = serde_json::json!({
            "choices": [{"text": "hi", "logprobs": {"tokens": ["h"], "token_logprobs": [-0.5]}}]
        });
        assert!(
            parse_vllm(&text_only)
                .unwrap_err()
                .to_string()
                .contains("token_id:")
        );
    }

    #[test]
    fn sglang_round_trip() {
        let body = sglang_request(&[1, 2], &sampling());
        assert_eq!(body["input_ids"], serde_json::json!([1, 2]));
        assert_eq!(body["sampling_params"]["max_new_tokens"], 64);
        assert_eq!(body["return_logprob"], true);
        let resp = serde_json::json!({
            "text": "hi", "output_ids": [7, 8],
            "meta_info": {"output_token_logprobs": [[-0.5, 7, null], [-0.25, 8, null]],
                          "finish_reason": {"type": "length", "length": 2}, "cached_tokens": 1}
        });
        let g = parse_sglang(&resp).unwrap();
        assert_eq!((g.token_ids, g.logprobs), (vec![7, 8], vec![-0.5, -0.25]));
        assert_eq!(g.finish, Finish::Length);
        assert_eq!(g.cached_prompt_tokens, Some(1));
        let bad = serde_json::json!({"meta_info": {}});
        assert!(
            parse_sglang(&bad)
                .unwrap_err()
                .to_string()
                .contains("return_logprob")
        );
    }
}
