//! What is published once the store has recorded it: submitted jobs queued for INIT, a
//! result once it is durable, and the dead-letter copy of a message given up on (with
//! the job's failure and its result). Shared by the workers, the reconciler, the
//! sampling driver and the gateway (submits and cancels). Named for what it does: it
//! started as "ending" jobs, but starting them goes through here too.

use crate::domain::{EpochMs, Outcome, Stage, Status, WorkMessage};
use crate::queue::{Outbox, Queue, QueueError};
use crate::store::{Ended, FinishIf, JobStore, ResultStore, Submitted};

/// A failure to dead-letter a job (retry later).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeadLetterError {
    /// Publishing the copy to the dead-letter subject failed.
    #[error(transparent)]
    Queue(#[from] QueueError),
    /// Recording the failure failed.
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
}

/// Gives up on a stage message: keeps a copy on the dead-letter subject, then fails the
/// job (if it is still in that stage entry) and publishes its result. Idempotent: the
/// copy is deduplicated and the failure is a compare-and-set. The caller then removes
/// the original message (ack, or delete from the stream). `jobs` and `results` are
/// usually one store, seen as the two concerns this touches.
pub async fn dead_letter(
    queue: &dyn Outbox,
    jobs: &dyn JobStore,
    results: &dyn ResultStore,
    cond: &FinishIf,
    attempts: i64,
    error: &str,
    node: Option<&str>,
) -> Result<(), DeadLetterError> {
    let work = match cond {
        FinishIf::Claimed { msg, .. } => msg,
        FinishIf::Unleased(msg) => {
            // A message nobody holds: give up only if its stage entry is still live and
            // unleased. Otherwise it is a duplicate copy (its job moved on, ended, or is
            // held by a worker with its own message) and the caller just removes it.
            let now = EpochMs::now();
            let live = jobs.job(&msg.job_id).await?.is_some_and(|j| {
                !j.status.is_terminal()
                    && (j.stage, j.epoch) == (msg.stage, msg.epoch)
                    && !(j.status == Status::Running
                        && j.lease_until.is_some_and(|l| l >= now.as_millis()))
            });
            if !live {
                return Ok(());
            }
            msg
        }
        FinishIf::Live => unreachable!("dead-lettering names a stage entry"),
    };
    // Copy first: removing the message from the work-queue stream loses it.
    queue.publish_dead(work, attempts, error).await?;
    let outcome = Outcome::failed(error);
    if let Some(result) = jobs
        .finish(cond, &work.job_id, &outcome, EpochMs::now())
        .await?
    {
        tracing::warn!(job_id = %work.job_id, error, "job failed and its message dead-lettered");
        metrics::counter!(crate::metrics::JOBS_FINISHED, "status" => "failed").increment(1);
        publish_result(queue, results, &result).await;
        // Bookkeeping only: the job's end and its result are already durable.
        if let Err(e) = jobs
            .record_event(
                &work.job_id,
                "dead_lettered",
                Some(work.stage),
                node,
                Some(error),
                EpochMs::now(),
            )
            .await
        {
            tracing::warn!(job_id = %work.job_id, error = %e, "cannot log the dead-letter event");
        }
    }
    Ok(())
}

/// Starts submitted jobs: publishes the INIT hand-off of those still waiting for INIT
/// (new ones, and repeated ones whose first publish may have been lost). The name says
/// what it does for the job; it queues a message to do it.
pub async fn start_submitted(queue: &Queue, submitted: &[Submitted]) -> Result<(), QueueError> {
    let msgs = submitted
        .iter()
        .filter(|s| s.status == Status::Queued && s.stage == Stage::Init)
        .map(|s| {
            (
                WorkMessage {
                    job_id: s.id.clone(),
                    stage: Stage::Init,
                    epoch: s.epoch,
                },
                None,
            )
        })
        .collect();
    queue.publish_work_many(msgs).await
}

/// Publishes a result and marks it published (on failure the reconciler retries
/// later); when the result decided a sampling group, wakes the batch drivers.
pub async fn publish_result(queue: &dyn Outbox, results: &dyn ResultStore, ended: &Ended) {
    let result = &ended.result;
    match queue.publish_result(result).await {
        Ok(()) => {
            if let Err(e) = results.mark_published(&[result.seq], EpochMs::now()).await {
                tracing::warn!(error = %e, "result published but not marked; it may be re-published (deduplicated)");
            }
        }
        Err(e) => tracing::warn!(error = %e, "result not published yet; the reconciler will retry"),
    }
    if let Some(decided) = &ended.decided {
        tracing::info!(
            batch_id = %decided.batch_id,
            group_id = %decided.group_id,
            verdict = decided.verdict.as_str(),
            rank = ?decided.accepted_rank,
            batch_status = decided.batch_status.as_str(),
            "sampling group decided"
        );
        if let Err(e) = queue.publish_wake(&decided.batch_id).await {
            tracing::warn!(batch_id = %decided.batch_id, error = %e, "batch wake not sent; the reconciler's sweep will drive the batch");
        }
    }
}
