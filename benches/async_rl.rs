//! Asynchronous-RL benchmark (not a test): run with `cargo bench --bench async_rl`.
//!
//! A trainer keeps `C` = 32 agent episodes in flight against one inference server and
//! updates the policy's weights every `T` seconds; an update takes `S` seconds, during
//! which the server cannot generate. Episode lengths are log-normal (σ = 1 around a
//! median of 500 tokens at 1 ms a token, so a median episode generates for 0.5 s and the
//! slowest of a few hundred for about 8 s, capped at 4,000 tokens), as in the sampling
//! benchmark. Samples are delivered under a staleness bound of 1: one whose oldest token
//! is more than one version behind the current one when it ends is not a training
//! sample. Three ways to update, each on a fresh server with the same episodes in the
//! same order:
//!
//! - **(a) drain, then update** (the only way before weight updates could pause): at
//!   each update, start no new episode, wait for every one in flight to end, update,
//!   go on.
//! - **(b) pause with partial rollouts** (`POST /v1/policy` with `mode: "abort"`): new
//!   turns are held, the server aborts the generations in flight (they come back with
//!   their tokens so far), the update runs, and each aborted turn goes on from its
//!   tokens under the new version.
//! - **(c) abort and regenerate**: the episodes in flight are dropped at each update
//!   and started again from scratch after it.
//!
//! The loop is the real one: the agent loop ([`rollout::agent::episode`]), its client,
//! the hold of new turns ([`rollout::policy::PolicyWatch`]) and the server's pause in
//! vLLM's words ([`rollout::backends::control`]); the server is the stand-in
//! (`rollout::scripted`, which plays a script and simulates vLLM's pause and abort; it
//! is not a model). The service's gateway, which in production turns the trainer's
//! `POST /v1/policy` into that hold and that pause, is tested end to end in
//! `tests/pipeline/weight_update.rs`.
//!
//! Reported per strategy: delivered samples per second and the ratio to (a) (goal: (b)
//! ≥ 1.5×), the time the server generated nothing (in all, and per update: goal for (b):
//! at most `S`), the mean share of the `C` slots generating, samples dropped as stale,
//! generated tokens thrown away, and the staleness of what was delivered. Each strategy
//! runs `BENCH_ROUNDS` times (default 3), interleaved; medians are reported.
//! `BENCH_QUICK=1` runs a short smoke round; `BENCH_SECONDS`, `BENCH_PERIOD_MS` and
//! `BENCH_UPDATE_MS` change `D`, `T` and `S`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use rollout::agent::episode::{self, AlwaysWanted, Episode, EpisodeLimits, Parser};
use rollout::agent::model::ModelFiles;
use rollout::agent::tools::ToolRunner;
use rollout::agent::trajectory::{BackendSwitch, Trajectory};
use rollout::backends::client::{ClientSettings, InferenceClient};
use rollout::backends::generate::{GenerateError, Generated, Generator};
use rollout::backends::wire::Sampling;
use rollout::domain::backend::{BackendSpec, LogprobsMode, WireKind};
use rollout::domain::policy::{PolicyPause, PolicyState, PolicyVersion, UpdateMode};
use rollout::policy::PolicyWatch;
use rollout::sandbox::SandboxError;
use rollout::sandbox::protocol::Response;
use rollout::scripted::script::Script;
use rollout::scripted::{ScriptedConfig, ScriptedServer, demo};
use serde_json::{Value, json};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

#[allow(dead_code)] // this benchmark uses part of the shared helpers
mod common;

/// Episodes in flight.
const C: usize = 32;
/// The staleness bound samples are delivered under.
const BOUND: i64 = 1;
/// Time per generated token (µs).
const TOKEN_US: u64 = 1_000;
/// Median episode length (tokens).
const MEDIAN_TOKENS: f64 = 500.0;
/// The longest episode (tokens).
const MAX_TOKENS: u64 = 4_000;
/// The essay every episode writes, cut at its length.
const SENTENCE: &str = "The quick brown fox jumps over the lazy dog. ";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Strategy {
    Drain,
    Pause,
    Regenerate,
}

impl Strategy {
    fn name(self) -> &'static str {
        match self {
            Strategy::Drain => "(a) drain, then update",
            Strategy::Pause => "(b) pause, partial rollouts",
            Strategy::Regenerate => "(c) abort and regenerate",
        }
    }
}

/// The run's shape.
#[derive(Debug, Clone, Copy)]
struct Shape {
    /// How long each strategy runs (D).
    duration: Duration,
    /// Time between updates (T).
    period: Duration,
    /// How long an update takes (S).
    update: Duration,
}

/// What one strategy's run measured.
#[derive(Debug, Default, Clone)]
struct Run {
    delivered: usize,
    stale: usize,
    updates: usize,
    /// Time the server generated nothing (s).
    idle: f64,
    /// Mean share of the C slots generating.
    slots: f64,
    /// Tokens generated and thrown away (aborted episodes of (c)).
    wasted_tokens: u64,
    /// Staleness of the delivered samples.
    staleness: BTreeMap<i64, usize>,
}

/// Generates straight from the one server through the real client.
struct Direct {
    client: InferenceClient,
    backend: BackendSpec,
}

#[async_trait]
impl Generator for Direct {
    async fn generate(
        &mut self,
        prompt_ids: &[u32],
        sampling: &Sampling,
        _turn: usize,
    ) -> Result<Generated, GenerateError> {
        let (generation, backend_wait) = self
            .client
            .generate(
                &self.backend,
                prompt_ids,
                sampling,
                &CancellationToken::new(),
            )
            .await
            .map_err(|e| GenerateError::Unavailable(e.to_string()))?;
        Ok(Generated {
            generation,
            backend: self.backend.id.clone(),
            logprobs_mode: LogprobsMode::Raw,
            backend_wait,
        })
    }

    fn take_switches(&mut self) -> Vec<BackendSwitch> {
        Vec::new()
    }
}

/// No episode here calls a tool.
struct NoTools;

#[async_trait]
impl ToolRunner for NoTools {
    async fn call(&self, _: &str, _: Value, _: Duration) -> Result<Response, SandboxError> {
        unreachable!("the bench episodes call no tool")
    }
}

/// Episode `i`'s length in tokens: log-normal, σ = 1, the same sequence for every
/// strategy.
fn length(i: u64) -> u64 {
    // Two uniforms from a counter-based generator, then Box-Muller.
    let u = |k: u64| {
        let mut z = (i * 2 + k).wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        ((z >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    let normal = (-2.0 * u(0).ln()).sqrt() * (2.0 * std::f64::consts::PI * u(1)).cos();
    let tokens = (MEDIAN_TOKENS * normal.exp()).clamp(8.0, MAX_TOKENS as f64);
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // clamped to 8..=4000
    let tokens = tokens as u64;
    tokens
}

fn episode(model: &Arc<ModelFiles>, tokens: u64, policy: &PolicyWatch) -> Episode {
    Episode {
        observations_as_text: true,
        model: model.clone(),
        model_name: "demo".into(),
        messages: vec![json!({"role": "user", "content": "Write an essay."})],
        tools: Vec::new(),
        parser: Parser::Hermes,
        sampling: Sampling::default(),
        limits: EpisodeLimits {
            max_turns: 1,
            max_tokens: 32_000,
            max_new_tokens: usize::try_from(tokens).unwrap(),
            tool_timeout: Duration::from_secs(60),
            stop_without_tool_call: true,
            max_observation_bytes: 4096,
        },
        template_args: Default::default(),
        deadline: tokio::time::Instant::now() + Duration::from_secs(3600),
        policy: policy.clone(),
    }
}

/// Moves `watch` to a new state (the gateway's broadcast, here in process).
fn set_state(watch: &PolicyWatch, version: i64, pause: Option<i64>) {
    let mut s: PolicyState = watch.state();
    s.seq += 1;
    s.current = Some(PolicyVersion {
        version,
        announced_at: 0,
    });
    s.pause = pause.map(|to| PolicyPause {
        version: to,
        mode: UpdateMode::Abort,
        since: 0,
        until: i64::MAX,
    });
    watch.observe(s);
}

/// Samples the server's load every 5 ms until `done`: (seconds generating nothing,
/// mean share of the C slots generating).
async fn watch_load(server: Arc<ScriptedServer>, done: CancellationToken) -> (f64, f64) {
    let (mut idle, mut slots, mut total) = (0.0, 0.0, 0.0);
    let mut last = Instant::now();
    while !done.is_cancelled() {
        tokio::time::sleep(Duration::from_millis(5)).await;
        let dt = last.elapsed().as_secs_f64();
        last = Instant::now();
        let (_, generating) = server.load();
        let working = if server.is_paused() { 0 } else { generating };
        if working == 0 {
            idle += dt;
        }
        slots += dt * (working.min(C as u64) as f64 / C as f64);
        total += dt;
    }
    (idle, slots / total.max(1e-9))
}

type Ended = (u64, Result<Trajectory, episode::EpisodeError>);

/// The trainer's side of one run: the episodes in flight, the version, the tally.
struct Trainer<'a> {
    model: &'a Arc<ModelFiles>,
    client: InferenceClient,
    backend: BackendSpec,
    watch: PolicyWatch,
    version: i64,
    set: JoinSet<Ended>,
    /// Each episode task's length, to start a dropped one again.
    lengths: HashMap<tokio::task::Id, u64>,
    next: u64,
    out: Run,
}

impl Trainer<'_> {
    /// Starts episode `i` of `tokens`.
    fn spawn(&mut self, i: u64, tokens: u64) {
        let ep = episode(self.model, tokens, &self.watch);
        let mut llm = Direct {
            client: self.client.clone(),
            backend: self.backend.clone(),
        };
        let h = self.set.spawn(async move {
            let t = episode::run(&ep, &mut llm, &NoTools, &AlwaysWanted).await;
            (i, t)
        });
        self.lengths.insert(h.id(), tokens);
    }

    /// Keeps C episodes in flight.
    fn fill(&mut self) {
        while self.set.len() < C {
            let i = self.next;
            self.next += 1;
            self.spawn(i, length(i));
        }
    }

    /// Counts an ended episode: delivered, with its staleness, or dropped as stale.
    fn record(&mut self, id: tokio::task::Id, ended: Ended) {
        self.lengths.remove(&id);
        let t = ended.1.expect("an episode ends");
        let oldest = t.policy_version_oldest.expect("tagged");
        let staleness = self.version - oldest;
        if staleness <= BOUND {
            self.out.delivered += 1;
            *self.out.staleness.entry(staleness).or_default() += 1;
        } else {
            self.out.stale += 1;
        }
    }

    /// One weight update, the strategy's way.
    async fn update(&mut self, strategy: Strategy, took: Duration) {
        self.out.updates += 1;
        match strategy {
            Strategy::Drain => {
                while let Some(r) = self.set.join_next_with_id().await {
                    let (id, ended) = r.expect("an episode task ends");
                    self.record(id, ended);
                }
                tokio::time::sleep(took).await;
                self.version += 1;
                set_state(&self.watch, self.version, None);
            }
            Strategy::Pause => {
                // The gateway's order: hold new turns, then stop the server.
                set_state(&self.watch, self.version, Some(self.version + 1));
                self.client
                    .pause_backend(&self.backend, UpdateMode::Abort)
                    .await
                    .unwrap();
                tokio::time::sleep(took).await;
                self.version += 1;
                set_state(&self.watch, self.version, None);
                self.client.resume_backend(&self.backend).await.unwrap();
            }
            Strategy::Regenerate => {
                self.set.abort_all();
                let mut again = Vec::new();
                while let Some(r) = self.set.join_next_with_id().await {
                    match r {
                        Ok((id, ended)) => self.record(id, ended),
                        Err(e) => again.push(self.lengths.remove(&e.id()).unwrap()),
                    }
                }
                // What the dropped episodes had generated is lost: about half of each,
                // on average.
                self.out.wasted_tokens += again.iter().sum::<u64>() / 2;
                tokio::time::sleep(took).await;
                self.version += 1;
                set_state(&self.watch, self.version, None);
                for tokens in again {
                    let i = self.next;
                    self.next += 1;
                    self.spawn(i, tokens);
                }
            }
        }
    }
}

/// Runs one strategy for `shape.duration` on a fresh server.
async fn run(strategy: Strategy, shape: Shape, model: &Arc<ModelFiles>, script: &Script) -> Run {
    let mut cfg = ScriptedConfig::new(model.clone(), script.clone());
    cfg.model_name = "demo".into();
    cfg.token_us = TOKEN_US;
    cfg.keep_requests = 0;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = Arc::new(ScriptedServer::spawn(listener, cfg).unwrap());
    let mut t = Trainer {
        model,
        client: InferenceClient::new(ClientSettings {
            max_pause: Duration::from_secs(600),
            ..Default::default()
        }),
        backend: BackendSpec {
            id: "b0".into(),
            url: server.url(),
            kind: WireKind::Vllm,
            model: "demo".into(),
            ..Default::default()
        },
        watch: PolicyWatch::default(),
        version: 0,
        set: JoinSet::new(),
        lengths: HashMap::new(),
        next: 0,
        out: Run::default(),
    };
    set_state(&t.watch, 0, None);
    let sampling = CancellationToken::new();
    let load = tokio::spawn(watch_load(server.clone(), sampling.clone()));
    let start = Instant::now();
    let end = start + shape.duration;
    let mut next_update = start + shape.period;
    while Instant::now() < end {
        t.fill();
        tokio::select! {
            Some(r) = t.set.join_next_with_id() => {
                let (id, ended) = r.expect("an episode task ends");
                t.record(id, ended);
            }
            () = tokio::time::sleep_until(next_update.into()) => {
                t.update(strategy, shape.update).await;
                next_update = (next_update + shape.period).max(Instant::now());
            }
        }
    }
    t.set.abort_all();
    sampling.cancel();
    let (idle, slots) = load.await.unwrap();
    let mut out = std::mem::take(&mut t.out);
    out.idle = idle;
    out.slots = slots;
    drop(t);
    if let Ok(s) = Arc::try_unwrap(server) {
        s.stop().await;
    }
    out
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if !common::started_by_cargo_bench("async_rl") {
        return;
    }
    let quick = common::quick();
    let shape = Shape {
        duration: Duration::from_secs(env_u64("BENCH_SECONDS", if quick { 12 } else { 40 })),
        period: Duration::from_millis(env_u64("BENCH_PERIOD_MS", 4_000)),
        update: Duration::from_millis(env_u64("BENCH_UPDATE_MS", 1_000)),
    };
    let rounds = env_u64("BENCH_ROUNDS", if quick { 1 } else { 3 });
    let essay = SENTENCE.repeat(450);
    let model = Arc::new(demo::model_files(demo::CHATML_TEMPLATE, &[essay.as_str()]).unwrap());
    let script = Script::from_json(&json!({"fallback": [{"turns": [essay]}]}).to_string()).unwrap();
    println!(
        "# async RL: C = {C} episodes in flight, an update every {:?} taking {:?}, for {:?} a run, staleness bound {BOUND}, {rounds} round(s)",
        shape.period, shape.update, shape.duration
    );
    let strategies = [Strategy::Drain, Strategy::Pause, Strategy::Regenerate];
    let mut runs: HashMap<&str, Vec<Run>> = HashMap::new();
    for round in 0..rounds {
        for s in strategies {
            let r = run(s, shape, &model, &script).await;
            eprintln!("round {round} {}: {r:?}", s.name());
            runs.entry(s.name()).or_default().push(r);
        }
    }
    let secs = shape.duration.as_secs_f64();
    let rate = |s: Strategy| {
        median(
            runs[s.name()]
                .iter()
                .map(|r| r.delivered as f64 / secs)
                .collect(),
        )
    };
    let base = rate(Strategy::Drain);
    println!(
        "| strategy | samples/s | vs (a) | idle s (per update) | slots busy | stale dropped | tokens thrown away | staleness of delivered (0 / 1) |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for s in strategies {
        let rs = &runs[s.name()];
        let idle = median(rs.iter().map(|r| r.idle).collect());
        let updates = median(rs.iter().map(|r| r.updates as f64).collect());
        let slots = median(rs.iter().map(|r| r.slots).collect());
        let stale = median(rs.iter().map(|r| r.stale as f64).collect());
        let wasted = median(rs.iter().map(|r| r.wasted_tokens as f64).collect());
        let s0 = median(
            rs.iter()
                .map(|r| *r.staleness.get(&0).unwrap_or(&0) as f64)
                .collect(),
        );
        let s1 = median(
            rs.iter()
                .map(|r| *r.staleness.get(&1).unwrap_or(&0) as f64)
                .collect(),
        );
        println!(
            "| {} | {:.1} | {:.2}× | {:.1} ({:.2}) | {:.0}% | {:.0} | {:.0} | {:.0} / {:.0} |",
            s.name(),
            rate(s),
            rate(s) / base,
            idle,
            idle / updates.max(1.0),
            slots * 100.0,
            stale,
            wasted,
            s0,
            s1
        );
    }
}
