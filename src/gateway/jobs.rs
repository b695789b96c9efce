//! `/v1/jobs`: submit, inspect, list and cancel jobs.

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use serde::Deserialize;
use utoipa::IntoParams;

use super::AppState;
use super::error::{ApiError, ApiErrorBody};
use super::params::{ApiQuery, CheckQuery, IdPath, check_opt_text, check_range};
use crate::api::jobs::{CancelResponse, JobPage, JobView, SubmitRequest, SubmitResponse};
use crate::domain::EpochMs;
use crate::domain::{Outcome, Status, Task, is_subject_token};
use crate::store::{FinishIf, JobQuery, NewJob};

/// Query of `GET /v1/jobs`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Only jobs of this batch.
    #[param(pattern = "^[^\\u0000]{1,256}$")]
    pub batch: Option<String>,
    /// Only jobs with this status.
    pub status: Option<Status>,
    /// Page size (default 100, at most 1000; 0 means 1). A page also ends before it
    /// would exceed `gateway.max_page_bytes` (16 MiB by default) of stored task, outputs
    /// and error, but holds at least one job; `next_cursor` is then given.
    #[param(minimum = 0, maximum = 1000)]
    pub limit: Option<i64>,
    /// `next_cursor` of the previous page.
    #[param(pattern = "^[^\\u0000]{1,256}$")]
    pub cursor: Option<String>,
}

impl CheckQuery for ListQuery {
    fn check(&self) -> Result<(), ApiError> {
        check_opt_text("batch", self.batch.as_deref())?;
        check_opt_text("cursor", self.cursor.as_deref())?;
        check_range("limit", self.limit, 1000)
    }
}

const MAX_ID_LEN: usize = 256;

/// Decodes a JSON request body; a field of the wrong shape is named in the error.
pub(super) fn decode_body<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let req: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let field = (path != ".").then_some(path);
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("invalid request body: {}", e.inner()),
            field,
        )
    })?;
    de.end().map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("invalid request body: {e}"),
            None,
        )
    })?;
    Ok(req)
}

/// The caller's batch id, checked (it becomes a NATS subject token), or a fresh one.
pub(super) fn batch_id_or_new(batch_id: Option<String>) -> Result<String, ApiError> {
    match batch_id {
        Some(b) if !is_subject_token(&b) => Err(ApiError::bad_field(
            "batch_id",
            "`batch_id` must be 1-128 letters, digits, `-` or `_`",
        )),
        Some(b) => Ok(b),
        None => Ok(format!("b-{}", uuid::Uuid::now_v7().simple())),
    }
}

/// Parses and validates a submit body; nothing is written unless every task is valid.
fn parse_submit(state: &AppState, body: &[u8]) -> Result<(String, Vec<NewJob>), ApiError> {
    let req: SubmitRequest = decode_body(body)?;
    let limits = &state.settings.gateway;
    if req.tasks.is_empty() {
        return Err(ApiError::bad_field("tasks", "`tasks` must not be empty"));
    }
    if req.tasks.len() > limits.max_tasks_per_request {
        return Err(ApiError::bad_field(
            "tasks",
            format!(
                "at most {} tasks per request (got {}); split the submission",
                limits.max_tasks_per_request,
                req.tasks.len()
            ),
        ));
    }
    let batch_id = batch_id_or_new(req.batch_id)?;
    let mut jobs = Vec::with_capacity(req.tasks.len());
    for (i, task) in req.tasks.into_iter().enumerate() {
        let value = check_task(state, &format!("tasks[{i}]"), &task)?;
        jobs.push(NewJob {
            id: uuid::Uuid::now_v7().to_string(),
            kind: task.kind.clone(),
            client_id: task.client_id.clone(),
            group_id: task.group_id.clone(),
            task: value,
        });
    }
    Ok((batch_id, jobs))
}

/// Checks one task of a request (`at` is its path, e.g. `tasks[3]`): a known kind, ids
/// and metadata of the right shape, no NUL, and a spec its kind accepts. Returns the
/// task as the JSON to store.
pub(super) fn check_task(
    state: &AppState,
    at: &str,
    task: &Task,
) -> Result<serde_json::Value, ApiError> {
    let at = |f: &str| format!("{at}.{f}");
    let Some(kind) = state.kinds.get(&task.kind) else {
        return Err(ApiError::bad_field(
            at("kind"),
            format!(
                "unknown task kind `{}`; this service knows: {}",
                task.kind,
                state.kinds.names().join(", ")
            ),
        ));
    };
    for (name, v) in [("client_id", &task.client_id), ("group_id", &task.group_id)] {
        if let Some(v) = v
            && (v.is_empty() || v.chars().count() > MAX_ID_LEN || v.chars().any(char::is_control))
        {
            return Err(ApiError::bad_field(
                at(name),
                format!(
                    "`{name}` must be 1-{MAX_ID_LEN} characters, none of them control characters"
                ),
            ));
        }
    }
    if task.max_staleness.is_some_and(|m| m < 0) {
        return Err(ApiError::bad_field(
            at("max_staleness"),
            "`max_staleness` counts policy versions: 0 (on-policy) or more",
        ));
    }
    let value = serde_json::to_value(task).expect("task serialises");
    if let Some(path) = crate::nul::find_in_json(&value) {
        return Err(ApiError::bad_field(
            at(&path),
            "contains a NUL character (\\u0000), which the database cannot store; remove it, or encode the data (e.g. base64)",
        ));
    }
    if !(task.metadata.is_null() || task.metadata.is_object()) {
        return Err(ApiError::bad_field(
            at("metadata"),
            "`metadata` must be an object",
        ));
    }
    kind.validate(&task.spec).map_err(|e| {
        let field = if e.path.is_empty() {
            at("spec")
        } else {
            at(&format!("spec.{}", e.path))
        };
        ApiError::bad_field(field, format!("invalid spec: {}", e.message))
    })?;
    Ok(value)
}

/// Refuses a task (`at`, its spec) that would replay a job it may not: no job at all,
/// or one of another batch without `replay_across_batches` (see
/// [`crate::agent::replay::check_scope`]: a replay shows the recorded episode in its
/// own result).
pub(super) async fn check_replays<'a>(
    state: &AppState,
    batch_id: &str,
    tasks: impl Iterator<Item = (String, &'a serde_json::Value)>,
) -> Result<(), ApiError> {
    for (at, spec) in tasks {
        let Some(of) = spec.get("replay_of").and_then(serde_json::Value::as_str) else {
            continue;
        };
        let field = format!("{at}.spec.replay_of");
        let across = spec
            .get("replay_across_batches")
            .and_then(serde_json::Value::as_bool)
            .unwrap_or(false);
        let Some(original) = state.store.job(of).await? else {
            return Err(ApiError::bad_field(
                field,
                format!("no job with id `{of}` to replay"),
            ));
        };
        crate::agent::replay::check_scope(&original, batch_id, across)
            .map_err(|e| ApiError::bad_field(field, e.to_string()))?;
    }
    Ok(())
}

/// Submit tasks.
///
/// Writes every job in one transaction, then queues them for INIT. A task whose
/// `client_id` was submitted before returns the existing job (`duplicate: true`), so a
/// retried request never creates jobs twice.
#[utoipa::path(
    post,
    path = "/v1/jobs",
    tag = "jobs",
    request_body = SubmitRequest,
    responses(
        (status = 201, description = "Jobs created (or found, for repeated client ids)", body = SubmitResponse),
        (status = 400, description = "Invalid input; `field` names the problem", body = ApiErrorBody),
        (status = 413, description = "Body too large", body = ApiErrorBody),
        (status = 503, description = "Database or NATS unavailable; retry", body = ApiErrorBody),
    )
)]
pub async fn submit(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<SubmitResponse>), ApiError> {
    let body = read_body(&state, body)?;
    let response = submit_body(&state, &body).await?;
    Ok((StatusCode::CREATED, Json(response)))
}

/// A request body as axum read it, or the error to answer (413 past
/// `gateway.max_body_bytes`).
pub(super) fn read_body(
    state: &AppState,
    body: Result<Bytes, BytesRejection>,
) -> Result<Bytes, ApiError> {
    body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            too_large(state)
        } else {
            ApiError::new(e.status(), e.body_text(), None)
        }
    })
}

/// A submit body over `gateway.max_body_bytes` (413), over HTTP or NATS.
pub(super) fn too_large(state: &AppState) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!(
            "request body larger than {} bytes; split the submission",
            state.settings.gateway.max_body_bytes
        ),
        None,
    )
}

/// Submits the tasks of a `POST /v1/jobs` body, whichever way it came (HTTP, or a NATS
/// request on `<prefix>.submit`): checks it, writes every job in one transaction, then
/// queues them for INIT.
pub async fn submit_body(state: &AppState, body: &[u8]) -> Result<SubmitResponse, ApiError> {
    let (batch_id, jobs) = parse_submit(state, body)?;
    let tasks = jobs
        .iter()
        .enumerate()
        .map(|(i, j)| (format!("tasks[{i}]"), &j.task["spec"]));
    check_replays(state, &batch_id, tasks).await?;
    // A batch that has ended takes no more jobs (any that raced in with its end are
    // cancelled by the reconciler, never run).
    if let Some(ended) = state
        .store
        .batch(&batch_id)
        .await?
        .and_then(|b| b.end_reason)
    {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "batch `{batch_id}` has ended ({ended}) and takes no more jobs: submit to another batch"
            ),
            Some("batch_id".into()),
        ));
    }
    // Submits take their rows in one order, so they should not deadlock; should the
    // database still abort one for colliding with another, it is run again here rather
    // than handed to the caller as a 503.
    let submitted = {
        use backon::Retryable;
        (|| state.store.submit(&batch_id, &jobs, EpochMs::now()))
            .retry(crate::retry::submit_conflicts())
            .when(crate::store::StoreError::is_conflict)
            .notify(|e, after| tracing::info!(error = %e, ?after, "submit collided with another; retrying"))
            .await?
    };
    metrics::counter!(crate::metrics::JOBS_SUBMITTED)
        .increment(submitted.iter().filter(|s| !s.duplicate).count() as u64);
    crate::publish::start_submitted(&state.queue, &submitted)
        .await
        .map_err(|e| {
            ApiError::unavailable(format!(
                "jobs were recorded but could not be queued ({e}); resubmit with the same \
             client_id values, or the reconciler will queue them"
            ))
        })?;
    tracing::info!(batch_id, jobs = submitted.len(), "tasks submitted");
    Ok(SubmitResponse {
        batch_id,
        jobs: submitted.into_iter().map(super::wire::submitted).collect(),
    })
}

/// One job: its state, per-stage timings, result and event log.
#[utoipa::path(
    get,
    path = "/v1/jobs/{id}",
    tag = "jobs",
    params(("id" = String, Path, description = "Job id", pattern = "^[^\\u0000]{1,256}$")),
    responses(
        (status = 400, description = "Invalid input; `field` names the problem", body = ApiErrorBody),
        (status = 200, body = JobView),
        (status = 404, body = ApiErrorBody),
    )
)]
pub async fn get_job(
    State(state): State<AppState>,
    IdPath(id): IdPath,
) -> Result<Json<JobView>, ApiError> {
    let job = state
        .store
        .job(&id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no job with id `{id}`")))?;
    let result = state.store.result(&id).await?;
    let events = state.store.events(&id).await?;
    Ok(Json(JobView {
        job,
        result,
        events: events.into_iter().map(super::wire::job_event).collect(),
    }))
}

/// A page of jobs, optionally of one batch and status, in creation order.
#[utoipa::path(
    get,
    path = "/v1/jobs",
    tag = "jobs",
    params(ListQuery),
    responses(
        (status = 200, body = JobPage),
        (status = 400, body = ApiErrorBody),
    )
)]
pub async fn list_jobs(
    State(state): State<AppState>,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> Result<Json<JobPage>, ApiError> {
    let limit = q.limit.unwrap_or(100).max(1);
    let query = JobQuery {
        batch: q.batch,
        status: q.status,
        cursor: q.cursor,
        limit,
        max_bytes: super::results::page_bytes(&state),
    };
    let page = state.store.list_jobs(&query).await?;
    let next_cursor = page
        .more
        .then(|| page.jobs.last().map(|j| j.id.clone()))
        .flatten();
    Ok(Json(JobPage {
        jobs: page.jobs,
        next_cursor,
    }))
}

/// Cancel a job.
///
/// A queued job never runs; a running job's worker stops it within a second (it is told
/// over `rollout.cancel`, and also finds out at its next lease renewal). The job ends
/// `cancelled` and its result (with any partial output) is published like any other.
#[utoipa::path(
    post,
    path = "/v1/jobs/{id}/cancel",
    tag = "jobs",
    params(("id" = String, Path, description = "Job id", pattern = "^[^\\u0000]{1,256}$")),
    responses(
        (status = 400, description = "Invalid input; `field` names the problem", body = ApiErrorBody),
        (status = 200, body = CancelResponse),
        (status = 404, body = ApiErrorBody),
        (status = 409, description = "The job already ended", body = ApiErrorBody),
    )
)]
pub async fn cancel_job(
    State(state): State<AppState>,
    IdPath(id): IdPath,
) -> Result<Json<CancelResponse>, ApiError> {
    let outcome = Outcome::cancelled("cancelled by request");
    match state
        .store
        .finish(&FinishIf::Live, &id, &outcome, EpochMs::now())
        .await?
    {
        Some(result) => {
            // What was recorded: `failed` when the database refused the cancelled end
            // (see `JobStore::finish`), and the answer must say so.
            let status = result.result.status;
            tracing::info!(job_id = %id, %status, "job cancelled");
            metrics::counter!(crate::metrics::JOBS_FINISHED, "status" => status.as_str())
                .increment(1);
            if let Err(e) = state.queue.publish_cancel(&id).await {
                tracing::warn!(job_id = %id, error = %e, "cancel broadcast failed; the worker will notice at its next lease renewal");
            }
            crate::publish::publish_result(&state.queue, state.store.as_ref(), &result).await;
            Ok(Json(CancelResponse { id, status }))
        }
        None => match state.store.job(&id).await? {
            None => Err(ApiError::not_found(format!("no job with id `{id}`"))),
            Some(job) => Err(ApiError::new(
                StatusCode::CONFLICT,
                format!("job already ended with status `{}`", job.status),
                None,
            )),
        },
    }
}
