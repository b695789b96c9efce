//! Stopping and restarting generation at the inference servers for a weight update, in
//! each server's own words.
//!
//! - vLLM (its dev-mode endpoints, served with `VLLM_SERVER_DEV_MODE=1`):
//!   `POST /pause?mode=keep|abort|wait` and `POST /resume`. `keep` freezes the requests
//!   in flight (they go on after the resume; the prefix cache is cleared, so their KV is
//!   recomputed under the new weights), `abort` ends them with the tokens generated so
//!   far (`finish_reason: "abort"`), `wait` answers once they have ended; in every mode
//!   new requests wait until the resume.
//! - SGLang: `POST /pause_generation` with `{"mode": "retract"|"abort"}` and
//!   `POST /continue_generation` with `{}` (0.5.23 wants a body on both). `retract` puts the running requests back in the queue
//!   (they go on after the resume), `abort` ends them with their tokens so far; releases
//!   before the mode existed abort in every case, which the service also handles (it
//!   continues an aborted turn from its tokens). SGLang has no `wait`: the service, which
//!   holds its own new turns, polls `GET /v1/loads` (`/get_load` before 0.5.2x) until
//!   the server has no request left, then pauses it.
//!
//! Every mode holds the service's own new turns as well ([`crate::policy::PolicyWatch`]),
//! so the servers' differences only concern the requests already in them.

use std::time::{Duration, Instant};

use super::client::{InferenceClient, authorized, describe, shorten};
use crate::domain::backend::{BackendSpec, WireKind};
use crate::domain::policy::{BackendAnswer, UpdateMode};
use crate::store::BackendStore;

/// How often `wait` polls an SGLang server's load.
const LOAD_POLL: Duration = Duration::from_millis(100);

impl InferenceClient {
    /// Stops generation at `backend` as `mode` says; returns once it has (for `wait`,
    /// once the requests in flight have ended). The error says what went wrong and,
    /// where it can, what to do.
    pub async fn pause_backend(
        &self,
        backend: &BackendSpec,
        mode: UpdateMode,
    ) -> Result<(), String> {
        let base = backend.url.trim_end_matches('/');
        match backend.kind {
            WireKind::Vllm => {
                let vllm_mode = match mode {
                    UpdateMode::Pause => "keep",
                    UpdateMode::Abort => "abort",
                    UpdateMode::Wait => "wait",
                };
                self.control(backend, format!("{base}/pause?mode={vllm_mode}"), None)
                    .await
            }
            WireKind::Sglang => {
                if mode == UpdateMode::Wait {
                    self.wait_idle(backend).await?;
                }
                let sglang_mode = match mode {
                    UpdateMode::Pause => "retract",
                    UpdateMode::Abort | UpdateMode::Wait => "abort",
                };
                self.control(
                    backend,
                    format!("{base}/pause_generation"),
                    Some(serde_json::json!({"mode": sglang_mode})),
                )
                .await
            }
        }
    }

    /// Lets `backend` generate again. (SGLang 0.5.23 wants a JSON body, even empty;
    /// older releases ignore it.)
    pub async fn resume_backend(&self, backend: &BackendSpec) -> Result<(), String> {
        let base = backend.url.trim_end_matches('/');
        match backend.kind {
            WireKind::Vllm => self.control(backend, format!("{base}/resume"), None).await,
            WireKind::Sglang => {
                let url = format!("{base}/continue_generation");
                self.control(backend, url, Some(serde_json::json!({})))
                    .await
            }
        }
    }

    /// Labels `backend`'s weights with policy `version` (`POST /update_weight_version`,
    /// which vLLM and SGLang both serve; SGLang is told not to abort anything), so the
    /// weight version the server reports with its answers is the service's. `Ok(false)`
    /// when the server has no such endpoint.
    pub async fn label_backend(&self, backend: &BackendSpec, version: i64) -> Result<bool, String> {
        let url = format!(
            "{}/update_weight_version",
            backend.url.trim_end_matches('/')
        );
        let mut body = serde_json::json!({"new_version": version.to_string()});
        if backend.kind == WireKind::Sglang {
            body["abort_all_requests"] = false.into();
        }
        match self.post(backend, &url, Some(body)).await? {
            (status, _) if status.is_success() => Ok(true),
            (reqwest::StatusCode::NOT_FOUND, _) => Ok(false),
            (status, text) => Err(refusal(&url, backend, status, &text)),
        }
    }

    /// Posts a control request; a refusal says what went wrong, and a missing endpoint
    /// how to get it.
    async fn control(
        &self,
        backend: &BackendSpec,
        url: String,
        body: Option<serde_json::Value>,
    ) -> Result<(), String> {
        match self.post(backend, &url, body).await? {
            (status, _) if status.is_success() => Ok(()),
            (status, text) => Err(refusal(&url, backend, status, &text)),
        }
    }

    /// Posts a control request: the answer's status and body, or why none came.
    async fn post(
        &self,
        backend: &BackendSpec,
        url: &str,
        body: Option<serde_json::Value>,
    ) -> Result<(reqwest::StatusCode, String), String> {
        let mut req =
            authorized(self.http.post(url), backend).timeout(self.settings().request_timeout);
        if let Some(body) = body {
            req = req.json(&body);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| format!("POST {url}: {}", describe(&e)))?;
        let status = resp.status();
        Ok((status, resp.text().await.unwrap_or_default()))
    }

    /// Waits until an SGLang server has no request running or queued: by
    /// `GET /v1/loads?include=core` (0.5.2x), or `GET /get_load` where that is missing
    /// (the earlier 0.5 releases).
    async fn wait_idle(&self, backend: &BackendSpec) -> Result<(), String> {
        let base = backend.url.trim_end_matches('/');
        let mut url = format!("{base}/v1/loads?include=core");
        let t0 = Instant::now();
        loop {
            let resp = authorized(self.http.get(&url), backend)
                .timeout(self.settings().connect_timeout.max(Duration::from_secs(5)))
                .send()
                .await
                .map_err(|e| format!("GET {url}: {}", describe(&e)))?;
            if resp.status() == reqwest::StatusCode::NOT_FOUND && !url.ends_with("/get_load") {
                url = format!("{base}/get_load");
                continue;
            }
            if !resp.status().is_success() {
                return Err(format!("GET {url} answered {}", resp.status()));
            }
            let load: serde_json::Value = resp
                .json()
                .await
                .map_err(|e| format!("GET {url}: {}", describe(&e)))?;
            if requests_in(&load) == Some(0) {
                return Ok(());
            }
            if t0.elapsed() > self.settings().request_timeout {
                return Err(format!(
                    "the server still had requests after {:?}",
                    self.settings().request_timeout
                ));
            }
            tokio::time::sleep(LOAD_POLL).await;
        }
    }
}

/// A control request's refusal, with how to get a missing endpoint.
fn refusal(url: &str, backend: &BackendSpec, status: reqwest::StatusCode, text: &str) -> String {
    let hint = match (status.as_u16(), backend.kind) {
        (404, WireKind::Vllm) => {
            ": vLLM serves /pause and /resume only in its dev mode; start it with VLLM_SERVER_DEV_MODE=1"
        }
        (404, WireKind::Sglang) => {
            ": this SGLang has no /pause_generation; use a 0.5 release or newer"
        }
        _ => "",
    };
    format!("POST {url} answered {status}{hint}: {}", shorten(text))
}

/// Pauses every backend of `backends` at once, as `mode` says; one answer each.
pub async fn pause_all(
    client: &InferenceClient,
    backends: &[BackendSpec],
    mode: UpdateMode,
) -> Vec<BackendAnswer> {
    let each = backends.iter().map(|b| async move {
        let r = client.pause_backend(b, mode).await;
        answer(b, "paused", r)
    });
    futures::future::join_all(each).await
}

/// Resumes every backend of `backends` at once; one answer each.
pub async fn resume_all(client: &InferenceClient, backends: &[BackendSpec]) -> Vec<BackendAnswer> {
    let each = backends.iter().map(|b| async move {
        let r = client.resume_backend(b).await;
        answer(b, "resumed", r)
    });
    futures::future::join_all(each).await
}

/// Resumes every backend of `backends` (see [`resume_all`]) after the service's own
/// pause, and records in `store` which are still owed a resume (those that did not
/// answer: down, unreachable), so the reconciler asks them again until they do; a
/// backend that answered is owed nothing.
pub async fn resume_all_owed(
    client: &InferenceClient,
    store: &dyn BackendStore,
    backends: &[BackendSpec],
) -> Vec<BackendAnswer> {
    let answers = resume_all(client, backends).await;
    for a in &answers {
        if let Err(e) = store.owe_resume(&a.backend, !a.ok).await {
            tracing::warn!(backend = %a.backend, error = %e, "cannot record whether the backend is owed a resume");
        }
    }
    answers
}

/// Labels every backend of `backends` with policy `version`, at once (see
/// [`InferenceClient::label_backend`]); a failure is logged, not fatal: the label is for
/// the servers' own reports, the service tags tokens itself.
pub async fn label_all(client: &InferenceClient, backends: &[BackendSpec], version: i64) {
    let each = backends.iter().map(|b| async move {
        match client.label_backend(b, version).await {
            Ok(true) => tracing::debug!(backend = %b.id, version, "weight version labelled"),
            Ok(false) => {
                tracing::debug!(backend = %b.id, "the server keeps no weight version label")
            }
            Err(e) => {
                tracing::warn!(backend = %b.id, version, error = %e, "weight version label not set")
            }
        }
    });
    futures::future::join_all(each).await;
}

/// One backend's answer, logged.
fn answer(b: &BackendSpec, what: &'static str, r: Result<(), String>) -> BackendAnswer {
    match r {
        Ok(()) => {
            tracing::info!(backend = %b.id, "generation {what}");
            BackendAnswer {
                backend: b.id.clone(),
                ok: true,
                error: None,
            }
        }
        Err(e) => {
            tracing::warn!(backend = %b.id, error = %e, "generation not {what}");
            BackendAnswer {
                backend: b.id.clone(),
                ok: false,
                error: Some(e),
            }
        }
    }
}

/// The requests running and queued in an SGLang load answer, one entry per data
/// parallel rank: `/v1/loads`' `{"loads": [{"num_running_reqs", "num_waiting_reqs"}]}`
/// or `/get_load`'s `[{"num_reqs", "num_waiting_reqs"}]`; `None` when the answer is of
/// neither shape.
fn requests_in(load: &serde_json::Value) -> Option<u64> {
    let ranks = match load {
        serde_json::Value::Array(a) => a.as_slice(),
        serde_json::Value::Object(o) if o.contains_key("loads") => load["loads"].as_array()?,
        one @ serde_json::Value::Object(_) => std::slice::from_ref(one),
        _ => return None,
    };
    ranks.iter().try_fold(0u64, |n, r| {
        let running = r["num_running_reqs"]
            .as_u64()
            .or_else(|| r["num_reqs"].as_u64())?;
        Some(n + running + r["num_waiting_reqs"].as_u64().unwrap_or(0))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_sglang_load_counts_running_and_queued_requests_over_its_ranks() {
        let load = serde_json::json!([
            {"dp_rank": 0, "num_reqs": 2, "num_waiting_reqs": 1, "num_tokens": 90},
            {"dp_rank": 1, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}
        ]);
        assert_eq!(requests_in(&load), Some(3));
        assert_eq!(
            requests_in(&serde_json::json!([{"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0}])),
            Some(0)
        );
        assert_eq!(requests_in(&serde_json::json!({"error": "x"})), None);
        // 0.5.2x's /v1/loads.
        let loads = serde_json::json!({"version": "0.5.23", "loads": [
            {"dp_rank": 0, "num_running_reqs": 1, "num_waiting_reqs": 2},
            {"dp_rank": 1, "num_running_reqs": 0, "num_waiting_reqs": 0}
        ]});
        assert_eq!(requests_in(&loads), Some(3));
    }
}
