//! The two request bodies the stand-in serves, typed: vLLM's `POST /v1/completions` and
//! SGLang's `POST /generate`, with the fields it reads.
//!
//! Fields it does not read are ignored, as both real servers ignore them (vLLM logs a
//! warning; SGLang's request dataclass drops them). A field of the wrong type is refused
//! with a 400 naming it, as vLLM's validation and SGLang's do, rather than read as
//! absent.

use serde::Deserialize;

/// `prompt`: text, or token IDs.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum Prompt {
    /// Token IDs (what the RUN workers send).
    Ids(Vec<u32>),
    /// Text, tokenized by the server.
    Text(String),
}

/// `stop`: one string or a list.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum Stop {
    /// One stop string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

impl Stop {
    /// The stop strings, however they were given.
    pub(super) fn into_list(stop: Option<Stop>) -> Vec<String> {
        match stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s],
            Some(Stop::Many(v)) => v,
        }
    }
}

/// vLLM's `POST /v1/completions` body: the fields the stand-in reads.
#[derive(Debug, Deserialize)]
pub(super) struct CompletionRequest {
    /// The served model's name.
    #[serde(default)]
    pub(super) model: Option<String>,
    /// The prompt.
    pub(super) prompt: Prompt,
    /// Most new tokens.
    #[serde(default)]
    pub(super) max_tokens: Option<u64>,
    /// Stop strings.
    #[serde(default)]
    pub(super) stop: Option<Stop>,
    /// Stop tokens.
    #[serde(default)]
    pub(super) stop_token_ids: Option<Vec<u32>>,
    /// The sampling seed; range-checked by [`crate::refuse::refuse_sampling`] with vLLM's message.
    #[serde(default)]
    pub(super) seed: Option<serde_json::Number>,
    /// The top-k cut-off.
    #[serde(default)]
    pub(super) top_k: Option<i64>,
    /// Write tokens as `token_id:<id>` in `logprobs.tokens`.
    #[serde(default)]
    pub(super) return_tokens_as_token_ids: bool,
    /// Return `token_ids` and `prompt_token_ids` in the choice.
    #[serde(default)]
    pub(super) return_token_ids: bool,
    /// The prefix cache's namespace; checked as vLLM checks it.
    #[serde(default)]
    pub(super) cache_salt: Option<String>,
    /// vLLM 0.33: the choice says which weight-version label sampled its tokens.
    #[serde(default)]
    pub(super) return_weight_versions: bool,
}

/// SGLang's `sampling_params`: the fields the stand-in reads.
#[derive(Debug, Default, Deserialize)]
pub(super) struct SglangSampling {
    /// Most new tokens.
    #[serde(default)]
    pub(super) max_new_tokens: Option<u64>,
    /// Stop strings.
    #[serde(default)]
    pub(super) stop: Option<Stop>,
    /// Stop tokens.
    #[serde(default)]
    pub(super) stop_token_ids: Option<Vec<u32>>,
    /// The sampling seed (honoured only with `--enable-deterministic-inference`).
    #[serde(default)]
    pub(super) sampling_seed: Option<serde_json::Number>,
    /// The top-k cut-off.
    #[serde(default)]
    pub(super) top_k: Option<i64>,
}

/// SGLang's `POST /generate` body: the fields the stand-in reads.
#[derive(Debug, Deserialize)]
pub(super) struct GenerateRequest {
    /// The prompt's token IDs (the stand-in takes no text prompt here).
    #[serde(default)]
    pub(super) input_ids: Option<Vec<u32>>,
    /// Sampling parameters.
    #[serde(default)]
    pub(super) sampling_params: SglangSampling,
    /// Return `meta_info.output_token_logprobs`.
    #[serde(default)]
    pub(super) return_logprob: bool,
    /// The prefix cache's namespace.
    #[serde(default)]
    pub(super) cache_salt: Option<String>,
}

/// Decodes `body` as `T`; the error names the field that is wrong.
pub(super) fn decode<T: serde::de::DeserializeOwned>(body: serde_json::Value) -> Result<T, String> {
    rollout_core::domain::SpecError::decode(body).map_err(|e| {
        if e.path.is_empty() {
            e.message
        } else {
            e.to_string()
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_field_of_the_wrong_type_is_named() {
        let e =
            decode::<CompletionRequest>(json!({"prompt": [1], "max_tokens": "ten"})).unwrap_err();
        assert!(e.starts_with("max_tokens:"), "{e}");
        let e = decode::<GenerateRequest>(
            json!({"input_ids": [1], "sampling_params": {"stop_token_ids": [-1]}}),
        )
        .unwrap_err();
        assert!(e.starts_with("sampling_params.stop_token_ids"), "{e}");
    }

    #[test]
    fn unread_fields_are_ignored_and_stops_take_either_form() {
        let r = decode::<CompletionRequest>(
            json!({"prompt": "hi", "stop": "x", "logprobs": 1, "n": 1}),
        )
        .unwrap();
        assert!(matches!(r.prompt, Prompt::Text(_)));
        assert_eq!(Stop::into_list(r.stop), vec!["x".to_string()]);
        let r = decode::<GenerateRequest>(json!({"input_ids": [1, 2]})).unwrap();
        assert!(r.sampling_params.stop.is_none());
    }
}
