//! `/v1/policy`: the trainer's announcements of policy versions and weight updates.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

pub use rollout_core::domain::policy::{BackendAnswer, PolicyPause, PolicyVersion, UpdateMode};

/// An announcement: the trainer's weights are now at `version` (no `mode`), or are about
/// to be updated to it (`mode`: stop generation first, until
/// `POST /v1/policy/{version}/resume`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicyRequest {
    /// The new version (the trainer's own numbering, e.g. its step). Must be newer than
    /// the current one; announcing the current one again is harmless.
    #[schema(minimum = 0)]
    pub version: i64,
    /// Stop generation for a weight update to `version`: the answer comes once every
    /// backend has stopped, and the version becomes current on the resume. Without it the
    /// version is current at once (the trainer updated the servers itself).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<UpdateMode>,
    /// How long the update may hold generation (seconds, default 600, at most 86400):
    /// if no resume comes by then (the trainer died), the service resumes the backends
    /// itself and the version does not become current.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 86400)]
    pub lease_s: Option<u64>,
}

/// The current policy version, the weight update in progress, and what a request did.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct PolicyView {
    /// The current version; `null` before the first announcement.
    pub current: Option<PolicyVersion>,
    /// The weight update in progress, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause: Option<PolicyPause>,
    /// For an announcement or a resume: `true` when it changed something, `false` when it
    /// was a repeat. Absent on `GET`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changed: Option<bool>,
    /// For a pause or a resume: what each backend answered.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backends: Vec<BackendAnswer>,
    /// On `GET`: the latest versions that became current (at most 20), newest first,
    /// each with when; absent otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recent: Vec<PolicyVersion>,
}
