//! What the stand-in has served: counters since start ([`Stats`], `GET /stats`) and the
//! last requests answered with their tokens ([`Served`], `GET /requests`). Tests and
//! benchmarks read them to check token-exactness and cache hits against what the server
//! really sent, which the service's own view cannot prove.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};

use crate::Shared;

/// Counters since start: what a test compares with what the service says it sent.
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
    /// Requests being served now: from their arrival, including those a pause holds
    /// before they generate.
    pub in_flight: u64,
    /// Requests let in and generating now (vLLM's `num_requests_running`): a test that
    /// needs an update to land in the middle of a generation waits for this, since a
    /// request still waiting at a `wait` pause is held, not let finish.
    pub generating: u64,
    /// Requests whose client went away before the answer was ready (the handler was
    /// dropped): what a cancelled job's closed connection looks like from here.
    pub aborted: u64,
}

/// One served request, as `GET /requests` lists it: the token IDs and logprobs the
/// server sent, for tests that check the service stored exactly those.
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

impl Shared {
    /// The counters now.
    pub(crate) fn stats(&self) -> Stats {
        Stats {
            requests: self.requests.load(Ordering::Relaxed),
            prompt_tokens: self.prompt_tokens.load(Ordering::Relaxed),
            cached_tokens: self.cached_tokens.load(Ordering::Relaxed),
            completion_tokens: self.completion_tokens.load(Ordering::Relaxed),
            faulted: self.faulted.load(Ordering::Relaxed),
            in_flight: self.in_flight.load(Ordering::Relaxed),
            generating: self.pause.load().1,
            aborted: self.aborted.load(Ordering::Relaxed),
        }
    }
}

/// `GET /stats`: the counters since start.
pub(crate) async fn get_stats(State(s): State<Arc<Shared>>) -> Json<Stats> {
    Json(s.stats())
}

/// `GET /requests`: the last requests served, oldest first.
pub(crate) async fn get_requests(State(s): State<Arc<Shared>>) -> Json<Vec<Served>> {
    Json(s.served.lock().expect("lock").iter().cloned().collect())
}
