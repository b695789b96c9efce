//! Row shapes shared by both backends and their conversion into domain types.
//!
//! Columns use only types both databases decode the same way (TEXT, 64-bit integers,
//! doubles), so one `FromRow` derive serves SQLite and Postgres.

use rollout_core::domain::{
    BatchCounters, GroupCounters, Job, JobResult, Stage, StageTimes, Status, Timings,
};

use super::{JobEvent, StoreError, StoreResult};

#[derive(sqlx::FromRow)]
pub(crate) struct JobRow {
    id: String,
    batch_id: String,
    group_id: Option<String>,
    client_id: Option<String>,
    kind: String,
    task: String,
    status: String,
    stage: String,
    epoch: i64,
    attempts: i64,
    node: Option<String>,
    route: Option<String>,
    lease_until: Option<i64>,
    init_output: Option<String>,
    run_output: Option<String>,
    error: Option<String>,
    created_at: i64,
    updated_at: i64,
    finished_at: Option<i64>,
    init_queued_at: Option<i64>,
    init_started_at: Option<i64>,
    init_finished_at: Option<i64>,
    run_queued_at: Option<i64>,
    run_started_at: Option<i64>,
    run_finished_at: Option<i64>,
    eval_queued_at: Option<i64>,
    eval_started_at: Option<i64>,
    eval_finished_at: Option<i64>,
    stage_attempts: i64,
    restarts: i64,
    /// The result's reward and finish reason: only in lists of jobs.
    #[sqlx(default)]
    reward: Option<f64>,
    #[sqlx(default)]
    finish_reason: Option<String>,
}

pub(crate) fn parse_status(s: &str) -> StoreResult<Status> {
    Status::parse(s).ok_or_else(|| StoreError::Corrupt(format!("unknown status `{s}`")))
}

pub(crate) fn parse_stage(s: &str) -> StoreResult<Stage> {
    Stage::parse(s).ok_or_else(|| StoreError::Corrupt(format!("unknown stage `{s}`")))
}

fn parse_json(s: &str) -> StoreResult<serde_json::Value> {
    serde_json::from_str(s).map_err(|e| StoreError::Corrupt(format!("bad JSON column: {e}")))
}

fn parse_opt_json(s: Option<String>) -> StoreResult<Option<serde_json::Value>> {
    s.as_deref().map(parse_json).transpose()
}

impl JobRow {
    /// The job's id (to match rows of a multi-row statement with their requests).
    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    pub(crate) fn into_job(self) -> StoreResult<Job> {
        Ok(Job {
            status: parse_status(&self.status)?,
            stage: parse_stage(&self.stage)?,
            task: parse_json(&self.task)?,
            init_output: parse_opt_json(self.init_output)?,
            run_output: parse_opt_json(self.run_output)?,
            id: self.id,
            batch_id: self.batch_id,
            group_id: self.group_id,
            client_id: self.client_id,
            kind: self.kind,
            epoch: self.epoch,
            attempts: self.attempts,
            stage_attempts: self.stage_attempts,
            restarts: self.restarts,
            node: self.node,
            route: self.route,
            lease_until: self.lease_until,
            error: self.error,
            timings: Timings {
                init: StageTimes {
                    queued_at: self.init_queued_at,
                    started_at: self.init_started_at,
                    finished_at: self.init_finished_at,
                },
                run: StageTimes {
                    queued_at: self.run_queued_at,
                    started_at: self.run_started_at,
                    finished_at: self.run_finished_at,
                },
                eval: StageTimes {
                    queued_at: self.eval_queued_at,
                    started_at: self.eval_started_at,
                    finished_at: self.eval_finished_at,
                },
            },
            created_at: self.created_at,
            updated_at: self.updated_at,
            finished_at: self.finished_at,
            reward: self.reward,
            finish_reason: self.finish_reason,
        })
    }
}

#[derive(sqlx::FromRow)]
pub(crate) struct ResultRow {
    seq: i64,
    job_id: String,
    batch_id: String,
    group_id: Option<String>,
    client_id: Option<String>,
    status: String,
    reward: Option<f64>,
    error: Option<String>,
    output: String,
    created_at: i64,
}

impl ResultRow {
    /// The bytes of stored output and error, which page budgets count.
    pub(crate) fn stored_bytes(&self) -> i64 {
        let n = self.output.len() + self.error.as_ref().map_or(0, String::len);
        i64::try_from(n).unwrap_or(i64::MAX)
    }

    pub(crate) fn into_result(self) -> StoreResult<JobResult> {
        Ok(JobResult {
            status: parse_status(&self.status)?,
            output: parse_json(&self.output)?,
            seq: self.seq,
            job_id: self.job_id,
            batch_id: self.batch_id,
            group_id: self.group_id,
            client_id: self.client_id,
            reward: self.reward,
            error: self.error,
            created_at: self.created_at,
        })
    }
}

#[derive(sqlx::FromRow)]
pub(crate) struct BatchRow {
    id: String,
    submitted: i64,
    finished: i64,
    done: i64,
    failed: i64,
    cancelled: i64,
    timed_out: i64,
    stale: i64,
    ended_at: Option<i64>,
    end_reason: Option<String>,
}

impl From<BatchRow> for BatchCounters {
    fn from(r: BatchRow) -> Self {
        BatchCounters {
            id: r.id,
            submitted: r.submitted,
            finished: r.finished,
            done: r.done,
            failed: r.failed,
            cancelled: r.cancelled,
            timed_out: r.timed_out,
            stale: r.stale,
            ended_at: r.ended_at,
            end_reason: r.end_reason,
        }
    }
}

#[derive(sqlx::FromRow)]
pub(crate) struct GroupRow {
    id: String,
    batch_id: String,
    submitted: i64,
    finished: i64,
    rewarded: i64,
    reward_sum: f64,
    reward_min: Option<f64>,
    reward_max: Option<f64>,
}

impl From<GroupRow> for GroupCounters {
    fn from(r: GroupRow) -> Self {
        GroupCounters {
            id: r.id,
            batch_id: r.batch_id,
            submitted: r.submitted,
            finished: r.finished,
            rewarded: r.rewarded,
            reward_sum: r.reward_sum,
            reward_min: r.reward_min,
            reward_max: r.reward_max,
        }
    }
}

#[derive(sqlx::FromRow)]
pub(crate) struct EventRow {
    at: i64,
    event: String,
    stage: Option<String>,
    epoch: Option<i64>,
    attempt: Option<i64>,
    node: Option<String>,
    detail: Option<String>,
}

impl From<EventRow> for JobEvent {
    fn from(r: EventRow) -> Self {
        JobEvent {
            at: r.at,
            event: r.event,
            stage: r.stage,
            epoch: r.epoch,
            attempt: r.attempt,
            node: r.node,
            detail: r.detail,
        }
    }
}

#[derive(sqlx::FromRow)]
pub(crate) struct CountRow {
    pub(crate) status: String,
    pub(crate) stage: String,
    pub(crate) n: i64,
}

#[derive(sqlx::FromRow)]
pub(crate) struct StaleRow {
    pub(crate) id: String,
    pub(crate) stage: String,
    pub(crate) epoch: i64,
    pub(crate) route: Option<String>,
    pub(crate) status: String,
    pub(crate) attempts: i64,
}

impl StaleRow {
    /// The job's current stage entry, as the reconciler needs it.
    pub(crate) fn into_stale(self) -> StoreResult<super::StaleJob> {
        Ok(super::StaleJob {
            msg: rollout_core::domain::WorkMessage {
                stage: parse_stage(&self.stage)?,
                job_id: self.id,
                epoch: self.epoch,
            },
            route: self.route,
            status: parse_status(&self.status)?,
            attempts: self.attempts,
        })
    }
}

#[derive(sqlx::FromRow)]
pub(crate) struct BackendRow {
    id: String,
    url: String,
    kind: String,
    model: String,
    tokenizer: String,
    weight: f64,
    healthy: i64,
    checked_at: Option<i64>,
    last_error: Option<String>,
    source: String,
    served_model_name: Option<String>,
    api_key: Option<String>,
    logprobs_mode: Option<String>,
    pub(crate) active: i64,
    pub(crate) group_members: i64,
    pub(crate) group_home: i64,
}

impl BackendRow {
    pub(crate) fn into_state(self) -> StoreResult<rollout_core::domain::backend::BackendState> {
        let kind = rollout_core::domain::backend::WireKind::parse(&self.kind).ok_or_else(|| {
            StoreError::Corrupt(format!("backend {} has kind `{}`", self.id, self.kind))
        })?;
        let logprobs_mode = match self.logprobs_mode.as_deref() {
            None => None,
            Some(m) => Some(
                rollout_core::domain::backend::LogprobsMode::parse(m).ok_or_else(|| {
                    StoreError::Corrupt(format!("backend {} has logprobs_mode `{m}`", self.id))
                })?,
            ),
        };
        Ok(rollout_core::domain::backend::BackendState {
            spec: rollout_core::domain::backend::BackendSpec {
                id: self.id,
                url: self.url,
                kind,
                model: self.model,
                tokenizer: self.tokenizer,
                weight: self.weight,
                served_model_name: self.served_model_name,
                api_key: self.api_key.map(rollout_core::domain::backend::ApiKey),
                logprobs_mode,
            },
            healthy: self.healthy != 0,
            active: self.active,
            checked_at: self.checked_at,
            last_error: self.last_error,
            source: self.source,
            api_key_set: false,
        })
    }
}

#[derive(sqlx::FromRow)]
pub(crate) struct SamplingRow {
    id: String,
    pub(crate) group_size: i64,
    target_groups: i64,
    pub(crate) max_groups_in_flight: i64,
    pub(crate) max_groups: i64,
    prompt_count: i64,
    rule: String,
    eps: f64,
    min_mean: Option<f64>,
    max_mean: Option<f64>,
    pub(crate) policy_version: Option<i64>,
    pub(crate) status: String,
    pub(crate) next_prompt: i64,
    pub(crate) groups_launched: i64,
    pub(crate) groups_decided: i64,
    informative: i64,
    surplus: i64,
    uniform: i64,
    incomplete: i64,
    cancelled_groups: i64,
    stale_groups: i64,
    sandbox_ms_used: i64,
    samples_completed: i64,
    jobs_saved: i64,
    sandbox_ms_saved: i64,
    created_at: i64,
    ended_at: Option<i64>,
    reason: Option<String>,
    pub(crate) on_cancel: String,
    carry_from: Option<String>,
    kept_groups: i64,
    pub(crate) adopted_groups: i64,
}

impl SamplingRow {
    pub(crate) fn into_batch(self) -> StoreResult<rollout_core::domain::sampling::SamplingBatch> {
        use rollout_core::domain::sampling::{
            InformativeRule, OnCancel, RuleKind, SamplingBatch, SamplingCounters, SamplingParams,
            SamplingStatus,
        };
        let rule = RuleKind::parse(&self.rule).ok_or_else(|| {
            StoreError::Corrupt(format!("batch {} has rule `{}`", self.id, self.rule))
        })?;
        let status = SamplingStatus::parse(&self.status).ok_or_else(|| {
            StoreError::Corrupt(format!("batch {} has status `{}`", self.id, self.status))
        })?;
        let on_cancel = OnCancel::parse(&self.on_cancel).ok_or_else(|| {
            StoreError::Corrupt(format!(
                "batch {} has on_cancel `{}`",
                self.id, self.on_cancel
            ))
        })?;
        Ok(SamplingBatch {
            params: SamplingParams {
                group_size: self.group_size,
                target_groups: self.target_groups,
                max_groups_in_flight: self.max_groups_in_flight,
                max_groups: self.max_groups,
                informative: InformativeRule {
                    rule,
                    eps: self.eps,
                    min_mean: self.min_mean,
                    max_mean: self.max_mean,
                },
                policy_version: self.policy_version,
                on_cancel,
                carry_from: self.carry_from,
            },
            id: self.id,
            prompt_count: self.prompt_count,
            status,
            reason: self.reason,
            counters: SamplingCounters {
                groups_launched: self.groups_launched,
                groups_decided: self.groups_decided,
                informative: self.informative,
                surplus: self.surplus,
                uniform: self.uniform,
                incomplete: self.incomplete,
                cancelled_groups: self.cancelled_groups,
                stale_groups: self.stale_groups,
                jobs_saved: self.jobs_saved,
                sandbox_ms_saved: self.sandbox_ms_saved,
                sandbox_ms_used: self.sandbox_ms_used,
                samples_completed: self.samples_completed,
                kept_groups: self.kept_groups,
                adopted_groups: self.adopted_groups,
            },
            created_at: self.created_at,
            ended_at: self.ended_at,
        })
    }
}

/// A sampling batch's status as stored.
pub(super) fn parse_sampling_status(
    s: &str,
) -> StoreResult<rollout_core::domain::sampling::SamplingStatus> {
    rollout_core::domain::sampling::SamplingStatus::parse(s)
        .ok_or_else(|| StoreError::Corrupt(format!("unknown sampling batch status `{s}`")))
}
