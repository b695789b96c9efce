//! Dynamic sampling (DAPO): what a sampling batch asks for and how a group's verdict is
//! decided.
//!
//! A trainer wants K prompt groups whose rewards differ, because a group of G samples
//! that all got the same reward has zero advantage everywhere and contributes no
//! gradient. The service keeps groups running and decides each one's verdict the moment
//! its last sample ends; the decision itself is the pure function [`decide`], so every
//! gateway and worker that records a last result decides the same way.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{JobResult, Status};

/// When a group counts as informative.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct InformativeRule {
    /// `not_all_equal` (default): the rewards are not all the same. `reward_std`: their
    /// population standard deviation exceeds `eps`.
    #[serde(default)]
    pub rule: RuleKind,
    /// Threshold of `reward_std` (ignored by `not_all_equal`). Default 0.
    #[serde(default)]
    pub eps: f64,
    /// Only groups whose mean reward is at least this (a pass-rate window, as
    /// POLARIS-style difficulty filters use).
    #[serde(default)]
    pub min_mean: Option<f64>,
    /// Only groups whose mean reward is at most this.
    #[serde(default)]
    pub max_mean: Option<f64>,
}

impl Default for InformativeRule {
    fn default() -> Self {
        Self {
            rule: RuleKind::NotAllEqual,
            eps: 0.0,
            min_mean: None,
            max_mean: None,
        }
    }
}

/// The test applied to a group's rewards.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RuleKind {
    /// Not every reward is equal.
    #[default]
    NotAllEqual,
    /// The standard deviation of the rewards exceeds `eps`.
    RewardStd,
}

impl RuleKind {
    /// The name stored in the database and used in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            RuleKind::NotAllEqual => "not_all_equal",
            RuleKind::RewardStd => "reward_std",
        }
    }

    /// Parses [`RuleKind::as_str`]'s output.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "not_all_equal" => Some(RuleKind::NotAllEqual),
            "reward_std" => Some(RuleKind::RewardStd),
            _ => None,
        }
    }
}

impl InformativeRule {
    /// Why the rule cannot be applied (a field and the problem), if it cannot.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        if !self.eps.is_finite() || self.eps < 0.0 {
            return Err(("eps", "`eps` must be a finite number ≥ 0".into()));
        }
        for (name, v) in [("min_mean", self.min_mean), ("max_mean", self.max_mean)] {
            if v.is_some_and(|v| !v.is_finite()) {
                return Err((name, format!("`{name}` must be a finite number")));
            }
        }
        if let (Some(lo), Some(hi)) = (self.min_mean, self.max_mean)
            && lo > hi
        {
            return Err((
                "min_mean",
                format!("`min_mean` ({lo}) is above `max_mean` ({hi}); no group could pass"),
            ));
        }
        Ok(())
    }
}

/// What a finished group is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Its rewards pass the rule: it carries a gradient.
    Informative,
    /// Every sample ended with a reward, but they fail the rule (all equal, or outside
    /// the pass-rate window).
    Uniform,
    /// A sample failed or timed out, or ended without a reward: the group cannot be used.
    Incomplete,
    /// A sample was cancelled (the batch was complete or cancelled by the trainer).
    Cancelled,
    /// A sample was stale (its oldest model token older than `max_staleness` allowed
    /// when it finished): the group is not a training sample, and the next prompt
    /// replaces it.
    Stale,
}

impl Verdict {
    /// The name stored in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Informative => "informative",
            Verdict::Uniform => "uniform",
            Verdict::Incomplete => "incomplete",
            Verdict::Cancelled => "cancelled",
            Verdict::Stale => "stale",
        }
    }

    /// Parses [`Verdict::as_str`]'s output.
    pub fn parse(s: &str) -> Option<Self> {
        [
            Verdict::Informative,
            Verdict::Uniform,
            Verdict::Incomplete,
            Verdict::Cancelled,
            Verdict::Stale,
        ]
        .into_iter()
        .find(|v| v.as_str() == s)
    }
}

/// A group's rewards, summarised.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GroupStats {
    /// What the group is.
    pub verdict: Verdict,
    /// Mean reward, when every sample has one.
    pub mean: Option<f64>,
    /// Population standard deviation of the rewards, when every sample has one.
    pub std: Option<f64>,
}

/// Decides a group from its samples' terminal statuses and rewards.
///
/// A cancelled sample makes the group `cancelled`; any other sample without a reward
/// (failed, timed out, or `done` with no reward) makes it `incomplete`; otherwise the
/// rule decides between `informative` and `uniform`. Rewards are compared exactly:
/// graders give exact values (0, 1, fractions of cases), and a tolerance belongs in
/// `eps` with the `reward_std` rule.
pub fn decide(samples: &[(Status, Option<f64>)], rule: &InformativeRule) -> GroupStats {
    if samples.iter().any(|(s, _)| *s == Status::Cancelled) {
        return GroupStats {
            verdict: Verdict::Cancelled,
            mean: None,
            std: None,
        };
    }
    if samples.iter().any(|(s, _)| *s == Status::Stale) {
        return GroupStats {
            verdict: Verdict::Stale,
            mean: None,
            std: None,
        };
    }
    let rewards: Option<Vec<f64>> = samples
        .iter()
        .map(|(s, r)| if *s == Status::Done { *r } else { None })
        .collect();
    let Some(rewards) = rewards.filter(|r| !r.is_empty()) else {
        return GroupStats {
            verdict: Verdict::Incomplete,
            mean: None,
            std: None,
        };
    };
    #[allow(clippy::cast_precision_loss)] // a group has far fewer than 2^52 samples
    let n = rewards.len() as f64;
    let mean = rewards.iter().sum::<f64>() / n;
    let std = (rewards.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / n).sqrt();
    let spread = match rule.rule {
        RuleKind::NotAllEqual => rewards.iter().any(|r| *r != rewards[0]),
        RuleKind::RewardStd => std > rule.eps,
    };
    let in_window =
        rule.min_mean.is_none_or(|lo| mean >= lo) && rule.max_mean.is_none_or(|hi| mean <= hi);
    GroupStats {
        verdict: if spread && in_window {
            Verdict::Informative
        } else {
            Verdict::Uniform
        },
        mean: Some(mean),
        std: Some(std),
    }
}

/// Where a sampling batch is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SamplingStatus {
    /// Groups are being launched and decided.
    Running,
    /// `target_groups` informative groups were accepted; the rest was cancelled.
    Complete,
    /// `max_groups` prompts (or the whole pool) were tried and every group decided
    /// with fewer than `target_groups` informative: the batch gave up.
    Exhausted,
    /// The trainer cancelled it.
    Cancelled,
}

impl SamplingStatus {
    /// The name stored in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            SamplingStatus::Running => "running",
            SamplingStatus::Complete => "complete",
            SamplingStatus::Exhausted => "exhausted",
            SamplingStatus::Cancelled => "cancelled",
        }
    }

    /// Parses [`SamplingStatus::as_str`]'s output.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "running" => Some(SamplingStatus::Running),
            "complete" => Some(SamplingStatus::Complete),
            "exhausted" => Some(SamplingStatus::Exhausted),
            "cancelled" => Some(SamplingStatus::Cancelled),
            _ => None,
        }
    }

    /// Whether no more groups will be launched or accepted.
    pub fn is_final(self) -> bool {
        self != SamplingStatus::Running
    }
}

/// What a sampling batch does with its groups still running when it ends (its K-th
/// informative group, `max_groups`, or the trainer's cancel).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnCancel {
    /// Cancel them: their work is thrown away (the default).
    #[default]
    Discard,
    /// Keep them running, as partial rollouts a later batch adopts (its `carry_from`):
    /// they go on under whatever policy version is current (held through weight
    /// updates like any episode) and are delivered with the adopter's groups.
    Keep,
}

impl OnCancel {
    /// The name stored in the database and used in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            OnCancel::Discard => "discard",
            OnCancel::Keep => "keep",
        }
    }

    /// Parses [`OnCancel::as_str`]'s output.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "discard" => Some(OnCancel::Discard),
            "keep" => Some(OnCancel::Keep),
            _ => None,
        }
    }
}

/// What a sampling batch is asked to do (everything of `POST /v1/batches` but the
/// prompts and the id).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SamplingParams {
    /// G: how many times each prompt is sampled, as one group.
    pub group_size: i64,
    /// K: how many informative groups the trainer wants.
    pub target_groups: i64,
    /// How many groups run at once; a new prompt is launched as soon as a group ends.
    pub max_groups_in_flight: i64,
    /// Give up after this many prompts were tried (at most the pool's size, which is
    /// the default).
    pub max_groups: i64,
    /// When a group counts as informative.
    pub informative: InformativeRule,
    /// The policy version the samples are drawn from, stamped on every job (in its
    /// task's `metadata.policy_version`) so off-policy samples can be told apart.
    pub policy_version: Option<i64>,
    /// What happens to the groups still running when the batch ends.
    #[serde(default)]
    pub on_cancel: OnCancel,
    /// The batch whose kept groups (`on_cancel: keep`) this one adopted when it was
    /// created: they count among its groups in flight and, once decided, toward its K,
    /// and are delivered with its groups (each says `carried_from`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub carry_from: Option<String>,
}

/// The counters of a sampling batch: rows a dashboard can read, updated in the
/// transactions that cause them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SamplingCounters {
    /// Groups launched (prompts tried).
    pub groups_launched: i64,
    /// Groups whose verdict is decided.
    pub groups_decided: i64,
    /// Informative groups accepted (at most `target_groups`).
    pub informative: i64,
    /// Informative groups decided after the batch had ended (not accepted).
    pub surplus: i64,
    /// Groups whose rewards failed the rule.
    pub uniform: i64,
    /// Groups with a failed, timed-out or unrewarded sample.
    pub incomplete: i64,
    /// Groups with a cancelled sample.
    pub cancelled_groups: i64,
    /// Groups with a stale sample (replaced by the next prompt).
    #[serde(default)]
    pub stale_groups: i64,
    /// Samples cancelled before their end (by early cancel or the trainer).
    pub jobs_saved: i64,
    /// Sandbox milliseconds those samples did not spend: each one's expected sandbox
    /// time (the mean over the batch's samples that ran to their end) less what it had
    /// spent. Zero while no sample has run to its end.
    pub sandbox_ms_saved: i64,
    /// Sandbox milliseconds spent by samples that ran to their end (INIT start to
    /// result).
    pub sandbox_ms_used: i64,
    /// Samples that ran to their end (`done`).
    pub samples_completed: i64,
    /// Groups still running when the batch ended that it kept (`on_cancel: keep`) for a
    /// later batch to adopt; counted among the decided ones.
    #[serde(default)]
    pub kept_groups: i64,
    /// Kept groups of an earlier batch this one adopted (`carry_from`); counted among
    /// the launched ones, not among the prompts tried (`max_groups`).
    #[serde(default)]
    pub adopted_groups: i64,
}

/// A sampling batch as `GET /v1/batches/{id}` reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SamplingBatch {
    /// Batch id (also the id of its plain batch: its jobs and results).
    pub id: String,
    /// What it was asked to do.
    #[serde(flatten)]
    pub params: SamplingParams,
    /// Prompts in the pool.
    pub prompt_count: i64,
    /// Where it is.
    pub status: SamplingStatus,
    /// Why it ended, for `exhausted` and `cancelled`.
    pub reason: Option<String>,
    /// Progress and savings.
    pub counters: SamplingCounters,
    /// Created (epoch ms).
    pub created_at: i64,
    /// Ended (epoch ms), once it did.
    pub ended_at: Option<i64>,
}

/// An accepted informative group: what the trainer trains on.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AcceptedGroup {
    /// The batch.
    pub batch_id: String,
    /// Its place among the accepted groups, 1..=K, in the order they were decided.
    pub rank: i64,
    /// The prompt's index in the pool.
    pub prompt_index: i64,
    /// The group id its jobs and results carry (`p<index>`).
    pub group_id: String,
    /// Mean reward.
    pub reward_mean: Option<f64>,
    /// Population standard deviation of the rewards.
    pub reward_std: Option<f64>,
    /// The G results, in sample order, each with its trajectory in `output`.
    pub results: Vec<JobResult>,
    /// The batch that launched the group, when this one adopted it (a partial rollout
    /// carried over: `prompt_index` and `group_id` are in that batch, as are its
    /// results' `batch_id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub carried_from: Option<String>,
}

/// The client id of sample `sample` of prompt `index` of `batch`: fixed, so launching a
/// group twice (a retried transaction) can never create its jobs twice.
pub fn sample_client_id(batch: &str, index: i64, sample: i64) -> String {
    format!("{batch}:p{index}:s{sample}")
}

/// The group id of prompt `index` of a sampling batch.
pub fn prompt_group_id(index: i64) -> String {
    format!("p{index}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(rewards: &[f64]) -> Vec<(Status, Option<f64>)> {
        rewards.iter().map(|r| (Status::Done, Some(*r))).collect()
    }

    #[test]
    fn not_all_equal_separates_mixed_from_uniform_groups() {
        let rule = InformativeRule::default();
        assert_eq!(
            decide(&done(&[1.0, 0.0, 1.0]), &rule).verdict,
            Verdict::Informative
        );
        assert_eq!(
            decide(&done(&[1.0, 1.0, 1.0]), &rule).verdict,
            Verdict::Uniform
        );
        assert_eq!(decide(&done(&[0.0, 0.0]), &rule).verdict, Verdict::Uniform);
        let s = decide(&done(&[1.0, 0.0]), &rule);
        assert_eq!((s.mean, s.std), (Some(0.5), Some(0.5)));
    }

    #[test]
    fn a_failed_or_unrewarded_sample_makes_the_group_incomplete_and_a_cancelled_one_cancelled() {
        let rule = InformativeRule::default();
        let mut s = done(&[1.0, 0.0]);
        s.push((Status::Failed, None));
        assert_eq!(decide(&s, &rule).verdict, Verdict::Incomplete);
        let mut s = done(&[1.0, 0.0]);
        s.push((Status::Done, None));
        assert_eq!(decide(&s, &rule).verdict, Verdict::Incomplete);
        s.push((Status::Cancelled, None));
        assert_eq!(decide(&s, &rule).verdict, Verdict::Cancelled);
        assert_eq!(decide(&[], &rule).verdict, Verdict::Incomplete);
        // A stale sample, however its group's rewards spread, makes the group stale;
        // a cancelled one still wins (the batch is over).
        let mut s = done(&[1.0, 0.0]);
        s.push((Status::Stale, Some(1.0)));
        assert_eq!(decide(&s, &rule).verdict, Verdict::Stale);
        s.push((Status::Cancelled, None));
        assert_eq!(decide(&s, &rule).verdict, Verdict::Cancelled);
    }

    #[test]
    fn reward_std_needs_a_spread_above_eps() {
        let rule = InformativeRule {
            rule: RuleKind::RewardStd,
            eps: 0.1,
            ..InformativeRule::default()
        };
        assert_eq!(
            decide(&done(&[0.5, 0.55, 0.5, 0.55]), &rule).verdict,
            Verdict::Uniform
        );
        assert_eq!(
            decide(&done(&[0.0, 1.0, 0.0, 0.0]), &rule).verdict,
            Verdict::Informative
        );
    }

    #[test]
    fn the_pass_rate_window_drops_too_easy_and_too_hard_groups() {
        let rule = InformativeRule {
            min_mean: Some(0.2),
            max_mean: Some(0.8),
            ..InformativeRule::default()
        };
        let easy = done(&[1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0]);
        let hard = done(&[0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]);
        let mid = done(&[1.0, 0.0, 1.0, 0.0]);
        assert_eq!(decide(&easy, &rule).verdict, Verdict::Uniform);
        assert_eq!(decide(&hard, &rule).verdict, Verdict::Uniform);
        assert_eq!(decide(&mid, &rule).verdict, Verdict::Informative);
    }

    #[test]
    fn rules_that_no_group_could_pass_are_refused() {
        let bad = InformativeRule {
            min_mean: Some(0.9),
            max_mean: Some(0.1),
            ..InformativeRule::default()
        };
        assert_eq!(bad.check().unwrap_err().0, "min_mean");
        let bad = InformativeRule {
            eps: f64::NAN,
            ..InformativeRule::default()
        };
        assert_eq!(bad.check().unwrap_err().0, "eps");
        assert!(InformativeRule::default().check().is_ok());
    }
}
