//! Jobs: submitting them, reading them, and moving them through their stages.
//!
//! Every transition is a compare-and-set on the job row (`WHERE id = $1 AND stage = $2
//! AND epoch = $3 …`), and a claimed stage entry's statements also match `attempts`,
//! the claim's token: a worker whose lease lapsed and was taken over can no longer
//! renew, release, advance or end the new claim.

use std::collections::{BTreeMap, HashSet};

use async_trait::async_trait;
use serde::Serialize;

use super::dialect::{Dialect, StageAdvance, StageClaim};
use super::query::query;
use super::rows::{BatchRow, CountRow, EventRow, GroupRow, JobRow, parse_stage, parse_status};
use super::sql_store::SqlStore;
use super::verdict::Ended;
use super::write::ends::{JobEnd, end_bare};
use super::{StoreResult, sql};
use rollout_core::domain::EpochMs;
use rollout_core::domain::{
    BatchCounters, GroupCounters, Job, Outcome, Stage, Status, WorkMessage,
};
use rollout_core::nul;

/// A job to insert at submit time (already validated).
#[derive(Debug, Clone)]
pub struct NewJob {
    /// Fresh job id.
    pub id: String,
    /// Task kind.
    pub kind: String,
    /// Caller's idempotency key.
    pub client_id: Option<String>,
    /// Prompt group.
    pub group_id: Option<String>,
    /// The task JSON as submitted.
    pub task: serde_json::Value,
}

/// What submit did with one task.
#[derive(Debug, Clone)]
pub struct Submitted {
    /// The job's id (the existing one for a repeated `client_id`).
    pub id: String,
    /// The caller's key, echoed.
    pub client_id: Option<String>,
    /// The job's status now.
    pub status: Status,
    /// Its current stage.
    pub stage: Stage,
    /// Its stage-entry counter (needed to re-publish its message).
    pub epoch: i64,
    /// True when the `client_id` already existed and no new job was created.
    pub duplicate: bool,
}

/// Result of trying to start a stage.
#[derive(Debug, Clone)]
pub enum Claim {
    /// The job is now `running` in this stage under a fresh lease; go ahead.
    Started(Box<Job>),
    /// The message is stale: the job has moved on or ended. Carries the job as it is.
    Stale(Box<Job>),
    /// Another delivery holds a live lease on this stage until the given time (epoch ms),
    /// or (the time is the claim's `now`) it handed the stage back an instant ago: try
    /// again then.
    Busy(EpochMs),
    /// No such job.
    Missing,
    /// The job has not ended but its batch has (cancelled, or a sampling batch that has
    /// what it needs): it starts nothing more, and the batch's canceller (or the
    /// reconciler) ends it. Drop the message.
    BatchEnded,
}

/// Which jobs a terminal transition may apply to.
#[derive(Debug, Clone)]
pub enum FinishIf {
    /// Only if the job is still in this stage entry under this claim (`attempt` is the
    /// job's `attempts` right after the claim): the worker holding the stage ends it.
    Claimed {
        /// The stage entry.
        msg: WorkMessage,
        /// The claim's token.
        attempt: i64,
    },
    /// Only if the job is still in this stage entry and nobody holds a live lease on it:
    /// giving up on a message nobody is working on.
    Unleased(WorkMessage),
    /// Whenever the job is live (used by cancel).
    Live,
}

/// Filter and page of `GET /v1/jobs`.
#[derive(Debug, Clone, Default)]
pub struct JobQuery {
    /// Only this batch.
    pub batch: Option<String>,
    /// Only this status.
    pub status: Option<Status>,
    /// Return ids greater than this (the previous page's last id).
    pub cursor: Option<String>,
    /// Page size.
    pub limit: i64,
    /// The page's byte budget: no job follows the one with which the stored bytes of
    /// the page's jobs (task, stage outputs, error) reach this, so a page holds at most
    /// this plus one job, and at least one job however large. Only the jobs on the page
    /// are read whole.
    pub max_bytes: i64,
}

/// A page of jobs (see [`JobStore::list_jobs`]).
#[derive(Debug, Clone, Default)]
pub struct JobsPage {
    /// The jobs, in id order.
    pub jobs: Vec<Job>,
    /// Whether jobs of the query may follow the last one: the page is full, or it ended
    /// at its byte budget with jobs left.
    pub more: bool,
}

/// One line of `rollout status`: how many jobs have this status in this stage.
#[derive(Debug, Clone)]
pub struct StatusCount {
    /// Status.
    pub status: Status,
    /// Stage.
    pub stage: Stage,
    /// Number of jobs.
    pub count: i64,
}

/// One entry of a job's event log.
#[derive(Debug, Clone)]
pub struct JobEvent {
    /// When (epoch ms).
    pub at: i64,
    /// A status name for transitions, or a named event such as `republished`.
    pub event: String,
    /// Stage at the time.
    pub stage: Option<String>,
    /// Stage-entry counter at the time.
    pub epoch: Option<i64>,
    /// Attempt counter at the time.
    pub attempt: Option<i64>,
    /// Node involved.
    pub node: Option<String>,
    /// Error text or other detail.
    pub detail: Option<String>,
}

/// Jobs, their stage transitions, their ends and their counters.
#[async_trait]
pub trait JobStore: Send + Sync {
    /// Inserts jobs in one transaction, creating the batch and groups as needed. A task
    /// whose `client_id` exists already returns that job with `duplicate = true`.
    async fn submit(
        &self,
        batch_id: &str,
        jobs: &[NewJob],
        now: EpochMs,
    ) -> StoreResult<Vec<Submitted>>;
    /// One job.
    async fn job(&self, id: &str) -> StoreResult<Option<Job>>;
    /// A page of jobs in id (= creation) order, within the query's byte budget.
    async fn list_jobs(&self, q: &JobQuery) -> StoreResult<JobsPage>;
    /// Starts the stage named by `msg` on `node` with a lease until `lease_until`.
    async fn claim(
        &self,
        msg: &WorkMessage,
        node: &str,
        lease_until: EpochMs,
        now: EpochMs,
    ) -> StoreResult<Claim>;
    /// Extends the lease of the claim `attempt` of a running stage until `lease_until`;
    /// false when the job is no longer running under that claim (cancelled, or taken
    /// over), which tells the worker to stop.
    async fn extend_lease(
        &self,
        msg: &WorkMessage,
        attempt: i64,
        lease_until: EpochMs,
    ) -> StoreResult<bool>;
    /// Records the output of the claim `attempt` of a stage and queues the job for the next
    /// stage; returns the next stage's message, or `None` if the compare-and-set failed
    /// (the job moved on or was taken over).
    async fn advance(
        &self,
        msg: &WorkMessage,
        attempt: i64,
        output: &serde_json::Value,
        route: Option<&str>,
        now: EpochMs,
    ) -> StoreResult<Option<WorkMessage>>;
    /// Hands the claim `attempt` of a running stage back to the queue: after a transient
    /// fault (the start counts towards the delivery limit) or, with `hand_back`, because
    /// the worker is shutting down (it does not).
    async fn release(
        &self,
        msg: &WorkMessage,
        attempt: i64,
        hand_back: bool,
        now: EpochMs,
    ) -> StoreResult<bool>;
    /// Sends the claim `attempt` of a running stage back to INIT under a new stage entry,
    /// because the node-local state it needed is gone; `None` if the claim no longer
    /// holds or the job was sent back `max_restarts` times already. An uncounted restart
    /// (a graceful hand-back) leaves the job's `restarts` as it is.
    async fn restart(
        &self,
        msg: &WorkMessage,
        attempt: i64,
        max_restarts: i64,
        counted: bool,
        now: EpochMs,
    ) -> StoreResult<Option<WorkMessage>>;
    /// Ends the job with `outcome` if `cond` holds, writing its result and updating the
    /// batch and group counters in the same transaction; for the last sample of a
    /// sampling group, the group's verdict is taken in that transaction too (see
    /// [`SamplingStore`](super::SamplingStore)). `None` if the condition failed.
    /// An end the database refuses (for what the job's data holds) is recorded instead as
    /// a failure whose error gives the reason, without the output, so that no job is
    /// retried for ever; only a database that cannot be reached is an error.
    async fn finish(
        &self,
        cond: &FinishIf,
        job_id: &str,
        outcome: &Outcome,
        now: EpochMs,
    ) -> StoreResult<Option<Ended>>;
    /// Job counts by status and stage. Reads every job (of the batch): for an API call,
    /// not for something polled for the life of the service (see [`totals`](Self::totals)).
    async fn counts(&self, batch: Option<&str>) -> StoreResult<Vec<StatusCount>>;
    /// Jobs by status over the whole store, every status listed (zero where none).
    /// Unlike [`counts`](Self::counts) it reads no finished job's row (the finished are
    /// summed from their batches' counters), so its cost follows the unfinished jobs
    /// and the batches, not everything a long training run ever submitted: it is what a
    /// metrics scrape every few seconds may call.
    async fn totals(&self) -> StoreResult<Vec<(Status, i64)>>;
    /// A batch's counters.
    async fn batch(&self, id: &str) -> StoreResult<Option<BatchCounters>>;
    /// Ends batch `id` before its jobs (a trainer's cancel): from this commit on, none of
    /// its jobs starts a stage, renews a lease, moves on, or is scored (an end written
    /// later records the job `cancelled` with `reason`); the caller then cancels the
    /// jobs left. `None` if there is no such batch, `Some(false)` if it had ended
    /// already. A sampling batch ends through
    /// [`SamplingStore::end_sampling`](super::SamplingStore::end_sampling), which ends
    /// its batch row too.
    async fn end_batch(&self, id: &str, reason: &str, now: EpochMs) -> StoreResult<Option<bool>>;
    /// Batches that have ended with jobs of theirs still live: the work a canceller
    /// left (it died, or jobs were submitted as the batch ended), for the reconciler.
    async fn ended_batches_with_live_jobs(&self) -> StoreResult<Vec<String>>;
    /// A prompt group's counters.
    async fn group(&self, batch_id: &str, id: &str) -> StoreResult<Option<GroupCounters>>;
    /// A job's event log, oldest first.
    async fn events(&self, job_id: &str) -> StoreResult<Vec<JobEvent>>;
    /// Appends a named event (one that is not a status change) to a job's log.
    async fn record_event(
        &self,
        job_id: &str,
        event: &str,
        stage: Option<Stage>,
        node: Option<&str>,
        detail: Option<&str>,
        now: EpochMs,
    ) -> StoreResult<()>;
}

impl<D: Dialect> SqlStore<D> {
    /// Runs `sql`, an update of the claimed stage entry named by `msg` and the claim's
    /// `attempt` (`$1`-`$3` = job, stage, epoch, `$5` = attempt) with one more value
    /// (`$4`) and optionally another (`$6`); true if it applied.
    async fn update_stage_entry(
        &self,
        sql: &'static str,
        msg: &WorkMessage,
        attempt: i64,
        value: EpochMs,
        extra: Option<i64>,
    ) -> StoreResult<bool> {
        let msg = msg.clone();
        self.write(move |conn: &mut D::Conn| {
            Box::pin(async move {
                let mut q = query(sql)
                    .bind(&msg.job_id)
                    .bind(msg.stage.as_str())
                    .bind(msg.epoch)
                    .bind(value)
                    .bind(attempt);
                if let Some(extra) = extra {
                    q = q.bind(extra);
                }
                Ok(q.execute(conn).await? == 1)
            })
        })
        .await
    }
}

/// Inserts `jobs` into `batch_id` (creating the batch and their groups as needed) on
/// `conn`, inside the caller's transaction: a submit's whole work, shared by a plain
/// submit and a sampling batch's launch. A job whose `client_id` exists already is
/// answered with that job, `duplicate = true`.
pub(super) async fn insert_jobs<D: Dialect>(
    conn: &mut D::Conn,
    batch_id: &str,
    jobs: &[NewJob],
    now: EpochMs,
) -> StoreResult<Vec<Submitted>> {
    /// Jobs in one statement.
    const CHUNK: usize = 1_000;
    /// One job in `D::INSERT_JOBS`'s JSON array.
    #[derive(Serialize)]
    struct JobArg<'a> {
        id: &'a str,
        group_id: Option<&'a str>,
        client_id: Option<&'a str>,
        kind: &'a str,
        task: String,
    }
    query(sql::INSERT_BATCH)
        .bind(batch_id)
        .bind(now)
        .execute(conn)
        .await?;
    // Rows are taken in one order whatever the request's (jobs by client id,
    // then groups by id, then the batch), so submits that overlap never wait
    // on each other in a cycle (a deadlock on Postgres); answers keep the
    // request's order.
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    order.sort_by(|&a, &b| jobs[a].client_id.cmp(&jobs[b].client_id));
    let mut out: Vec<Option<Submitted>> = vec![None; jobs.len()];
    let mut inserted_count = 0i64;
    let mut groups = BTreeMap::<&str, i64>::new();
    for chunk in order.chunks(CHUNK) {
        let args: Vec<JobArg> = chunk
            .iter()
            .map(|&i| JobArg {
                id: &jobs[i].id,
                group_id: jobs[i].group_id.as_deref(),
                client_id: jobs[i].client_id.as_deref(),
                kind: &jobs[i].kind,
                task: jobs[i].task.to_string(),
            })
            .collect();
        let args = serde_json::to_string(&args).expect("jobs serialise");
        let inserted: Vec<(String,)> = query(D::INSERT_JOBS)
            .bind(&args)
            .bind(batch_id)
            .bind(now)
            .fetch_all(conn)
            .await?;
        let inserted: HashSet<String> = inserted.into_iter().map(|(id,)| id).collect();
        for &i in chunk {
            let job = &jobs[i];
            out[i] = Some(if inserted.contains(&job.id) {
                inserted_count += 1;
                if let Some(group) = &job.group_id {
                    *groups.entry(group.as_str()).or_default() += 1;
                }
                Submitted {
                    id: job.id.clone(),
                    client_id: job.client_id.clone(),
                    status: Status::Queued,
                    stage: Stage::Init,
                    epoch: 0,
                    duplicate: false,
                }
            } else {
                let (id, status, stage, epoch): (String, String, String, i64) =
                    query(sql::SELECT_BY_CLIENT)
                        .bind(&job.client_id)
                        .fetch_optional(conn)
                        .await?
                        .ok_or(sqlx::Error::RowNotFound)?;
                Submitted {
                    id,
                    client_id: job.client_id.clone(),
                    status: parse_status(&status)?,
                    stage: parse_stage(&stage)?,
                    epoch,
                    duplicate: true,
                }
            });
        }
    }
    for (group, n) in groups {
        query(sql::INSERT_GROUP)
            .bind(batch_id)
            .bind(group)
            .bind(now)
            .bind(n)
            .execute(conn)
            .await?;
    }
    if inserted_count > 0 {
        query(sql::COUNT_BATCH)
            .bind(batch_id)
            .bind(inserted_count)
            .execute(conn)
            .await?;
    }
    Ok(out.into_iter().flatten().collect())
}

#[async_trait]
impl<D: Dialect> JobStore for SqlStore<D> {
    async fn submit(
        &self,
        batch_id: &str,
        jobs: &[NewJob],
        now: EpochMs,
    ) -> StoreResult<Vec<Submitted>> {
        let batch_id = batch_id.to_string();
        let jobs = jobs.to_vec();
        self.write_atomic(move |conn: &mut D::Conn| {
            Box::pin(async move { insert_jobs::<D>(conn, &batch_id, &jobs, now).await })
        })
        .await
    }

    async fn job(&self, id: &str) -> StoreResult<Option<Job>> {
        let mut conn = self.reader().await?;
        let row: Option<JobRow> = query(sql::SELECT_JOB)
            .bind(id)
            .fetch_optional(&mut *conn)
            .await?;
        row.map(JobRow::into_job).transpose()
    }

    async fn list_jobs(&self, q: &JobQuery) -> StoreResult<JobsPage> {
        let mut conn = self.reader().await?;
        let rows: Vec<JobRow> = query(sql::LIST_JOBS)
            .bind(&q.batch)
            .bind(q.status.map(|s| s.as_str()))
            .bind(q.cursor.as_deref().unwrap_or(""))
            .bind(q.limit)
            .bind(q.max_bytes)
            .fetch_all(&mut *conn)
            .await?;
        let jobs = rows
            .into_iter()
            .map(JobRow::into_job)
            .collect::<StoreResult<Vec<Job>>>()?;
        let full = i64::try_from(jobs.len()).is_ok_and(|n| n >= q.limit);
        let more = match jobs.last() {
            None => false,
            Some(_) if full => true,
            // Cut short by the budget, or the end: ask for one id past the page.
            Some(last) => {
                let next: Option<(String,)> = query(sql::LIST_JOBS_MORE)
                    .bind(&q.batch)
                    .bind(q.status.map(|s| s.as_str()))
                    .bind(&last.id)
                    .fetch_optional(&mut *conn)
                    .await?;
                next.is_some()
            }
        };
        Ok(JobsPage { jobs, more })
    }

    async fn claim(
        &self,
        msg: &WorkMessage,
        node: &str,
        lease_until: EpochMs,
        now: EpochMs,
    ) -> StoreResult<Claim> {
        let claimed = self
            .db
            .claim(StageClaim {
                job_id: msg.job_id.clone(),
                stage: msg.stage,
                epoch: msg.epoch,
                node: node.to_string(),
                lease_until,
                now,
            })
            .await?;
        if let Some(row) = claimed {
            return Ok(Claim::Started(Box::new(row.into_job()?)));
        }
        let Some(job) = self.job(&msg.job_id).await? else {
            return Ok(Claim::Missing);
        };
        if !job.status.is_terminal()
            && self
                .batch(&job.batch_id)
                .await?
                .is_some_and(|b| b.ended_at.is_some())
        {
            return Ok(Claim::BatchEnded);
        }
        let same_entry = job.stage == msg.stage && job.epoch == msg.epoch;
        Ok(match job.status {
            // Someone holds a live lease: this claim lost the race.
            Status::Running if same_entry => {
                Claim::Busy(job.lease_until.map_or(now, EpochMs).max(now))
            }
            // The holder handed the stage back between the claim and this read (they are
            // two statements): the entry is claimable again, so try again at once rather
            // than drop its only message.
            Status::Queued if same_entry => Claim::Busy(now),
            _ => Claim::Stale(Box::new(job)),
        })
    }

    async fn extend_lease(
        &self,
        msg: &WorkMessage,
        attempt: i64,
        lease_until: EpochMs,
    ) -> StoreResult<bool> {
        self.update_stage_entry(sql::EXTEND_LEASE, msg, attempt, lease_until, None)
            .await
    }

    async fn advance(
        &self,
        msg: &WorkMessage,
        attempt: i64,
        output: &serde_json::Value,
        route: Option<&str>,
        now: EpochMs,
    ) -> StoreResult<Option<WorkMessage>> {
        let Some(next) = msg.stage.next() else {
            return Ok(None);
        };
        let epoch = self
            .db
            .advance(StageAdvance {
                job_id: msg.job_id.clone(),
                stage: msg.stage,
                epoch: msg.epoch,
                next,
                now,
                route: route.map(str::to_string),
                output: nul::scrub_json(output.to_string()),
                attempt,
            })
            .await?;
        Ok(epoch.map(|epoch| WorkMessage {
            job_id: msg.job_id.clone(),
            stage: next,
            epoch,
        }))
    }

    async fn release(
        &self,
        msg: &WorkMessage,
        attempt: i64,
        hand_back: bool,
        now: EpochMs,
    ) -> StoreResult<bool> {
        self.update_stage_entry(sql::RELEASE, msg, attempt, now, Some(i64::from(hand_back)))
            .await
    }

    async fn restart(
        &self,
        msg: &WorkMessage,
        attempt: i64,
        max_restarts: i64,
        counted: bool,
        now: EpochMs,
    ) -> StoreResult<Option<WorkMessage>> {
        let msg = msg.clone();
        self.write(move |conn: &mut D::Conn| {
            Box::pin(async move {
                let row: Option<(i64,)> = query(sql::RESTART)
                    .bind(&msg.job_id)
                    .bind(msg.stage.as_str())
                    .bind(msg.epoch)
                    .bind(now)
                    .bind(attempt)
                    .bind(max_restarts)
                    .bind(i64::from(counted))
                    .fetch_optional(conn)
                    .await?;
                Ok(row.map(|(epoch,)| WorkMessage {
                    job_id: msg.job_id.clone(),
                    stage: Stage::Init,
                    epoch,
                }))
            })
        })
        .await
    }

    async fn finish(
        &self,
        cond: &FinishIf,
        job_id: &str,
        outcome: &Outcome,
        now: EpochMs,
    ) -> StoreResult<Option<Ended>> {
        let (stage, epoch, attempt, unleased_at) = match cond {
            FinishIf::Claimed { msg, attempt } => (
                Some(msg.stage.as_str()),
                Some(msg.epoch),
                Some(*attempt),
                None,
            ),
            FinishIf::Unleased(msg) => (Some(msg.stage.as_str()), Some(msg.epoch), None, Some(now)),
            FinishIf::Live => (None, None, None, None),
        };
        let status = outcome.status;
        let end = JobEnd {
            job_id: job_id.to_string(),
            stage,
            epoch,
            attempt,
            unleased_at,
            status,
            error: outcome.error.as_deref().map(|e| nul::scrub(e).into()),
            // A stale sample keeps its reward, for inspection.
            reward: if matches!(status, Status::Done | Status::Stale) {
                outcome.reward
            } else {
                None
            },
            eval_output: outcome
                .eval_output
                .as_ref()
                .map(|v| nul::scrub_json(v.to_string()).into()),
            run_output: outcome
                .run_output
                .as_ref()
                .map(|v| nul::scrub_json(v.to_string()).into()),
            now,
        };
        let rejected = match self.ends.write(end.clone()).await {
            Err(e) if e.is_rejected() => e,
            other => return other,
        };
        // The database refuses this end (what the job's row or output holds), and would
        // on every retry: end the job anyway, failed, with the reason and without the
        // output, rather than leave it to be retried for ever.
        tracing::error!(job_id = %end.job_id, error = %rejected, "cannot record the job's end with its output; recording the failure alone");
        let error = format!(
            "{}the job's end ({status}) could not be recorded with its output, which was dropped: {rejected}",
            outcome
                .error
                .as_ref()
                .map(|e| format!("{e}; "))
                .unwrap_or_default()
        );
        let bare = JobEnd {
            error: Some(nul::scrub(&error).into()),
            ..end
        };
        self.db
            .write_result(move |conn: &mut D::Conn| {
                let bare = bare.clone();
                Box::pin(async move { end_bare::<D>(conn, &bare).await })
            })
            .await
    }

    async fn counts(&self, batch: Option<&str>) -> StoreResult<Vec<StatusCount>> {
        let mut conn = self.reader().await?;
        let rows: Vec<CountRow> = match batch {
            Some(b) => {
                query(sql::COUNTS_IN_BATCH)
                    .bind(b)
                    .fetch_all(&mut *conn)
                    .await?
            }
            None => query(sql::COUNTS).fetch_all(&mut *conn).await?,
        };
        rows.into_iter()
            .map(|r| {
                Ok(StatusCount {
                    status: parse_status(&r.status)?,
                    stage: parse_stage(&r.stage)?,
                    count: r.n,
                })
            })
            .collect()
    }

    async fn totals(&self) -> StoreResult<Vec<(Status, i64)>> {
        let mut conn = self.reader().await?;
        let rows: Vec<(String, i64)> = query(sql::TOTALS).fetch_all(&mut *conn).await?;
        let mut totals: Vec<(Status, i64)> = Status::ALL.iter().map(|s| (*s, 0)).collect();
        for (status, n) in rows {
            let status = parse_status(&status)?;
            if let Some(total) = totals.iter_mut().find(|(s, _)| *s == status) {
                total.1 += n;
            }
        }
        Ok(totals)
    }

    async fn batch(&self, id: &str) -> StoreResult<Option<BatchCounters>> {
        let mut conn = self.reader().await?;
        let row: Option<BatchRow> = query(sql::SELECT_BATCH)
            .bind(id)
            .fetch_optional(&mut *conn)
            .await?;
        Ok(row.map(Into::into))
    }

    async fn end_batch(&self, id: &str, reason: &str, now: EpochMs) -> StoreResult<Option<bool>> {
        let (id, reason) = (id.to_string(), reason.to_string());
        self.write(move |conn: &mut D::Conn| {
            Box::pin(async move {
                let ended = query(sql::END_BATCH)
                    .bind(&id)
                    .bind(&reason)
                    .bind(now)
                    .execute(&mut *conn)
                    .await?;
                if ended == 1 {
                    return Ok(Some(true));
                }
                let exists: Option<(String,)> = query(sql::BATCH_EXISTS)
                    .bind(&id)
                    .fetch_optional(conn)
                    .await?;
                Ok(exists.map(|_| false))
            })
        })
        .await
    }

    async fn ended_batches_with_live_jobs(&self) -> StoreResult<Vec<String>> {
        let mut conn = self.reader().await?;
        let rows: Vec<(String,)> = query(sql::ENDED_WITH_LIVE_JOBS)
            .fetch_all(&mut *conn)
            .await?;
        Ok(rows.into_iter().map(|(id,)| id).collect())
    }

    async fn group(&self, batch_id: &str, id: &str) -> StoreResult<Option<GroupCounters>> {
        let mut conn = self.reader().await?;
        let row: Option<GroupRow> = query(sql::SELECT_GROUP)
            .bind(batch_id)
            .bind(id)
            .fetch_optional(&mut *conn)
            .await?;
        Ok(row.map(Into::into))
    }

    async fn events(&self, job_id: &str) -> StoreResult<Vec<JobEvent>> {
        let mut conn = self.reader().await?;
        let rows: Vec<EventRow> = query(sql::SELECT_EVENTS)
            .bind(job_id)
            .fetch_all(&mut *conn)
            .await?;
        Ok(rows.into_iter().map(Into::into).collect())
    }

    async fn record_event(
        &self,
        job_id: &str,
        event: &str,
        stage: Option<Stage>,
        node: Option<&str>,
        detail: Option<&str>,
        now: EpochMs,
    ) -> StoreResult<()> {
        let job_id = job_id.to_string();
        let event = event.to_string();
        let node = node.map(str::to_string);
        let detail = detail.map(|d| nul::scrub(d).into_owned());
        self.write(move |conn: &mut D::Conn| {
            Box::pin(async move {
                query(sql::INSERT_EVENT)
                    .bind(&job_id)
                    .bind(now)
                    .bind(&event)
                    .bind(stage.map(|s| s.as_str()))
                    .bind(&node)
                    .bind(&detail)
                    .execute(conn)
                    .await?;
                Ok(())
            })
        })
        .await
    }
}
