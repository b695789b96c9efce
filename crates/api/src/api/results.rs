//! `/v1/results`: a page of results in `seq` order.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use rollout_core::domain::JobResult;

/// Response of `GET /v1/results`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ResultPage {
    /// Results with `seq > after`, in `seq` order.
    pub results: Vec<JobResult>,
    /// Pass as `after` next time (the last `seq` returned, or `after` if none).
    pub next_cursor: i64,
}
