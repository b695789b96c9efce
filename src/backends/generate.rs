//! What the agent loop asks of inference: generate the next turn from token IDs. The
//! loop (in `agent`) is written against [`Generator`]; the job's backend session
//! implements it (see [`super::session`]), a stand-in does in tests.

use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::wire::{Generation, Sampling};
use crate::domain::backend::LogprobsMode;

/// One generated turn, and the backend that produced it.
#[derive(Debug, Clone)]
pub struct Generated {
    /// The tokens, logprobs and finish reason.
    pub generation: Generation,
    /// The backend's id.
    pub backend: String,
    /// Which logprobs the backend returns.
    pub logprobs_mode: LogprobsMode,
    /// Time spent waiting for backends (requests in flight and backoff between
    /// retries), as opposed to building requests and reading answers.
    pub backend_wait: Duration,
}

/// Why no backend produced a turn.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum GenerateError {
    /// The backend refused the request because prompt and `max_tokens` exceed its
    /// context length.
    #[error("the backend's context is full: {0}")]
    ContextFull(String),
    /// No backend could answer (all down, or none registered for the model).
    #[error("{0}")]
    Unavailable(String),
    /// The backend refused the request or answered without token IDs; another attempt
    /// would fail the same way.
    #[error("{0}")]
    Refused(String),
}

/// Where turns are generated: the job's backend (switching when it dies), or a stand-in
/// in unit tests.
#[async_trait]
pub trait Generator: Send {
    /// Generates the next turn from `prompt_ids`. `turn` is the 0-based turn index.
    async fn generate(
        &mut self,
        prompt_ids: &[u32],
        sampling: &Sampling,
        turn: usize,
    ) -> Result<Generated, GenerateError>;

    /// The moves to other backends made so far (taken: a second call returns none).
    fn take_switches(&mut self) -> Vec<BackendSwitch>;
}

/// A move of the job to another backend in the middle of an episode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BackendSwitch {
    /// The turn (0-based) being generated when it happened.
    pub turn: usize,
    /// The backend given up on.
    pub from: String,
    /// The backend the episode continued on.
    pub to: String,
    /// Why.
    pub reason: String,
}
