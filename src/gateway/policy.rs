//! `/v1/policy`: the trainer announces each new version of the policy's weights, and
//! stops generation while it updates them.
//!
//! An announcement without a `mode` makes its version current at once (the trainer
//! updated the servers itself). One with a `mode` starts a weight update: it is recorded
//! (a compare-and-set, so concurrent announcers get one order), broadcast, so the RUN
//! workers hold their new turns, and every backend of the pool is asked to stop
//! generating as the mode says ([`crate::backends::control`]); the answer comes once
//! all have. `POST /v1/policy/{version}/resume` makes the version current and lets
//! generation go on. The update holds a lease: if no resume comes by its end, the
//! reconciler resumes the backends and the version does not become current. The RUN
//! workers also re-read the policy row every few seconds, so a lost broadcast delays
//! them and never loses a change. A NATS request on `<prefix>.policy.announce` carries
//! the same body as the announcement and gets the same answer, and one on
//! `<prefix>.policy.resume` (`{"version": N}`) resumes ([`super::nats`]).

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::StatusCode;

use super::AppState;
use super::error::{ApiError, ApiErrorBody};
use super::jobs::{decode_body, read_body};
use crate::api::policy::{BackendAnswer, PolicyPause, PolicyRequest, PolicyView, UpdateMode};
use crate::backends::client::InferenceClient;
use crate::backends::control;
use crate::domain::EpochMs;
use crate::domain::backend::BackendSpec;
use crate::store::{Announced, BackendStore, Pausing, Resumed};

/// How long a weight update may hold generation when the request does not say.
const DEFAULT_LEASE_S: u64 = 600;
/// The longest lease a request may ask for.
const MAX_LEASE_S: u64 = 86_400;

/// Announce a policy version, or start a weight update to it.
///
/// Without `mode`: the trainer has updated the inference servers' weights (its own way:
/// NCCL, disk, the servers' update endpoints) and from the moment the RUN workers hear
/// of it, every model token they record carries this version. With `mode`
/// (`pause`, `abort` or `wait`): new turns are held and every backend stops generating
/// as the mode says; the answer comes once all have, and the trainer then updates the
/// weights and calls `POST /v1/policy/{version}/resume`. A version older than the
/// current one is refused (409, naming the current one), as is any announcement while
/// another update is in progress; the same request again is answered as it was (a
/// repeated pause renews its lease and asks the backends again).
#[utoipa::path(
    post,
    path = "/v1/policy",
    tag = "policy",
    request_body = PolicyRequest,
    responses(
        (status = 200, description = "The version is current, or every backend has stopped for the update", body = PolicyView),
        (status = 400, description = "Invalid input; `field` names the problem", body = ApiErrorBody),
        (status = 409, description = "A newer version is current, or another update is in progress", body = ApiErrorBody),
        (status = 413, description = "Body too large", body = ApiErrorBody),
        (status = 502, description = "A backend not marked down did not stop; the update stays in progress (repeat the request, or resume)", body = ApiErrorBody),
        (status = 503, description = "Database unavailable; retry", body = ApiErrorBody),
    )
)]
pub async fn announce_policy(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<PolicyView>, ApiError> {
    let body = read_body(&state, body)?;
    Ok(Json(announce_body(&state, &body).await?))
}

/// Announces the version a `POST /v1/policy` body (or a NATS request's) names.
pub(super) async fn announce_body(state: &AppState, body: &[u8]) -> Result<PolicyView, ApiError> {
    let req: PolicyRequest = decode_body(body)?;
    if req.version < 0 {
        return Err(ApiError::bad_field(
            "version",
            "a policy version is a number from 0 up",
        ));
    }
    match req.mode {
        None => {
            if req.lease_s.is_some() {
                return Err(ApiError::bad_field(
                    "lease_s",
                    "`lease_s` bounds a weight update: it goes with `mode`",
                ));
            }
            announce(state, req.version).await
        }
        Some(mode) => {
            let lease_s = req.lease_s.unwrap_or(DEFAULT_LEASE_S);
            if !(1..=MAX_LEASE_S).contains(&lease_s) {
                return Err(ApiError::bad_field(
                    "lease_s",
                    format!("`lease_s` must be from 1 to {MAX_LEASE_S} seconds"),
                ));
            }
            pause(state, req.version, mode, lease_s).await
        }
    }
}

/// Makes `version` current at once.
async fn announce(state: &AppState, version: i64) -> Result<PolicyView, ApiError> {
    match state.store.announce_policy(version, EpochMs::now()).await? {
        Announced::New(current) => {
            tracing::info!(version = current.version, "policy version announced");
            broadcast(state).await;
            control::label_all(&client(state), &backends(state).await?.0, current.version).await;
            Ok(view(Some(current), None, Some(true), Vec::new()))
        }
        Announced::Repeated(current) => Ok(view(Some(current), None, Some(false), Vec::new())),
        Announced::Outdated(current) => Err(outdated(current.version)),
        Announced::Busy(p) => Err(busy(p)),
    }
}

/// Starts (or repeats) a weight update to `version` and stops every backend for it.
async fn pause(
    state: &AppState,
    version: i64,
    mode: UpdateMode,
    lease_s: u64,
) -> Result<PolicyView, ApiError> {
    let now = EpochMs::now();
    let until = EpochMs(
        now.0
            .saturating_add(i64::try_from(lease_s * 1000).unwrap_or(i64::MAX)),
    );
    let (policy, started) = match state.store.begin_pause(version, mode, now, until).await? {
        Pausing::Started(s) => (s, true),
        Pausing::Repeated(s) => (s, false),
        Pausing::Outdated(current) => return Err(outdated(current.version)),
        Pausing::Busy(p) => return Err(busy(p)),
    };
    tracing::info!(
        version,
        mode = mode.as_str(),
        lease_s,
        "weight update started: holding new turns and stopping the backends"
    );
    // The workers hold their new turns first, then the backends stop.
    crate::policy::broadcast(&state.queue, &policy).await;
    let (specs, down) = backends(state).await?;
    let answers = control::pause_all(&client(state), &specs, mode).await;
    let failed = failures(&answers, &down);
    if !failed.is_empty() {
        return Err(ApiError::new(
            StatusCode::BAD_GATEWAY,
            format!(
                "the update to version {version} is in progress, but {failed}; repeat the request to ask them again, or resume with POST /v1/policy/{version}/resume"
            ),
            None,
        ));
    }
    Ok(view(policy.current, policy.pause, Some(started), answers))
}

/// End a weight update: its version becomes current and generation goes on.
///
/// Every backend is asked to resume, and the RUN workers' held turns start, under the
/// new version. Resuming a version that is current already is answered as it was (and
/// asks the backends again); one with no update in progress is refused (409).
#[utoipa::path(
    post,
    path = "/v1/policy/{version}/resume",
    tag = "policy",
    params(("version" = i64, Path, description = "The version of the update in progress")),
    responses(
        (status = 200, description = "The version is current and the backends generate again", body = PolicyView),
        (status = 400, description = "Invalid version", body = ApiErrorBody),
        (status = 409, description = "No update to that version is in progress", body = ApiErrorBody),
        (status = 502, description = "A backend not marked down did not resume; the version is current (repeat the request)", body = ApiErrorBody),
        (status = 503, description = "Database unavailable; retry", body = ApiErrorBody),
    )
)]
pub async fn resume_policy(
    State(state): State<AppState>,
    version: Result<Path<i64>, PathRejection>,
) -> Result<Json<PolicyView>, ApiError> {
    let Path(version) = version.map_err(|e| {
        ApiError::bad_field("version", format!("the version must be a number: {e}"))
    })?;
    Ok(Json(resume(&state, version).await?))
}

/// The body of a resume request over NATS.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ResumeRequest {
    version: i64,
}

/// Resumes the version a NATS request's body (`{"version": N}`) names.
pub(super) async fn resume_body(state: &AppState, body: &[u8]) -> Result<PolicyView, ApiError> {
    let req: ResumeRequest = decode_body(body)?;
    resume(state, req.version).await
}

/// Ends the weight update to `version` and resumes every backend.
async fn resume(state: &AppState, version: i64) -> Result<PolicyView, ApiError> {
    let (policy, changed) = match state.store.end_pause(version, EpochMs::now()).await? {
        Resumed::Done(s) => (s, true),
        Resumed::Repeated(s) => (s, false),
        Resumed::NotPaused(s) => {
            let what = match s.pause {
                Some(p) => format!("the update in progress is to version {}", p.version),
                None => "no update is in progress".to_string(),
            };
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                format!("no weight update to version {version} is in progress ({what})"),
                Some("version".into()),
            ));
        }
    };
    if changed {
        tracing::info!(
            version,
            "weight update ended: policy version current, generation resumed"
        );
        crate::policy::broadcast(&state.queue, &policy).await;
    }
    let (client, (specs, down)) = (client(state), backends(state).await?);
    // The servers report the new weights under the service's number.
    control::label_all(&client, &specs, version).await;
    let answers = control::resume_all_owed(&client, state.store.as_ref(), &specs).await;
    let failed = failures(&answers, &down);
    if !failed.is_empty() {
        return Err(ApiError::new(
            StatusCode::BAD_GATEWAY,
            format!(
                "version {version} is current, but {failed}; repeat the request to ask them again"
            ),
            None,
        ));
    }
    Ok(view(policy.current, None, Some(changed), answers))
}

/// How many of the latest versions `GET /v1/policy` lists.
const RECENT: i64 = 20;

/// The current policy version, the weight update in progress, and the latest versions.
#[utoipa::path(
    get,
    path = "/v1/policy",
    tag = "policy",
    responses(
        (status = 200, body = PolicyView),
        (status = 503, description = "Database unavailable; retry", body = ApiErrorBody),
    )
)]
pub async fn current_policy(State(state): State<AppState>) -> Result<Json<PolicyView>, ApiError> {
    let policy = state.store.policy_state().await?;
    let mut v = view(policy.current, policy.pause, None, Vec::new());
    v.recent = state.store.recent_policies(RECENT).await?;
    Ok(Json(v))
}

/// Broadcasts the policy row as it is now.
async fn broadcast(state: &AppState) {
    match state.store.policy_state().await {
        Ok(policy) => crate::policy::broadcast(&state.queue, &policy).await,
        Err(e) => {
            tracing::warn!(error = %e, "policy state not broadcast; the workers will read it from the database")
        }
    }
}

fn client(state: &AppState) -> InferenceClient {
    InferenceClient::new((&state.settings.pool).into())
}

/// Every registered backend, healthy or not (one marked down may come back mid-update,
/// so it is asked too), and the ids of those marked down.
async fn backends(
    state: &AppState,
) -> Result<(Vec<BackendSpec>, std::collections::HashSet<String>), ApiError> {
    let all = BackendStore::backends(state.store.as_ref()).await?;
    let down = all
        .iter()
        .filter(|b| !b.healthy)
        .map(|b| b.spec.id.clone())
        .collect();
    Ok((all.into_iter().map(|b| b.spec).collect(), down))
}

/// The backends that did not do as asked, with why, for an error message; a backend
/// marked down is left out (it generates nothing for the service, and its answer is in
/// the view's `backends`).
fn failures(answers: &[BackendAnswer], down: &std::collections::HashSet<String>) -> String {
    answers
        .iter()
        .filter(|a| !a.ok && !down.contains(&a.backend))
        .map(|a| {
            format!(
                "backend `{}` did not: {}",
                a.backend,
                a.error.as_deref().unwrap_or("no reason given")
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn view(
    current: Option<crate::api::policy::PolicyVersion>,
    pause: Option<PolicyPause>,
    changed: Option<bool>,
    backends: Vec<BackendAnswer>,
) -> PolicyView {
    PolicyView {
        current,
        pause,
        changed,
        backends,
        recent: Vec::new(),
    }
}

fn outdated(current: i64) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        format!(
            "policy version {current} is current; versions only move forward (announce {} or newer)",
            current.saturating_add(1)
        ),
        Some("version".into()),
    )
}

fn busy(p: PolicyPause) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        format!(
            "a weight update to version {} (mode {}) is in progress: resume it with POST /v1/policy/{}/resume, or wait for its lease to run out at {} ms since the epoch",
            p.version,
            p.mode.as_str(),
            p.version,
            p.until
        ),
        Some("version".into()),
    )
}
