//! The HTTP client for inference servers.
//!
//! One pooled [`reqwest::Client`] per process keeps connections to every backend alive
//! across turns and jobs. Each generation has a timeout; connection errors, timeouts
//! and 5xx answers are retried with exponential backoff, because a backend under load
//! or restarting answers so briefly and a lost turn costs a whole episode. Other errors
//! (4xx, an answer without token IDs) are not retried: the same request would fail the
//! same way. A server that answers 503 while it pauses (a weight update) is waited out
//! for up to `max_pause`, retrying without using up the retries or counting as a backend
//! error. A generation the server aborts (`finish_reason: "abort"`, e.g. a pause in
//! `abort` mode) is returned as it is, with the tokens generated before the abort: the
//! agent loop continues the turn from them once generation resumes, instead of
//! throwing them away. Cancelling drops the request future, which closes its
//! connection, so the server sees the client go away and can abort the generation.

use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::wire::{self, Generation, Sampling};
use crate::domain::backend::BackendSpec;
use crate::domain::backend::WireKind;

/// Timeouts and retry policy.
#[derive(Debug, Clone)]
pub struct ClientSettings {
    /// How long one connection attempt may take.
    pub connect_timeout: Duration,
    /// How long one generation request may take, answer included.
    pub request_timeout: Duration,
    /// Retries after the first attempt, for connection errors, timeouts and 5xx.
    pub retries: u32,
    /// The first backoff; it doubles with each retry.
    pub backoff: Duration,
    /// How long a backend may keep pausing (aborting generations, answering 503, as a
    /// server does while its weights are updated) before the job moves elsewhere. A
    /// pause is waited out and retried without using up `retries` and without counting
    /// as a backend error.
    pub max_pause: Duration,
}

impl Default for ClientSettings {
    fn default() -> Self {
        ClientSettings {
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(600),
            retries: 3,
            backoff: Duration::from_millis(200),
            max_pause: Duration::from_secs(300),
        }
    }
}

impl From<&crate::config::PoolSettings> for ClientSettings {
    /// The `pool` section's timeouts and retries.
    fn from(pool: &crate::config::PoolSettings) -> Self {
        ClientSettings {
            connect_timeout: Duration::from_millis(pool.connect_timeout_ms),
            request_timeout: Duration::from_millis(pool.request_timeout_ms),
            retries: pool.retries,
            backoff: Duration::from_millis(pool.backoff_ms),
            max_pause: Duration::from_millis(pool.max_pause_ms),
        }
    }
}

/// Why a generation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InferenceError {
    /// The backend could not be reached, timed out or answered 5xx on every attempt:
    /// the caller should move the job to another backend.
    #[error("backend `{backend}` is unavailable after {attempts} attempts: {last}")]
    Unavailable {
        /// The backend's id.
        backend: String,
        /// Attempts made.
        attempts: u32,
        /// The last error.
        last: String,
    },
    /// The backend refused the request (4xx): retrying or moving would not help.
    #[error("backend `{backend}` refused the request ({status}): {body}")]
    Refused {
        /// The backend's id.
        backend: String,
        /// HTTP status.
        status: u16,
        /// Its answer, shortened.
        body: String,
    },
    /// The answer lacks what token-exact training needs.
    #[error("backend `{backend}`: {source}")]
    Wire {
        /// The backend's id.
        backend: String,
        /// What is missing.
        source: wire::WireError,
    },
    /// The job was cancelled; the request was closed.
    #[error("cancelled")]
    Cancelled,
}

/// A pooled inference client.
#[derive(Debug, Clone)]
pub struct InferenceClient {
    pub(super) http: reqwest::Client,
    settings: ClientSettings,
}

/// One attempt's failure, and whether another attempt may help.
enum Attempt {
    /// A fault of the backend: retried up to `retries` times.
    Retry(String),
    /// The backend paused (503): waited out up to `max_pause`, not counted as a fault.
    Paused(String),
    Fatal(InferenceError),
}

impl InferenceClient {
    /// A client with `settings`.
    pub fn new(settings: ClientSettings) -> Self {
        let http = reqwest::Client::builder()
            .connect_timeout(settings.connect_timeout)
            .pool_idle_timeout(Duration::from_secs(90))
            .tcp_nodelay(true)
            .build()
            .expect("HTTP client builds");
        InferenceClient { http, settings }
    }

    /// Its settings.
    pub fn settings(&self) -> &ClientSettings {
        &self.settings
    }

    /// Generates from `prompt_ids` on `backend`, retrying transient failures; returns
    /// early with [`InferenceError::Cancelled`] when `cancel` fires. With the generation
    /// comes the time spent waiting on the backend (requests in flight and the backoff
    /// between them), so callers can tell it from their own time.
    pub async fn generate(
        &self,
        backend: &BackendSpec,
        prompt_ids: &[u32],
        sampling: &Sampling,
        cancel: &CancellationToken,
    ) -> Result<(Generation, Duration), InferenceError> {
        let (url, body) = match backend.kind {
            WireKind::Vllm => (
                format!("{}/v1/completions", backend.url.trim_end_matches('/')),
                wire::vllm_body(backend.served_name(), prompt_ids, sampling),
            ),
            WireKind::Sglang => (
                format!("{}/generate", backend.url.trim_end_matches('/')),
                wire::sglang_body(prompt_ids, sampling),
            ),
        };
        let body = bytes::Bytes::from(body);
        let mut last;
        let mut waited = Duration::ZERO;
        let mut tries = 0u32;
        let mut paused = false;
        let mut fault_delays =
            crate::retry::inference_faults(self.settings.backoff, self.settings.retries);
        let mut pause_delays =
            crate::retry::inference_paused(self.settings.backoff, self.settings.max_pause);
        loop {
            tries += 1;
            let once = self.attempt(backend, &url, body.clone(), &mut waited);
            let outcome = tokio::select! {
                // Dropping the request future closes its connection.
                _ = cancel.cancelled() => return Err(InferenceError::Cancelled),
                r = once => r,
            };
            let delay = match outcome {
                Ok(mut g) => {
                    g.after_pause = paused;
                    return Ok((g, waited));
                }
                Err(Attempt::Fatal(e)) => return Err(e),
                Err(Attempt::Retry(e)) => {
                    metrics::counter!(crate::metrics::BACKEND_ERRORS, "backend" => backend.id.clone())
                        .increment(1);
                    last = e;
                    match fault_delays.next() {
                        Some(d) => d,
                        None => break,
                    }
                }
                Err(Attempt::Paused(e)) => {
                    paused = true;
                    last = e;
                    match pause_delays.next() {
                        Some(d) => d,
                        None => break,
                    }
                }
            };
            tracing::debug!(backend = %backend.id, tries, ?delay, error = %last, "retrying generation");
            tokio::select! {
                _ = cancel.cancelled() => return Err(InferenceError::Cancelled),
                _ = tokio::time::sleep(delay) => {}
            }
            waited += delay;
        }
        Err(InferenceError::Unavailable {
            backend: backend.id.clone(),
            attempts: tries,
            last,
        })
    }

    async fn attempt(
        &self,
        backend: &BackendSpec,
        url: &str,
        body: bytes::Bytes,
        waited: &mut Duration,
    ) -> Result<Generation, Attempt> {
        let t0 = Instant::now();
        metrics::counter!(crate::metrics::BACKEND_REQUESTS, "backend" => backend.id.clone())
            .increment(1);
        let resp = authorized(self.http.post(url), backend)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .timeout(self.settings.request_timeout)
            .body(body)
            .send()
            .await
            .map_err(|e| {
                *waited += t0.elapsed();
                Attempt::Retry(describe(&e))
            })?;
        let status = resp.status();
        let bytes = resp.bytes().await;
        *waited += t0.elapsed();
        let bytes = bytes.map_err(|e| Attempt::Retry(describe(&e)))?;
        metrics::histogram!(crate::metrics::BACKEND_LATENCY, "backend" => backend.id.clone())
            .record(t0.elapsed().as_secs_f64());
        if status == reqwest::StatusCode::SERVICE_UNAVAILABLE {
            // A server paused for a weight update (or draining) says 503: wait it out.
            return Err(Attempt::Paused(format!(
                "HTTP {status}: {}",
                shorten(&String::from_utf8_lossy(&bytes))
            )));
        }
        if status.is_server_error() {
            return Err(Attempt::Retry(format!(
                "HTTP {status}: {}",
                shorten(&String::from_utf8_lossy(&bytes))
            )));
        }
        if !status.is_success() {
            return Err(Attempt::Fatal(InferenceError::Refused {
                backend: backend.id.clone(),
                status: status.as_u16(),
                body: shorten(&String::from_utf8_lossy(&bytes)),
            }));
        }
        let parsed = match backend.kind {
            WireKind::Vllm => wire::parse_vllm(&bytes),
            WireKind::Sglang => wire::parse_sglang(&bytes),
        };
        match parsed {
            // An aborted generation is returned with its tokens so far: the caller goes
            // on from them (a partial rollout) rather than throwing them away.
            Ok(g) => Ok(g),
            Err(source) => Err(Attempt::Fatal(InferenceError::Wire {
                backend: backend.id.clone(),
                source,
            })),
        }
    }

    /// Probes `backend` with `GET /v1/models`, which both vLLM and SGLang answer
    /// without running the model (SGLang's `/health` runs a generation, slow under
    /// load); the error says why it is not usable. A vLLM that does not serve the
    /// model under the name requests use ([`BackendSpec::served_name`]) would answer
    /// every request 404, so that is reported here, with what fixes it, rather than
    /// failing jobs; so is a key the server refuses.
    pub async fn health(&self, backend: &BackendSpec, timeout: Duration) -> Result<(), String> {
        let url = format!("{}/v1/models", backend.url.trim_end_matches('/'));
        let resp = authorized(self.http.get(&url), backend)
            .timeout(timeout)
            .send()
            .await
            .map_err(|e| describe(&e))?;
        if resp.status() == reqwest::StatusCode::UNAUTHORIZED {
            return Err(format!(
                "GET /v1/models answered {}: the server wants an API key; register the backend with api_key set to its --api-key{}",
                resp.status(),
                if backend.api_key.is_some() {
                    " (the one registered is refused)"
                } else {
                    ""
                }
            ));
        }
        if !resp.status().is_success() {
            return Err(format!("GET /v1/models answered {}", resp.status()));
        }
        if backend.kind != WireKind::Vllm {
            return Ok(());
        }
        let list: serde_json::Value = resp
            .json()
            .await
            .map_err(|e| format!("GET /v1/models: {}", describe(&e)))?;
        let served: Vec<&str> = list["data"]
            .as_array()
            .map(|d| d.iter().filter_map(|m| m["id"].as_str()).collect())
            .unwrap_or_default();
        let name = backend.served_name();
        if served.contains(&name) {
            Ok(())
        } else {
            Err(format!(
                "it serves {served:?}, not `{name}`, and would refuse every request (404): start vLLM with --served-model-name {name}, or register the backend with served_model_name set to the name it serves"
            ))
        }
    }
}

/// `request` with the backend's API key as a Bearer token, when it has one.
pub(super) fn authorized(
    request: reqwest::RequestBuilder,
    backend: &BackendSpec,
) -> reqwest::RequestBuilder {
    match &backend.api_key {
        Some(key) => request.bearer_auth(&key.0),
        None => request,
    }
}

/// A transport error with its causes (reqwest's top-level message alone says little).
pub(super) fn describe(e: &reqwest::Error) -> String {
    let mut s = if e.is_timeout() {
        "timed out".to_string()
    } else if e.is_connect() {
        "cannot connect".to_string()
    } else {
        e.to_string()
    };
    let mut source = std::error::Error::source(e);
    while let Some(inner) = source {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        source = inner.source();
    }
    s
}

pub(super) fn shorten(s: &str) -> String {
    const MAX: usize = 500;
    if s.len() <= MAX {
        return s.to_string();
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::scripted::{Control, FaultMode, ScriptedConfig, ScriptedServer, demo};

    async fn server() -> ScriptedServer {
        server_with(|_| {}).await
    }

    async fn server_with(tweak: impl FnOnce(&mut ScriptedConfig)) -> ScriptedServer {
        let model = demo::model_files(demo::CHATML_TEMPLATE, &[]).unwrap();
        let mut cfg = ScriptedConfig::new(Arc::new(model), Default::default());
        tweak(&mut cfg);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        ScriptedServer::spawn(listener, cfg).unwrap()
    }

    /// What real servers want and refuse, against the stand-in that plays them: the API
    /// key, the served model name, stop tokens, cached-token counts and seeds only with
    /// their flags, a slow `/health`, SGLang's `top_k` and error shape.
    #[tokio::test]
    async fn the_client_meets_what_real_servers_want() {
        let never = CancellationToken::new();
        let c = client(0);
        let t = Duration::from_secs(1);
        api_key_is_sent(&c, t, &never).await;
        // The pool's model name differs from the name vLLM serves.
        let s = server_with(|cfg| {
            cfg.script = crate::scripted::script::Script::from_json(
                r#"{"fallback": [{"turns": ["Looking.\n<tool_call>\n{}\n</tool_call>"]}]}"#,
            )
            .unwrap();
        })
        .await;
        served_model_name_is_sent(&c, &s, t, &never).await;
        stop_tokens_end_turns(&c, &s, &never).await;
        sglang_top_k_and_seeds(&c, s, &never).await;
    }

    /// Part of `the_client_meets_what_real_servers_want`: without the API key the probe
    /// says what to register and generation is refused, not retried; with it, a
    /// `/health` that takes 3 s does not hold up the probe.
    async fn api_key_is_sent(c: &InferenceClient, t: Duration, never: &CancellationToken) {
        let s = server_with(|cfg| {
            cfg.api_key = Some("s3cret".into());
            cfg.health_delay_ms = 3_000;
        })
        .await;
        // No key: the probe says what to register; generation is refused, not retried.
        let mut b = spec(s.url(), WireKind::Vllm);
        let e = c.health(&b, t).await.unwrap_err();
        assert!(e.contains("401") && e.contains("api_key"), "{e}");
        let e = client(3)
            .generate(&b, &[1, 2], &Sampling::default(), never)
            .await
            .unwrap_err();
        assert!(
            matches!(e, InferenceError::Refused { status: 401, .. }),
            "{e}"
        );
        b.api_key = Some(crate::domain::backend::ApiKey("wrong".into()));
        let e = c.health(&b, t).await.unwrap_err();
        assert!(e.contains("is refused"), "{e}");
        // With the key, and a /health that takes 3 s: the probe does not wait for it.
        for kind in [WireKind::Vllm, WireKind::Sglang] {
            let mut b = spec(s.url(), kind);
            b.api_key = Some(crate::domain::backend::ApiKey("s3cret".into()));
            c.health(&b, t).await.unwrap();
            c.generate(&b, &[1, 2], &Sampling::default(), never)
                .await
                .unwrap();
        }
        s.stop().await;
    }

    /// Part of `the_client_meets_what_real_servers_want`: the served model name is sent
    /// in place of the pool's, and a wrong one is named by the probe.
    async fn served_model_name_is_sent(
        c: &InferenceClient,
        s: &ScriptedServer,
        t: Duration,
        never: &CancellationToken,
    ) {
        let b = BackendSpec {
            model: "policy".into(),
            served_model_name: Some("scripted".into()),
            ..spec(s.url(), WireKind::Vllm)
        };
        c.health(&b, t).await.unwrap();
        c.generate(&b, &[1, 2], &Sampling::default(), never)
            .await
            .unwrap();
        let wrong = BackendSpec {
            served_model_name: Some("policy-v2".into()),
            ..b.clone()
        };
        let e = c.health(&wrong, t).await.unwrap_err();
        assert!(e.contains("served_model_name"), "{e}");
    }

    /// Part of `the_client_meets_what_real_servers_want`: stop tokens end the turn on
    /// them, kept; cached tokens are counted only with the flag.
    async fn stop_tokens_end_turns(
        c: &InferenceClient,
        s: &ScriptedServer,
        never: &CancellationToken,
    ) {
        let files = demo::model_files(demo::CHATML_TEMPLATE, &[]).unwrap();
        let call = files.tokenizer.token_id("<tool_call>").unwrap();
        let stops = Sampling {
            stop_token_ids: vec![call],
            ..Sampling::default()
        };
        for kind in [WireKind::Vllm, WireKind::Sglang] {
            let b = spec(s.url(), kind);
            let (g, _) = c.generate(&b, &[1, 2], &stops, never).await.unwrap();
            assert_eq!(g.token_ids.last(), Some(&call), "{kind}");
            assert_eq!(g.finish, wire::Finish::Stop);
            let cached = g.cached_prompt_tokens;
            match kind {
                WireKind::Vllm => assert_eq!(cached, None, "no --enable-prompt-tokens-details"),
                WireKind::Sglang => assert!(cached.is_some()),
            }
        }
    }

    /// Part of `the_client_meets_what_real_servers_want`, on `s` (which it stops): SGLang
    /// refuses `top_k` 0 in its error shape and ignores a seed without
    /// `--enable-deterministic-inference`; with the flags, seeds and cached counts come.
    async fn sglang_top_k_and_seeds(
        c: &InferenceClient,
        s: ScriptedServer,
        never: &CancellationToken,
    ) {
        // SGLang: top_k 0 is refused in its error shape (the client sends -1), and a
        // seed is ignored without --enable-deterministic-inference.
        let raw = reqwest::Client::new()
            .post(format!("{}/generate", s.url()))
            .json(&serde_json::json!({"input_ids": [1, 2], "sampling_params": {"top_k": 0}}))
            .send()
            .await
            .unwrap();
        assert_eq!(raw.status(), 400);
        let body: serde_json::Value = raw.json().await.unwrap();
        assert!(
            body["error"]["message"].as_str().unwrap().contains("top_k"),
            "{body}"
        );
        let b = spec(s.url(), WireKind::Sglang);
        let seeded = Sampling {
            top_k: Some(0),
            seed: Some(7),
            ..Sampling::default()
        };
        c.generate(&b, &[1, 2], &seeded, never).await.unwrap();
        assert_ne!(s.served().last().unwrap().key, 7);
        s.stop().await;
        let s = server_with(|cfg| {
            cfg.deterministic = true;
            cfg.prompt_tokens_details = true;
        })
        .await;
        c.generate(&spec(s.url(), WireKind::Sglang), &[1, 2], &seeded, never)
            .await
            .unwrap();
        assert_eq!(s.served().last().unwrap().key, 7);
        let (g, _) = c
            .generate(&spec(s.url(), WireKind::Vllm), &[1, 2], &seeded, never)
            .await
            .unwrap();
        assert!(g.cached_prompt_tokens.is_some());
        s.stop().await;
    }

    fn spec(url: String, kind: WireKind) -> BackendSpec {
        BackendSpec {
            id: "b".into(),
            url,
            kind,
            model: "scripted".into(),
            tokenizer: String::new(),
            weight: 1.0,
            ..Default::default()
        }
    }

    fn client(retries: u32) -> InferenceClient {
        InferenceClient::new(ClientSettings {
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(5),
            retries,
            backoff: Duration::from_millis(10),
            max_pause: Duration::from_secs(30),
        })
    }

    /// 503s (a server pausing for a weight update) are waited out and retried without
    /// using up the retries; a pause longer than `max_pause` makes the backend
    /// unavailable. An aborted generation comes back as it is, with its tokens so far,
    /// and sending them back after the prompt continues it: the two parts are, token for
    /// token and logprob for logprob, the undisturbed answer.
    #[tokio::test]
    async fn pauses_are_waited_out_and_aborts_come_back_with_their_tokens() {
        let s = server().await;
        let never = CancellationToken::new();
        let sampling = Sampling {
            seed: Some(9),
            max_tokens: Some(64),
            ..Default::default()
        };
        for kind in [WireKind::Vllm, WireKind::Sglang] {
            let b = spec(s.url(), kind);
            let calm = client(0)
                .generate(&b, &[1, 2, 3], &sampling, &never)
                .await
                .unwrap()
                .0;
            s.control(Control {
                mode: FaultMode::Paused,
                count: Some(3),
            });
            // No retries at all: the pauses must not count as faults.
            let (g, _) = client(0)
                .generate(&b, &[1, 2, 3], &sampling, &never)
                .await
                .unwrap();
            assert_eq!(g.token_ids, calm.token_ids, "{kind:?}");
            assert!(
                g.after_pause && !calm.after_pause,
                "{kind:?}: the answer says it waited"
            );
            s.control(Control {
                mode: FaultMode::Abort,
                count: Some(1),
            });
            let (cut, _) = client(0)
                .generate(&b, &[1, 2, 3], &sampling, &never)
                .await
                .unwrap();
            assert_eq!(cut.finish, wire::Finish::Aborted, "{kind:?}");
            assert!(cut.token_ids.len() < calm.token_ids.len());
            assert_eq!(cut.token_ids[..], calm.token_ids[..cut.token_ids.len()]);
            let rest = continue_after(&b, &[1, 2, 3], &cut, &sampling).await;
            assert_joined(&cut, &rest, &calm, &format!("{kind:?}"));
        }
        s.control(Control {
            mode: FaultMode::Paused,
            count: None,
        });
        let short = InferenceClient::new(ClientSettings {
            max_pause: Duration::from_millis(50),
            ..client(0).settings().clone()
        });
        let e = short
            .generate(
                &spec(s.url(), WireKind::Vllm),
                &[1],
                &Sampling::default(),
                &never,
            )
            .await
            .unwrap_err();
        assert!(matches!(e, InferenceError::Unavailable { .. }), "{e}");
        s.stop().await;
    }

    /// Sends `prompt` and the tokens of `cut` to continue it.
    async fn continue_after(
        b: &BackendSpec,
        prompt: &[u32],
        cut: &Generation,
        sampling: &Sampling,
    ) -> Generation {
        let mut more = prompt.to_vec();
        more.extend_from_slice(&cut.token_ids);
        let sampling = Sampling {
            max_tokens: sampling.max_tokens.map(|m| m - cut.token_ids.len() as u64),
            ..sampling.clone()
        };
        client(0)
            .generate(b, &more, &sampling, &CancellationToken::new())
            .await
            .unwrap()
            .0
    }

    /// `cut` then `rest` are `whole`, tokens and logprobs.
    fn assert_joined(cut: &Generation, rest: &Generation, whole: &Generation, what: &str) {
        let mut ids = cut.token_ids.clone();
        ids.extend_from_slice(&rest.token_ids);
        let mut lps = cut.logprobs.clone();
        lps.extend_from_slice(&rest.logprobs);
        assert_eq!(ids, whole.token_ids, "{what}");
        assert_eq!(lps, whole.logprobs, "{what}");
        assert_eq!(rest.finish, whole.finish, "{what}");
    }

    /// A paused vLLM holds requests (no 503). Its pause in `abort` mode answers the
    /// requests in it at once, `finish_reason: "abort"` with their tokens so far; their
    /// continuation waits out the pause inside its request and, after the resume,
    /// completes the answer. In `keep` mode the request is frozen and answered whole
    /// after the resume.
    #[tokio::test]
    async fn a_pause_in_abort_mode_answers_with_the_tokens_so_far_and_keep_freezes() {
        use crate::scripted::pause::PauseMode;
        let s = server_with(|c| c.token_us = 2_000).await;
        let b = spec(s.url(), WireKind::Vllm);
        let sampling = Sampling {
            max_tokens: Some(40),
            seed: Some(4),
            ..Default::default()
        };
        let never = CancellationToken::new();
        let calm = client(0)
            .generate(&b, &[1, 2, 3], &sampling, &never)
            .await
            .unwrap()
            .0;
        for mode in [PauseMode::Abort, PauseMode::Keep] {
            let (c, b2, s2) = (client(0), b.clone(), sampling.clone());
            let pending = tokio::spawn(async move {
                c.generate(&b2, &[1, 2, 3], &s2, &CancellationToken::new())
                    .await
            });
            // Mid-generation (40 tokens at 2 ms each).
            tokio::time::sleep(Duration::from_millis(30)).await;
            s.pause(mode).await;
            if mode == PauseMode::Abort {
                let cut = pending.await.unwrap().unwrap().0;
                assert_eq!(cut.finish, wire::Finish::Aborted);
                assert!(!cut.token_ids.is_empty() && cut.token_ids.len() < calm.token_ids.len());
                let (b3, s3, cut3) = (b.clone(), sampling.clone(), cut.clone());
                let rest =
                    tokio::spawn(async move { continue_after(&b3, &[1, 2, 3], &cut3, &s3).await });
                tokio::time::sleep(Duration::from_millis(200)).await;
                assert!(!rest.is_finished(), "the continuation waits for the resume");
                s.resume();
                assert_joined(&cut, &rest.await.unwrap(), &calm, "abort");
            } else {
                tokio::time::sleep(Duration::from_millis(200)).await;
                assert!(!pending.is_finished(), "nothing is answered while frozen");
                s.resume();
                let (g, _) = pending.await.unwrap().unwrap();
                assert_eq!(g, calm, "{mode:?}");
            }
        }
        assert_eq!(s.stats().faulted, 0, "a pause is not a fault");
        s.stop().await;
    }

    #[tokio::test]
    async fn failures_and_dropped_connections_are_retried_until_the_budget_is_spent() {
        let s = server().await;
        let never = CancellationToken::new();
        for kind in [WireKind::Vllm, WireKind::Sglang] {
            let b = spec(s.url(), kind);
            // Two 500s, then an answer: the third attempt succeeds.
            s.control(Control {
                mode: FaultMode::Fail,
                count: Some(2),
            });
            let (g, _) = client(2)
                .generate(&b, &[1, 2, 3], &Sampling::default(), &never)
                .await
                .unwrap();
            assert!(!g.token_ids.is_empty());
            assert_eq!(g.token_ids.len(), g.logprobs.len());
            // A connection closed mid-answer is retried too.
            s.control(Control {
                mode: FaultMode::Drop,
                count: Some(1),
            });
            client(1)
                .generate(&b, &[1, 2, 3], &Sampling::default(), &never)
                .await
                .unwrap();
        }
        // More failures than retries: the backend is reported unavailable.
        s.control(Control {
            mode: FaultMode::Fail,
            count: Some(5),
        });
        let e = client(2)
            .generate(
                &spec(s.url(), WireKind::Vllm),
                &[1],
                &Sampling::default(),
                &never,
            )
            .await
            .unwrap_err();
        assert!(
            matches!(e, InferenceError::Unavailable { attempts: 3, .. }),
            "{e}"
        );
        assert_eq!(s.stats().faulted, 2 * 2 + 2 + 3);
        s.stop().await;
    }

    #[tokio::test]
    async fn bad_requests_are_not_retried_and_health_follows_the_server() {
        let s = server().await;
        let never = CancellationToken::new();
        let b = spec(s.url(), WireKind::Vllm);
        // Longer than the context: a 400, at once, with the server's words.
        let long: Vec<u32> = vec![5; 40_000];
        let e = client(3)
            .generate(&b, &long, &Sampling::default(), &never)
            .await
            .unwrap_err();
        match e {
            InferenceError::Refused { status, body, .. } => {
                assert_eq!(status, 400);
                assert!(body.contains("maximum context length"), "{body}");
            }
            other => panic!("{other}"),
        }
        let c = client(0);
        assert!(c.health(&b, Duration::from_secs(1)).await.is_ok());
        s.control(Control {
            mode: FaultMode::Down,
            count: None,
        });
        let down = c.health(&b, Duration::from_secs(1)).await.unwrap_err();
        assert!(down.contains("503"), "{down}");
        s.control(Control {
            mode: FaultMode::Ok,
            count: None,
        });
        // A vLLM serving another name is not usable, and the probe says how to fix it.
        let other = BackendSpec {
            model: "policy-v2".into(),
            ..b.clone()
        };
        let wrong = c.health(&other, Duration::from_secs(1)).await.unwrap_err();
        assert!(wrong.contains("--served-model-name policy-v2"), "{wrong}");
        let e = client(3)
            .generate(&other, &[1], &Sampling::default(), &never)
            .await
            .unwrap_err();
        assert!(
            matches!(e, InferenceError::Refused { status: 404, .. }),
            "the stand-in refuses an unknown model as vLLM does: {e}"
        );
        // Cancelling gives up at once.
        s.control(Control {
            mode: FaultMode::Stall,
            count: None,
        });
        let cancel = CancellationToken::new();
        let stop = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            stop.cancel();
        });
        let e = c
            .generate(&b, &[1], &Sampling::default(), &cancel)
            .await
            .unwrap_err();
        assert!(matches!(e, InferenceError::Cancelled), "{e}");
        s.stop().await;
    }
}
