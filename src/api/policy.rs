//! `/v1/policy`: the trainer's announcements of policy versions.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

pub use crate::domain::policy::PolicyVersion;

/// An announcement: the trainer's weights are now at `version`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicyRequest {
    /// The new version (the trainer's own numbering, e.g. its step). Must be newer than
    /// the current one; announcing the current one again is harmless.
    #[schema(minimum = 0)]
    pub version: i64,
}

/// The current policy version, and what an announcement did.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct PolicyView {
    /// The current version; `null` before the first announcement.
    pub current: Option<PolicyVersion>,
    /// For an announcement: `true` when it made its version current, `false` when that
    /// version was current already (a repeat). Absent on `GET`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changed: Option<bool>,
    /// On `GET`: the latest versions announced (at most 20), newest first, each with
    /// when it was; absent on an announcement.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recent: Vec<PolicyVersion>,
}
