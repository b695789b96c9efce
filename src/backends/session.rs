//! A job's session with the backend pool: the backend it was assigned, kept for every
//! turn, and the move to another one when it dies.
//!
//! When a backend stops answering (connection errors, timeouts or 5xx on every retry),
//! the session marks it down in the database, so other jobs stop picking it until the
//! health probe sees it back, and asks the pool for another backend of the same model,
//! excluding every backend that failed this turn. The episode continues there with the
//! same token IDs (the new backend's prefix cache is cold, the tokens are unchanged);
//! the move is recorded in the trajectory and the job's event log.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use super::client::{InferenceClient, InferenceError};
use super::generate::{BackendSwitch, GenerateError, Generated, Generator};
use super::wire::Sampling;
use crate::domain::EpochMs;
use crate::domain::Stage;
use crate::domain::backend::BackendSpec;
use crate::domain::placement::{AffinityPolicy, AssignRequest};
use crate::store::{BackendStore, JobStore};

/// Why a session could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    /// No healthy backend serves the model.
    #[error("{0}")]
    NoBackend(String),
    /// The database did not answer.
    #[error("cannot assign a backend: {0}")]
    Store(#[from] crate::store::StoreError),
}

/// A job's assigned backend.
pub struct BackendSession {
    store: Arc<dyn BackendStore>,
    /// The job's event log, where a switch of backend is noted.
    events: Arc<dyn JobStore>,
    client: InferenceClient,
    job_id: String,
    group_key: Option<String>,
    model: String,
    policy: AffinityPolicy,
    node: String,
    current: BackendSpec,
    switches: Vec<BackendSwitch>,
    cancel: CancellationToken,
}

impl std::fmt::Debug for BackendSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackendSession")
            .field("job_id", &self.job_id)
            .field("backend", &self.current.id)
            .finish_non_exhaustive()
    }
}

/// What a session needs to know about its job.
#[derive(Debug, Clone)]
pub struct SessionJob {
    /// The job.
    pub job_id: String,
    /// Its prompt group (`batch/group`), whose samples should share a backend.
    pub group_key: Option<String>,
    /// The model the task asks for (any when `None`).
    pub model: Option<String>,
    /// The node running it (for the event log).
    pub node: String,
}

impl BackendSession {
    /// Assigns (or, for a retried RUN, finds again) the job's backend from `store`;
    /// switches are noted in the job's log in `events` (usually the same store).
    pub async fn open(
        store: Arc<dyn BackendStore>,
        events: Arc<dyn JobStore>,
        client: InferenceClient,
        job: SessionJob,
        policy: AffinityPolicy,
        cancel: CancellationToken,
    ) -> Result<Self, SessionError> {
        let req = AssignRequest {
            job_id: job.job_id.clone(),
            group_key: job.group_key.clone(),
            model: job.model.clone(),
            exclude: Vec::new(),
            policy,
        };
        let Some(a) = store.assign_backend(&req, EpochMs::now()).await? else {
            return Err(SessionError::NoBackend(match &job.model {
                Some(m) => format!("no healthy inference backend serves model `{m}`"),
                None => "no healthy inference backend is registered".into(),
            }));
        };
        tracing::debug!(backend = %a.backend.id, reason = ?a.reason, "backend assigned");
        Ok(BackendSession {
            store,
            events,
            client,
            job_id: job.job_id,
            group_key: job.group_key,
            model: a.backend.model.clone(),
            policy,
            node: job.node,
            current: a.backend,
            switches: Vec::new(),
            cancel,
        })
    }

    /// The backend in use.
    pub fn backend(&self) -> &BackendSpec {
        &self.current
    }

    /// Marks the current backend down and moves to another one of the same model; the
    /// error says why there is none.
    async fn move_on(
        &mut self,
        failed: &mut Vec<String>,
        turn: usize,
        why: &str,
    ) -> Result<(), GenerateError> {
        let from = self.current.id.clone();
        match self
            .store
            .set_backend_health(&from, false, Some(why), EpochMs::now())
            .await
        {
            Ok(Some(true)) => tracing::warn!(backend = %from, error = why, "backend marked down"),
            Ok(_) => {}
            Err(e) => tracing::warn!(backend = %from, error = %e, "cannot mark the backend down"),
        }
        failed.push(from.clone());
        let req = AssignRequest {
            job_id: self.job_id.clone(),
            group_key: self.group_key.clone(),
            model: Some(self.model.clone()),
            exclude: failed.clone(),
            policy: self.policy,
        };
        let next = self.store.assign_backend(&req, EpochMs::now()).await.map_err(|e| {
            GenerateError::Unavailable(format!(
                "backend `{from}` failed ({why}) and the database did not answer to move to another: {e}"
            ))
        })?;
        let Some(a) = next else {
            return Err(GenerateError::Unavailable(format!(
                "backend `{from}` failed ({why}) and no other healthy backend serves model `{}`",
                self.model
            )));
        };
        let to = a.backend.id.clone();
        tracing::warn!(from = %from, to = %to, turn, "job moved to another backend");
        metrics::counter!(crate::metrics::BACKEND_SWITCHES, "from" => from.clone()).increment(1);
        let detail = format!("{from} -> {to} at turn {turn}: {why}");
        if let Err(e) = self
            .events
            .record_event(
                &self.job_id,
                "backend_switch",
                Some(Stage::Run),
                Some(&self.node),
                Some(&detail),
                EpochMs::now(),
            )
            .await
        {
            tracing::warn!(error = %e, "cannot log the backend switch");
        }
        self.switches.push(BackendSwitch {
            turn,
            from,
            to,
            reason: why.to_string(),
        });
        self.current = a.backend;
        Ok(())
    }
}

/// Whether a 400 answer says the request does not fit the model's context. vLLM 0.32
/// clamps `max_tokens` to the room left and refuses only a prompt that leaves none, in
/// its own words: "max_tokens must be at least 1, got 0" for a prompt of exactly the
/// context's length, "max_tokens=… cannot be greater than max_model_len=…"; older
/// servers and SGLang speak of the context length. Public for the real-server suite.
pub fn is_context_error(body: &str) -> bool {
    let b = body.to_ascii_lowercase();
    b.contains("context length")
        || b.contains("context_length")
        || b.contains("too long")
        || b.contains("max_tokens must be at least 1")
        || b.contains("cannot be greater than max_model_len")
}

#[async_trait]
impl Generator for BackendSession {
    async fn generate(
        &mut self,
        prompt_ids: &[u32],
        sampling: &Sampling,
        turn: usize,
    ) -> Result<Generated, GenerateError> {
        let mut failed = Vec::new();
        let mut waited = Duration::ZERO;
        loop {
            let t0 = std::time::Instant::now();
            let r = self
                .client
                .generate(&self.current, prompt_ids, sampling, &self.cancel)
                .await;
            match r {
                Ok((generation, wait)) => {
                    return Ok(Generated {
                        generation,
                        backend: self.current.id.clone(),
                        logprobs_mode: self.current.logprobs(),
                        backend_wait: waited + wait,
                    });
                }
                Err(InferenceError::Unavailable { last, .. }) => {
                    waited += t0.elapsed();
                    self.move_on(&mut failed, turn, &last).await?;
                }
                Err(InferenceError::Refused { status, body, .. })
                    if status == 400 && is_context_error(&body) =>
                {
                    return Err(GenerateError::ContextFull(body));
                }
                Err(e @ InferenceError::Cancelled) => {
                    return Err(GenerateError::Refused(e.to_string()));
                }
                Err(e) => return Err(GenerateError::Refused(e.to_string())),
            }
        }
    }

    fn take_switches(&mut self) -> Vec<BackendSwitch> {
        std::mem::take(&mut self.switches)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_refusals_are_known_in_each_servers_words() {
        // As vLLM 0.32 answers (nested error bodies), and as older servers did.
        for body in [
            r#"{"error": {"message": "max_tokens must be at least 1, got 0.", "type": "BadRequestError", "param": "max_tokens", "code": 400}}"#,
            r#"{"error": {"message": "max_tokens=2048 cannot be greater than max_model_len=1024. Please request fewer output tokens.", "type": "BadRequestError", "param": "max_tokens", "code": 400}}"#,
            r#"{"object": "error", "message": "This model's maximum context length is 1024 tokens."}"#,
        ] {
            assert!(is_context_error(body), "{body}");
        }
        assert!(!is_context_error(
            r#"{"error": {"message": "top_k must be 0 (disable), or at least 1, got -2.", "type": "BadRequestError", "param": "top_k", "code": 400}}"#
        ));
    }
}
