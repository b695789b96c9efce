//! `/v1/training`: what a training run follows from batch to batch, read from the
//! results' summary columns: reward by batch, by policy version and over time, the
//! distributions of finish reasons, turns and response lengths, the tool-error rate,
//! and throughput and stage latency over time.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::dashboard::Percentiles;

/// A value and how many results had it (a histogram bar or a category's count).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Count {
    /// The value: a finish reason, a number of turns, a bucket's lower bound.
    pub value: String,
    /// Results with it.
    pub jobs: i64,
}

/// One batch's episodes, summarised.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct BatchTraining {
    /// The batch.
    pub batch_id: String,
    /// When it was created (epoch ms).
    pub created_at: i64,
    /// Results it has.
    pub results: i64,
    /// Of those, the ones read for the distributions (its latest, at most
    /// `max_results` of the query).
    pub read: i64,
    /// Of those read, how many ended `done`.
    pub done: i64,
    /// Mean reward of the `done` ones read.
    pub reward_mean: Option<f64>,
    /// Their rewards' population standard deviation.
    pub reward_std: Option<f64>,
    /// Results read per finish reason, most first; a result without an episode counts
    /// under its status in parentheses, e.g. `(failed)`.
    pub finish_reasons: Vec<Count>,
    /// Results read per number of turns, in order of turns.
    pub turns: Vec<Count>,
    /// Mean turns of the results with an episode.
    pub turns_mean: Option<f64>,
    /// Percentiles of `response_ids` lengths.
    pub response_tokens: Percentiles,
    /// The longest response.
    pub response_tokens_max: Option<i64>,
    /// Response lengths in power-of-two buckets: `value` is the bucket's lower bound
    /// (a bucket holds lengths from it to just under twice it; `0` holds 0).
    pub response_tokens_histogram: Vec<Count>,
    /// Tool calls the model made, over the results that count them.
    pub tool_calls: i64,
    /// Of which failed.
    pub tool_errors: i64,
    /// `tool_errors / tool_calls`, absent without calls.
    pub tool_error_rate: Option<f64>,
}

/// Reward under one policy version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct VersionReward {
    /// The oldest version of a result's tokens.
    pub policy_version: i64,
    /// Results read with it.
    pub results: i64,
    /// Of which `done`.
    pub done: i64,
    /// Their mean reward.
    pub reward_mean: Option<f64>,
}

/// One minute's results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct MinuteTraining {
    /// The minute's start (epoch ms).
    pub minute: i64,
    /// Results written in it, whatever their status.
    pub results: i64,
    /// Of which `done`.
    pub done: i64,
    /// Mean reward of the `done` ones.
    pub reward_mean: Option<f64>,
}

/// One stage's times over one minute.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct StageMinute {
    /// `init`, `run` or `eval`.
    pub stage: String,
    /// The minute the stages finished in (epoch ms).
    pub minute: i64,
    /// Queued → started (ms).
    pub wait_ms: Percentiles,
    /// Started → finished (ms).
    pub work_ms: Percentiles,
}

/// Response of `GET /v1/training`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Training {
    /// When it was read (epoch ms).
    pub generated_at: i64,
    /// The window of `minutes` and `stage_latency` (ms).
    pub window_ms: i64,
    /// The latest batches, oldest first: the order a run made them in.
    pub batches: Vec<BatchTraining>,
    /// Mean reward per policy version, over the results read of those batches.
    pub policy_versions: Vec<VersionReward>,
    /// Results and mean reward per minute over the window.
    pub minutes: Vec<MinuteTraining>,
    /// Stage latency per minute and stage over the window (of jobs that have ended).
    pub stage_latency: Vec<StageMinute>,
}
