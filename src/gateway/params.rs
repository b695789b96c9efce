//! Typed query strings and path ids that name the offending parameter.
//!
//! axum's `Query<T>` rejects bad input with plain-text messages; the API promises a
//! JSON error naming the field. [`ApiQuery<T>`] decodes the query string into the
//! handler's typed struct (the same struct the OpenAPI document describes), naming
//! the parameter that failed to decode (or was unknown, or repeated), then runs the
//! struct's [`CheckQuery`] for what a type cannot say (ranges, text limits).

use serde::de::DeserializeOwned;

use super::error::ApiError;

/// What a decoded query must satisfy beyond its types.
pub trait CheckQuery {
    /// A 400 naming the first parameter out of bounds.
    fn check(&self) -> Result<(), ApiError>;
}

/// A query string decoded into `T` and checked, or the API's JSON 400 naming the
/// parameter. `T` should deny unknown fields, so a misspelt parameter is an error
/// rather than silently ignored.
#[derive(Debug)]
pub struct ApiQuery<T>(pub T);

impl<T, S> axum::extract::FromRequestParts<S> for ApiQuery<T>
where
    T: DeserializeOwned + CheckQuery + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _state: &S,
    ) -> Result<Self, Self::Rejection> {
        let raw = parts.uri.query().unwrap_or("");
        let de = serde_urlencoded::Deserializer::new(form_urlencoded::parse(raw.as_bytes()));
        let query: T = serde_path_to_error::deserialize(de).map_err(query_error)?;
        query.check()?;
        Ok(ApiQuery(query))
    }
}

/// The 400 for a query string that does not decode: the field is the failing path, or
/// for an unknown or repeated parameter (reported at the top level) the name serde
/// quotes.
fn query_error(e: serde_path_to_error::Error<serde_urlencoded::de::Error>) -> ApiError {
    let message = e.inner().to_string();
    let path = e.path().to_string();
    let field = if path.is_empty() || path == "." || path == "?" {
        message
            .split('`')
            .nth(1)
            .map_or_else(|| "query".to_string(), str::to_string)
    } else {
        path
    };
    ApiError::bad_field(
        field.clone(),
        format!("invalid query parameter `{field}`: {message}"),
    )
}

/// A text parameter, when given, passes [`check_text`].
pub fn check_opt_text(name: &str, v: Option<&str>) -> Result<(), ApiError> {
    v.map_or(Ok(()), |v| check_text(name, v))
}

/// A number parameter, when given, lies in `0..=max`.
pub fn check_range(name: &str, v: Option<i64>, max: i64) -> Result<(), ApiError> {
    match v {
        Some(v) if !(0..=max).contains(&v) => Err(ApiError::bad_field(
            name,
            format!("`{name}` must be between 0 and {max}, got {v}"),
        )),
        _ => Ok(()),
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

/// The `Last-Event-ID` header a reconnecting EventSource client sends: the id of the
/// last event it got (`what` it is, for the error), which wins over the query's cursor.
pub(super) fn last_event_id(
    headers: &axum::http::HeaderMap,
    what: &str,
) -> Result<Option<i64>, ApiError> {
    let Some(v) = headers.get("last-event-id") else {
        return Ok(None);
    };
    v.to_str()
        .ok()
        .and_then(|s| s.trim().parse::<i64>().ok())
        .filter(|v| *v >= 0)
        .map(Some)
        .ok_or_else(|| {
            ApiError::bad_field("Last-Event-ID", format!("`Last-Event-ID` must be {what}"))
        })
}
