//! `/v1/policy`: the trainer announces each new version of the policy's weights, and
//! every RUN worker tags the tokens it generates from then on with it.
//!
//! An announcement is recorded in the database (only a newer version replaces the
//! current one, so concurrent announcers get one order) and then broadcast to the RUN
//! workers, which also re-read the current version every few seconds, so a lost
//! broadcast delays the tag and never loses it. A NATS request on
//! `<prefix>.policy.announce` carries the same body and gets the same answer
//! ([`super::nats`]).

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;

use super::AppState;
use super::error::{ApiError, ApiErrorBody};
use super::jobs::{decode_body, read_body};
use crate::api::policy::{PolicyRequest, PolicyView};
use crate::domain::EpochMs;
use crate::store::Announced;

/// Announce a policy version.
///
/// The trainer calls this after it has updated the inference servers' weights (its own
/// way: NCCL, disk, the servers' update endpoints). From the moment the RUN workers hear
/// of it, every model token they record carries this version. A version older than the
/// current one is refused (409, naming the current one); the current one again is
/// answered as it was.
#[utoipa::path(
    post,
    path = "/v1/policy",
    tag = "policy",
    request_body = PolicyRequest,
    responses(
        (status = 200, description = "The version is current", body = PolicyView),
        (status = 400, description = "Invalid input; `field` names the problem", body = ApiErrorBody),
        (status = 409, description = "A newer version is current", body = ApiErrorBody),
        (status = 413, description = "Body too large", body = ApiErrorBody),
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
    match state
        .store
        .announce_policy(req.version, EpochMs::now())
        .await?
    {
        Announced::New(current) => {
            tracing::info!(version = current.version, "policy version announced");
            // The workers also re-read the current version every few seconds: a lost
            // broadcast only delays them.
            if let Err(e) = state.queue.publish_policy(current.version).await {
                tracing::warn!(error = %e, "policy version not broadcast; the workers will read it from the database");
            }
            Ok(PolicyView {
                current: Some(current),
                changed: Some(true),
                recent: Vec::new(),
            })
        }
        Announced::Repeated(current) => Ok(PolicyView {
            current: Some(current),
            changed: Some(false),
            recent: Vec::new(),
        }),
        Announced::Outdated(current) => Err(ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "policy version {} is current; versions only move forward (announce {} or newer)",
                current.version,
                current.version.saturating_add(1)
            ),
            Some("version".into()),
        )),
    }
}

/// How many of the latest versions `GET /v1/policy` lists.
const RECENT: i64 = 20;

/// The current policy version, and the latest ones announced.
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
    Ok(Json(PolicyView {
        current: state.store.current_policy().await?,
        changed: None,
        recent: state.store.recent_policies(RECENT).await?,
    }))
}
