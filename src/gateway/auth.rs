//! Bearer-token authentication of the gateway.
//!
//! With `gateway.token` set, every request must carry `Authorization: Bearer <token>`,
//! except the paths in [`OPEN_PATHS`]: `GET /healthz`, which load balancers probe
//! without credentials (unauthenticated callers see only whether NATS and the database
//! answer, not why they do not), `GET /openapi.json`, which describes the API but
//! holds no data, and the status page's three files, which hold no data either (the
//! page asks for the token and sends it with every read). Without a token anything that can reach the port — code running in a
//! sandbox on the same machine included — could submit and cancel jobs, read results and
//! repoint the inference backend pool. With `gateway.token` empty nothing is checked,
//! which the settings allow only on a loopback address.
//!
//! The token is compared in constant time, so response timing does not reveal how much
//! of a guess was right.

use axum::extract::{Request, State};
use axum::http::{HeaderMap, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;
use utoipa::openapi::OpenApi;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};

use super::AppState;
use super::error::ApiError;

/// Paths served without a token even when `gateway.token` is set: health, the API's
/// description and the status page's files (the page asks for the token before it
/// reads any data).
pub const OPEN_PATHS: &[&str] = &[
    "/healthz",
    "/openapi.json",
    "/",
    "/ui/app.js",
    "/ui/app.css",
];

/// The name of the bearer scheme in the OpenAPI document.
const SCHEME: &str = "bearer";

/// Checks the `Authorization` header against `expected`. An empty `expected` means
/// authentication is off and every request passes; otherwise a missing, malformed or
/// wrong token is a 401 saying which and what to send.
pub fn check(headers: &HeaderMap, expected: &str) -> Result<(), ApiError> {
    if expected.is_empty() {
        return Ok(());
    }
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Err(ApiError::unauthorized(
            "this gateway requires a token: send the header `Authorization: Bearer <token>` \
             with the gateway's gateway.token (the rollout CLI reads --token, \
             ROLLOUT_GATEWAY_TOKEN or gateway.token)",
        ));
    };
    let provided = value
        .to_str()
        .ok()
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim());
    let Some(provided) = provided else {
        return Err(ApiError::unauthorized(
            "the Authorization header is not of the form `Bearer <token>`: send \
             `Authorization: Bearer <token>` with the gateway's gateway.token",
        ));
    };
    if bool::from(provided.as_bytes().ct_eq(expected.as_bytes())) {
        Ok(())
    } else {
        tracing::info!("request with a wrong gateway token rejected");
        Err(ApiError::unauthorized(
            "the bearer token is not the one this gateway expects: send the value of the \
             gateway's gateway.token (the rollout CLI reads --token, ROLLOUT_GATEWAY_TOKEN or \
             gateway.token)",
        ))
    }
}

/// Middleware of the whole router: lets [`OPEN_PATHS`] through and answers 401 to any
/// other request without the right token, before it reaches a handler (unknown paths
/// included, so the API's shape is not probed without a token either).
pub async fn require_token(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let expected = &state.settings.gateway.token;
    if expected.is_empty() || OPEN_PATHS.contains(&req.uri().path()) {
        return next.run(req).await;
    }
    match check(req.headers(), expected) {
        Ok(()) => next.run(req).await,
        Err(e) => e.into_response(),
    }
}

/// Declares the bearer scheme in the OpenAPI document, required by every operation but
/// those on [`OPEN_PATHS`], so generated clients send the token. Called only when a
/// token is configured: the document describes the gateway as it runs.
pub fn document(api: &mut OpenApi) {
    let scheme = HttpBuilder::new()
        .scheme(HttpAuthScheme::Bearer)
        .description(Some(
            "The gateway's `gateway.token`, sent as `Authorization: Bearer <token>`.",
        ))
        .build();
    api.components
        .get_or_insert_with(Default::default)
        .add_security_scheme(SCHEME, SecurityScheme::Http(scheme));
    api.security = Some(vec![SecurityRequirement::new(SCHEME, Vec::<String>::new())]);
    for path in OPEN_PATHS {
        if let Some(op) = api
            .paths
            .paths
            .get_mut(*path)
            .and_then(|item| item.get.as_mut())
        {
            // An empty requirement: no credentials needed.
            op.security = Some(vec![SecurityRequirement::default()]);
        }
    }
}
