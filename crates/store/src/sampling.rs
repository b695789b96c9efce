//! Sampling batches (DAPO dynamic sampling): creating them, launching their groups,
//! deciding each group in the transaction of its last result, and reading what was
//! accepted.
//!
//! All of a batch's state is in its rows, so any number of gateways can drive it and a
//! gateway restart loses nothing: launching is a compare-and-set on `next_prompt` (two
//! launchers never take one prompt), and a group's verdict is taken in the transaction
//! that writes its last result, guarded so that it is taken once and the K-th
//! acceptance completes the batch exactly once.

use async_trait::async_trait;

use super::dialect::Dialect;
use super::jobs::{NewJob, Submitted, insert_jobs};
use super::query::{Conn, query};
use super::rows::{ResultRow, SamplingRow};
use super::sql_store::SqlStore;
use super::{StoreError, StoreResult, sql, verdict};
use rollout_core::domain::EpochMs;
use rollout_core::domain::sampling::{
    AcceptedGroup, SamplingBatch, SamplingParams, SamplingStatus, Verdict, prompt_group_id,
    sample_client_id,
};

/// A sampling batch to create (already validated).
#[derive(Debug, Clone)]
pub struct NewSampling {
    /// Batch id.
    pub id: String,
    /// What it is to do; `max_groups` is capped at the pool's size here.
    pub params: SamplingParams,
    /// The prompt pool: task JSON objects (`kind`, `spec`, `metadata`), each sampled
    /// `group_size` times.
    pub prompts: Vec<serde_json::Value>,
}

/// What creating a sampling batch did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Created {
    /// A new batch.
    New,
    /// A sampling batch with this id exists already (the request was repeated).
    Exists,
    /// A plain batch (jobs submitted without sampling) has this id.
    IdTaken,
}

/// Sampling batches.
#[async_trait]
pub trait SamplingStore: Send + Sync {
    /// Creates a sampling batch and its prompt pool in one transaction (idempotent by
    /// id). Launches nothing: see [`SamplingStore::launch_groups`].
    async fn create_sampling(&self, batch: &NewSampling, now: EpochMs) -> StoreResult<Created>;
    /// Launches as many groups as the batch has room for (`max_groups_in_flight` less
    /// those running, within `max_groups`): inserts their jobs and group rows and
    /// returns the jobs to queue for INIT. Returns nothing when another launcher took
    /// the same prompts first, or the batch has ended.
    async fn launch_groups(&self, batch_id: &str, now: EpochMs) -> StoreResult<Vec<Submitted>>;
    /// A sampling batch, with its counters.
    async fn sampling_batch(&self, id: &str) -> StoreResult<Option<SamplingBatch>>;
    /// Accepted groups ranked after `after_rank`, in rank order, each with its results:
    /// at most `limit`, and no more than fit in `max_bytes` of stored output and error
    /// (but at least one, however large), as a page of results is bounded.
    async fn accepted_groups(
        &self,
        id: &str,
        after_rank: i64,
        limit: i64,
        max_bytes: i64,
    ) -> StoreResult<Vec<AcceptedGroup>>;
    /// Ends a running batch as `status` (the trainer's cancel) with `reason`; false if
    /// it was not running.
    async fn end_sampling(
        &self,
        id: &str,
        status: SamplingStatus,
        reason: &str,
        now: EpochMs,
    ) -> StoreResult<bool>;
    /// Up to `limit` ids of the batch's jobs that have not ended.
    async fn live_jobs(&self, batch_id: &str, limit: i64) -> StoreResult<Vec<String>>;
    /// Sampling batches a driver has work for: running, ended with groups still out,
    /// or with accepted groups not yet published.
    async fn sampling_to_drive(&self) -> StoreResult<Vec<String>>;
    /// Ranks of accepted groups not yet published on the groups subject.
    async fn unpublished_groups(&self, id: &str) -> StoreResult<Vec<i64>>;
    /// Every group the batch launched or adopted with its verdict so far, in launch
    /// order, the first `limit`.
    async fn group_verdicts(&self, id: &str, limit: i64) -> StoreResult<Vec<GroupVerdict>>;
    /// Records that the accepted group `rank` was published.
    async fn mark_group_published(&self, id: &str, rank: i64, now: EpochMs) -> StoreResult<()>;
    /// Takes batch `id`'s group-publisher lease until `until`, if no one holds it or its
    /// holder's lease had lapsed at `now`; true if taken. One publisher at a time keeps a
    /// core-NATS subscriber from hearing a group twice or out of rank order.
    async fn claim_group_publisher(
        &self,
        id: &str,
        now: EpochMs,
        until: EpochMs,
    ) -> StoreResult<bool>;
    /// Gives back the lease taken until `until` (a no-op if another publisher has
    /// since taken it over).
    async fn release_group_publisher(&self, id: &str, until: EpochMs) -> StoreResult<()>;
}

/// One group of a sampling batch and where it stands: every group, not only the
/// accepted ones, so a reader sees why the batch took the prompts it took.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
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

/// The jobs of prompts `first .. first + n` of a batch: `group_size` samples each,
/// with fixed client ids and the policy version stamped in their metadata.
async fn group_jobs<C: Conn>(
    conn: &mut C,
    batch_id: &str,
    first: i64,
    n: i64,
    group_size: i64,
    policy_version: Option<i64>,
) -> StoreResult<Vec<(i64, Vec<NewJob>)>> {
    let prompts: Vec<(i64, String)> = query(sql::SELECT_PROMPTS)
        .bind(batch_id)
        .bind(first)
        .bind(first + n)
        .fetch_all(conn)
        .await?;
    let mut out = Vec::with_capacity(prompts.len());
    for (idx, task) in prompts {
        let task: serde_json::Value = serde_json::from_str(&task)
            .map_err(|e| StoreError::Corrupt(format!("prompt {idx} of {batch_id}: {e}")))?;
        let kind = task
            .get("kind")
            .and_then(serde_json::Value::as_str)
            .ok_or_else(|| StoreError::Corrupt(format!("prompt {idx} of {batch_id}: no kind")))?
            .to_string();
        let group_id = prompt_group_id(idx);
        let jobs = (0..group_size)
            .map(|sample| {
                let client_id = sample_client_id(batch_id, idx, sample);
                let mut task = task.clone();
                let obj = task.as_object_mut().expect("prompts are stored as objects");
                obj.insert("client_id".into(), client_id.clone().into());
                obj.insert("group_id".into(), group_id.clone().into());
                let meta = obj
                    .entry("metadata")
                    .or_insert_with(|| serde_json::json!({}));
                if !meta.is_object() {
                    *meta = serde_json::json!({});
                }
                let meta = meta.as_object_mut().expect("just made an object");
                meta.insert("prompt_index".into(), idx.into());
                meta.insert("sample".into(), sample.into());
                if let Some(v) = policy_version {
                    meta.insert("policy_version".into(), v.into());
                }
                NewJob {
                    id: uuid::Uuid::now_v7().to_string(),
                    kind: kind.clone(),
                    client_id: Some(client_id),
                    group_id: Some(group_id.clone()),
                    task,
                }
            })
            .collect();
        out.push((idx, jobs));
    }
    Ok(out)
}

/// Adopts the kept groups of batch `from` that no batch has adopted into new batch `to`
/// (whose pool holds `prompts` prompts: the adopted rows are numbered after them), in
/// `to`'s creating transaction. Each gets a row in `to` (named `<batch>/<group>` after
/// where its jobs are), the kept row points at it, and one that has already ended is
/// decided in `to` at once with the verdict it took. The batches whose jobs these are
/// are locked first, as their jobs' ends take them, so an end either comes before (its
/// verdict is then read here) or finds the group adopted.
async fn adopt<D: Dialect>(
    conn: &mut D::Conn,
    from: &str,
    to: &str,
    prompts: i64,
    now: EpochMs,
) -> StoreResult<()> {
    let mut origins: Vec<(String,)> = query(sql::KEPT_ORIGINS)
        .bind(from)
        .fetch_all(&mut *conn)
        .await?;
    origins.sort();
    for (origin,) in &origins {
        D::lock_batch(conn, origin).await?;
    }
    type Kept = (
        String,
        String,
        String,
        Option<String>,
        Option<f64>,
        Option<f64>,
    );
    let kept: Vec<Kept> = query(sql::ADOPTABLE)
        .bind(from)
        .fetch_all(&mut *conn)
        .await?;
    if kept.is_empty() {
        return Ok(());
    }
    for (k, (row, origin, group, ..)) in (0i64..).zip(&kept) {
        let name = format!("{origin}/{group}");
        query(sql::CARRY)
            .bind(from)
            .bind(row)
            .bind(to)
            .execute(&mut *conn)
            .await?;
        if origin.as_str() != from || group != row {
            // Adopted by `from` from an earlier batch: the launching row follows too.
            query(sql::CARRY)
                .bind(origin)
                .bind(group)
                .bind(to)
                .execute(&mut *conn)
                .await?;
        }
        query(sql::INSERT_ADOPTED)
            .bind(to)
            .bind(prompts + k)
            .bind(&name)
            .bind(now)
            .bind(origin)
            .bind(group)
            .execute(&mut *conn)
            .await?;
    }
    query(sql::COUNT_ADOPTED)
        .bind(to)
        .bind(i64::try_from(kept.len()).unwrap_or(i64::MAX))
        .bind(now)
        .execute(&mut *conn)
        .await?;
    for (_, origin, group, verdict, mean, std) in &kept {
        let Some(verdict) = verdict else { continue };
        let name = format!("{origin}/{group}");
        query(sql::DECIDE_GROUP)
            .bind(to)
            .bind(&name)
            .bind(verdict)
            .bind(*mean)
            .bind(*std)
            .bind(now)
            .execute(&mut *conn)
            .await?;
        let verdict = Verdict::parse(verdict).ok_or_else(|| {
            StoreError::Corrupt(format!("kept group {name} has verdict `{verdict}`"))
        })?;
        verdict::count_verdict(&mut *conn, to, &name, verdict, now).await?;
    }
    Ok(())
}

#[async_trait]
impl<D: Dialect> SamplingStore for SqlStore<D> {
    async fn create_sampling(&self, batch: &NewSampling, now: EpochMs) -> StoreResult<Created> {
        let batch = batch.clone();
        self.write_atomic(move |conn: &mut D::Conn| {
            Box::pin(async move {
                let new: Option<(String,)> = query(sql::INSERT_BATCH_NEW)
                    .bind(&batch.id)
                    .bind(now)
                    .fetch_optional(conn)
                    .await?;
                if new.is_none() {
                    let sampling: Option<(String,)> = query(sql::SAMPLING_EXISTS)
                        .bind(&batch.id)
                        .fetch_optional(conn)
                        .await?;
                    return Ok(if sampling.is_some() {
                        Created::Exists
                    } else {
                        Created::IdTaken
                    });
                }
                let p = &batch.params;
                let count = i64::try_from(batch.prompts.len()).unwrap_or(i64::MAX);
                query(sql::INSERT_SAMPLING)
                    .bind(&batch.id)
                    .bind(p.group_size)
                    .bind(p.target_groups)
                    .bind(p.max_groups_in_flight)
                    .bind(p.max_groups.min(count))
                    .bind(count)
                    .bind(p.informative.rule.as_str())
                    .bind(p.informative.eps)
                    .bind(p.informative.min_mean)
                    .bind(p.informative.max_mean)
                    .bind(p.policy_version)
                    .bind(now)
                    .bind(p.on_cancel.as_str())
                    .bind(p.carry_from.as_deref())
                    .execute(conn)
                    .await?;
                for (idx, task) in (0i64..).zip(&batch.prompts) {
                    query(sql::INSERT_PROMPT)
                        .bind(&batch.id)
                        .bind(idx)
                        .bind(&rollout_core::nul::scrub_json(task.to_string()))
                        .execute(conn)
                        .await?;
                }
                if let Some(from) = &p.carry_from {
                    adopt::<D>(conn, from, &batch.id, count, now).await?;
                }
                Ok(Created::New)
            })
        })
        .await
    }

    async fn launch_groups(&self, batch_id: &str, now: EpochMs) -> StoreResult<Vec<Submitted>> {
        let batch_id = batch_id.to_string();
        self.write_atomic(move |conn: &mut D::Conn| {
            Box::pin(async move {
                D::lock_batch(conn, &batch_id).await?;
                let row: Option<SamplingRow> = query(sql::SELECT_SAMPLING)
                    .bind(&batch_id)
                    .fetch_optional(conn)
                    .await?;
                let Some(b) = row else {
                    return Ok(Vec::new());
                };
                if b.status != "running" {
                    return Ok(Vec::new());
                }
                let in_flight = b.groups_launched - b.groups_decided;
                let room = b.max_groups_in_flight - in_flight;
                // Adopted groups are not prompts this batch tried.
                let left = b.max_groups - (b.groups_launched - b.adopted_groups);
                let n = room.min(left);
                if n <= 0 {
                    return Ok(Vec::new());
                }
                let claimed = query(sql::CLAIM_PROMPTS)
                    .bind(&batch_id)
                    .bind(n)
                    .bind(b.next_prompt)
                    .bind(now)
                    .execute(conn)
                    .await?;
                if claimed == 0 {
                    return Ok(Vec::new());
                }
                let groups = group_jobs(
                    conn,
                    &batch_id,
                    b.next_prompt,
                    n,
                    b.group_size,
                    b.policy_version,
                )
                .await?;
                let jobs: Vec<NewJob> = groups.iter().flat_map(|(_, j)| j.clone()).collect();
                let submitted = insert_jobs::<D>(conn, &batch_id, &jobs, now).await?;
                for (idx, _) in &groups {
                    query(sql::INSERT_SAMPLING_GROUP)
                        .bind(&batch_id)
                        .bind(*idx)
                        .bind(&prompt_group_id(*idx))
                        .bind(now)
                        .execute(conn)
                        .await?;
                }
                Ok(submitted)
            })
        })
        .await
    }

    async fn sampling_batch(&self, id: &str) -> StoreResult<Option<SamplingBatch>> {
        let mut conn = self.reader().await?;
        let row: Option<SamplingRow> = query(sql::SELECT_SAMPLING)
            .bind(id)
            .fetch_optional(&mut *conn)
            .await?;
        row.map(SamplingRow::into_batch).transpose()
    }

    async fn accepted_groups(
        &self,
        id: &str,
        after_rank: i64,
        limit: i64,
        max_bytes: i64,
    ) -> StoreResult<Vec<AcceptedGroup>> {
        let mut conn = self.reader().await?;
        type Row = (i64, String, i64, Option<f64>, Option<f64>, Option<String>);
        let groups: Vec<Row> = query(sql::ACCEPTED_GROUPS)
            .bind(id)
            .bind(after_rank)
            .bind(limit)
            .fetch_all(&mut *conn)
            .await?;
        let mut out = Vec::with_capacity(groups.len());
        let mut bytes = 0i64;
        for (idx, group_id, rank, mean, std, carried_from) in groups {
            if !out.is_empty() && bytes >= max_bytes {
                break;
            }
            // An adopted group's results are where its jobs are: the batch that kept it.
            let rows: Vec<ResultRow> = query(sql::RESULTS_OF_GROUP)
                .bind(carried_from.as_deref().unwrap_or(id))
                .bind(&group_id)
                .fetch_all(&mut *conn)
                .await?;
            bytes = bytes.saturating_add(rows.iter().map(ResultRow::stored_bytes).sum());
            let mut results = rows
                .into_iter()
                .map(ResultRow::into_result)
                .collect::<StoreResult<Vec<_>>>()?;
            results.sort_by_key(|r| sample_of(r.client_id.as_deref()));
            out.push(AcceptedGroup {
                batch_id: id.to_string(),
                rank,
                prompt_index: idx,
                group_id,
                reward_mean: mean,
                reward_std: std,
                results,
                carried_from,
            });
        }
        Ok(out)
    }

    async fn group_verdicts(&self, id: &str, limit: i64) -> StoreResult<Vec<GroupVerdict>> {
        let mut conn = self.reader().await?;
        Ok(query(sql::GROUP_VERDICTS)
            .bind(id)
            .bind(limit)
            .fetch_all(&mut *conn)
            .await?)
    }

    async fn end_sampling(
        &self,
        id: &str,
        status: SamplingStatus,
        reason: &str,
        now: EpochMs,
    ) -> StoreResult<bool> {
        let (id, reason) = (id.to_string(), reason.to_string());
        self.write_atomic(move |conn: &mut D::Conn| {
            Box::pin(async move {
                // The batch's row first, as a job's end takes it (its counters) before
                // the sampling rows: a cancel ends the batch row too (a trigger).
                D::lock_batch(conn, &id).await?;
                let ended = query(sql::END_SAMPLING)
                    .bind(&id)
                    .bind(status.as_str())
                    .bind(&reason)
                    .bind(now)
                    .execute(conn)
                    .await?
                    == 1;
                if ended {
                    verdict::keep_stragglers(conn, &id, now).await?;
                }
                Ok(ended)
            })
        })
        .await
    }

    async fn live_jobs(&self, batch_id: &str, limit: i64) -> StoreResult<Vec<String>> {
        let mut conn = self.reader().await?;
        let rows: Vec<(String,)> = query(sql::LIVE_JOBS)
            .bind(batch_id)
            .bind(limit)
            .fetch_all(&mut *conn)
            .await?;
        Ok(rows.into_iter().map(|(id,)| id).collect())
    }

    async fn sampling_to_drive(&self) -> StoreResult<Vec<String>> {
        let mut conn = self.reader().await?;
        let rows: Vec<(String,)> = query(sql::SAMPLING_TO_DRIVE).fetch_all(&mut *conn).await?;
        Ok(rows.into_iter().map(|(id,)| id).collect())
    }

    async fn unpublished_groups(&self, id: &str) -> StoreResult<Vec<i64>> {
        let mut conn = self.reader().await?;
        let rows: Vec<(i64,)> = query(sql::UNPUBLISHED_GROUPS)
            .bind(id)
            .fetch_all(&mut *conn)
            .await?;
        Ok(rows.into_iter().map(|(r,)| r).collect())
    }

    async fn claim_group_publisher(
        &self,
        id: &str,
        now: EpochMs,
        until: EpochMs,
    ) -> StoreResult<bool> {
        let id = id.to_string();
        self.write(move |conn: &mut D::Conn| {
            Box::pin(async move {
                Ok(query(sql::CLAIM_GROUP_PUBLISHER)
                    .bind(&id)
                    .bind(now)
                    .bind(until)
                    .execute(conn)
                    .await?
                    == 1)
            })
        })
        .await
    }

    async fn release_group_publisher(&self, id: &str, until: EpochMs) -> StoreResult<()> {
        let id = id.to_string();
        self.write(move |conn: &mut D::Conn| {
            Box::pin(async move {
                query(sql::RELEASE_GROUP_PUBLISHER)
                    .bind(&id)
                    .bind(until)
                    .execute(conn)
                    .await?;
                Ok(())
            })
        })
        .await
    }

    async fn mark_group_published(&self, id: &str, rank: i64, now: EpochMs) -> StoreResult<()> {
        let id = id.to_string();
        self.write(move |conn: &mut D::Conn| {
            Box::pin(async move {
                query(sql::MARK_GROUP_PUBLISHED)
                    .bind(&id)
                    .bind(rank)
                    .bind(now)
                    .execute(conn)
                    .await?;
                Ok(())
            })
        })
        .await
    }
}

/// The sample index in a sampling job's client id (`<batch>:p<i>:s<sample>`), for
/// ordering a group's results; results without one sort last.
fn sample_of(client_id: Option<&str>) -> i64 {
    client_id
        .and_then(|c| c.rsplit_once(":s"))
        .and_then(|(_, s)| s.parse().ok())
        .unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_sort_by_their_sample_index_not_their_text() {
        let mut ids = vec!["b:p3:s10", "b:p3:s2", "b:p3:s0"];
        ids.sort_by_key(|c| sample_of(Some(c)));
        assert_eq!(ids, ["b:p3:s0", "b:p3:s2", "b:p3:s10"]);
        assert_eq!(sample_of(None), i64::MAX);
    }
}
