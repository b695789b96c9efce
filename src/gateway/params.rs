//! Query-string parsing that names the offending parameter.
//!
//! axum's `Query<T>` rejects bad input with plain-text messages that often do not say
//! which parameter was wrong; the API promises a JSON error naming the field, so query
//! strings are read as a map and each parameter is parsed here.

use std::collections::HashMap;
use std::str::FromStr;

use super::error::ApiError;

/// Raw query parameters with the names the handler accepts.
pub struct Params {
    map: HashMap<String, String>,
}

impl Params {
    /// Checks that only `allowed` names occur.
    pub fn new(map: HashMap<String, String>, allowed: &[&str]) -> Result<Self, ApiError> {
        if let Some(k) = map.keys().find(|k| !allowed.contains(&k.as_str())) {
            return Err(ApiError::bad_field(
                k.clone(),
                format!(
                    "unknown query parameter `{k}`; expected one of: {}",
                    allowed.join(", ")
                ),
            ));
        }
        for (k, v) in &map {
            check_text(k, v)?;
        }
        Ok(Self { map })
    }

    /// A string parameter.
    pub fn string(&self, name: &str) -> Option<String> {
        self.map.get(name).cloned()
    }

    /// A parsed parameter, with `what` describing the expected form for the error.
    pub fn parse<T: FromStr>(&self, name: &str, what: &str) -> Result<Option<T>, ApiError> {
        match self.map.get(name) {
            None => Ok(None),
            Some(v) => v.parse().map(Some).map_err(|_| {
                ApiError::bad_field(name, format!("`{name}` must be {what}, got `{v}`"))
            }),
        }
    }

    /// A non-negative integer parameter no larger than `max`.
    pub fn bounded(&self, name: &str, default: i64, max: i64) -> Result<i64, ApiError> {
        let v = self
            .parse::<i64>(name, "a non-negative integer")?
            .unwrap_or(default);
        if v < 0 || v > max {
            return Err(ApiError::bad_field(
                name,
                format!("`{name}` must be between 0 and {max}, got {v}"),
            ));
        }
        Ok(v)
    }
}

/// Refuses a text parameter no id can be or the database could not take: empty, over
/// 256 characters, or holding NUL (which Postgres cannot store; see [`crate::nul`]). A
/// 400 naming `name`, on every database alike. The OpenAPI document states the same as
/// the pattern `^[^\u0000]{1,256}$`.
pub fn check_text(name: &str, v: &str) -> Result<(), ApiError> {
    if v.is_empty() || v.chars().count() > 256 || v.contains('\0') {
        return Err(ApiError::bad_field(
            name,
            format!("`{name}` must be 1-256 characters, none of them NUL"),
        ));
    }
    Ok(())
}

/// The `{id}` of a path (a job or backend id), checked with [`check_text`]; also turns
/// a path that is not UTF-8 into the API's JSON 400 instead of axum's plain text.
pub struct IdPath(pub String);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for IdPath {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        let axum::extract::Path(id) =
            axum::extract::Path::<String>::from_request_parts(parts, state)
                .await
                .map_err(|e| ApiError::bad_field("id", format!("invalid `id`: {e}")))?;
        check_text("id", &id)?;
        Ok(IdPath(id))
    }
}

/// The query string as a map, for [`Params::new`]; a query that cannot be decoded (not
/// UTF-8 after percent-decoding, say) is the API's JSON 400, not axum's plain text.
pub struct QueryMap(pub HashMap<String, String>);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for QueryMap {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        let axum::extract::Query(map) =
            axum::extract::Query::<HashMap<String, String>>::from_request_parts(parts, state)
                .await
                .map_err(|e| ApiError::bad_field("query", format!("invalid query string: {e}")))?;
        Ok(QueryMap(map))
    }
}
