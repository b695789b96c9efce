//! Agent-loop benchmarks (not tests): run with `cargo bench --bench agent`.
//!
//! 1. **routing**: prefix-cache hits reported by 4 stand-in backends (`rollout::scripted`:
//!    they play a script and simulate vLLM's block prefix cache; they are not models)
//!    for one batch of prompt groups (G = 8 samples each), episodes of several turns,
//!    under three ways of picking a backend:
//!    - (a) this pool: the real assignment in a SQLite store (least weighted load, group
//!      affinity within a fair share, sticky per job, counts released when a job ends);
//!    - (b) ProRL Agent's scheme: a min-heap of assignment counts, sticky per job, counts
//!      never decremented;
//!    - (c) round-robin per request.
//!
//!    The same jobs arrive in the same order with the same number in flight; each
//!    scheme gets fresh servers (cold caches). The figure is cached prompt tokens over
//!    prompt tokens; the ratio (a)/(b) is the goal (≥ 1.3).
//! 2. **overhead**: the RUN loop's own time per turn (building requests, reading
//!    answers, parsing, rendering and tokenizing observations, bookkeeping: the turn's
//!    wall time minus backend and tool time), from the trajectories of run (a), beside
//!    the time of one bare HTTP request to the same server in the same run.
//!
//! Tools run in a stand-in that answers after a fixed delay (sandbox speed is the sandbox
//! benchmark's subject); the loop, the client, the pool and the store are the real ones.
//! `BENCH_QUICK=1` runs a small batch; `BENCH_GROUPS`, `BENCH_IN_FLIGHT`,
//! `BENCH_PROMPT_WORDS`, `BENCH_CACHE_BLOCKS` and `BENCH_TOOL_MS` change the shape.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use rollout::agent::episode::{self, AlwaysWanted, Episode, EpisodeLimits, Parser};
use rollout::agent::model::ModelFiles;
use rollout::agent::template::python_json;
use rollout::agent::tools::ToolRunner;
use rollout::agent::trajectory::{BackendSwitch, Trajectory};
use rollout::backends::client::{ClientSettings, InferenceClient};
use rollout::backends::generate::{GenerateError, Generated, Generator};
use rollout::backends::session::{BackendSession, SessionJob};
use rollout::backends::wire::Sampling;
use rollout::domain::backend::{BackendSpec, WireKind};
use rollout::domain::duration_us;
use rollout::domain::placement::AffinityPolicy;
use rollout::sandbox::SandboxError;
use rollout::sandbox::protocol::Response;
use rollout::scripted::script::Script;
use rollout::scripted::{ScriptedConfig, ScriptedServer, demo};
use rollout::store::Store;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

mod common;

const WORDS: &[&str] = &[
    "parse", "config", "module", "request", "handler", "buffer", "value", "error", "return",
    "test", "file", "line", "index", "cache", "token", "stream", "worker", "thread", "queue",
    "record", "field", "schema", "table", "row", "column", "query", "update", "insert", "delete",
    "user", "server", "client", "timeout", "retry", "offset", "length", "limit", "page",
];

/// The batch's shape.
#[derive(Debug, Clone, Copy)]
struct Shape {
    groups: usize,
    group_size: usize,
    backends: usize,
    in_flight: usize,
    prompt_words: usize,
    cache_blocks: usize,
    tool_ms: u64,
}

/// The bench script: every task plays one of four scripted episodes of four turns (three
/// bash calls, then finish), picked per sample by the server's seeded variation.
fn script() -> Script {
    let call = |name: &str, args: Value| {
        format!(
            "<tool_call>\n{}\n</tool_call>",
            python_json(&json!({"name": name, "arguments": args}), None)
        )
    };
    let variants: Vec<Value> = (0..4)
        .map(|v| {
            json!({"turns": [
                format!("I will start by reading the code.\n{}", call("bash", json!({"command": format!("grep -rn handler src/ | head -{}", 10 + v)}))),
                call("bash", json!({"command": format!("sed -n {},{}p src/worker.py", 10 * v, 10 * v + 40)})),
                call("bash", json!({"command": "python3 -m pytest -x -q tests/"})),
                call("finish", json!({"answer": format!("patched {v}")})),
            ]})
        })
        .collect();
    Script::from_json(&json!({"fallback": variants}).to_string()).unwrap()
}

/// A unique task description per group, `words` long, from a fixed word list.
fn prompt(group: usize, words: usize) -> String {
    let mut x = (group as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = format!("Task {group}: fix the failing test. Context:");
    for _ in 0..words {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.push(' ');
        let word = usize::try_from(x % WORDS.len() as u64).expect("below WORDS.len()");
        out.push_str(WORDS[word]);
    }
    out
}

/// Answers every tool call with a short, realistic observation after `latency` (a fast
/// tool: the time other episodes' turns use the backend in between, which is what
/// lets a bounded prefix cache evict an episode's blocks before its next turn).
struct Tools {
    latency: Duration,
}

#[async_trait]
impl ToolRunner for Tools {
    async fn call(
        &self,
        _tool: &str,
        args: Value,
        _timeout: Duration,
    ) -> Result<Response, SandboxError> {
        tokio::time::sleep(self.latency).await;
        let cmd = args["command"].as_str().unwrap_or_default();
        let output = format!(
            "$ {cmd}\nsrc/worker.py:12: def handler(request):\nsrc/worker.py:40:     return handler(value)\n"
        );
        Ok(Response::ok(
            1,
            json!({"output": output, "exit_code": 0, "omitted_bytes": 0, "timed_out": false,
                   "shell_restarted": false, "elapsed_us": 1}),
        ))
    }
}

/// A fixed backend per job (schemes b) or per request (scheme c).
struct Routed {
    client: InferenceClient,
    backends: Arc<Vec<BackendSpec>>,
    sticky: Option<usize>,
    round_robin: Option<Arc<AtomicUsize>>,
    cancel: CancellationToken,
}

#[async_trait]
impl Generator for Routed {
    async fn generate(
        &mut self,
        prompt_ids: &[u32],
        sampling: &Sampling,
        _turn: usize,
    ) -> Result<Generated, GenerateError> {
        let i = match (&self.round_robin, self.sticky) {
            (Some(rr), _) => rr.fetch_add(1, Ordering::Relaxed) % self.backends.len(),
            (None, Some(i)) => i,
            (None, None) => unreachable!("a scheme routes somewhere"),
        };
        let b = &self.backends[i];
        let (generation, wait) = self
            .client
            .generate(b, prompt_ids, sampling, &self.cancel)
            .await
            .map_err(|e| GenerateError::Unavailable(e.to_string()))?;
        Ok(Generated {
            generation,
            backend: b.id.clone(),
            logprobs_mode: b.logprobs(),
            backend_wait: wait,
        })
    }

    fn take_switches(&mut self) -> Vec<BackendSwitch> {
        Vec::new()
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Scheme {
    Pool,
    ProRl,
    RoundRobin,
}

impl Scheme {
    fn label(self) -> &'static str {
        match self {
            Scheme::Pool => "(a) this pool",
            Scheme::ProRl => "(b) ProRL Agent (min-heap, never decremented)",
            Scheme::RoundRobin => "(c) round-robin per request",
        }
    }
}

struct Outcome {
    prompt_tokens: u64,
    cached_tokens: u64,
    trajectories: Vec<Trajectory>,
    groups_on_one_backend: usize,
    seconds: f64,
}

/// How the episodes of one run pick their backend: what each spawned episode needs of
/// the scheme, cloned into it.
#[derive(Clone)]
struct Routing {
    scheme: Scheme,
    client: InferenceClient,
    specs: Arc<Vec<BackendSpec>>,
    /// The pool's store (scheme a).
    store: Option<Arc<dyn Store>>,
    /// Assignments per backend, never decremented (scheme b).
    prorl_counts: Arc<std::sync::Mutex<Vec<u64>>>,
    /// The next backend of the rotation (scheme c).
    round_robin: Arc<AtomicUsize>,
}

impl Routing {
    /// Runs `ep` as job `job_id` of group `g` on the backends the scheme picks.
    async fn run(self, ep: &Episode, job_id: String, g: usize, tools: &Tools) -> Trajectory {
        let cancel = CancellationToken::new();
        match self.scheme {
            Scheme::Pool => {
                let store = self.store.unwrap();
                let mut session = BackendSession::open(
                    store.clone(),
                    store.clone(),
                    self.client,
                    SessionJob {
                        job_id: job_id.clone(),
                        group_key: Some(format!("bench/g{g}")),
                        model: Some("demo".into()),
                        node: "bench".into(),
                    },
                    AffinityPolicy::default(),
                    cancel,
                )
                .await
                .unwrap();
                let t = episode::run(ep, &mut session, tools, &AlwaysWanted)
                    .await
                    .unwrap();
                // The job leaves RUN: its assignment goes (the trigger does this
                // for real jobs).
                store.release_backend(&job_id).await.unwrap();
                t
            }
            Scheme::ProRl | Scheme::RoundRobin => {
                let sticky = (self.scheme == Scheme::ProRl).then(|| {
                    let mut c = self.prorl_counts.lock().unwrap();
                    let (i, _) = c.iter().enumerate().min_by_key(|(i, n)| (**n, *i)).unwrap();
                    c[i] += 1;
                    i
                });
                let mut routed = Routed {
                    client: self.client,
                    backends: self.specs,
                    sticky,
                    round_robin: (self.scheme == Scheme::RoundRobin).then_some(self.round_robin),
                    cancel,
                };
                episode::run(ep, &mut routed, tools, &AlwaysWanted)
                    .await
                    .unwrap()
            }
        }
    }
}

/// The bench episode: the system prompt, the group's task `text`, bash and finish.
fn bench_episode(model: Arc<ModelFiles>, text: String) -> Episode {
    Episode {
        observations_as_text: true,
        model,
        model_name: "demo".into(),
        messages: vec![
            json!({"role": "system", "content": "You are a software engineer working in a repository. Use the tools to inspect and change files, run the tests, then finish."}),
            json!({"role": "user", "content": text}),
        ],
        tools: vec!["bash".into(), "finish".into()],
        parser: Parser::Hermes,
        sampling: Sampling::default(),
        limits: EpisodeLimits {
            max_turns: 8,
            max_tokens: 32_768,
            max_new_tokens: 1024,
            tool_timeout: Duration::from_secs(60),
            stop_without_tool_call: true,
            max_observation_bytes: 16_384,
        },
        template_args: Default::default(),
        deadline: tokio::time::Instant::now() + Duration::from_secs(600),
        policy: rollout::policy::PolicyWatch::default(),
    }
}

/// Fresh stand-in servers (cold caches) for one run, alternately vLLM and SGLang, and
/// their specs.
async fn start_backends(
    shape: Shape,
    model: &Arc<ModelFiles>,
    p: &Script,
    model_dir: &std::path::Path,
) -> (Vec<ScriptedServer>, Vec<BackendSpec>) {
    let mut servers = Vec::new();
    let mut specs = Vec::new();
    for i in 0..shape.backends {
        let mut cfg = ScriptedConfig::new(model.clone(), p.clone());
        cfg.seed = i as u64;
        cfg.model_name = "demo".into();
        cfg.cache_blocks = shape.cache_blocks;
        cfg.keep_requests = 0;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let s = ScriptedServer::spawn(listener, cfg).unwrap();
        specs.push(BackendSpec {
            id: format!("b{i}"),
            url: s.url(),
            kind: if i % 2 == 0 {
                WireKind::Vllm
            } else {
                WireKind::Sglang
            },
            model: "demo".into(),
            tokenizer: model_dir.display().to_string(),
            weight: 1.0,
            ..Default::default()
        });
        servers.push(s);
    }
    (servers, specs)
}

/// Stops the run's servers, returning the prompt and cached tokens they counted.
async fn stop_backends(servers: Vec<ScriptedServer>) -> (u64, u64) {
    let mut prompt_tokens = 0;
    let mut cached_tokens = 0;
    for s in servers {
        let st = s.stats();
        prompt_tokens += st.prompt_tokens;
        cached_tokens += st.cached_tokens;
        s.stop().await;
    }
    (prompt_tokens, cached_tokens)
}

async fn run_scheme(
    scheme: Scheme,
    shape: Shape,
    model: Arc<ModelFiles>,
    model_dir: &std::path::Path,
    dir: &std::path::Path,
) -> Outcome {
    let p = script();
    let (servers, specs) = start_backends(shape, &model, &p, model_dir).await;
    let specs = Arc::new(specs);
    let client = InferenceClient::new(ClientSettings::default());
    let store = match scheme {
        Scheme::Pool => {
            let url = format!("sqlite://{}", dir.join(format!("{scheme:?}.db")).display());
            let store = rollout::store::connect(&url, 4).await.unwrap();
            for s in specs.iter() {
                store
                    .upsert_backend(s, "config", rollout::domain::EpochMs(0))
                    .await
                    .unwrap();
            }
            Some(store)
        }
        _ => None,
    };
    let routing = Routing {
        scheme,
        client,
        specs,
        store,
        prorl_counts: Arc::new(std::sync::Mutex::new(vec![0u64; shape.backends])),
        round_robin: Arc::new(AtomicUsize::new(0)),
    };
    let slots = Arc::new(tokio::sync::Semaphore::new(shape.in_flight));
    let t0 = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for g in 0..shape.groups {
        let text = prompt(g, shape.prompt_words);
        for s in 0..shape.group_size {
            let permit = slots.clone().acquire_owned().await.unwrap();
            let (model, routing, text) = (model.clone(), routing.clone(), text.clone());
            tasks.spawn(async move {
                let _permit = permit;
                let ep = bench_episode(model, text);
                let job_id = format!("g{g}-s{s}");
                let tools = Tools {
                    latency: Duration::from_millis(shape.tool_ms),
                };
                (g, routing.run(&ep, job_id, g, &tools).await)
            });
        }
    }
    let mut trajectories = Vec::new();
    let mut homes: HashMap<usize, std::collections::BTreeSet<String>> = HashMap::new();
    while let Some(r) = tasks.join_next().await {
        let (g, t) = r.unwrap();
        for turn in &t.turns {
            homes.entry(g).or_default().insert(turn.backend.clone());
        }
        trajectories.push(t);
    }
    let seconds = t0.elapsed().as_secs_f64();
    let (prompt_tokens, cached_tokens) = stop_backends(servers).await;
    Outcome {
        prompt_tokens,
        cached_tokens,
        trajectories,
        groups_on_one_backend: homes.values().filter(|b| b.len() == 1).count(),
        seconds,
    }
}

/// A named step of a turn, timed alone.
type Step<'a> = (&'static str, Box<dyn Fn() + 'a>);

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[common::rank(sorted.len(), p)]
}

#[tokio::main]
async fn main() {
    if !common::started_by_cargo_bench("agent") {
        return;
    }
    let shape = shape_from_env();
    let dir = tempfile::tempdir().unwrap();
    let model_dir = dir.path().join("model");
    let p = script();
    let mut corpus: Vec<String> = p.fallback.iter().flat_map(|v| v.turns.clone()).collect();
    corpus.push(WORDS.join(" "));
    let extra: Vec<&str> = corpus.iter().map(String::as_str).collect();
    demo::write_model_dir(&model_dir, demo::CHATML_TEMPLATE, &extra).unwrap();
    let model = Arc::new(ModelFiles::load(&model_dir).unwrap());
    let outcomes = routing(shape, &model, &model_dir, dir.path()).await;

    // Overhead per turn: the loop's own work, measured with one episode at a time (the
    // pool, the client and the loop as in run a; 4 groups of 8 episodes), so it is the
    // worker's cost and not time queued behind the other episodes and the stand-in
    // servers, which share this process's two cores in run (a).
    let alone = Shape {
        groups: 4,
        in_flight: 1,
        ..shape
    };
    let single = run_scheme(Scheme::Pool, alone, model.clone(), &model_dir, dir.path()).await;
    let turns_of = |o: &Outcome| {
        let mut v: Vec<u64> = o
            .trajectories
            .iter()
            .flat_map(|t| t.turns.iter().map(|u| u.overhead_us))
            .collect();
        v.sort_unstable();
        v
    };
    let overhead = turns_of(&single);
    let loaded = turns_of(&outcomes[0].1);
    // A typical turn of run (a): its prompt and its model tokens.
    let turn = &outcomes[0].1.trajectories[0].turns[1];
    let t = &outcomes[0].1.trajectories[0];
    let typical = turn.prompt_tokens;
    let ids = t.all_ids()[..turn.prompt_tokens].to_vec();
    let out_ids = t.response_ids[turn.model_range[0]..turn.model_range[1]].to_vec();
    let (bare, raw) = baseline(&model, &p, &model_dir, typical, &ids).await;
    let parts = time_steps(&model, &ids, &out_ids, &raw);
    println!(
        "overhead: RUN loop's own time per turn, one episode at a time, over {} turns: p50 {} us, p90 {} us, p99 {} us (goal p50 <= 200 us)",
        overhead.len(),
        percentile(&overhead, 0.5),
        percentile(&overhead, 0.9),
        percentile(&overhead, 0.99)
    );
    println!(
        "  with {} episodes in flight beside the stand-in servers (run a): p50 {} us, p90 {} us",
        shape.in_flight,
        percentile(&loaded, 0.5),
        percentile(&loaded, 0.9)
    );
    println!(
        "  baseline: one bare request of a {}-token prompt to a stand-in server: p50 {} us; overhead p50 / bare p50 = {:.2}",
        typical,
        percentile(&bare, 0.5),
        percentile(&overhead, 0.5) as f64 / percentile(&bare, 0.5).max(1) as f64
    );
    println!(
        "  steps of a typical turn, each alone: {}",
        parts.join(", ")
    );
}

/// The batch's shape: `BENCH_QUICK` for a small one, the other `BENCH_*` variables to
/// change one dimension.
fn shape_from_env() -> Shape {
    let quick = common::quick();
    let var = |name: &str, default: usize| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    Shape {
        groups: var("BENCH_GROUPS", if quick { 8 } else { 64 }),
        group_size: 8,
        backends: 4,
        in_flight: var("BENCH_IN_FLIGHT", if quick { 16 } else { 64 }),
        prompt_words: var("BENCH_PROMPT_WORDS", 600),
        // Blocks of 16 tokens per backend: about what the 16 episodes a backend runs need
        // when the 8 samples of a group share their prompt (2 prompts of ~70 blocks and
        // ~15 blocks of each episode's own turns), half of what they need when every
        // backend holds a copy of 8 groups' prompts. An engine's prefix cache is the KV
        // memory its running sequences leave, far smaller than the contexts of all the
        // episodes in flight in agentic RL; BENCHMARKS.md has a sweep of this size.
        cache_blocks: var("BENCH_CACHE_BLOCKS", 384),
        tool_ms: var("BENCH_TOOL_MS", 20) as u64,
    }
}

/// Benchmark 1: the batch under each scheme, one line each, then the ratios of cached
/// tokens.
async fn routing(
    shape: Shape,
    model: &Arc<ModelFiles>,
    model_dir: &std::path::Path,
    dir: &std::path::Path,
) -> Vec<(Scheme, Outcome)> {
    println!(
        "routing: {} groups x G={} on {} stand-in backends, {} jobs in flight, ~{}-word task prompts, {} cache blocks of 16 tokens per backend",
        shape.groups,
        shape.group_size,
        shape.backends,
        shape.in_flight,
        shape.prompt_words,
        shape.cache_blocks
    );
    let mut outcomes = Vec::new();
    for scheme in [Scheme::Pool, Scheme::ProRl, Scheme::RoundRobin] {
        let o = run_scheme(scheme, shape, model.clone(), model_dir, dir).await;
        println!(
            "  {:<48} cached {:>9} of {:>9} prompt tokens ({:>5.1}%), groups on one backend {:>3}/{}, {:.1} s",
            scheme.label(),
            o.cached_tokens,
            o.prompt_tokens,
            100.0 * o.cached_tokens as f64 / o.prompt_tokens.max(1) as f64,
            o.groups_on_one_backend,
            shape.groups,
            o.seconds
        );
        outcomes.push((scheme, o));
    }
    let cached = |i: usize| outcomes[i].1.cached_tokens as f64;
    println!(
        "  ratio (a)/(b) = {:.2} (goal >= 1.3), (a)/(c) = {:.2}",
        cached(0) / cached(1).max(1.0),
        cached(0) / cached(2).max(1.0)
    );
    outcomes
}

/// The baseline of benchmark 2: 200 bare requests with a prompt of `typical` tokens to
/// a fresh server, their times sorted (µs); and that server's raw answer to the prompt
/// `ids`, for timing the reading of an answer.
async fn baseline(
    model: &Arc<ModelFiles>,
    p: &Script,
    model_dir: &std::path::Path,
    typical: usize,
    ids: &[u32],
) -> (Vec<u64>, bytes::Bytes) {
    let mut cfg = ScriptedConfig::new(model.clone(), p.clone());
    cfg.model_name = "demo".into();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = ScriptedServer::spawn(listener, cfg).unwrap();
    let spec = BackendSpec {
        id: "bare".into(),
        url: server.url(),
        kind: WireKind::Vllm,
        model: "demo".into(),
        tokenizer: model_dir.display().to_string(),
        weight: 1.0,
        ..Default::default()
    };
    let client = InferenceClient::new(ClientSettings::default());
    let prompt_ids: Vec<u32> = (0..u32::try_from(typical).unwrap())
        .map(|i| 10 + i % 500)
        .collect();
    let mut bare = Vec::new();
    for _ in 0..200 {
        let t0 = Instant::now();
        client
            .generate(
                &spec,
                &prompt_ids,
                &Sampling::default(),
                &CancellationToken::new(),
            )
            .await
            .unwrap();
        bare.push(duration_us(t0.elapsed()));
    }
    bare.sort_unstable();
    let raw = reqwest::Client::new()
        .post(format!("{}/v1/completions", server.url()))
        .header("content-type", "application/json")
        .body(rollout::backends::wire::vllm_body(
            "demo",
            ids,
            &Sampling::default(),
        ))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    server.stop().await;
    (bare, raw)
}

/// Where a turn's own time goes: each step of the loop on a typical turn (prompt `ids`,
/// model tokens `out_ids`, the backend's `raw` answer), timed alone, as "name N us".
fn time_steps(model: &ModelFiles, ids: &[u32], out_ids: &[u32], raw: &[u8]) -> Vec<String> {
    let schemas: Vec<Value> = ["bash", "finish"]
        .iter()
        .filter_map(|n| rollout::agent::tools::schema(n))
        .collect();
    let args = serde_json::Map::new();
    let glue = rollout::agent::render::TurnGlue::new(
        &model.template,
        &model.stop_tokens(),
        Some(&schemas[..]),
        &args,
    )
    .unwrap();
    let obs = [
        json!({"role": "tool", "content": "src/worker.py:12: def handler(request):\nsrc/worker.py:40:     return handler(value)"}),
    ];
    let between = glue.between_turns(&obs, true).unwrap();
    let text = model.tokenizer.decode(out_ids).unwrap();
    let steps: Vec<Step> = vec![
        (
            "build the request body",
            Box::new(|| {
                std::hint::black_box(rollout::backends::wire::vllm_body(
                    "demo",
                    ids,
                    &Sampling::default(),
                ));
            }),
        ),
        (
            "read the answer",
            Box::new(|| {
                std::hint::black_box(rollout::backends::wire::parse_vllm(raw).unwrap());
            }),
        ),
        (
            "decode the turn for parsing",
            Box::new(|| {
                std::hint::black_box(model.tokenizer.decode(out_ids).unwrap());
            }),
        ),
        (
            "parse tool calls",
            Box::new(|| {
                std::hint::black_box(rollout::agent::parse::parse_hermes(&text, false));
            }),
        ),
        (
            "render the observation",
            Box::new(|| {
                std::hint::black_box(glue.between_turns(&obs, true).unwrap());
            }),
        ),
        (
            "tokenize the observation",
            Box::new(|| {
                std::hint::black_box(model.tokenizer.encode(&between).unwrap());
            }),
        ),
    ];
    let mut parts = Vec::new();
    for (name, f) in &steps {
        let n = 2000;
        let t0 = Instant::now();
        for _ in 0..n {
            f();
        }
        parts.push(format!(
            "{name} {:.1} us",
            t0.elapsed().as_secs_f64() * 1e6 / n as f64
        ));
    }
    parts
}
