//! The body of every error response.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The JSON body of every error response.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ApiErrorBody {
    /// What went wrong and what to do about it.
    pub error: String,
    /// The offending field for bad input, as a path such as `tasks[2].spec.run_ms`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}
