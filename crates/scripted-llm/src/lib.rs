//! `rollout-scripted-llm`: a stand-in inference server for tests, benchmarks and demos.
//!
//! **It plays a script; it is not a model.** It answers vLLM's `POST /v1/completions`
//! and SGLang's `POST /generate` in their wire formats, token-in and token-out, with the
//! assistant turns a [`script::Script`] file scripts for each task. The turns become
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
//! The modules, from the wire down: `router` (the endpoints, and the admin ones),
//! `vllm` and `sglang` (the two wire formats), `answer` (the answering path they
//! share), `faults` (faults on command), `refuse` (refusals and error bodies in the
//! real servers' words), `stats` (what was served), [`pause`], [`cache`] and
//! [`script`] (what the server plays and how). This file holds the configuration and the
//! running server's handle and state, which all of them use.
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
use std::sync::atomic::AtomicU64;

use tokio_util::sync::CancellationToken;

use rollout_model::model::ModelFiles;

mod answer;
pub mod cache;
pub mod cli;
pub mod demo;
mod faults;
pub mod pause;
mod refuse;
mod requests;
mod router;
pub mod script;
mod sglang;
mod stats;
#[cfg(test)]
mod tests;
mod vllm;

pub use answer::pseudo_logprob;
pub use faults::{Control, FaultMode};
pub use stats::{Served, Stats};

use cache::PrefixCache;
use script::Script;

/// How the server behaves: the model it plays, its script, and which of the real
/// servers' behaviours (context limit, cache report, pause semantics, API key) it
/// mimics.
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
    /// The script: which turns it plays for which task.
    pub script: Script,
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
    /// Defaults around `model` and `script`: no simulated delays, 16-token blocks, a
    /// cache of 65,536 blocks, a 32,768-token context.
    pub fn new(model: Arc<ModelFiles>, script: Script) -> Self {
        ScriptedConfig {
            model_name: "scripted".into(),
            aliases: Vec::new(),
            model,
            script,
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

/// The running server's state, shared by every handler: what each request reads (the
/// configuration, the fault set, the pause, the weight label) and what it changes (the
/// cache, the counters, the log). It sits here, above the modules that use it and below
/// none of them, so that they use it without using one another; each keeps its own
/// methods on it (`faults`, `stats`, `answer`).
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
    /// the answer, as a real model continues its own text (see [`answer::Continuation`]).
    continuations: Mutex<HashMap<Vec<u32>, answer::Continuation>>,
    /// The weights' label (`default` until told), as both servers keep one.
    weight_version: Mutex<String>,
    /// When it started (Unix seconds), as `/v1/models` says `created`.
    started: u64,
    shutdown: CancellationToken,
}

/// A running stand-in server: where it listens, and the handle tests use to read its
/// counters, play faults and pause it without going through HTTP.
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
        let app = router::router(shared.clone());
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
