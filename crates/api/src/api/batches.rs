//! `/v1/batches`: a sampling batch's request, its view, a cancel's answer and a page of
//! accepted groups.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use rollout_core::domain::BatchCounters;
use rollout_core::domain::Task;
use rollout_core::domain::sampling::{
    AcceptedGroup, InformativeRule, OnCancel, SamplingBatch, SamplingStatus,
};

/// Body of `POST /v1/batches`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchRequest {
    /// The batch's id: letters, digits, `-`, `_`. The same id again returns the existing
    /// batch (a retried request creates nothing twice). A fresh id when absent.
    #[serde(default)]
    #[schema(pattern = "^[A-Za-z0-9_-]{1,128}$")]
    pub batch_id: Option<String>,
    /// The prompt pool, tried in order: each task is sampled `group_size` times as the
    /// group `p<index>`. Tasks carry no `client_id` or `group_id` (the service sets
    /// them) and should carry no fixed seed, or every sample of a group is the same.
    #[schema(min_items = 1)]
    pub prompts: Vec<Task>,
    /// G: samples per prompt (at least 2: one sample cannot disagree with itself).
    #[schema(minimum = 2)]
    pub group_size: i64,
    /// K: informative groups wanted.
    #[schema(minimum = 1)]
    pub target_groups: i64,
    /// Groups running at once (default: `target_groups`).
    #[serde(default)]
    #[schema(minimum = 1)]
    pub max_groups_in_flight: Option<i64>,
    /// Give up after this many prompts were tried (default and most: the pool's size).
    #[serde(default)]
    #[schema(minimum = 1)]
    pub max_groups: Option<i64>,
    /// When a group counts as informative (default: rewards not all equal).
    #[serde(default)]
    pub informative: InformativeRule,
    /// Stamped on every job as `metadata.policy_version`.
    #[serde(default)]
    pub policy_version: Option<i64>,
    /// The staleness bound (policy versions), given to every prompt that does not set
    /// its own: a sample whose oldest model token is older than `current - max_staleness`
    /// when it finishes ends `stale`, and its group is replaced by the next prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0)]
    pub max_staleness: Option<i64>,
    /// What happens to the groups still running when the batch ends (its K-th
    /// informative group, `max_groups`, or a cancel): `discard` (the default) cancels
    /// them; `keep` lets them run on as partial rollouts, for a later batch to adopt
    /// (`carry_from`).
    #[serde(default)]
    pub on_cancel: OnCancel,
    /// A sampling batch whose kept groups (`on_cancel: keep`) this one adopts: they
    /// count among its groups in flight and, once decided, toward its K, and come with
    /// its groups (`carried_from` on each). Kept groups another batch adopted already
    /// are not adopted twice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[A-Za-z0-9_-]{1,128}$")]
    pub carry_from: Option<String>,
}

/// A sampling batch and its accepted groups.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct BatchView {
    /// The batch: parameters, status, counters.
    pub batch: SamplingBatch,
    /// The accepted groups in rank order, each with its G results (exactly
    /// `target_groups` once the batch is `complete`), as many as fit in one page's
    /// byte budget (`gateway.max_page_bytes`; at least one).
    pub groups: Vec<AcceptedGroup>,
    /// Set when the accepted groups did not all fit in `groups`: pass it as `after` to
    /// `GET /v1/batches/{id}/groups` for the rest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub more_groups_after: Option<i64>,
    /// True when the id existed and this request created nothing.
    #[serde(default)]
    pub duplicate: bool,
    /// In the answer to a cancel: how many of the batch's jobs had not ended when it was
    /// cancelled. They end `cancelled` shortly after the answer; none is scored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancelling: Option<i64>,
}

/// The answer to cancelling a plain batch (one made by `POST /v1/jobs`).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PlainBatchCancelled {
    /// The batch's counters, with `ended_at` and `end_reason` set.
    pub batch: BatchCounters,
    /// How many of its jobs had not ended when it was cancelled. They end `cancelled`
    /// shortly after the answer and none is scored, but for a job whose end was being
    /// written as the cancel came: it ends as it would have, stamped before the cancel.
    pub cancelling: i64,
}

/// The answer to `POST /v1/batches/{id}/cancel`: the sampling batch, or the plain one.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum CancelledBatch {
    /// A sampling batch.
    Sampling(Box<BatchView>),
    /// A plain batch.
    Plain(PlainBatchCancelled),
}

/// Response of `GET /v1/batches/{id}/verdicts`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct VerdictPage {
    /// The batch's groups in launch order, each with its verdict so far.
    pub groups: Vec<GroupVerdict>,
    /// Whether the batch has more groups than `limit` asked for.
    pub more: bool,
}

/// One group of a sampling batch and where it stands: every group, not only the
/// accepted ones, so a reader sees why the batch took the prompts it took.
// The served description (see the reviewed OpenAPI snapshot) starts with the doc
// comment of a store function that once sat just above this type's store row, when
// that row was the schema. It is kept word for word so that moving the type changed
// nothing served; correcting it is a change to the snapshot, to be reviewed on its own.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(description = concat!(
    "The jobs of prompts `first .. first + n` of a batch: `group_size` samples each,\n",
    "with fixed client ids and the policy version stamped in their metadata.\n",
    "One group of a sampling batch and where it stands: every group, not only the\n",
    "accepted ones, so a reader sees why the batch took the prompts it took."
))]
pub struct GroupVerdict {
    /// The group (`p<index>`; an adopted group's id in the batch that kept it).
    pub group_id: String,
    /// Its prompt's index in the pool (in the batch that launched it).
    pub prompt_index: i64,
    /// `in_flight`, `informative`, `uniform`, `incomplete`, `cancelled`, `stale` or
    /// `kept`.
    pub state: String,
    /// Its rank among the accepted groups, when accepted.
    pub accepted_rank: Option<i64>,
    /// Mean reward of its samples, once decided.
    pub reward_mean: Option<f64>,
    /// Their standard deviation.
    pub reward_std: Option<f64>,
    /// When it was launched (epoch ms).
    pub launched_at: i64,
    /// When its verdict was taken (epoch ms).
    pub decided_at: Option<i64>,
    /// For an adopted group, the batch that kept it (its jobs are there).
    pub carried_from: Option<String>,
}

/// Response of `GET /v1/batches/{id}/groups`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct GroupPage {
    /// Accepted groups ranked after `after`, in rank order.
    pub groups: Vec<AcceptedGroup>,
    /// Pass as `after` next time.
    pub next_cursor: i64,
    /// The batch's status; once it is not `running` and a page comes back empty, no
    /// more groups will come.
    pub status: SamplingStatus,
}
