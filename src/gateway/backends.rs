//! `/v1/backends`: the inference backend pool, listed, registered and removed.
//!
//! Backends from the configuration file are registered at every start; these endpoints
//! add the ones a deployment brings up later (a new vLLM replica on a fresh node) and
//! remove the ones it takes down. A backend registered here is probed at once (`GET
//! /v1/models`), so the answer already says whether it is reachable and serves the
//! model under the name requests will use; after that the health prober keeps the
//! verdict current. API keys are never returned (`api_key_set` says whether one is
//! registered).

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;

use super::AppState;
use super::error::{ApiError, ApiErrorBody};
use super::params::IdPath;
use crate::domain::EpochMs;
use crate::domain::backend::{BackendSpec, BackendState};

/// Every registered backend with its health and active jobs.
#[utoipa::path(
    get,
    path = "/v1/backends",
    tag = "backends",
    responses(
        (status = 200, body = Vec<BackendState>),
        (status = 503, description = "Database unavailable; retry", body = ApiErrorBody),
    )
)]
pub async fn list_backends(
    State(state): State<AppState>,
) -> Result<Json<Vec<BackendState>>, ApiError> {
    let all = state.store.backends().await?;
    Ok(Json(all.into_iter().map(BackendState::redacted).collect()))
}

/// One backend.
#[utoipa::path(
    get,
    path = "/v1/backends/{id}",
    tag = "backends",
    params(("id" = String, Path, description = "Backend id", pattern = "^[^\\u0000]{1,256}$")),
    responses(
        (status = 400, description = "Invalid input; `field` names the problem", body = ApiErrorBody),
        (status = 200, body = BackendState),
        (status = 404, body = ApiErrorBody),
    )
)]
pub async fn get_backend(
    State(state): State<AppState>,
    IdPath(id): IdPath,
) -> Result<Json<BackendState>, ApiError> {
    state
        .store
        .backend(&id)
        .await?
        .map(|b| Json(b.redacted()))
        .ok_or_else(|| ApiError::not_found(format!("no backend with id `{id}`")))
}

/// Registers a backend, or replaces the one with the same id, and probes it once: the
/// answer's `healthy` and `last_error` say whether it answers and serves the model
/// under the name requests use (a vLLM started without the matching
/// `--served-model-name` would refuse every request). A backend that is down when
/// registered stays registered; the health prober marks it up when it answers.
#[utoipa::path(
    post,
    path = "/v1/backends",
    tag = "backends",
    request_body = BackendSpec,
    responses(
        (status = 201, description = "Registered", body = BackendState),
        (status = 400, description = "Invalid input; `field` names the problem", body = ApiErrorBody),
        (status = 503, description = "Database unavailable; retry", body = ApiErrorBody),
    )
)]
pub async fn add_backend(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<BackendState>), ApiError> {
    let body = body.map_err(|e| ApiError::new(e.status(), e.body_text(), None))?;
    let mut de = serde_json::Deserializer::from_slice(&body);
    let spec: BackendSpec = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("invalid backend: {}", e.inner()),
            (path != ".").then_some(path),
        )
    })?;
    spec.validate().map_err(|(field, problem)| {
        ApiError::bad_field(field, format!("invalid backend: {problem}"))
    })?;
    state
        .store
        .upsert_backend(&spec, "api", EpochMs::now())
        .await?;
    tracing::info!(backend = %spec.id, url = %spec.url, model = %spec.model, "backend registered");
    let client = crate::backends::client::InferenceClient::new((&state.settings.pool).into());
    let timeout = std::time::Duration::from_millis(state.settings.pool.health_timeout_ms);
    let verdict = client.health(&spec, timeout).await;
    if let Err(e) = &verdict {
        tracing::warn!(backend = %spec.id, error = %e, "the backend just registered is not usable yet");
    }
    state
        .store
        .set_backend_health(
            &spec.id,
            verdict.is_ok(),
            verdict.err().as_deref(),
            EpochMs::now(),
        )
        .await?;
    let registered = state.store.backend(&spec.id).await?.ok_or_else(|| {
        ApiError::unavailable("the backend vanished right after it was registered")
    })?;
    Ok((StatusCode::CREATED, Json(registered.redacted())))
}

/// Unregisters a backend. Jobs running on it finish their current request there and
/// move to another backend at their next failed request.
#[utoipa::path(
    delete,
    path = "/v1/backends/{id}",
    tag = "backends",
    params(("id" = String, Path, description = "Backend id", pattern = "^[^\\u0000]{1,256}$")),
    responses(
        (status = 400, description = "Invalid input; `field` names the problem", body = ApiErrorBody),
        (status = 204, description = "Removed"),
        (status = 404, body = ApiErrorBody),
    )
)]
pub async fn remove_backend(
    State(state): State<AppState>,
    IdPath(id): IdPath,
) -> Result<StatusCode, ApiError> {
    if state.store.delete_backend(&id).await? {
        tracing::info!(backend = %id, "backend removed");
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found(format!("no backend with id `{id}`")))
    }
}
