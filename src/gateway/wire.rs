//! The store's rows as the API shows them: one function per row type the answers carry,
//! copying it into its wire type in `crate::api`.
//!
//! The two are kept apart so the database's columns are not the public API: a store row
//! can gain, lose or rename a field and only the function here changes (each one takes
//! its row apart field by field, so the compiler stops at the copy rather than letting a
//! new column slip into, or out of, the API unseen), while the OpenAPI snapshot test
//! catches any change that does reach the wire.

use crate::api::batches::GroupVerdict;
use crate::api::jobs::{JobEvent, Submitted};
use crate::api::status::StatusCount;
use crate::api::views::{
    BackendLoad, BatchProgress, FailureReason, SamplingProgress, SandboxCount, StageQueue,
    ThroughputMinute,
};
use crate::store;

/// What submit did with one task. The stage-entry counter stays behind: the service
/// queues the job with it, the caller has no use for it.
pub fn submitted(row: store::Submitted) -> Submitted {
    let store::Submitted {
        id,
        client_id,
        status,
        stage,
        epoch: _,
        duplicate,
    } = row;
    Submitted {
        id,
        client_id,
        status,
        stage,
        duplicate,
    }
}

/// One entry of a job's event log.
pub fn job_event(row: store::JobEvent) -> JobEvent {
    let store::JobEvent {
        at,
        event,
        stage,
        epoch,
        attempt,
        node,
        detail,
    } = row;
    JobEvent {
        at,
        event,
        stage,
        epoch,
        attempt,
        node,
        detail,
    }
}

/// Jobs of one status in one stage.
pub fn status_count(row: store::StatusCount) -> StatusCount {
    let store::StatusCount {
        status,
        stage,
        count,
    } = row;
    StatusCount {
        status,
        stage,
        count,
    }
}

/// One group of a sampling batch and its verdict so far.
pub fn group_verdict(row: store::GroupVerdict) -> GroupVerdict {
    let store::GroupVerdict {
        group_id,
        prompt_index,
        state,
        accepted_rank,
        reward_mean,
        reward_std,
        launched_at,
        decided_at,
        carried_from,
    } = row;
    GroupVerdict {
        group_id,
        prompt_index,
        state,
        accepted_rank,
        reward_mean,
        reward_std,
        launched_at,
        decided_at,
        carried_from,
    }
}

/// A row of the `batch_progress` view.
pub fn batch_progress(row: store::BatchProgress) -> BatchProgress {
    let store::BatchProgress {
        batch_id,
        created_at,
        submitted,
        finished,
        in_flight,
        done,
        failed,
        cancelled,
        timed_out,
        stale,
        rewarded,
        reward_mean,
        last_result_at,
    } = row;
    BatchProgress {
        batch_id,
        created_at,
        submitted,
        finished,
        in_flight,
        done,
        failed,
        cancelled,
        timed_out,
        stale,
        rewarded,
        reward_mean,
        last_result_at,
    }
}

/// A row of the `stage_queue` view.
pub fn stage_queue(row: store::StageQueue) -> StageQueue {
    let store::StageQueue {
        stage,
        position,
        queued,
        running,
        oldest_queued_at,
    } = row;
    StageQueue {
        stage,
        position,
        queued,
        running,
        oldest_queued_at,
    }
}

/// A row of the `throughput_per_minute` view.
pub fn throughput_minute(row: store::ThroughputMinute) -> ThroughputMinute {
    let store::ThroughputMinute {
        minute,
        status,
        jobs,
        reward_mean,
    } = row;
    ThroughputMinute {
        minute,
        status,
        jobs,
        reward_mean,
    }
}

/// A row of the `failures_by_reason` view.
pub fn failure_reason(row: store::FailureReason) -> FailureReason {
    let store::FailureReason {
        status,
        kind,
        reason,
        jobs,
        last_at,
        example_job_id,
    } = row;
    FailureReason {
        status,
        kind,
        reason,
        jobs,
        last_at,
        example_job_id,
    }
}

/// A row of the `backend_load` view.
pub fn backend_load(row: store::BackendLoad) -> BackendLoad {
    let store::BackendLoad {
        backend_id,
        kind,
        model,
        url,
        weight,
        healthy,
        checked_at,
        last_error,
        source,
        in_flight,
    } = row;
    BackendLoad {
        backend_id,
        kind,
        model,
        url,
        weight,
        healthy,
        checked_at,
        last_error,
        source,
        in_flight,
    }
}

/// A row of the `sandbox_counts` view.
pub fn sandbox_count(row: store::SandboxCount) -> SandboxCount {
    let store::SandboxCount {
        node,
        backend,
        sandboxes,
        oldest_created_at,
        earliest_lease_until,
    } = row;
    SandboxCount {
        node,
        backend,
        sandboxes,
        oldest_created_at,
        earliest_lease_until,
    }
}

/// A row of the `sampling_progress` view.
pub fn sampling_progress(row: store::SamplingProgress) -> SamplingProgress {
    let store::SamplingProgress {
        batch_id,
        status,
        reason,
        group_size,
        target_groups,
        informative,
        surplus,
        uniform,
        incomplete,
        cancelled_groups,
        stale_groups,
        kept_groups,
        adopted_groups,
        groups_launched,
        groups_decided,
        samples_completed,
        jobs_saved,
        sandbox_ms_used,
        sandbox_ms_saved,
        created_at,
        ended_at,
    } = row;
    SamplingProgress {
        batch_id,
        status,
        reason,
        group_size,
        target_groups,
        informative,
        surplus,
        uniform,
        incomplete,
        cancelled_groups,
        stale_groups,
        kept_groups,
        adopted_groups,
        groups_launched,
        groups_decided,
        samples_completed,
        jobs_saved,
        sandbox_ms_used,
        sandbox_ms_saved,
        created_at,
        ended_at,
    }
}
