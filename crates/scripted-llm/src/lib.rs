//! `rollout-scripted-llm`: a stand-in inference server for tests, benchmarks and demos.
//!
//! **It plays a script; it is not a model.** It answers vLLM's `POST /v1/completions`
//! and SGLang's `POST /generate` in their wire formats, token-in and token-out, with the
//! assistant turns a [`policy::Policy`] file scripts for each task. The turns become
//! real token IDs of the model directory's tokenizer (the same files the RUN workers
//! load), each with a deterministic pseudo-logprob. It simulates what matters for
//! measuring the rollout service around it: per-token generation time, a prefix cache
//! that reports cached prompt tokens as vLLM and SGLang do ([`cache::PrefixCache`]),
//! the context limit, vLLM's and SGLang's pause and abort ([`pause`]), an aborted answer
//! continued where it stopped by a request that sends its tokens back (as a model
//! continues its own text), and faults on command
//! (`POST /control`: fail with 5xx, stall, drop connections, go down).
//!
//! Where it answers as vLLM, it answers as vLLM 0.32 does, checked against the real
//! server (`tests/pipeline/real_vllm.rs`, `docs/real-vllm.md`): nested error bodies naming the
//! parameter, `max_tokens` cut to the room left in the context (and 16 when absent),
//! a prompt that leaves no room refused in vLLM's words, token IDs outside the
//! vocabulary refused, an integer `stop_reason` for a stop token. Its pause is vLLM
//! 0.33's by default (new requests refused with 503 during an `abort` or `wait` pause;
//! `ScriptedConfig::pause_holds_new` holds them as 0.32 does), and it keeps a weight
//! version label (`/update_weight_version`, `/weight_info`, vLLM's
//! `return_weight_versions`, SGLang's `meta_info.weight_version`).
//!
//! Endpoints: `POST /v1/completions`, `POST /generate`, `GET /health`, `GET /v1/models`,
//! `POST /pause`, `POST /resume`, `GET /is_paused`, `POST /abort_requests` (vLLM),
//! `GET /weight_info`, `POST /pause_generation`, `POST /continue_generation`,
//! `GET /v1/loads`, `GET /get_weight_version` (SGLang 0.5.23), `POST /update_weight_version`
//! (both), `POST /control`, `GET /stats`, `GET /requests` (the last requests served, for tests
//! that check token-exactness against what the server sent).
//!
//! A crate of its own: only its binary (a target of the service's package, so `cargo
//! install --path .` installs it), the tests and the benchmarks use it, and it needs
//! nothing of the service but a model's files (`rollout-model`) and the shared words
//! (`rollout-core`). The service re-exports it as `rollout::scripted`.

#![forbid(unsafe_code)]

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Json;
use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use rollout_core::domain::duration_us;
use rollout_model::model::ModelFiles;

pub mod cache;
pub mod cli;
pub mod demo;
pub mod pause;
pub mod policy;
mod requests;
#[cfg(test)]
mod tests;

use cache::PrefixCache;
use policy::{Policy, stable_hash};
use requests::{CompletionRequest, GenerateRequest, Prompt, Stop};

/// How the server behaves.
#[derive(Debug)]
pub struct ScriptedConfig {
    /// The model name it serves (vLLM's `--served-model-name`): a vLLM request whose
    /// `model` is neither this nor one of `aliases` gets vLLM's 404, as from the real
    /// server. (SGLang's `/generate` names no model.)
    pub model_name: String,
    /// More names it serves (vLLM takes several after `--served-model-name`).
    pub aliases: Vec<String>,
    /// The tokenizer and template.
    pub model: Arc<ModelFiles>,
    /// The script.
    pub policy: Policy,
    /// Seed for requests that carry none.
    pub seed: u64,
    /// Simulated time per generated token (µs).
    pub token_us: u64,
    /// Simulated prefill time per prompt token not found in the cache (ns).
    pub prefill_ns_per_token: u64,
    /// Prefix cache block size (tokens).
    pub block_size: usize,
    /// Prefix cache capacity (blocks).
    pub cache_blocks: usize,
    /// Context length. As vLLM, `max_tokens` is cut to the room the prompt leaves and
    /// a prompt that leaves none is refused (400); as SGLang, a prompt plus
    /// `max_new_tokens` beyond it is refused.
    pub max_model_len: usize,
    /// Behave like a vLLM without `return_token_ids`: IDs only as `token_id:<id>`.
    pub legacy_vllm: bool,
    /// How many served requests `GET /requests` keeps.
    pub keep_requests: usize,
    /// The key of `--api-key`: every endpoint but `/health` (and the stand-in's own
    /// `/control`, `/stats`, `/requests`) then wants `Authorization: Bearer <key>` and
    /// answers 401 without it, as both servers do.
    pub api_key: Option<String>,
    /// vLLM's `--enable-prompt-tokens-details`: without it vLLM reports no cached-token
    /// count (`usage.prompt_tokens_details` is null). SGLang always reports it.
    pub prompt_tokens_details: bool,
    /// SGLang's `--enable-deterministic-inference`: without it SGLang ignores
    /// `sampling_seed`. (vLLM honours `seed` either way.)
    pub deterministic: bool,
    /// How long `GET /health` takes (ms): SGLang's runs a one-token generation, a
    /// second or more under load.
    pub health_delay_ms: u64,
    /// A vLLM-format request arriving during an `abort` or `wait` pause waits for the
    /// resume, as vLLM 0.32 does. Off (the default), it is refused at once, 503
    /// "Generation is paused. Please retry after it resumes.", as vLLM 0.33 does. A
    /// `keep` pause holds new requests in both, and SGLang always holds them.
    pub pause_holds_new: bool,
}

impl ScriptedConfig {
    /// Defaults around `model` and `policy`: no simulated delays, 16-token blocks, a
    /// cache of 65,536 blocks, a 32,768-token context.
    pub fn new(model: Arc<ModelFiles>, policy: Policy) -> Self {
        ScriptedConfig {
            model_name: "scripted".into(),
            aliases: Vec::new(),
            model,
            policy,
            seed: 0,
            token_us: 0,
            prefill_ns_per_token: 0,
            block_size: 16,
            cache_blocks: 65_536,
            max_model_len: 32_768,
            legacy_vllm: false,
            keep_requests: 10_000,
            api_key: None,
            prompt_tokens_details: false,
            deterministic: false,
            health_delay_ms: 0,
            pause_holds_new: false,
        }
    }
}

/// A fault to play.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultMode {
    /// Answer normally.
    Ok,
    /// Answer generation requests with HTTP 500.
    Fail,
    /// Never answer generation requests (until the client gives up).
    Stall,
    /// Close the connection without an answer.
    Drop,
    /// Answer everything, `/health` included, with HTTP 503.
    Down,
    /// Answer generation requests with HTTP 503, `/health` still answering: a server,
    /// or a proxy in front of one, that is overloaded or draining. (Neither vLLM nor
    /// SGLang answers a pause this way: a paused vLLM holds requests until it resumes,
    /// which `POST /pause` plays; see [`pause`].)
    Paused,
    /// Abort the generation part-way, as vLLM (`finish_reason: "abort"`) and SGLang
    /// (`{"type": "abort"}`) answer a request they drop (a weight update, a pause).
    Abort,
}

/// `POST /control` body: play `mode` for the next `count` generation requests (all of
/// them when absent), then answer normally again.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Control {
    /// The fault.
    pub mode: FaultMode,
    /// How many requests it applies to.
    #[serde(default)]
    pub count: Option<u64>,
}

/// Counters since start.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// Generation requests answered with tokens.
    pub requests: u64,
    /// Prompt tokens received.
    pub prompt_tokens: u64,
    /// Prompt tokens found in the prefix cache.
    pub cached_tokens: u64,
    /// Tokens generated.
    pub completion_tokens: u64,
    /// Requests that got a fault instead.
    pub faulted: u64,
    /// Requests being served now.
    pub in_flight: u64,
    /// Requests whose client went away before the answer was ready (the handler was
    /// dropped): what a cancelled job's closed connection looks like from here.
    pub aborted: u64,
}

/// One served request, as `GET /requests` lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Served {
    /// `vllm` or `sglang`.
    pub format: String,
    /// The seed the pick used.
    pub key: u64,
    /// Prompt length.
    pub prompt_len: usize,
    /// Prompt tokens found in the cache.
    pub cached_tokens: usize,
    /// The token IDs returned.
    pub output_ids: Vec<u32>,
    /// Their logprobs.
    pub logprobs: Vec<f32>,
    /// Which variant and turn were played.
    pub variant: usize,
    /// The turn index.
    pub turn: usize,
}

struct Shared {
    cfg: ScriptedConfig,
    cache: Mutex<PrefixCache>,
    fault: Mutex<(FaultMode, Option<u64>)>,
    counter: AtomicU64,
    requests: AtomicU64,
    prompt_tokens: AtomicU64,
    cached_tokens: AtomicU64,
    completion_tokens: AtomicU64,
    faulted: AtomicU64,
    in_flight: AtomicU64,
    aborted: AtomicU64,
    served: Mutex<VecDeque<Served>>,
    pause: pause::Pause,
    /// What an aborted generation would have gone on to say, keyed by its prompt and the
    /// tokens it generated before the abort: a request sending exactly those continues
    /// the answer, as a real model continues its own text (see [`Continuation`]).
    continuations: Mutex<HashMap<Vec<u32>, Continuation>>,
    /// The weights' label (`default` until told), as both servers keep one.
    weight_version: Mutex<String>,
    /// When it started (Unix seconds), as `/v1/models` says `created`.
    started: u64,
    shutdown: CancellationToken,
}

/// A running stand-in server.
pub struct ScriptedServer {
    /// Where it listens.
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for ScriptedServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScriptedServer")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl ScriptedServer {
    /// Serves on `listener` until [`ScriptedServer::stop`].
    pub fn spawn(listener: tokio::net::TcpListener, cfg: ScriptedConfig) -> std::io::Result<Self> {
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            cache: Mutex::new(PrefixCache::new(cfg.block_size, cfg.cache_blocks)),
            cfg,
            fault: Mutex::new((FaultMode::Ok, None)),
            counter: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            prompt_tokens: AtomicU64::new(0),
            cached_tokens: AtomicU64::new(0),
            completion_tokens: AtomicU64::new(0),
            faulted: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            aborted: AtomicU64::new(0),
            served: Mutex::new(VecDeque::new()),
            pause: pause::Pause::default(),
            continuations: Mutex::new(HashMap::new()),
            weight_version: Mutex::new("default".into()),
            started: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            shutdown: CancellationToken::new(),
        });
        let app = router(shared.clone());
        let stop = shared.shutdown.clone();
        let task = tokio::spawn(async move {
            let serve = axum::serve(listener, app).with_graceful_shutdown(stop.cancelled_owned());
            if let Err(e) = serve.await {
                tracing::error!(error = %e, "the scripted server stopped");
            }
        });
        Ok(ScriptedServer { addr, shared, task })
    }

    /// Its base URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Counters since start.
    pub fn stats(&self) -> Stats {
        self.shared.stats()
    }

    /// The requests served, oldest first.
    pub fn served(&self) -> Vec<Served> {
        self.shared
            .served
            .lock()
            .expect("lock")
            .iter()
            .cloned()
            .collect()
    }

    /// Plays a fault.
    pub fn control(&self, c: Control) {
        *self.shared.fault.lock().expect("lock") = (c.mode, c.count);
    }

    /// Pauses as `POST /pause?mode=…` does (the prefix cache kept), returning when the
    /// pause has taken effect (for `wait`, once no request is generating).
    pub async fn pause(&self, mode: pause::PauseMode) {
        self.shared.pause.pause(mode).await;
    }

    /// The requests waiting to be let in (held by a pause), and those generating
    /// (frozen ones included).
    pub fn load(&self) -> (u64, u64) {
        self.shared.pause.load()
    }

    /// Whether it is paused, as `GET /is_paused` says.
    pub fn is_paused(&self) -> bool {
        self.shared.pause.is_paused()
    }

    /// Resumes as `POST /resume` does.
    pub fn resume(&self) {
        self.shared.pause.resume();
    }

    /// Stops serving: stalled requests end, open connections close.
    pub async fn stop(self) {
        self.shared.shutdown.cancel();
        let _ = self.task.await;
    }
}

impl Shared {
    fn stats(&self) -> Stats {
        Stats {
            requests: self.requests.load(Ordering::Relaxed),
            prompt_tokens: self.prompt_tokens.load(Ordering::Relaxed),
            cached_tokens: self.cached_tokens.load(Ordering::Relaxed),
            completion_tokens: self.completion_tokens.load(Ordering::Relaxed),
            faulted: self.faulted.load(Ordering::Relaxed),
            in_flight: self.in_flight.load(Ordering::Relaxed),
            aborted: self.aborted.load(Ordering::Relaxed),
        }
    }

    /// The fault for this request, consuming one from its count.
    fn take_fault(&self) -> FaultMode {
        let mut f = self.fault.lock().expect("lock");
        let mode = f.0;
        if mode == FaultMode::Ok {
            return mode;
        }
        if let Some(n) = f.1.as_mut() {
            if *n == 0 {
                *f = (FaultMode::Ok, None);
                return FaultMode::Ok;
            }
            *n -= 1;
        }
        mode
    }

    fn is_down(&self) -> bool {
        self.fault.lock().expect("lock").0 == FaultMode::Down
    }
}

fn router(shared: Arc<Shared>) -> Router {
    let served = Router::new()
        .route("/v1/completions", post(completions))
        .route("/generate", post(generate))
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
        .route("/control", post(control))
        .route("/stats", get(stats))
        .route("/requests", get(requests))
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

async fn control(State(s): State<Arc<Shared>>, Json(c): Json<Control>) -> StatusCode {
    tracing::info!(mode = ?c.mode, count = ?c.count, "fault mode set");
    *s.fault.lock().expect("lock") = (c.mode, c.count);
    StatusCode::NO_CONTENT
}

async fn stats(State(s): State<Arc<Shared>>) -> Json<Stats> {
    Json(s.stats())
}

async fn requests(State(s): State<Arc<Shared>>) -> Json<Vec<Served>> {
    Json(s.served.lock().expect("lock").iter().cloned().collect())
}

/// vLLM 0.32's error answer: `{"error": {"message", "type", "param", "code"}}`.
fn vllm_error(status: StatusCode, kind: &str, message: String, param: Option<&str>) -> Response {
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
fn bad_request_in(format: &str, message: String) -> Response {
    bad_request_at(format, message, None)
}

/// A 400 answer in vLLM's shape, naming no parameter.
fn bad_request(message: String) -> Response {
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

/// What a request asks for, from either format.
struct Ask {
    prompt: Vec<u32>,
    max_tokens: Option<usize>,
    stop: Vec<String>,
    stop_token_ids: Vec<u32>,
    seed: Option<u64>,
    /// The prefix cache's namespace.
    salt: Option<String>,
}

/// vLLM's check of `cache_salt` (the same in 0.32 and 0.33): a non-empty string of at
/// most 128 characters without `@`, `/`, `\` or NUL. The messages are the real
/// server's, doubled backslash and parameter suffix included (`tests/pipeline/real_vllm.rs`).
fn refuse_cache_salt(salt: Option<&str>) -> Option<Response> {
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
fn refuse_sampling(
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
fn room(
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

/// vLLM's refusal of token IDs the model does not have, in the prompt or in
/// `stop_token_ids`.
fn refuse_unknown_ids(cfg: &ScriptedConfig, ask: &Ask) -> Result<(), Box<Response>> {
    let vocab = cfg.model.tokenizer.vocab_size();
    let known = |id: &u32| usize::try_from(*id).is_ok_and(|i| i < vocab);
    if let Some(id) = ask.prompt.iter().find(|id| !known(id)) {
        return Err(Box::new(bad_request(format!(
            "Token id {id} is out of vocabulary"
        ))));
    }
    let unknown: Vec<u32> = ask
        .stop_token_ids
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

/// The rest of an aborted answer: its tokens from the abort on, and what stops them.
#[derive(Debug, Clone)]
struct Continuation {
    ids: Vec<u32>,
    matched: Option<serde_json::Value>,
    /// The script's variant and turn that made it (for the request log).
    variant: usize,
    turn: usize,
}

/// How many aborted answers the stand-in remembers for continuation.
const MAX_CONTINUATIONS: usize = 4096;

/// What the script answers.
struct Answer {
    ids: Vec<u32>,
    logprobs: Vec<f32>,
    text: String,
    /// `stop` or `length`.
    finish: &'static str,
    /// The token or string that stopped it.
    matched: Option<serde_json::Value>,
    cached: usize,
    /// The weights' label over the output tokens, as `(label, start, end)` runs.
    versions: Vec<(String, usize, usize)>,
}

/// The script's answer to `prompt_text`: its tokens, cut after the first stop string or
/// stop token the request names (kept, as both servers keep it), or ended with the
/// model's end-of-sequence token; and what stopped it.
fn script_answer(
    cfg: &ScriptedConfig,
    prompt_text: &str,
    key: u64,
    ask: &Ask,
) -> Result<Continuation, String> {
    let vocab = &cfg.model.tokenizer;
    let pick = cfg.policy.pick(prompt_text, key);
    let (mut ids, stopped_by) =
        cut_at_stop(vocab, &pick.text, &ask.stop).map_err(|e| e.to_string())?;
    let by_string = stopped_by.is_some();
    let mut matched = stopped_by.map(serde_json::Value::String);
    if let Some(at) = ids.iter().position(|id| ask.stop_token_ids.contains(id)) {
        ids.truncate(at + 1);
        matched = Some(ids[at].into());
    } else if !by_string {
        ids.push(cfg.model.eos_id);
        matched = Some(cfg.model.eos_id.into());
    }
    Ok(Continuation {
        ids,
        matched,
        variant: pick.variant,
        turn: pick.turn,
    })
}

impl Shared {
    /// Puts a prompt and its answer in the prefix cache, in `salt`'s namespace.
    fn cache_answer(&self, salt: Option<&str>, prompt: &[u32], ids: &[u32]) {
        let mut all = prompt.to_vec();
        all.extend_from_slice(ids);
        self.cache.lock().expect("lock").insert(salt, &all);
    }

    /// Remembers the rest of `whole`, aborted after `ids`, for a request that sends
    /// `prompt` and `ids` to continue it.
    fn remember_rest(&self, prompt: &[u32], ids: &[u32], whole: &Continuation) {
        let mut key = prompt.to_vec();
        key.extend_from_slice(ids);
        let rest = Continuation {
            ids: whole.ids[ids.len()..].to_vec(),
            ..whole.clone()
        };
        let mut map = self.continuations.lock().expect("lock");
        if map.len() >= MAX_CONTINUATIONS {
            map.clear();
        }
        map.insert(key, rest);
    }
}

/// vLLM 0.33 refuses a request that arrives during an `abort` or `wait` pause.
fn refuse_while_paused(s: &Shared, format: &str) -> Option<Response> {
    (format == "vllm" && !s.cfg.pause_holds_new && s.pause.refusing()).then(|| {
        vllm_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailableError",
            "Generation is paused. Please retry after it resumes.".into(),
            None,
        )
    })
}

/// Plays faults, then the script, with the simulated timing. `Err` is the response to
/// send instead.
async fn serve(s: &Shared, ask: Ask, format: &str) -> Result<Answer, Response> {
    let cfg = &s.cfg;
    let max_tokens = room(cfg, ask.prompt.len(), ask.max_tokens, format).map_err(|r| *r)?;
    if format == "vllm" {
        refuse_unknown_ids(cfg, &ask).map_err(|r| *r)?;
    }
    if let Some(r) = refuse_while_paused(s, format) {
        return Err(r);
    }
    // A paused server holds the request here (see `pause`).
    let mut ticket = s.pause.arrive();
    let admitted = ticket.admitted().await;
    let abort = if admitted {
        play_fault(s).await?
    } else {
        false
    };
    let vocab = &cfg.model.tokenizer;
    let prompt_text = vocab
        .decode(&ask.prompt)
        .map_err(|e| bad_request_in(format, format!("prompt: {e}")))?;
    let key = ask
        .seed
        .unwrap_or_else(|| stable_hash(&[cfg.seed, s.counter.fetch_add(1, Ordering::Relaxed)]));
    // A request that sends an aborted answer's tokens after its prompt continues it.
    let resumed = s.continuations.lock().expect("lock").remove(&ask.prompt);
    let whole = match resumed {
        Some(c) => c,
        None => script_answer(cfg, &prompt_text, key, &ask)
            .map_err(|e| bad_request_in(format, format!("script: {e}")))?,
    };
    let mut ids = whole.ids.clone();
    let mut matched = whole.matched.clone();
    let mut finish = "stop";
    if ids.len() > max_tokens {
        ids.truncate(max_tokens);
        finish = "length";
        matched = None;
    }
    if abort {
        ids.truncate(ids.len() / 2);
        finish = "abort";
        matched = None;
    }
    let mut logprobs: Vec<f32> = ids
        .iter()
        .enumerate()
        .map(|(i, &id)| pseudo_logprob(ask.prompt.len() + i, id))
        .collect();
    let cached = s
        .cache
        .lock()
        .expect("lock")
        .lookup(ask.salt.as_deref(), &ask.prompt);
    let wait = Duration::from_nanos(
        (ask.prompt.len() - cached) as u64 * cfg.prefill_ns_per_token
            + ids.len() as u64 * cfg.token_us * 1000,
    );
    let planned = ids.len();
    let (generated, labels) = if admitted {
        generate_labelled(s, &ticket, wait).await
    } else {
        (Err(Duration::ZERO), Vec::new())
    };
    if let Err(done) = generated {
        // Aborted: the tokens generated so far (none for a request still waiting).
        let keep = if admitted {
            generated_by(ids.len(), done, wait)
        } else {
            0
        };
        ids.truncate(keep);
        logprobs.truncate(keep);
        finish = "abort";
        matched = None;
    }
    drop(ticket);
    if finish == "abort" {
        s.remember_rest(&ask.prompt, &ids, &whole);
    }
    s.cache_answer(ask.salt.as_deref(), &ask.prompt, &ids);
    let text = vocab.decode(&ids).unwrap_or_default();
    let versions = label_runs(
        &labels,
        (planned, ids.len()),
        wait,
        &s.weight_version.lock().expect("lock"),
    );
    let answer = Answer {
        ids,
        logprobs,
        text,
        finish,
        matched,
        cached,
        versions,
    };
    record(s, format, key, &ask.prompt, &answer, &whole);
    Ok(answer)
}

/// Spends `wait` generating (see [`pause::Ticket::generate`]), noting the weights'
/// label each time the clock (re)starts: vLLM tags each output token with the label
/// current when it was sampled, and the label changes while paused. The labels come
/// with the time generated when each took over.
async fn generate_labelled(
    s: &Shared,
    ticket: &pause::Ticket<'_>,
    wait: Duration,
) -> (Result<(), Duration>, Vec<(Duration, String)>) {
    let mut labels: Vec<(Duration, String)> = Vec::new();
    let generated = ticket
        .generate_with(wait, |done| {
            let now = s.weight_version.lock().expect("lock").clone();
            if labels.last().is_none_or(|(_, l)| *l != now) {
                labels.push((done, now));
            }
        })
        .await;
    (generated, labels)
}

/// Plays the fault set for the next request (counting it): `Err` is the response to
/// send instead of an answer, `Ok(true)` an answer cut short as aborted.
async fn play_fault(s: &Shared) -> Result<bool, Response> {
    match s.take_fault() {
        FaultMode::Ok => Ok(false),
        FaultMode::Abort => {
            s.faulted.fetch_add(1, Ordering::Relaxed);
            Ok(true)
        }
        FaultMode::Paused => {
            s.faulted.fetch_add(1, Ordering::Relaxed);
            Err((
                StatusCode::SERVICE_UNAVAILABLE,
                Json(serde_json::json!({"object": "error", "message": "the server is paused", "code": 503})),
            )
                .into_response())
        }
        FaultMode::Fail => {
            s.faulted.fetch_add(1, Ordering::Relaxed);
            Err((
                StatusCode::INTERNAL_SERVER_ERROR,
                Json(serde_json::json!({"object": "error", "message": "scripted failure", "code": 500})),
            )
                .into_response())
        }
        FaultMode::Down => {
            s.faulted.fetch_add(1, Ordering::Relaxed);
            Err(StatusCode::SERVICE_UNAVAILABLE.into_response())
        }
        FaultMode::Stall => {
            s.faulted.fetch_add(1, Ordering::Relaxed);
            s.shutdown.cancelled().await;
            Err(StatusCode::SERVICE_UNAVAILABLE.into_response())
        }
        FaultMode::Drop => {
            s.faulted.fetch_add(1, Ordering::Relaxed);
            // Headers, then a body that fails: the connection is closed mid-answer.
            let body = Body::from_stream(futures::stream::once(async {
                Err::<bytes::Bytes, _>(std::io::Error::other("scripted connection drop"))
            }));
            Err(Response::builder()
                .status(StatusCode::OK)
                .body(body)
                .expect("response builds"))
        }
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

/// The tokens of `text` up to the one that completes the first of `stops` to occur in
/// it, and that stop string: as vLLM and SGLang stop, on the detokenized output, keeping
/// the whole token that completed the string even when the string ends inside it.
/// Without a stop string in `text`, all its tokens.
fn cut_at_stop(
    vocab: &rollout_model::tokenizer::Tokenizer,
    text: &str,
    stops: &[String],
) -> Result<(Vec<u32>, Option<String>), rollout_model::tokenizer::TokenizerError> {
    let mut ids = vocab.encode(text)?;
    let first = stops
        .iter()
        .filter(|st| !st.is_empty())
        .filter_map(|st| text.find(st.as_str()).map(|i| (i + st.len(), st)))
        .min_by_key(|(end, _)| *end);
    let Some((_, stop)) = first else {
        return Ok((ids, None));
    };
    for k in 1..=ids.len() {
        if vocab.decode(&ids[..k])?.contains(stop.as_str()) {
            ids.truncate(k);
            break;
        }
    }
    Ok((ids, Some(stop.clone())))
}

/// How many of `n` tokens, generated over `wait`, were out after `done`.
/// The label of each output token, as runs: `planned` tokens were to be generated over
/// `wait` and the first `n` were (fewer when aborted); `labels` holds the label from
/// each point of the generation on (the first from its start). None (a request
/// answered without generating) gives `current` throughout.
fn label_runs(
    labels: &[(Duration, String)],
    (planned, n): (usize, usize),
    wait: Duration,
    current: &str,
) -> Vec<(String, usize, usize)> {
    let mut runs: Vec<(String, usize, usize)> = Vec::new();
    for (i, (at, label)) in labels.iter().enumerate() {
        let start = if i == 0 {
            0
        } else {
            generated_by(planned, *at, wait).min(n)
        };
        if let Some(last) = runs.last_mut() {
            last.2 = start;
        }
        runs.push((label.clone(), start, n));
    }
    runs.retain(|(_, start, end)| end > start);
    if runs.is_empty() && n > 0 {
        runs.push((current.to_string(), 0, n));
    }
    runs
}

fn generated_by(n: usize, done: Duration, wait: Duration) -> usize {
    if wait.is_zero() {
        return n;
    }
    usize::try_from(n as u128 * done.as_nanos() / wait.as_nanos()).map_or(n, |k| k.min(n))
}

/// Counts an answered request and keeps it in the log of served requests (the last
/// `keep_requests`), for tests to inspect.
fn record(s: &Shared, format: &str, key: u64, prompt: &[u32], a: &Answer, pick: &Continuation) {
    s.requests.fetch_add(1, Ordering::Relaxed);
    s.prompt_tokens
        .fetch_add(prompt.len() as u64, Ordering::Relaxed);
    s.cached_tokens
        .fetch_add(a.cached as u64, Ordering::Relaxed);
    s.completion_tokens
        .fetch_add(a.ids.len() as u64, Ordering::Relaxed);
    if s.cfg.keep_requests > 0 {
        let mut log = s.served.lock().expect("lock");
        if log.len() >= s.cfg.keep_requests {
            log.pop_front();
        }
        log.push_back(Served {
            format: format.into(),
            key,
            prompt_len: prompt.len(),
            cached_tokens: a.cached,
            output_ids: a.ids.clone(),
            logprobs: a.logprobs.clone(),
            variant: pick.variant,
            turn: pick.turn,
        });
    }
}

/// A deterministic logprob in [-4, -0.001] for token `id` at `position`.
pub fn pseudo_logprob(position: usize, id: u32) -> f32 {
    let h = stable_hash(&[position as u64, u64::from(id)]);
    -(0.001 + (h % 4000) as f32 / 1000.0)
}

/// Counts a request in flight for as long as it lives, and as aborted if it is dropped
/// before [`InFlight::done`] (the client closed the connection).
struct InFlight<'a> {
    shared: &'a Shared,
    done: bool,
}

impl<'a> InFlight<'a> {
    fn new(shared: &'a Shared) -> Self {
        shared.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight {
            shared,
            done: false,
        }
    }

    fn done(mut self) {
        self.done = true;
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.shared.in_flight.fetch_sub(1, Ordering::Relaxed);
        if !self.done {
            self.shared.aborted.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The prompt's token IDs, refused when empty, as both servers refuse an empty prompt.
fn non_empty(ids: Vec<u32>, field: &str) -> Result<Vec<u32>, String> {
    if ids.is_empty() {
        Err(format!("{field} must be a non-empty list of token IDs"))
    } else {
        Ok(ids)
    }
}

async fn completions(
    State(s): State<Arc<Shared>>,
    Json(body): Json<serde_json::Value>,
) -> Response {
    let in_flight = InFlight::new(&s);
    let resp = completions_answer(&s, body).await;
    in_flight.done();
    resp
}

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

async fn generate(State(s): State<Arc<Shared>>, Json(body): Json<serde_json::Value>) -> Response {
    let in_flight = InFlight::new(&s);
    let resp = generate_answer(&s, body).await;
    in_flight.done();
    resp
}

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
