//! `/v1/batches`: dynamic-sampling (DAPO) batches.
//!
//! A trainer hands over a prompt pool and asks for K groups of G samples whose rewards
//! differ; the service keeps `max_groups_in_flight` groups running, launching the next
//! prompt as soon as a group is decided, accepts informative groups until it has K,
//! then cancels everything else of the batch (see [`crate::batches`]). The trainer reads
//! the accepted groups as they are decided (`GET /v1/batches/{id}/groups`, long-poll,
//! or its `/stream` as Server-Sent Events; or the NATS subject
//! `<prefix>.groups.<batch>`).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::Stream;
use serde::Deserialize;
use utoipa::IntoParams;

use super::AppState;
use super::error::{ApiError, ApiErrorBody};
use super::jobs::{batch_id_or_new, check_replays, check_task, decode_body, read_body};
use super::params::{ApiQuery, CheckQuery, IdPath, check_range, last_event_id};
use super::results::Wakeup;
use crate::api::batches::{
    BatchRequest, BatchView, CancelledBatch, GroupPage, PlainBatchCancelled, VerdictPage,
};
use crate::domain::EpochMs;
use crate::domain::sampling::{AcceptedGroup, OnCancel, SamplingParams, SamplingStatus};
use crate::sampling::Driver;
use crate::store::{Created, NewSampling};

/// Query of `GET /v1/batches/{id}/groups`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct GroupsQuery {
    /// Return groups ranked after this (default 0: from the first).
    #[param(minimum = 0)]
    pub after: Option<i64>,
    /// If none is ready and the batch is running, wait up to this long (ms, default 0,
    /// at most `gateway.max_wait_ms`).
    #[param(minimum = 0, maximum = 60000)]
    pub wait_ms: Option<i64>,
    /// Page size (default 16, at most 256); a page also holds no more groups than fit
    /// in `gateway.max_page_bytes` of stored results (but at least one).
    #[param(minimum = 0, maximum = 256)]
    pub limit: Option<i64>,
}

impl CheckQuery for GroupsQuery {
    fn check(&self) -> Result<(), ApiError> {
        check_range("after", self.after, i64::MAX)?;
        check_range("limit", self.limit, 256)
    }
}

/// Query of `GET /v1/batches/{id}/groups/stream`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct GroupStreamQuery {
    /// Start after this rank; the `Last-Event-ID` header wins over it.
    #[param(minimum = 0)]
    pub after: Option<i64>,
}

impl CheckQuery for GroupStreamQuery {
    fn check(&self) -> Result<(), ApiError> {
        check_range("after", self.after, i64::MAX)
    }
}

/// The most prompts one request may carry is `gateway.max_tasks_per_request`, and so
/// is the most jobs one launch may insert (`max_groups_in_flight × group_size`).
fn check_request(state: &AppState, req: &BatchRequest) -> Result<SamplingParams, ApiError> {
    let limit = i64::try_from(state.settings.gateway.max_tasks_per_request).unwrap_or(i64::MAX);
    let prompts = i64::try_from(req.prompts.len()).unwrap_or(i64::MAX);
    if req.prompts.is_empty() {
        return Err(ApiError::bad_field(
            "prompts",
            "`prompts` must not be empty",
        ));
    }
    if prompts > limit {
        return Err(ApiError::bad_field(
            "prompts",
            format!("at most {limit} prompts per batch (got {prompts})"),
        ));
    }
    if !(2..=1024).contains(&req.group_size) {
        return Err(ApiError::bad_field(
            "group_size",
            "`group_size` must be 2-1024 (one sample cannot disagree with itself)",
        ));
    }
    if req.target_groups < 1 {
        return Err(ApiError::bad_field(
            "target_groups",
            "`target_groups` must be ≥ 1",
        ));
    }
    let max_groups = req.max_groups.unwrap_or(prompts);
    if max_groups < 1 {
        return Err(ApiError::bad_field(
            "max_groups",
            "`max_groups` must be ≥ 1",
        ));
    }
    if req.target_groups > max_groups.min(prompts) {
        return Err(ApiError::bad_field(
            "target_groups",
            format!(
                "`target_groups` ({}) is more than the prompts the batch may try ({}); add \
                 prompts or raise `max_groups`",
                req.target_groups,
                max_groups.min(prompts)
            ),
        ));
    }
    let in_flight = req.max_groups_in_flight.unwrap_or(req.target_groups);
    if in_flight < 1 || in_flight.saturating_mul(req.group_size) > limit {
        return Err(ApiError::bad_field(
            "max_groups_in_flight",
            format!(
                "`max_groups_in_flight` must be ≥ 1 and, times `group_size`, at most {limit} jobs"
            ),
        ));
    }
    req.informative
        .check()
        .map_err(|(field, e)| ApiError::bad_field(format!("informative.{field}"), e))?;
    for (i, task) in req.prompts.iter().enumerate() {
        let at = format!("prompts[{i}]");
        if task.client_id.is_some() || task.group_id.is_some() {
            let f = if task.client_id.is_some() {
                "client_id"
            } else {
                "group_id"
            };
            return Err(ApiError::bad_field(
                format!("{at}.{f}"),
                format!("a prompt carries no `{f}`: the service gives each sample its own"),
            ));
        }
        check_task(state, &at, task)?;
    }
    Ok(SamplingParams {
        group_size: req.group_size,
        target_groups: req.target_groups,
        max_groups_in_flight: in_flight,
        max_groups: max_groups.min(prompts),
        informative: req.informative.clone(),
        policy_version: req.policy_version,
        on_cancel: req.on_cancel,
        carry_from: req.carry_from.clone(),
    })
}

/// Creates the sampling batch a `POST /v1/batches` body describes, whichever way it
/// came (HTTP, or a NATS request on `<prefix>.batches.submit`), and launches its first
/// groups.
pub async fn create_body(state: &AppState, body: &[u8]) -> Result<BatchView, ApiError> {
    let req: BatchRequest = decode_body(body)?;
    let id = batch_id_or_new(req.batch_id.clone())?;
    let params = check_request(state, &req)?;
    let prompts = req
        .prompts
        .iter()
        .enumerate()
        .map(|(i, t)| (format!("prompts[{i}]"), &t.spec));
    check_replays(state, &id, prompts).await?;
    if let Some(from) = &req.carry_from {
        check_carry_from(state, from, &id).await?;
    }
    if req.max_staleness.is_some_and(|m| m < 0) {
        return Err(ApiError::bad_field(
            "max_staleness",
            "`max_staleness` counts policy versions: 0 (on-policy) or more",
        ));
    }
    let prompts = req
        .prompts
        .iter()
        .map(|t| {
            let mut t = t.clone();
            t.max_staleness = t.max_staleness.or(req.max_staleness);
            serde_json::to_value(t).expect("task serialises")
        })
        .collect();
    let new = NewSampling {
        id: id.clone(),
        params: params.clone(),
        prompts,
    };
    let created = state.store.create_sampling(&new, EpochMs::now()).await?;
    match created {
        Created::IdTaken => {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                format!("batch `{id}` exists and is not a sampling batch; choose another id"),
                Some("batch_id".into()),
            ));
        }
        Created::Exists => {
            let view = view(state, &id).await?;
            if view.batch.params != params
                || i64::try_from(new.prompts.len()).ok() != Some(view.batch.prompt_count)
            {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    format!(
                        "sampling batch `{id}` exists with other parameters or prompts; \
                         choose another id"
                    ),
                    Some("batch_id".into()),
                ));
            }
            // A repeated request may follow a crash right after the create: drive it.
            drive(state, &id).await;
            return Ok(BatchView {
                duplicate: true,
                ..view
            });
        }
        Created::New => {}
    }
    tracing::info!(
        batch_id = %id,
        prompts = new.prompts.len(),
        group_size = params.group_size,
        target_groups = params.target_groups,
        "sampling batch created"
    );
    drive(state, &id).await;
    view(state, &id).await
}

/// Refuses a `carry_from` that names no sampling batch, or the batch itself.
async fn check_carry_from(state: &AppState, from: &str, id: &str) -> Result<(), ApiError> {
    if from == id {
        return Err(ApiError::bad_field(
            "carry_from",
            "`carry_from` names the batch itself; name an earlier sampling batch",
        ));
    }
    let valid = !from.is_empty()
        && from.len() <= 128
        && from
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if !valid || state.store.sampling_batch(from).await?.is_none() {
        return Err(ApiError::bad_field(
            "carry_from",
            format!("`carry_from`: no sampling batch with id `{from}`"),
        ));
    }
    Ok(())
}

/// The 404 of a batch id that names no sampling batch.
fn no_batch(id: &str) -> ApiError {
    ApiError::not_found(format!("no sampling batch with id `{id}`"))
}

/// Drives a batch right away; a failure is left to the next wake or the sweep.
async fn drive(state: &AppState, id: &str) {
    let driver = Driver::new(
        state.store.clone(),
        state.store.clone(),
        state.store.clone(),
        state.queue.clone(),
    );
    if let Err(e) = driver.drive(id).await {
        tracing::warn!(batch_id = id, error = %e, "cannot launch the sampling batch's groups yet; the reconciler's sweep will");
    }
}

/// The batch and all its accepted groups.
async fn view(state: &AppState, id: &str) -> Result<BatchView, ApiError> {
    let batch = state
        .store
        .sampling_batch(id)
        .await?
        .ok_or_else(|| no_batch(id))?;
    let groups = state
        .store
        .accepted_groups(
            id,
            0,
            batch.params.target_groups,
            super::results::page_bytes(state),
        )
        .await?;
    let accepted = batch.counters.informative.min(batch.params.target_groups);
    let more_groups_after = (i64::try_from(groups.len()).unwrap_or(i64::MAX) < accepted)
        .then(|| groups.last().map_or(0, |g| g.rank));
    Ok(BatchView {
        batch,
        groups,
        more_groups_after,
        duplicate: false,
        cancelling: None,
    })
}

/// Start a sampling batch.
///
/// Records the batch and its prompt pool, launches its first groups and returns at once;
/// the service then keeps `max_groups_in_flight` groups running until `target_groups`
/// informative groups are accepted (`complete`), `max_groups` prompts were tried
/// (`exhausted`), or the batch is cancelled, and cancels whatever else of it is still
/// running. Repeating the request (same `batch_id`) returns the batch.
#[utoipa::path(
    post,
    path = "/v1/batches",
    tag = "batches",
    request_body = BatchRequest,
    responses(
        (status = 201, description = "Batch created (or found, for a repeated id)", body = BatchView),
        (status = 400, description = "Invalid input; `field` names the problem", body = ApiErrorBody),
        (status = 409, description = "The id belongs to another batch", body = ApiErrorBody),
        (status = 413, description = "Body too large", body = ApiErrorBody),
        (status = 503, description = "Database or NATS unavailable; retry", body = ApiErrorBody),
    )
)]
pub async fn create_batch(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<BatchView>), ApiError> {
    let body = read_body(&state, body)?;
    Ok((StatusCode::CREATED, Json(create_body(&state, &body).await?)))
}

/// A sampling batch: parameters, status, counters (what early cancel saved included),
/// and its accepted groups with their results.
#[utoipa::path(
    get,
    path = "/v1/batches/{id}",
    tag = "batches",
    params(("id" = String, Path, description = "Batch id", pattern = "^[^\\u0000]{1,256}$")),
    responses(
        (status = 200, body = BatchView),
        (status = 400, body = ApiErrorBody),
        (status = 404, body = ApiErrorBody),
    )
)]
pub async fn get_batch(
    State(state): State<AppState>,
    IdPath(id): IdPath,
) -> Result<Json<BatchView>, ApiError> {
    Ok(Json(view(&state, &id).await?))
}

/// Cancel a batch: a sampling batch, or a plain one made by `POST /v1/jobs`.
///
/// From the answer on, none of the batch's jobs starts a stage, moves on or is scored:
/// the ones that had not ended (`cancelling`) are stopped where they run (generation
/// closed, tools killed, no EVAL) and end `cancelled` shortly after. For a sampling
/// batch no more groups are launched or accepted; groups accepted before stay accepted.
/// A plain batch takes no more jobs.
#[utoipa::path(
    post,
    path = "/v1/batches/{id}/cancel",
    tag = "batches",
    params(("id" = String, Path, description = "Batch id", pattern = "^[^\\u0000]{1,256}$")),
    responses(
        (status = 200, body = CancelledBatch),
        (status = 400, body = ApiErrorBody),
        (status = 404, body = ApiErrorBody),
        (status = 409, description = "The batch already ended", body = ApiErrorBody),
    )
)]
pub async fn cancel_batch(
    State(state): State<AppState>,
    IdPath(id): IdPath,
) -> Result<Json<CancelledBatch>, ApiError> {
    let now = EpochMs::now();
    if let Some(batch) = state.store.sampling_batch(&id).await? {
        let ended = state
            .store
            .end_sampling(&id, SamplingStatus::Cancelled, "cancelled by request", now)
            .await?;
        if !ended {
            let status = state
                .store
                .sampling_batch(&id)
                .await?
                .map_or(batch.status, |b| b.status);
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                format!("sampling batch already ended `{}`", status.as_str()),
                None,
            ));
        }
        // A `keep` batch's groups in flight run on, for a later batch to adopt.
        let cancelling = if batch.params.on_cancel == OnCancel::Keep {
            0
        } else {
            live_count(&state, &id).await?
        };
        tracing::info!(batch_id = %id, jobs = cancelling, "sampling batch cancelled");
        let driver = Driver::new(
            state.store.clone(),
            state.store.clone(),
            state.store.clone(),
            state.queue.clone(),
        );
        let id2 = id.clone();
        crate::supervise::spawn_logged("batch cancel", async move {
            if let Err(e) = driver.drive(&id2).await {
                tracing::warn!(batch_id = %id2, error = %e, "cannot cancel the rest of the sampling batch yet; the reconciler's sweep will");
            }
        });
        let mut view = view(&state, &id).await?;
        view.cancelling = Some(cancelling);
        return Ok(Json(CancelledBatch::Sampling(Box::new(view))));
    }
    match state
        .store
        .end_batch(&id, crate::sampling::BATCH_CANCELLED, now)
        .await?
    {
        None => Err(ApiError::not_found(format!("no batch with id `{id}`"))),
        Some(false) => Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("batch `{id}` was cancelled already"),
            None,
        )),
        Some(true) => {
            let batch = state
                .store
                .batch(&id)
                .await?
                .ok_or_else(|| ApiError::not_found(format!("no batch with id `{id}`")))?;
            let cancelling = (batch.submitted - batch.finished).max(0);
            tracing::info!(batch_id = %id, jobs = cancelling, "batch cancelled");
            let driver = Driver::new(
                state.store.clone(),
                state.store.clone(),
                state.store.clone(),
                state.queue.clone(),
            );
            let id2 = id.clone();
            crate::supervise::spawn_logged("batch cancel", async move {
                if let Err(e) = driver
                    .cancel_live(&id2, crate::sampling::BATCH_CANCELLED)
                    .await
                {
                    tracing::warn!(batch_id = %id2, error = %e, "cannot cancel the rest of the batch yet; the reconciler's sweep will");
                }
            });
            Ok(Json(CancelledBatch::Plain(PlainBatchCancelled {
                batch,
                cancelling,
            })))
        }
    }
}

/// How many of batch `id`'s jobs have not ended (from its counters).
async fn live_count(state: &AppState, id: &str) -> Result<i64, ApiError> {
    Ok(state
        .store
        .batch(id)
        .await?
        .map_or(0, |b| (b.submitted - b.finished).max(0)))
}

/// Accepted groups after a rank, waiting up to `wait_ms` while none is ready and the
/// batch runs.
#[utoipa::path(
    get,
    path = "/v1/batches/{id}/groups",
    tag = "batches",
    params(("id" = String, Path, description = "Batch id", pattern = "^[^\\u0000]{1,256}$"), GroupsQuery),
    responses(
        (status = 200, body = GroupPage),
        (status = 400, body = ApiErrorBody),
        (status = 404, body = ApiErrorBody),
    )
)]
pub async fn groups(
    State(state): State<AppState>,
    IdPath(id): IdPath,
    ApiQuery(q): ApiQuery<GroupsQuery>,
) -> Result<Json<GroupPage>, ApiError> {
    let max_wait_ms = i64::try_from(state.settings.gateway.max_wait_ms).unwrap_or(i64::MAX);
    check_range("wait_ms", q.wait_ms, max_wait_ms)?;
    let after = q.after.unwrap_or(0);
    let limit = q.limit.unwrap_or(16).max(1);
    let wait = Duration::from_millis(u64::try_from(q.wait_ms.unwrap_or(0)).unwrap_or(0));
    let deadline = tokio::time::Instant::now() + wait;
    let mut wakeup = Wakeup::new(&state);
    loop {
        wakeup.mark_seen();
        let batch = state
            .store
            .sampling_batch(&id)
            .await?
            .ok_or_else(|| no_batch(&id))?;
        let groups = state
            .store
            .accepted_groups(&id, after, limit, super::results::page_bytes(&state))
            .await?;
        if !groups.is_empty()
            || batch.status.is_final()
            || tokio::time::Instant::now() >= deadline
            || state.shutdown.is_cancelled()
        {
            let next_cursor = groups.last().map_or(after, |g| g.rank);
            return Ok(Json(GroupPage {
                groups,
                next_cursor,
                status: batch.status,
            }));
        }
        wakeup.wait(&state, deadline).await;
    }
}

/// Query of `GET /v1/batches/{id}/verdicts`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct VerdictsQuery {
    /// How many groups, from the first launched (default 1000, at most 10000).
    #[param(minimum = 0, maximum = 10000)]
    pub limit: Option<i64>,
}

impl CheckQuery for VerdictsQuery {
    fn check(&self) -> Result<(), ApiError> {
        check_range("limit", self.limit, 10_000)
    }
}

/// Every group of a sampling batch with its verdict so far (`informative`, `uniform`,
/// `incomplete`, …, or `in_flight`), in launch order: the accepted ones and the rest.
#[utoipa::path(
    get,
    path = "/v1/batches/{id}/verdicts",
    tag = "batches",
    params(("id" = String, Path, description = "Batch id", pattern = "^[^\\u0000]{1,256}$"), VerdictsQuery),
    responses(
        (status = 200, body = VerdictPage),
        (status = 400, body = ApiErrorBody),
        (status = 404, body = ApiErrorBody),
    )
)]
pub async fn verdicts(
    State(state): State<AppState>,
    IdPath(id): IdPath,
    ApiQuery(q): ApiQuery<VerdictsQuery>,
) -> Result<Json<VerdictPage>, ApiError> {
    if state.store.sampling_batch(&id).await?.is_none() {
        return Err(no_batch(&id));
    }
    let limit = q.limit.unwrap_or(1000).max(1);
    let mut groups = state.store.group_verdicts(&id, limit + 1).await?;
    let more = i64::try_from(groups.len()).unwrap_or(i64::MAX) > limit;
    groups.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
    Ok(Json(VerdictPage {
        groups: groups.into_iter().map(super::wire::group_verdict).collect(),
        more,
    }))
}

/// The accepted groups as Server-Sent Events: a `group` event per group (its rank the
/// event id, so a reconnecting client resumes), then one `end` event (data: the batch)
/// once the batch has ended and every accepted group was sent.
#[utoipa::path(
    get,
    path = "/v1/batches/{id}/groups/stream",
    tag = "batches",
    params(("id" = String, Path, description = "Batch id", pattern = "^[^\\u0000]{1,256}$"), GroupStreamQuery),
    responses(
        (status = 200, description = "text/event-stream of `group` events (data: AcceptedGroup), then an `end` event (data: SamplingBatch)"),
        (status = 400, body = ApiErrorBody),
        (status = 404, body = ApiErrorBody),
    )
)]
pub async fn groups_stream(
    State(state): State<AppState>,
    IdPath(id): IdPath,
    headers: HeaderMap,
    ApiQuery(q): ApiQuery<GroupStreamQuery>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let after = last_event_id(&headers, "a group rank")?.unwrap_or(q.after.unwrap_or(0));
    if state.store.sampling_batch(&id).await?.is_none() {
        return Err(no_batch(&id));
    }
    struct Cursor {
        state: AppState,
        wakeup: Wakeup,
        id: String,
        after: i64,
        buffer: VecDeque<AcceptedGroup>,
        ended: bool,
    }
    let init = Cursor {
        wakeup: Wakeup::new(&state),
        state,
        id,
        after,
        buffer: VecDeque::new(),
        ended: false,
    };
    let stream = futures::stream::unfold(init, |mut c| async move {
        loop {
            if let Some(g) = c.buffer.pop_front() {
                c.after = g.rank;
                let event = Event::default()
                    .event("group")
                    .id(g.rank.to_string())
                    .json_data(&g)
                    .expect("group serialises");
                return Some((Ok(event), c));
            }
            if c.ended || c.state.shutdown.is_cancelled() {
                return None;
            }
            c.wakeup.mark_seen();
            // The status is read before the groups: a batch seen ended has every
            // accepted group already written, so the read after it finds them all.
            let read = async {
                let batch = c.state.store.sampling_batch(&c.id).await?;
                let groups = c
                    .state
                    .store
                    .accepted_groups(&c.id, c.after, 16, super::results::page_bytes(&c.state))
                    .await?;
                Ok::<_, crate::store::StoreError>((batch, groups))
            }
            .await;
            match read {
                Ok((_, groups)) if !groups.is_empty() => c.buffer.extend(groups),
                Ok((Some(batch), _)) if batch.status.is_final() => {
                    c.ended = true;
                    let event = Event::default()
                        .event("end")
                        .json_data(&batch)
                        .expect("batch serialises");
                    return Some((Ok(event), c));
                }
                Ok((None, _)) => return None,
                Ok(_) => {
                    let deadline = tokio::time::Instant::now() + Duration::from_millis(500);
                    let Cursor { wakeup, state, .. } = &mut c;
                    wakeup.wait(state, deadline).await;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "group stream cannot read the database; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}
