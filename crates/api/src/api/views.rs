//! The dashboard views' rows as the API shows them (in `GET /v1/dashboard`): one type
//! per view, with the view's columns as fields, as the views document them
//! (`migrations/views.sql`).
//!
//! The store reads the views into rows of its own, and the gateway copies those into
//! these: a view's column can be renamed, or a column added, without the API changing
//! (the copy is where the compiler then points), and these types need no database.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A row of `batch_progress`: one batch's counters and rewards so far.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct BatchProgress {
    /// The batch.
    pub batch_id: String,
    /// When it was created (epoch ms).
    pub created_at: i64,
    /// Jobs submitted into it.
    pub submitted: i64,
    /// Jobs that ended, whatever their status.
    pub finished: i64,
    /// Jobs not ended yet.
    pub in_flight: i64,
    /// Jobs that ended `done`.
    pub done: i64,
    /// Jobs that ended `failed`.
    pub failed: i64,
    /// Jobs that ended `cancelled`.
    pub cancelled: i64,
    /// Jobs that ended `timed_out`.
    pub timed_out: i64,
    /// Jobs that ended `stale` (scored, older than their `max_staleness` allowed).
    pub stale: i64,
    /// Results carrying a reward.
    pub rewarded: i64,
    /// Their mean reward.
    pub reward_mean: Option<f64>,
    /// When its latest result was written (epoch ms).
    pub last_result_at: Option<i64>,
}

/// A row of `stage_queue`: one stage's queue.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct StageQueue {
    /// `init`, `run` or `eval`.
    pub stage: String,
    /// 1–3, pipeline order.
    pub position: i64,
    /// Jobs waiting in its queue.
    pub queued: i64,
    /// Jobs a worker holds.
    pub running: i64,
    /// When the longest-waiting queued job was queued (epoch ms).
    pub oldest_queued_at: Option<i64>,
}

/// A row of `throughput_per_minute`: results of one minute and final status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ThroughputMinute {
    /// The minute's start (epoch ms).
    pub minute: i64,
    /// The results' final status.
    pub status: String,
    /// How many.
    pub jobs: i64,
    /// Their mean reward.
    pub reward_mean: Option<f64>,
}

/// A row of `failures_by_reason`: failed or timed-out jobs with one error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct FailureReason {
    /// `failed` or `timed_out`.
    pub status: String,
    /// The jobs' task kind.
    pub kind: String,
    /// The error's first 160 characters.
    pub reason: String,
    /// How many jobs ended so.
    pub jobs: i64,
    /// When the latest did (epoch ms).
    pub last_at: i64,
    /// One of them, to look at.
    pub example_job_id: String,
}

/// A row of `backend_load`: one inference backend's health and load (no API key).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct BackendLoad {
    /// The backend.
    pub backend_id: String,
    /// `vllm`, `sglang` or `openai`.
    pub kind: String,
    /// The model it serves.
    pub model: String,
    /// Its base URL.
    pub url: String,
    /// Its routing weight.
    pub weight: f64,
    /// 1 when the last probe found it healthy, else 0.
    pub healthy: i64,
    /// When it was last probed (epoch ms).
    pub checked_at: Option<i64>,
    /// Why the last probe failed.
    pub last_error: Option<String>,
    /// `config` or `api`: where it was registered.
    pub source: String,
    /// RUN jobs assigned to it now.
    pub in_flight: i64,
}

/// A row of `sandbox_counts`: live RUN sandboxes of one node and sandbox backend.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SandboxCount {
    /// The node.
    pub node: String,
    /// `bwrap`, `apptainer` or `local`.
    pub backend: String,
    /// How many.
    pub sandboxes: i64,
    /// The oldest one's creation (epoch ms).
    pub oldest_created_at: i64,
    /// The earliest lease to lapse (epoch ms).
    pub earliest_lease_until: i64,
}

/// A row of `sampling_progress`: one dynamic-sampling batch's target and counters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SamplingProgress {
    /// The sampling batch.
    pub batch_id: String,
    /// `running`, `complete`, `exhausted` or `cancelled`.
    pub status: String,
    /// Why it ended.
    pub reason: Option<String>,
    /// Samples per group.
    pub group_size: i64,
    /// Informative groups wanted.
    pub target_groups: i64,
    /// Informative groups kept.
    pub informative: i64,
    /// Informative groups beyond the target.
    pub surplus: i64,
    /// Groups whose samples all scored alike.
    pub uniform: i64,
    /// Groups that ended without all their samples.
    pub incomplete: i64,
    /// Groups cancelled once the target was reached.
    pub cancelled_groups: i64,
    /// Groups replaced because a sample was stale.
    pub stale_groups: i64,
    /// Groups still running at the end, kept for a later batch (`on_cancel: keep`).
    pub kept_groups: i64,
    /// Kept groups of an earlier batch it adopted (`carry_from`).
    pub adopted_groups: i64,
    /// Groups started.
    pub groups_launched: i64,
    /// Groups decided.
    pub groups_decided: i64,
    /// Samples that ended.
    pub samples_completed: i64,
    /// Jobs the early cancel saved.
    pub jobs_saved: i64,
    /// Sandbox time used (ms).
    pub sandbox_ms_used: i64,
    /// Sandbox time the early cancel saved (ms).
    pub sandbox_ms_saved: i64,
    /// When it was created (epoch ms).
    pub created_at: i64,
    /// When it ended (epoch ms).
    pub ended_at: Option<i64>,
}
