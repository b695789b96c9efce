//! SGLang's wire format: `POST /generate` with `input_ids`, answered with `output_ids`
//! and `meta_info` (finish reason, cached tokens, per-token logprobs, the weight
//! version) as SGLang answers. The request is decoded into an [`Ask`] and served by the
//! shared path ([`crate::answer`]); only the shapes here are SGLang's.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};

use crate::Shared;
use crate::answer::{Ask, InFlight, serve};
use crate::refuse::{bad_request_in, non_empty, refuse_sampling};
use crate::requests::{self, GenerateRequest, Stop};

/// `POST /generate`, counted in flight (and as aborted if the client leaves).
pub(crate) async fn generate(
    State(s): State<Arc<Shared>>,
    Json(body): Json<serde_json::Value>,
) -> Response {
    let in_flight = InFlight::new(&s);
    let resp = generate_answer(&s, body).await;
    in_flight.done();
    resp
}

/// The answer to a generate request `body`: decoded, checked as SGLang checks it,
/// served, and encoded as SGLang encodes it (or the refusal SGLang gives instead).
async fn generate_answer(s: &Shared, body: serde_json::Value) -> Response {
    let t0 = Instant::now();
    let body: GenerateRequest = match requests::decode(body) {
        Ok(b) => b,
        Err(m) => return bad_request_in("sglang", m),
    };
    let prompt = match non_empty(body.input_ids.unwrap_or_default(), "input_ids") {
        Ok(ids) => ids,
        Err(m) => return bad_request_in("sglang", m),
    };
    let sp = body.sampling_params;
    if let Some(r) = refuse_sampling("sglang", sp.top_k, sp.sampling_seed.as_ref()) {
        return r;
    }
    let ask = Ask {
        salt: body.cache_salt,
        max_tokens: sp
            .max_new_tokens
            .map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
        stop: Stop::into_list(sp.stop),
        stop_token_ids: sp.stop_token_ids.unwrap_or_default(),
        // Without --enable-deterministic-inference SGLang samples as it likes.
        seed: sp
            .sampling_seed
            .as_ref()
            .and_then(serde_json::Number::as_u64)
            .filter(|_| s.cfg.deterministic),
        prompt,
    };
    let prompt_len = ask.prompt.len();
    let a = match serve(s, ask, "sglang").await {
        Ok(a) => a,
        Err(r) => return r,
    };
    let with_lp = body.return_logprob;
    let finish = if a.finish == "length" {
        serde_json::json!({"type": "length", "length": a.ids.len()})
    } else if a.finish == "abort" {
        serde_json::json!({"type": "abort", "message": "Abort before prefill"})
    } else {
        serde_json::json!({"type": "stop", "matched": a.matched})
    };
    let id = s.counter.fetch_add(1, Ordering::Relaxed);
    let mut meta = serde_json::json!({
        "id": format!("scripted-{id}"),
        "finish_reason": finish,
        "prompt_tokens": prompt_len,
        "completion_tokens": a.ids.len(),
        "cached_tokens": a.cached,
        "e2e_latency": t0.elapsed().as_secs_f64(),
        "weight_version": s.weight_version.lock().expect("lock").clone(),
    });
    if with_lp {
        meta["input_token_logprobs"] = serde_json::Value::Null;
        meta["output_token_logprobs"] = a
            .ids
            .iter()
            .zip(&a.logprobs)
            .map(|(id, lp)| serde_json::json!([lp, id, null]))
            .collect();
    }
    Json(serde_json::json!({
        "text": a.text,
        "output_ids": a.ids,
        "meta_info": meta,
    }))
    .into_response()
}
