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
