//! vLLM's wire format: `POST /v1/completions`, token-in (`prompt` as token IDs) and
//! token-out (`return_token_ids`, or `token_id:N` logprob keys as an older vLLM gives),
//! as vLLM 0.32 answers it. The request is decoded into an [`Ask`] and served by the
//! shared path ([`crate::answer`]); only the shapes here are vLLM's.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use rollout_core::domain::duration_us;

use crate::Shared;
use crate::answer::{Answer, Ask, InFlight, serve};
use crate::refuse::{bad_request, refuse_cache_salt, refuse_sampling, vllm_error};
use crate::requests::{self, CompletionRequest, Prompt, Stop};

/// `POST /v1/completions`, counted in flight (and as aborted if the client leaves).
pub(crate) async fn completions(
    State(s): State<Arc<Shared>>,
    Json(body): Json<serde_json::Value>,
) -> Response {
    let in_flight = InFlight::new(&s);
    let resp = completions_answer(&s, body).await;
    in_flight.done();
    resp
}

/// The answer to a completions request `body`: decoded, checked as vLLM checks it,
/// served, and encoded as vLLM encodes it (or the refusal vLLM gives instead).
async fn completions_answer(s: &Shared, body: serde_json::Value) -> Response {
    let t0 = Instant::now();
    let body: CompletionRequest = match requests::decode(body) {
        Ok(b) => b,
        Err(m) => return bad_request(m),
    };
    // vLLM serves only the names it was started with.
    let asked = body.model.as_deref().unwrap_or_default();
    if asked != s.cfg.model_name && !s.cfg.aliases.iter().any(|a| a == asked) {
        let names: Vec<&str> = std::iter::once(&s.cfg.model_name)
            .chain(&s.cfg.aliases)
            .map(String::as_str)
            .collect();
        return vllm_error(
            StatusCode::NOT_FOUND,
            "NotFoundError",
            format!(
                "The model `{asked}` does not exist. Valid aliases: {}.",
                names.join(", ")
            ),
            Some("model"),
        );
    }
    let prompt = match body.prompt {
        Prompt::Text(text) => match s.cfg.model.tokenizer.encode(&text) {
            Ok(ids) => ids,
            Err(e) => return bad_request(format!("prompt: {e}")),
        },
        Prompt::Ids(ids) if ids.is_empty() => {
            return bad_request("You must pass at least one prompt".into());
        }
        Prompt::Ids(ids) => ids,
    };
    if let Some(r) = refuse_sampling("vllm", body.top_k, body.seed.as_ref()) {
        return r;
    }
    if let Some(r) = refuse_cache_salt(body.cache_salt.as_deref()) {
        return r;
    }
    let ask = Ask {
        salt: body.cache_salt,
        max_tokens: body
            .max_tokens
            .map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
        stop: Stop::into_list(body.stop),
        stop_token_ids: body.stop_token_ids.unwrap_or_default(),
        seed: body.seed.as_ref().and_then(serde_json::Number::as_u64),
        prompt,
    };
    let prompt_len = ask.prompt.len();
    let prompt_ids = ask.prompt.clone();
    let a = match serve(s, ask, "vllm").await {
        Ok(a) => a,
        Err(r) => return r,
    };
    let as_ids = body.return_tokens_as_token_ids;
    let with_ids = body.return_token_ids && !s.cfg.legacy_vllm;
    let mut choice = vllm_choice(s, &a, as_ids, with_ids.then_some(prompt_ids.as_slice()));
    if body.return_weight_versions {
        // Each token's label when it was sampled: a request frozen by a `keep` pause
        // and resumed after a relabel has two runs.
        choice["weight_versions"] = a
            .versions
            .iter()
            .map(|(v, start, end)| serde_json::json!({"version": v, "start": start, "end": end}))
            .collect();
    }
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let id = s.counter.fetch_add(1, Ordering::Relaxed);
    tracing::debug!(
        prompt_len,
        out = a.ids.len(),
        cached = a.cached,
        us = duration_us(t0.elapsed()),
        "completion"
    );
    Json(serde_json::json!({
        "id": format!("cmpl-scripted-{id}"),
        "object": "text_completion",
        "created": created,
        "model": s.cfg.model_name,
        "choices": [choice],
        "usage": {
            "prompt_tokens": prompt_len,
            "total_tokens": prompt_len + a.ids.len(),
            "completion_tokens": a.ids.len(),
            "prompt_tokens_details": if s.cfg.prompt_tokens_details {
                serde_json::json!({"cached_tokens": a.cached})
            } else {
                serde_json::Value::Null
            },
        },
    }))
    .into_response()
}

/// vLLM's `choices[0]` for answer `a`: the text, its logprobs (tokens as text, or as
/// `token_id:N` with `as_ids`), why it finished, and with `prompt_ids` (when the request
/// asked for `return_token_ids`) the token IDs of both prompt and answer.
fn vllm_choice(
    s: &Shared,
    a: &Answer,
    as_ids: bool,
    prompt_ids: Option<&[u32]>,
) -> serde_json::Value {
    let vocab = &s.cfg.model.tokenizer;
    let tokens: Vec<String> = a
        .ids
        .iter()
        .map(|&id| {
            if as_ids {
                format!("token_id:{id}")
            } else {
                vocab.decode(&[id]).unwrap_or_default()
            }
        })
        .collect();
    let mut offsets = Vec::with_capacity(a.ids.len());
    let mut off = 0usize;
    for &id in &a.ids {
        offsets.push(off);
        off += vocab.decode(&[id]).map(|t| t.len()).unwrap_or(0);
    }
    let top: Vec<serde_json::Value> = tokens
        .iter()
        .zip(&a.logprobs)
        .map(|(t, lp)| serde_json::json!({ t: lp }))
        .collect();
    let mut choice = serde_json::json!({
        "index": 0,
        "text": a.text,
        "logprobs": {
            "text_offset": offsets,
            "token_logprobs": a.logprobs,
            "tokens": tokens,
            "top_logprobs": top,
        },
        "finish_reason": a.finish,
        // vLLM names what stopped it: the stop string, or the stop token's ID; the
        // tokenizer's own end-of-sequence token is null.
        "stop_reason": a.matched.clone().filter(|m| {
            a.finish == "stop" && m.as_u64() != Some(u64::from(s.cfg.model.eos_id))
        }),
        "prompt_logprobs": null,
    });
    if let Some(prompt_ids) = prompt_ids {
        choice["token_ids"] = serde_json::json!(a.ids);
        choice["prompt_token_ids"] = serde_json::json!(prompt_ids);
    }
    choice
}
