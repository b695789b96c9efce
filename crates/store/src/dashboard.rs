//! Dashboards: the status page's reads, each one of the documented SQL views
//! (`migrations/views.sql`), so the page, Grafana and a user's own SQL
//! all see the same numbers.
//!
//! The rows are the views' columns as they are; what the views leave to the reader
//! (latency percentiles over a time window) is computed here from `stage_timings`.
//! They are the store's, not the API's: the gateway copies them into the HTTP API's
//! types of the same names, so a view's columns can change without the API following.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::dialect::Dialect;
use super::query::query;
use super::sql_store::SqlStore;
use super::{StoreResult, sql};

/// A row of `batch_progress`: one batch's counters and rewards so far.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
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
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
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

/// One stage's time from `stage_timings` rows: `wait_ms` and `work_ms` of the stages
/// that finished since a time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, sqlx::FromRow)]
pub struct StageTiming {
    /// `init`, `run` or `eval`.
    pub stage: String,
    /// Queued → started (ms).
    pub wait_ms: Option<i64>,
    /// Started → finished (ms).
    pub work_ms: Option<i64>,
    /// When the stage finished (epoch ms).
    pub finished_at: i64,
}

/// One result's summary columns (migration `result_stats`): what the training view
/// aggregates per batch, per policy version and over time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, sqlx::FromRow)]
pub struct ResultStats {
    /// Its batch.
    pub batch_id: String,
    /// Its terminal status.
    pub status: String,
    /// Its reward.
    pub reward: Option<f64>,
    /// Why its episode ended (NULL without an episode).
    pub finish_reason: Option<String>,
    /// Its episode's turns.
    pub turns: Option<i64>,
    /// Its trajectory's `response_ids` length.
    pub response_tokens: Option<i64>,
    /// Tool calls the model made.
    pub tool_calls: Option<i64>,
    /// Of which failed.
    pub tool_errors: Option<i64>,
    /// The oldest policy version of its tokens.
    pub policy_version: Option<i64>,
    /// When it was written (epoch ms).
    pub created_at: i64,
}

/// A row of `throughput_per_minute`: results of one minute and final status.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
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
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
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
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
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
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
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
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
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

/// Reads of the dashboard views, newest first where there can be many rows.
#[async_trait]
pub trait DashboardStore: Send + Sync {
    /// The `limit` most recently created batches.
    async fn batch_progress(&self, limit: i64) -> StoreResult<Vec<BatchProgress>>;
    /// The three stages' queues, in pipeline order.
    async fn stage_queues(&self) -> StoreResult<Vec<StageQueue>>;
    /// Wait and work times of stages that finished at or after `since` (epoch ms), of
    /// jobs that have ended, the latest `limit`. A job still running shows its stages
    /// when it ends: that is what lets the read go through the ended jobs' index rather
    /// than every job there ever was.
    async fn stage_timings(&self, since: i64, limit: i64) -> StoreResult<Vec<StageTiming>>;
    /// Results per minute and status, for the minutes at or after `since` (epoch ms).
    async fn throughput(&self, since: i64) -> StoreResult<Vec<ThroughputMinute>>;
    /// Failure reasons (as `failures_by_reason` groups them) of the latest `scan`
    /// failures that ended at or after `since` (epoch ms), the most recent `limit`.
    async fn failures(&self, since: i64, scan: i64, limit: i64) -> StoreResult<Vec<FailureReason>>;
    /// Every backend's health and load.
    async fn backend_load(&self) -> StoreResult<Vec<BackendLoad>>;
    /// Live RUN sandboxes per node and sandbox backend.
    async fn sandbox_counts(&self) -> StoreResult<Vec<SandboxCount>>;
    /// The `limit` most recently created sampling batches.
    async fn sampling_progress(&self, limit: i64) -> StoreResult<Vec<SamplingProgress>>;
    /// The summary columns of `batch`'s latest `limit` results, newest first.
    async fn result_stats(&self, batch: &str, limit: i64) -> StoreResult<Vec<ResultStats>>;
}

#[async_trait]
impl<D: Dialect> DashboardStore for SqlStore<D> {
    async fn batch_progress(&self, limit: i64) -> StoreResult<Vec<BatchProgress>> {
        let mut conn = self.reader().await?;
        Ok(query(sql::DASHBOARD_BATCHES)
            .bind(limit)
            .fetch_all(&mut *conn)
            .await?)
    }

    async fn stage_queues(&self) -> StoreResult<Vec<StageQueue>> {
        let mut conn = self.reader().await?;
        Ok(query(sql::DASHBOARD_QUEUES).fetch_all(&mut *conn).await?)
    }

    async fn stage_timings(&self, since: i64, limit: i64) -> StoreResult<Vec<StageTiming>> {
        let mut conn = self.reader().await?;
        Ok(query(sql::DASHBOARD_TIMINGS)
            .bind(since)
            .bind(limit)
            .fetch_all(&mut *conn)
            .await?)
    }

    async fn throughput(&self, since: i64) -> StoreResult<Vec<ThroughputMinute>> {
        let mut conn = self.reader().await?;
        Ok(query(sql::DASHBOARD_THROUGHPUT)
            .bind(since)
            .fetch_all(&mut *conn)
            .await?)
    }

    async fn failures(&self, since: i64, scan: i64, limit: i64) -> StoreResult<Vec<FailureReason>> {
        let mut conn = self.reader().await?;
        Ok(query(sql::DASHBOARD_FAILURES)
            .bind(since)
            .bind(scan)
            .bind(limit)
            .fetch_all(&mut *conn)
            .await?)
    }

    async fn backend_load(&self) -> StoreResult<Vec<BackendLoad>> {
        let mut conn = self.reader().await?;
        Ok(query(sql::DASHBOARD_BACKENDS).fetch_all(&mut *conn).await?)
    }

    async fn sandbox_counts(&self) -> StoreResult<Vec<SandboxCount>> {
        let mut conn = self.reader().await?;
        Ok(query(sql::DASHBOARD_SANDBOXES)
            .fetch_all(&mut *conn)
            .await?)
    }

    async fn sampling_progress(&self, limit: i64) -> StoreResult<Vec<SamplingProgress>> {
        let mut conn = self.reader().await?;
        Ok(query(sql::DASHBOARD_SAMPLING)
            .bind(limit)
            .fetch_all(&mut *conn)
            .await?)
    }

    async fn result_stats(&self, batch: &str, limit: i64) -> StoreResult<Vec<ResultStats>> {
        let mut conn = self.reader().await?;
        Ok(query(sql::RESULT_STATS)
            .bind(batch)
            .bind(limit)
            .fetch_all(&mut *conn)
            .await?)
    }
}
