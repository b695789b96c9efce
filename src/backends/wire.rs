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
//!   `usage.prompt_tokens_details.cached_tokens` when the server reports them. The
//!   request also asks for `return_weight_versions` (vLLM 0.33): the label of the
//!   weights behind each output token, in `choices[0].weight_versions`.
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
    /// Top-k cut-off; -1 or 0: none (sent to SGLang as -1, which it requires).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<i64>,
    /// Most new tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// Stop strings.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stop: Vec<String>,
    /// Sampling seed; at most `i64::MAX`, as both servers require (checked at submit).
    /// SGLang ignores it unless started with `--enable-deterministic-inference`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Tokens that end generation (kept in the output). The RUN worker adds the model's
    /// end-of-turn token and its other stop tokens (`generation_config.json`), so a
    /// turn ends where the template ends turns whatever the server's defaults.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stop_token_ids: Vec<u32>,
    /// What the model may write, enforced by the server's structured-output support
    /// (vLLM's `structured_outputs`, SGLang's `regex`/`ebnf`/`json_schema`): e.g. a
    /// regex that makes every turn a well-formed tool call. The tokens sampled under it
    /// are still the server's own, with their logprobs (a token the grammar forces has
    /// logprob 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub structured_outputs: Option<StructuredOutputs>,
    /// The prefix cache's namespace (`cache_salt`: vLLM's, and SGLang's `/generate` in
    /// its 0.5 releases): a request reuses cached blocks only of requests with the same
    /// salt. Set by the RUN worker to the policy version (`policy-v<N>`), so KV computed
    /// under one version of the weights is never reused under another; a task cannot
    /// set it.
    #[serde(default, skip_deserializing, skip_serializing_if = "Option::is_none")]
    pub cache_salt: Option<String>,
}

/// One structured-output constraint: exactly one of its fields (see
/// [`StructuredOutputs::check`]). The names are vLLM's (`structured_outputs` in
/// `/v1/completions`); SGLang takes the same as `regex`, `ebnf` and `json_schema`, and a
/// `choice` as a regex of the alternatives.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StructuredOutputs {
    /// A regular expression the whole output must match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regex: Option<String>,
    /// A grammar (GBNF/EBNF) the output must follow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grammar: Option<String>,
    /// A JSON schema the output must satisfy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json: Option<serde_json::Value>,
    /// The output is exactly one of these strings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub choice: Option<Vec<String>>,
}

impl StructuredOutputs {
    /// `Err` with the reason unless exactly one constraint is given and it can
    /// constrain something (a non-empty regex or grammar, a JSON object schema, at
    /// least one choice). Checked at submit: a server answers a bad one 400 (or, for
    /// some grammar backends, 500) on every turn.
    pub fn check(&self) -> Result<(), String> {
        let given = [
            self.regex.is_some(),
            self.grammar.is_some(),
            self.json.is_some(),
            self.choice.is_some(),
        ];
        if given.iter().filter(|g| **g).count() != 1 {
            return Err("give exactly one of regex, grammar, json, choice".into());
        }
        if self.regex.as_deref().is_some_and(str::is_empty)
            || self.grammar.as_deref().is_some_and(str::is_empty)
        {
            return Err("must not be empty".into());
        }
        if self.json.as_ref().is_some_and(|j| !j.is_object()) {
            return Err("json must be a JSON schema (an object)".into());
        }
        if self
            .choice
            .as_ref()
            .is_some_and(|c| c.is_empty() || c.iter().any(String::is_empty))
        {
            return Err("choice must list at least one non-empty string".into());
        }
        Ok(())
    }

    /// The regex SGLang is given for a `choice`: the alternatives, each escaped.
    fn choice_regex(choices: &[String]) -> String {
        let alts: Vec<String> = choices.iter().map(|c| regex_escape(c)).collect();
        format!("({})", alts.join("|"))
    }
}

/// `text` with every regex metacharacter escaped.
fn regex_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Finish {
    /// An end-of-sequence token or a stop string.
    Stop,
    /// `max_tokens`, or the context length.
    Length,
    /// The server aborted the generation (vLLM `finish_reason: "abort"`, SGLang
    /// `{"type": "abort"}`), e.g. to pause for a weight update: not a complete turn. The
    /// agent loop continues it from its tokens once generation resumes.
    Aborted,
    /// Anything else the server said.
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
    /// The server refused the request as paused (503) before answering it: the answer
    /// was generated after that pause ended (vLLM 0.33 refuses new requests while
    /// paused), so under the weights current at the answer. Set by the client.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub after_pause: bool,
    /// The server's own label of the weights that sampled each output token, as runs
    /// over `token_ids` (vLLM 0.33's `weight_versions`, asked for with
    /// `return_weight_versions`); `None` where the server does not say. The service
    /// labels each backend's weights with the policy version it makes current, so these
    /// split a turn that straddled an update exactly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_versions: Option<Vec<WeightSpan>>,
}

/// Output tokens `start..end` were sampled by the weights labelled `version` (vLLM's
/// `WeightVersionSpan`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WeightSpan {
    /// The label, as the server was told it (`/update_weight_version`).
    pub version: String,
    /// The first token's index.
    pub start: usize,
    /// One past the last token's index.
    pub end: usize,
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
        Some("abort") => Finish::Aborted,
        _ => Finish::Other,
    }
}

/// The body of a vLLM `/v1/completions` request, serialised straight from the borrowed
/// prompt (a request carries the whole context, tens of thousands of IDs, every turn).
pub fn vllm_body(model: &str, prompt_ids: &[u32], s: &Sampling) -> Vec<u8> {
    #[derive(Serialize)]
    struct Body<'a> {
        model: &'a str,
        prompt: &'a [u32],
        logprobs: u32,
        return_token_ids: bool,
        return_tokens_as_token_ids: bool,
        return_weight_versions: bool,
        skip_special_tokens: bool,
        include_stop_str_in_output: bool,
        stream: bool,
        #[serde(flatten)]
        sampling: &'a Sampling,
    }
    serde_json::to_vec(&Body {
        model,
        prompt: prompt_ids,
        logprobs: 1,
        return_token_ids: true,
        return_tokens_as_token_ids: true,
        return_weight_versions: true,
        skip_special_tokens: false,
        include_stop_str_in_output: true,
        stream: false,
        sampling: s,
    })
    .expect("a request serialises")
}

#[derive(Deserialize)]
struct VllmResponse {
    #[serde(default)]
    choices: Vec<VllmChoice>,
    #[serde(default)]
    usage: Option<VllmUsage>,
}

#[derive(Deserialize)]
struct VllmChoice {
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    finish_reason: Option<String>,
    #[serde(default)]
    token_ids: Option<Vec<u32>>,
    #[serde(default)]
    logprobs: Option<VllmLogprobs>,
    #[serde(default)]
    weight_versions: Option<Vec<WeightSpan>>,
}

#[derive(Deserialize)]
struct VllmLogprobs {
    #[serde(default)]
    token_logprobs: Option<Vec<Option<f64>>>,
    #[serde(default)]
    tokens: Option<Vec<String>>,
}

#[derive(Deserialize)]
struct VllmUsage {
    #[serde(default)]
    prompt_tokens_details: Option<CachedTokens>,
}

#[derive(Deserialize)]
struct CachedTokens {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

/// A token's logprob as a trajectory keeps it, with a missing one as −∞.
// Narrowing to f32 is the point: a trajectory stores f32 logprobs. Logprobs are ≤ 0 and
// far inside f32's range; the cast only rounds the mantissa.
#[allow(clippy::cast_possible_truncation)]
fn logprob(v: Option<f64>) -> f32 {
    v.unwrap_or(f64::NEG_INFINITY) as f32
}

/// Reads a vLLM `/v1/completions` response. Only the fields used are decoded; the rest
/// (`top_logprobs`, offsets) is skipped without being built.
pub fn parse_vllm(body: &[u8]) -> Result<Generation, WireError> {
    let err = |message: String| WireError {
        server: "vLLM",
        message,
    };
    let resp: VllmResponse = serde_json::from_slice(body)
        .map_err(|e| err(format!("the answer is not a completions response: {e}")))?;
    let cached_prompt_tokens = resp
        .usage
        .and_then(|u| u.prompt_tokens_details)
        .and_then(|d| d.cached_tokens);
    let choice = resp
        .choices
        .into_iter()
        .next()
        .ok_or_else(|| err("no choices[0]".into()))?;
    let lp = choice.logprobs.unwrap_or(VllmLogprobs {
        token_logprobs: None,
        tokens: None,
    });
    let logprobs: Vec<f32> = lp
        .token_logprobs
        .ok_or_else(|| err("no choices[0].logprobs.token_logprobs (send logprobs: 1)".into()))?
        .into_iter()
        .map(logprob)
        .collect();
    let token_ids: Vec<u32> = if let Some(ids) = choice.token_ids {
        ids
    } else if let Some(tokens) = lp.tokens {
        tokens
            .iter()
            .map(|t| t.strip_prefix("token_id:").and_then(|s| s.parse().ok()))
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
        finish: finish_of(choice.finish_reason.as_deref()),
        cached_prompt_tokens,
        text: choice.text,
        after_pause: false,
        weight_versions: choice.weight_versions,
    })
}

/// The body of an SGLang `/generate` request.
pub fn sglang_body(prompt_ids: &[u32], s: &Sampling) -> Vec<u8> {
    #[derive(Serialize)]
    struct Params<'a> {
        #[serde(skip_serializing_if = "Option::is_none")]
        temperature: Option<f64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        top_p: Option<f64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        top_k: Option<i64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        max_new_tokens: Option<u64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        sampling_seed: Option<u64>,
        #[serde(skip_serializing_if = "<[String]>::is_empty")]
        stop: &'a [String],
        #[serde(skip_serializing_if = "<[u32]>::is_empty")]
        stop_token_ids: &'a [u32],
        skip_special_tokens: bool,
        #[serde(skip_serializing_if = "Option::is_none")]
        regex: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        ebnf: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        json_schema: Option<String>,
    }
    #[derive(Serialize)]
    struct Body<'a> {
        input_ids: &'a [u32],
        sampling_params: Params<'a>,
        return_logprob: bool,
        stream: bool,
        #[serde(skip_serializing_if = "Option::is_none")]
        cache_salt: Option<&'a str>,
    }
    let constraint = s.structured_outputs.as_ref();
    serde_json::to_vec(&Body {
        input_ids: prompt_ids,
        sampling_params: Params {
            temperature: s.temperature,
            top_p: s.top_p,
            // SGLang refuses 0, which vLLM takes as "no cut-off": its -1 says the same.
            top_k: s.top_k.map(|k| if k == 0 { -1 } else { k }),
            max_new_tokens: s.max_tokens,
            sampling_seed: s.seed,
            stop: &s.stop,
            stop_token_ids: &s.stop_token_ids,
            skip_special_tokens: false,
            regex: constraint.and_then(|c| {
                c.regex
                    .clone()
                    .or_else(|| c.choice.as_deref().map(StructuredOutputs::choice_regex))
            }),
            ebnf: constraint.and_then(|c| c.grammar.as_deref()),
            // SGLang takes the schema as a JSON string.
            json_schema: constraint.and_then(|c| c.json.as_ref().map(ToString::to_string)),
        },
        return_logprob: true,
        stream: false,
        cache_salt: s.cache_salt.as_deref(),
    })
    .expect("a request serialises")
}

#[derive(Deserialize)]
struct SglangResponse {
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    output_ids: Option<Vec<u64>>,
    #[serde(default)]
    meta_info: Option<SglangMeta>,
}

/// One entry of SGLang's `output_token_logprobs`: `[logprob, token_id, token_text]`.
type TokenLogprob = (Option<f64>, Option<u64>, serde::de::IgnoredAny);

#[derive(Deserialize)]
struct SglangMeta {
    #[serde(default)]
    output_token_logprobs: Option<Vec<TokenLogprob>>,
    #[serde(default)]
    finish_reason: Option<serde_json::Value>,
    #[serde(default)]
    cached_tokens: Option<u64>,
}

/// Reads an SGLang `/generate` response.
pub fn parse_sglang(body: &[u8]) -> Result<Generation, WireError> {
    let err = |message: String| WireError {
        server: "SGLang",
        message,
    };
    let resp: SglangResponse = serde_json::from_slice(body)
        .map_err(|e| err(format!("the answer is not a generate response: {e}")))?;
    let meta = resp
        .meta_info
        .ok_or_else(|| err("no meta_info (send return_logprob: true)".into()))?;
    let triples = meta.output_token_logprobs.ok_or_else(|| {
        err("no meta_info.output_token_logprobs (send return_logprob: true)".into())
    })?;
    let mut token_ids = Vec::with_capacity(triples.len());
    let mut logprobs = Vec::with_capacity(triples.len());
    for (lp, id, _) in triples {
        let id = id.ok_or_else(|| err("an output_token_logprobs entry has no token ID".into()))?;
        // As vLLM's `token_ids`, which are decoded as u32 directly.
        let id = u32::try_from(id).map_err(|_| {
            err(format!(
                "the token ID {id} in output_token_logprobs is not a u32"
            ))
        })?;
        token_ids.push(id);
        logprobs.push(logprob(lp));
    }
    if let Some(ids) = &resp.output_ids
        && ids.len() == token_ids.len()
        && ids.iter().zip(&token_ids).any(|(a, b)| *a != u64::from(*b))
    {
        return Err(err("output_ids and output_token_logprobs disagree".into()));
    }
    let finish = match &meta.finish_reason {
        Some(serde_json::Value::Object(o)) => finish_of(o.get("type").and_then(|t| t.as_str())),
        Some(serde_json::Value::String(s)) => finish_of(Some(s)),
        _ => Finish::Other,
    };
    Ok(Generation {
        token_ids,
        logprobs,
        finish,
        cached_prompt_tokens: meta.cached_tokens,
        text: resp.text,
        after_pause: false,
        weight_versions: None,
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
            stop_token_ids: vec![7, 9],
            structured_outputs: None,
            cache_salt: None,
        }
    }

    #[test]
    fn the_cache_salt_reaches_both_servers_and_no_task_can_set_it() {
        let mut s = sampling();
        let v: serde_json::Value = serde_json::from_slice(&vllm_body("m", &[1], &s)).unwrap();
        assert!(v.get("cache_salt").is_none());
        s.cache_salt = Some("policy-v4".into());
        let v: serde_json::Value = serde_json::from_slice(&vllm_body("m", &[1], &s)).unwrap();
        assert_eq!(v["cache_salt"], "policy-v4");
        let g: serde_json::Value = serde_json::from_slice(&sglang_body(&[1], &s)).unwrap();
        assert_eq!(g["cache_salt"], "policy-v4");
        assert!(g["sampling_params"].get("cache_salt").is_none());
        // A task's sampling parameters cannot name it.
        let from_task: Result<Sampling, _> =
            serde_json::from_value(serde_json::json!({"cache_salt": "mine"}));
        assert!(from_task.is_err() || from_task.unwrap().cache_salt.is_none());
    }

    #[test]
    fn structured_outputs_reach_both_servers_in_their_words() {
        let mut s = sampling();
        s.structured_outputs = Some(StructuredOutputs {
            regex: Some("<tool_call>[a-z]+</tool_call>".into()),
            ..Default::default()
        });
        let v: serde_json::Value = serde_json::from_slice(&vllm_body("m", &[1], &s)).unwrap();
        assert_eq!(
            v["structured_outputs"],
            serde_json::json!({"regex": "<tool_call>[a-z]+</tool_call>"})
        );
        let g: serde_json::Value = serde_json::from_slice(&sglang_body(&[1], &s)).unwrap();
        assert_eq!(
            g["sampling_params"]["regex"],
            "<tool_call>[a-z]+</tool_call>"
        );
        s.structured_outputs = Some(StructuredOutputs {
            choice: Some(vec!["a.b".into(), "(c)".into()]),
            ..Default::default()
        });
        let g: serde_json::Value = serde_json::from_slice(&sglang_body(&[1], &s)).unwrap();
        assert_eq!(g["sampling_params"]["regex"], r"(a\.b|\(c\))");
        s.structured_outputs = Some(StructuredOutputs {
            json: Some(serde_json::json!({"type": "object"})),
            ..Default::default()
        });
        let g: serde_json::Value = serde_json::from_slice(&sglang_body(&[1], &s)).unwrap();
        assert_eq!(g["sampling_params"]["json_schema"], r#"{"type":"object"}"#);
        s.structured_outputs = Some(StructuredOutputs {
            grammar: Some("root ::= \"x\"".into()),
            ..Default::default()
        });
        let g: serde_json::Value = serde_json::from_slice(&sglang_body(&[1], &s)).unwrap();
        assert_eq!(g["sampling_params"]["ebnf"], "root ::= \"x\"");
        assert!(g["sampling_params"].get("regex").is_none());
    }

    #[test]
    fn a_structured_output_gives_exactly_one_usable_constraint() {
        let ok = StructuredOutputs {
            regex: Some("a+".into()),
            ..Default::default()
        };
        assert!(ok.check().is_ok());
        for bad in [
            StructuredOutputs::default(),
            StructuredOutputs {
                regex: Some("a".into()),
                grammar: Some("root ::= \"a\"".into()),
                ..Default::default()
            },
            StructuredOutputs {
                regex: Some(String::new()),
                ..Default::default()
            },
            StructuredOutputs {
                json: Some(serde_json::json!("string")),
                ..Default::default()
            },
            StructuredOutputs {
                choice: Some(vec![]),
                ..Default::default()
            },
        ] {
            assert!(bad.check().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn vllm_requests_carry_ids_and_sampling() {
        let body: serde_json::Value =
            serde_json::from_slice(&vllm_body("policy", &[1, 2, 3], &sampling())).unwrap();
        assert_eq!(body["prompt"], serde_json::json!([1, 2, 3]));
        assert_eq!(body["logprobs"], 1);
        assert_eq!(body["return_token_ids"], true);
        assert_eq!(body["top_k"], 20);
        assert_eq!(body["stop"], serde_json::json!(["</tool_call>"]));
        assert_eq!(body["seed"], 3);
        assert_eq!(body["stop_token_ids"], serde_json::json!([7, 9]));
        let sglang: serde_json::Value =
            serde_json::from_slice(&sglang_body(&[1, 2, 3], &sampling())).unwrap();
        assert_eq!(
            sglang["sampling_params"]["stop_token_ids"],
            serde_json::json!([7, 9])
        );
    }

    #[test]
    fn vllm_token_ids_in_either_form() {
        let new = serde_json::json!({
            "choices": [{"text": "hi", "finish_reason": "stop", "token_ids": [7, 8],
                         "logprobs": {"tokens": ["h", "i"], "token_logprobs": [-0.5, -0.25]}}],
            "usage": {"prompt_tokens": 3, "prompt_tokens_details": {"cached_tokens": 2}}
        });
        let g = parse_vllm(new.to_string().as_bytes()).unwrap();
        assert_eq!(g.token_ids, vec![7, 8]);
        assert_eq!(g.logprobs, vec![-0.5, -0.25]);
        assert_eq!(g.finish, Finish::Stop);
        assert_eq!(g.cached_prompt_tokens, Some(2));
        let old = serde_json::json!({
            "choices": [{"text": "hi", "finish_reason": "length",
                         "logprobs": {"tokens": ["token_id:7", "token_id:8"], "token_logprobs": [-0.5, -0.25]}}]
        });
        let g = parse_vllm(old.to_string().as_bytes()).unwrap();
        assert_eq!(g.token_ids, vec![7, 8]);
        assert_eq!(g.finish, Finish::Length);
        assert_eq!(g.cached_prompt_tokens, None);
        let text_only = serde_json::json!({
            "choices": [{"text": "hi", "logprobs": {"tokens": ["h"], "token_logprobs": [-0.5]}}]
        });
        assert!(
            parse_vllm(text_only.to_string().as_bytes())
                .unwrap_err()
                .to_string()
                .contains("token_id:")
        );
    }

    #[test]
    fn sglang_gets_minus_one_for_no_top_k() {
        let s = Sampling {
            top_k: Some(0),
            ..sampling()
        };
        let body: serde_json::Value = serde_json::from_slice(&sglang_body(&[1], &s)).unwrap();
        assert_eq!(body["sampling_params"]["top_k"], -1);
    }

    #[test]
    fn sglang_round_trip() {
        let body: serde_json::Value =
            serde_json::from_slice(&sglang_body(&[1, 2], &sampling())).unwrap();
        assert_eq!(body["input_ids"], serde_json::json!([1, 2]));
        assert_eq!(body["sampling_params"]["max_new_tokens"], 64);
        assert_eq!(body["return_logprob"], true);
        let resp = serde_json::json!({
            "text": "hi", "output_ids": [7, 8],
            "meta_info": {"output_token_logprobs": [[-0.5, 7, null], [-0.25, 8, null]],
                          "finish_reason": {"type": "length", "length": 2}, "cached_tokens": 1}
        });
        let g = parse_sglang(resp.to_string().as_bytes()).unwrap();
        assert_eq!((g.token_ids, g.logprobs), (vec![7, 8], vec![-0.5, -0.25]));
        assert_eq!(g.finish, Finish::Length);
        assert_eq!(g.cached_prompt_tokens, Some(1));
        let bad = serde_json::json!({"meta_info": {}});
        assert!(
            parse_sglang(bad.to_string().as_bytes())
                .unwrap_err()
                .to_string()
                .contains("return_logprob")
        );
        // A token ID no u32 holds is refused, not cut to another token.
        let wide = serde_json::json!({
            "meta_info": {"output_token_logprobs": [[-0.5, 4_294_967_303_u64, null]],
                          "finish_reason": {"type": "stop", "matched": null}}
        });
        assert!(
            parse_sglang(wide.to_string().as_bytes())
                .unwrap_err()
                .to_string()
                .contains("not a u32")
        );
    }
}
