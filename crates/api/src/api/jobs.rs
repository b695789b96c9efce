//! `/v1/jobs`: what a submit sends, and what submitting, reading, listing and cancelling
//! jobs return.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use rollout_core::domain::{Job, JobResult, Stage, Status, Task};

/// Body of `POST /v1/jobs`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SubmitRequest {
    /// The tasks to run; each becomes one job. (The served document states the most one
    /// request may carry, `gateway.max_tasks_per_request`.)
    #[schema(min_items = 1)]
    pub tasks: Vec<Task>,
    /// Batch to add the jobs to (created if new). Letters, digits, `-`, `_`. A fresh id is
    /// generated when absent.
    #[serde(default)]
    #[schema(pattern = "^[A-Za-z0-9_-]{1,128}$")]
    pub batch_id: Option<String>,
}

/// Response of `POST /v1/jobs`: one entry per task, in order.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct SubmitResponse {
    /// The batch.
    pub batch_id: String,
    /// The jobs.
    pub jobs: Vec<Submitted>,
}

/// What submit did with one task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Submitted {
    /// The job's id (the existing one for a repeated `client_id`).
    pub id: String,
    /// The caller's key, echoed.
    pub client_id: Option<String>,
    /// The job's status now.
    pub status: Status,
    /// Its current stage.
    pub stage: Stage,
    /// True when the `client_id` already existed and no new job was created.
    pub duplicate: bool,
}

/// Response of `GET /v1/jobs/{id}`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct JobView {
    /// The job's state and per-stage timings.
    pub job: Job,
    /// Its result, once it ended.
    pub result: Option<JobResult>,
    /// Its event log.
    pub events: Vec<JobEvent>,
}

/// One entry of a job's event log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct JobEvent {
    /// When (epoch ms).
    pub at: i64,
    /// A status name for transitions, or a named event such as `republished`.
    pub event: String,
    /// Stage at the time.
    pub stage: Option<String>,
    /// Stage-entry counter at the time.
    pub epoch: Option<i64>,
    /// Attempt counter at the time.
    pub attempt: Option<i64>,
    /// Node involved.
    pub node: Option<String>,
    /// Error text or other detail.
    pub detail: Option<String>,
}

/// Response of `GET /v1/jobs`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct JobPage {
    /// Jobs in id (creation) order.
    pub jobs: Vec<Job>,
    /// Pass as `cursor` to get the next page; absent on the last page (a page cut short
    /// by the byte budget has one).
    pub next_cursor: Option<String>,
}

/// Response of `POST /v1/jobs/{id}/cancel`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct CancelResponse {
    /// The job.
    pub id: String,
    /// The status recorded: `cancelled`, or `failed` when the database refused the
    /// cancelled end (the result's `error` says why).
    pub status: Status,
}
