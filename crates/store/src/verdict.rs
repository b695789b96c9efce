//! A job's end as it concerns its sampling batch: counting the sample into the batch
//! and, when it was the last of its group, taking the group's verdict, all in the
//! transaction that writes the result.
//!
//! Apart from the sampling batches' own store (`sampling`) because every job's end
//! runs it (`write::ends`), while the batches' store submits jobs (`jobs`), and the
//! write path must not depend on what depends on it.

use super::query::{Conn, query};
use super::rows::{parse_sampling_status, parse_status};
use super::{StoreError, StoreResult, sql};
use rollout_core::domain::sampling::{
    GroupStats, InformativeRule, RuleKind, SamplingStatus, Verdict, decide,
};
use rollout_core::domain::{EpochMs, JobResult, Status};

/// A group's verdict, taken by the result that ended its last sample.
#[derive(Debug, Clone, PartialEq)]
pub struct Decided {
    /// The batch.
    pub batch_id: String,
    /// The group (`p<index>`).
    pub group_id: String,
    /// What the group is.
    pub verdict: Verdict,
    /// Its rank, if it was accepted.
    pub accepted_rank: Option<i64>,
    /// The batch's status after this verdict (`complete` when this was the K-th).
    pub batch_status: SamplingStatus,
}

/// A job's end as the store recorded it: its result, and the verdict it decided when it
/// was the last sample of a sampling group.
#[derive(Debug, Clone)]
pub struct Ended {
    /// The result written.
    pub result: JobResult,
    /// The group decided by this result, if any.
    pub decided: Option<Decided>,
}

/// Runs inside the transaction that wrote `result`: counts the sample into its sampling
/// batch (sandbox time used, or saved when it was cancelled) and, when it was the last
/// sample of its group, decides the group. `None` when the result is not of a sampling
/// group or did not end its group.
pub(super) async fn on_result<C: Conn>(
    conn: &mut C,
    result: &JobResult,
    now: EpochMs,
) -> StoreResult<Option<Decided>> {
    let Some(group_id) = result.group_id.as_deref() else {
        return Ok(None);
    };
    let batch_id = result.batch_id.as_str();
    type GroupOfResult = (
        String,
        String,
        f64,
        Option<f64>,
        Option<f64>,
        i64,
        i64,
        i64,
        i64,
        Option<String>,
    );
    let row: Option<GroupOfResult> = query(sql::GROUP_OF_RESULT)
        .bind(batch_id)
        .bind(group_id)
        .fetch_optional(conn)
        .await?;
    let Some((state, rule, eps, min_mean, max_mean, used, completed, finished, submitted, carried)) =
        row
    else {
        return Ok(None);
    };
    count_sample(conn, result, used, completed, now).await?;
    if finished < submitted {
        return Ok(None);
    }
    let adopted = carried.map(|to| (to, format!("{batch_id}/{group_id}")));
    let Some((state, rule, eps, min_mean, max_mean)) = deciding_row(
        conn,
        adopted.as_ref(),
        (state, rule, eps, min_mean, max_mean),
    )
    .await?
    else {
        return Ok(None);
    };
    if state != "in_flight" && state != "kept" {
        return Ok(None);
    }
    let rule = InformativeRule {
        rule: RuleKind::parse(&rule)
            .ok_or_else(|| StoreError::Corrupt(format!("unknown sampling rule `{rule}`")))?,
        eps,
        min_mean,
        max_mean,
    };
    let stats = group_stats(conn, batch_id, group_id, &rule).await?;
    let (batch_id, group_id) = match &adopted {
        None => (batch_id, group_id),
        Some((to, row)) => (to.as_str(), row.as_str()),
    };
    // A kept group no batch has adopted (yet) keeps its verdict for the one that will.
    let kept = state == "kept";
    let decided = query(if kept {
        sql::KEPT_VERDICT
    } else {
        sql::DECIDE_GROUP
    })
    .bind(batch_id)
    .bind(group_id)
    .bind(stats.verdict.as_str())
    .bind(stats.mean)
    .bind(stats.std)
    .bind(now)
    .execute(conn)
    .await?;
    if kept || decided == 0 {
        return Ok(None);
    }
    let accepted_rank = count_verdict(conn, batch_id, group_id, stats.verdict, now).await?;
    let (status,): (String,) = query(sql::SAMPLING_STATUS)
        .bind(batch_id)
        .fetch_optional(conn)
        .await?
        .ok_or(sqlx::Error::RowNotFound)?;
    Ok(Some(Decided {
        batch_id: batch_id.to_string(),
        group_id: group_id.to_string(),
        verdict: stats.verdict,
        accepted_rank,
        batch_status: parse_sampling_status(&status)?,
    }))
}

/// The verdict on the samples of group `group_id` of batch `batch_id` under `rule`.
async fn group_stats<C: Conn>(
    conn: &mut C,
    batch_id: &str,
    group_id: &str,
    rule: &InformativeRule,
) -> StoreResult<GroupStats> {
    let rows: Vec<(String, Option<f64>)> = query(sql::GROUP_REWARDS)
        .bind(batch_id)
        .bind(group_id)
        .fetch_all(conn)
        .await?;
    let samples = rows
        .into_iter()
        .map(|(s, r)| Ok((parse_status(&s)?, r)))
        .collect::<StoreResult<Vec<_>>>()?;
    Ok(decide(&samples, rule))
}

/// A group row's state and its batch's rule.
type RuleRow = (String, String, f64, Option<f64>, Option<f64>);

/// The row a finished group is decided in, with the rule: its own (`own`), or, for a
/// kept group a later batch adopted (`adopted`: that batch and the row's name there),
/// the adopter's, under the adopter's rule. `None` when the adopter's row is missing.
async fn deciding_row<C: Conn>(
    conn: &mut C,
    adopted: Option<&(String, String)>,
    own: RuleRow,
) -> StoreResult<Option<RuleRow>> {
    let Some((to, row)) = adopted else {
        return Ok(Some(own));
    };
    Ok(query(sql::TARGET_GROUP)
        .bind(to.as_str())
        .bind(row.as_str())
        .fetch_optional(conn)
        .await?)
}

/// Counts a decided group into its batch: an informative group takes the next rank
/// while the batch still wants one (the K-th completes the batch), any other verdict is
/// counted; a batch whose every allowed prompt is now decided without its K gives up,
/// and a `keep` batch that has ended keeps the groups still in flight.
/// The rank, if the group was accepted.
pub(super) async fn count_verdict<C: Conn>(
    conn: &mut C,
    batch_id: &str,
    group_id: &str,
    verdict: Verdict,
    now: EpochMs,
) -> StoreResult<Option<i64>> {
    let mut accepted_rank = None;
    if verdict == Verdict::Informative {
        let rank: Option<(i64,)> = query(sql::ACCEPT_GROUP)
            .bind(batch_id)
            .bind(now)
            .fetch_optional(conn)
            .await?;
        if let Some((rank,)) = rank {
            query(sql::SET_RANK)
                .bind(batch_id)
                .bind(group_id)
                .bind(rank)
                .execute(conn)
                .await?;
            accepted_rank = Some(rank);
        }
    }
    if accepted_rank.is_none() {
        query(sql::COUNT_VERDICT)
            .bind(batch_id)
            .bind(verdict.as_str())
            .bind(now)
            .execute(conn)
            .await?;
    }
    query(sql::EXHAUST)
        .bind(batch_id)
        .bind(now)
        .bind("every prompt allowed (max_groups, or the whole pool) was tried and decided before target_groups informative groups were found")
        .execute(conn)
        .await?;
    keep_stragglers(conn, batch_id, now).await?;
    Ok(accepted_rank)
}

/// Marks the groups still in flight of batch `batch_id` kept, if it has ended and
/// keeps them (`on_cancel: keep`), and counts them among its decided groups; how many.
pub(super) async fn keep_stragglers<C: Conn>(
    conn: &mut C,
    batch_id: &str,
    now: EpochMs,
) -> StoreResult<u64> {
    let kept = query(sql::KEEP_STRAGGLERS)
        .bind(batch_id)
        .execute(conn)
        .await?;
    if kept > 0 {
        query(sql::COUNT_KEPT)
            .bind(batch_id)
            .bind(i64::try_from(kept).unwrap_or(i64::MAX))
            .bind(now)
            .execute(conn)
            .await?;
    }
    Ok(kept)
}

/// Counts one sample's sandbox time into its batch: the time a sample that ran to its
/// end spent, or the time a cancelled one did not (the batch's mean so far less what it
/// had spent).
async fn count_sample<C: Conn>(
    conn: &mut C,
    result: &JobResult,
    used: i64,
    completed: i64,
    now: EpochMs,
) -> StoreResult<()> {
    // Only a sample that ran to its end or was cancelled changes a counter.
    if !matches!(result.status, Status::Done | Status::Cancelled) {
        return Ok(());
    }
    let started: Option<(Option<i64>,)> = query(sql::JOB_STARTED_AT)
        .bind(&result.job_id)
        .fetch_optional(conn)
        .await?;
    let spent = started
        .and_then(|(s,)| s)
        .map_or(0, |s| (result.created_at - s).max(0));
    let (used_add, completed_add, saved, saved_ms) = match result.status {
        Status::Cancelled => {
            let expected = if completed > 0 { used / completed } else { 0 };
            (0, 0, 1, (expected - spent).max(0))
        }
        _ => (spent, 1, 0, 0),
    };
    query(sql::COUNT_SAMPLE)
        .bind(&result.batch_id)
        .bind(used_add)
        .bind(completed_add)
        .bind(saved)
        .bind(saved_ms)
        .bind(now)
        .execute(conn)
        .await?;
    Ok(())
}
