//! The stand-in's HTTP surface: the router, the `--api-key` check, and the admin
//! endpoints both servers have besides generation (health, models, vLLM's and SGLang's
//! pause, resume and abort, the weight version label, SGLang's loads). Generation is
//! [`crate::vllm`]'s and [`crate::sglang`]'s; faults on command and the stats are
//! [`crate::faults`]'s and [`crate::stats`]'s.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use crate::Shared;
use crate::refuse::vllm_error;
use crate::{faults, pause, sglang, stats, vllm};

/// Every endpoint the stand-in answers, on `shared`; the generation endpoints and
/// `/v1/models` behind the `--api-key` check, as on both real servers.
pub(crate) fn router(shared: Arc<Shared>) -> Router {
    let served = Router::new()
        .route("/v1/completions", post(vllm::completions))
        .route("/generate", post(sglang::generate))
        .route("/v1/models", get(models))
        .route_layer(axum::middleware::from_fn_with_state(
            shared.clone(),
            require_key,
        ));
    Router::new()
        .merge(served)
        .route("/health", get(health))
        .route("/pause", post(pause_server))
        .route("/resume", post(resume_server))
        .route("/is_paused", get(is_paused))
        .route("/abort_requests", post(abort_requests))
        .route("/pause_generation", post(pause_generation))
        .route("/continue_generation", post(continue_generation))
        .route("/v1/loads", get(get_loads))
        .route("/update_weight_version", post(update_weight_version))
        .route("/weight_info", get(weight_info))
        .route("/get_weight_version", get(weight_info))
        .route("/control", post(faults::post_control))
        .route("/stats", get(stats::get_stats))
        .route("/requests", get(stats::get_requests))
        .with_state(shared)
}

/// `--api-key`: a request without the key gets 401, as from either server.
async fn require_key(
    State(s): State<Arc<Shared>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if let Some(key) = &s.cfg.api_key {
        let given = request
            .headers()
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        if given != Some(format!("Bearer {key}").as_str()) {
            return (
                StatusCode::UNAUTHORIZED,
                Json(serde_json::json!({"error": "Unauthorized"})),
            )
                .into_response();
        }
    }
    next.run(request).await
}

/// `GET /health`: 200, or 503 when [`FaultMode::Down`](crate::faults::FaultMode::Down) is
/// played; after `health_delay_ms`, as SGLang's health check runs a generation.
async fn health(State(s): State<Arc<Shared>>) -> StatusCode {
    if s.cfg.health_delay_ms > 0 {
        tokio::time::sleep(Duration::from_millis(s.cfg.health_delay_ms)).await;
    }
    if s.is_down() {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    }
}

/// `GET /v1/models`: the served model name and its aliases, as vLLM lists them.
async fn models(State(s): State<Arc<Shared>>) -> Response {
    if s.is_down() {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    let data: Vec<serde_json::Value> = std::iter::once(&s.cfg.model_name)
        .chain(&s.cfg.aliases)
        .map(|name| {
            serde_json::json!({"id": name, "object": "model", "created": s.started,
                               "owned_by": "rollout-scripted-llm", "root": name,
                               "parent": null, "max_model_len": s.cfg.max_model_len})
        })
        .collect();
    Json(serde_json::json!({"object": "list", "data": data})).into_response()
}

/// `POST /pause?mode=abort|wait|keep&clear_cache=true|false`, as vLLM's dev mode.
async fn pause_server(
    State(s): State<Arc<Shared>>,
    query: Result<
        axum::extract::Query<pause::PauseQuery>,
        axum::extract::rejection::QueryRejection,
    >,
) -> Response {
    let Ok(axum::extract::Query(q)) = query else {
        return vllm_error(
            StatusCode::BAD_REQUEST,
            "Bad Request",
            "1 validation error: mode: Input should be 'abort', 'wait' or 'keep'".into(),
            Some("query.mode"),
        );
    };
    tracing::info!(mode = ?q.mode, clear_cache = q.clear_cache, "paused");
    s.pause.pause(q.mode).await;
    if q.clear_cache {
        s.cache.lock().expect("lock").clear();
    }
    Json(serde_json::json!({"status": "paused"})).into_response()
}

/// vLLM's `POST /resume`: lets held and frozen requests go on.
async fn resume_server(State(s): State<Arc<Shared>>) -> Json<serde_json::Value> {
    tracing::info!("resumed");
    s.pause.resume();
    Json(serde_json::json!({"status": "resumed"}))
}

/// SGLang's `POST /pause_generation` with `{"mode": "abort"|"retract"|"in_place"}`
/// (`abort` when absent; 0.5.23 wants a JSON body, and refuses none with 422):
/// `abort` ends the requests in flight with their tokens so far; `retract` (back to the
/// queue, KV recomputed) and `in_place` go on after the resume with the same tokens,
/// which the stand-in plays by freezing them. New requests wait in every mode.
async fn pause_generation(State(s): State<Arc<Shared>>, body: axum::body::Bytes) -> Response {
    let asked = match sglang_body(&body) {
        Ok(v) => v,
        Err(r) => return *r,
    };
    let mode = match asked
        .get("mode")
        .and_then(|m| m.as_str())
        .unwrap_or("abort")
    {
        "abort" => pause::PauseMode::Abort,
        "retract" | "in_place" => pause::PauseMode::Keep,
        other => {
            return (
                StatusCode::UNPROCESSABLE_ENTITY,
                Json(serde_json::json!({"detail": format!(
                    "mode: Input should be 'abort', 'retract' or 'in_place', got '{other}'"
                )})),
            )
                .into_response();
        }
    };
    tracing::info!(?mode, "generation paused");
    s.pause.pause(mode).await;
    Json(serde_json::json!({"message": "Generation paused successfully.", "status": "ok"}))
        .into_response()
}

/// SGLang's `POST /continue_generation` (a JSON body, `{}` will do, as 0.5.23 wants).
async fn continue_generation(State(s): State<Arc<Shared>>, body: axum::body::Bytes) -> Response {
    if let Err(r) = sglang_body(&body) {
        return *r;
    }
    tracing::info!("generation continued");
    s.pause.resume();
    Json(serde_json::json!({"message": "Generation continued successfully.", "status": "ok"}))
        .into_response()
}

/// The JSON object body SGLang 0.5.23's control endpoints want; FastAPI's 422 without.
fn sglang_body(body: &[u8]) -> Result<serde_json::Value, Box<Response>> {
    let refuse = |detail: String| {
        Box::new(
            (
                StatusCode::UNPROCESSABLE_ENTITY,
                Json(serde_json::json!({"detail": [{"type": "missing", "loc": ["body"], "msg": detail}]})),
            )
                .into_response(),
        )
    };
    if body.is_empty() {
        return Err(refuse("Field required".into()));
    }
    match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(v) if v.is_object() => Ok(v),
        Ok(_) => Err(refuse("Input should be an object".into())),
        Err(e) => Err(refuse(format!("JSON decode error: {e}"))),
    }
}

/// `POST /update_weight_version {"new_version": "…"}`, as both servers take it: the
/// label the answers report from now on. SGLang's `abort_all_requests` (true by default
/// there) aborts every request first when given as true; vLLM's has no such field and
/// aborts nothing, which is what the stand-in does when it is absent.
async fn update_weight_version(
    State(s): State<Arc<Shared>>,
    Json(body): Json<serde_json::Value>,
) -> Response {
    let Some(new) = body.get("new_version").and_then(|v| v.as_str()) else {
        return (
            StatusCode::UNPROCESSABLE_ENTITY,
            Json(serde_json::json!({"detail": "new_version: Field required"})),
        )
            .into_response();
    };
    if body
        .get("abort_all_requests")
        .and_then(serde_json::Value::as_bool)
        == Some(true)
    {
        s.pause.abort_all();
    }
    new.clone_into(&mut s.weight_version.lock().expect("lock"));
    tracing::info!(version = new, "weight version updated");
    Json(serde_json::json!({
        "success": true,
        "message": format!("Weight version updated to {new}"),
        "new_version": new,
    }))
    .into_response()
}

/// vLLM's `GET /weight_info` and SGLang's `GET /get_weight_version`.
async fn weight_info(State(s): State<Arc<Shared>>) -> Json<serde_json::Value> {
    let v = s.weight_version.lock().expect("lock").clone();
    Json(serde_json::json!({"weight_version": v}))
}

/// SGLang 0.5.23's `GET /v1/loads`: one entry per data-parallel rank (one here), its
/// running and queued requests among the core counters.
async fn get_loads(State(s): State<Arc<Shared>>) -> Json<serde_json::Value> {
    let (waiting, generating) = s.pause.load();
    Json(serde_json::json!({
        "version": "0.5.23",
        "loads": [{
            "dp_rank": 0,
            "num_running_reqs": generating,
            "num_waiting_reqs": waiting,
            "num_used_tokens": 0,
        }],
    }))
}

/// vLLM's `GET /is_paused`.
async fn is_paused(State(s): State<Arc<Shared>>) -> Json<serde_json::Value> {
    Json(serde_json::json!({"is_paused": s.pause.is_paused()}))
}

/// `POST /abort_requests`: `{}` aborts every request in the server. vLLM's
/// `request_ids` name its engine's ids, which the stand-in does not keep: a list
/// aborts nothing, and is answered with its length, as vLLM answers ids it does not know.
async fn abort_requests(
    State(s): State<Arc<Shared>>,
    body: Option<Json<serde_json::Value>>,
) -> Json<serde_json::Value> {
    let listed = body
        .as_ref()
        .and_then(|Json(b)| b.get("request_ids"))
        .and_then(serde_json::Value::as_array)
        .map(Vec::len);
    let aborted = match listed {
        Some(n) => n as u64,
        None => s.pause.abort_all(),
    };
    Json(serde_json::json!({"status": "aborted", "aborted": aborted}))
}
