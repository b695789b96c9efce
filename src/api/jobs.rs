//! `/v1/jobs`: what a submit sends, and what submitting, reading, listing and cancelling
//! jobs return.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::domain::{Job, JobResult, Status, Task};
use crate::store::{JobEvent, Submitted};

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
