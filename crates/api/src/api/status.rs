//! `/v1/status` and `/healthz`: job counts, and whether the service's dependencies answer.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use rollout_core::domain::{BatchCounters, Stage, Status};

/// Response of `GET /v1/status`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct StatusView {
    /// Jobs by status and stage.
    pub counts: Vec<StatusCount>,
    /// The batch's counters, when a batch was named.
    pub batch: Option<BatchCounters>,
}

/// One line of `rollout status`: how many jobs have this status in this stage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct StatusCount {
    /// Status.
    pub status: Status,
    /// Stage.
    pub stage: Stage,
    /// Number of jobs.
    pub count: i64,
}

/// Reachability of one dependency.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DependencyHealth {
    /// Whether it answered.
    pub ok: bool,
    /// Why not; left out for callers without the token when the gateway has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Response of `GET /healthz`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Health {
    /// `ok` or `degraded`.
    pub status: String,
    /// NATS.
    pub nats: DependencyHealth,
    /// The database.
    pub database: DependencyHealth,
    /// The sandbox limits this host enforces, and the ones it cannot (each with why),
    /// as probed by this process; every worker also logs its own at start.
    #[schema(value_type = Object)]
    pub sandbox: serde_json::Value,
}
