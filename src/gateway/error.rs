//! The gateway's one error type: every failure becomes a JSON body with a message and,
//! for bad input, the path of the offending field.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

pub use crate::api::error::ApiErrorBody;

/// An error response.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Body.
    pub body: ApiErrorBody,
}

impl ApiError {
    /// 400 naming `field`.
    pub fn bad_field(field: impl Into<String>, error: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, error, Some(field.into()))
    }

    /// An error with any status.
    pub fn new(status: StatusCode, error: impl Into<String>, field: Option<String>) -> Self {
        Self {
            status,
            body: ApiErrorBody {
                error: error.into(),
                field,
            },
        }
    }

    /// 401: the request lacks the gateway's token or carries a wrong one. The response
    /// also carries `WWW-Authenticate: Bearer`, as HTTP requires of a 401.
    pub fn unauthorized(error: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, error, None)
    }

    /// 404.
    pub fn not_found(what: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, what, None)
    }

    /// 503: a dependency is down; the caller should retry.
    pub fn unavailable(error: impl std::fmt::Display) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("{error}; retry the request"),
            None,
        )
    }
}

impl From<crate::store::StoreError> for ApiError {
    /// A database that cannot be reached is a 503 (retry); one that refuses the
    /// statement, or a row that cannot be read, is a 500: retrying would not help.
    fn from(e: crate::store::StoreError) -> Self {
        if e.is_rejected() {
            tracing::error!(error = %e, "the database refused a request's statement");
            return Self::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("{e}; retrying will not help, please report this"),
                None,
            );
        }
        tracing::warn!(error = %e, "database error in request");
        ApiError::unavailable(e)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (self.status, Json(self.body)).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            resp.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
        }
        resp
    }
}
