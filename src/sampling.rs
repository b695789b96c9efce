//! The sampling-batch driver: what follows from a group's verdict.
//!
//! The decisions themselves are taken in the database, in the transaction of each
//! group's last result (see [`crate::store::SamplingStore`]); the driver only acts on
//! them, and everything it does is idempotent, so any number of drivers can act on one
//! batch at once:
//!
//! - **launch**: keep `max_groups_in_flight` groups running (a compare-and-set on the
//!   batch's next prompt, so two drivers never launch one prompt), and queue their jobs
//!   for INIT;
//! - **early cancel**: once the batch has ended (its K-th informative group, `max_groups`
//!   reached, or the trainer's cancel), cancel every job of it that has not ended, with
//!   its `cancelled` result, and broadcast each cancel so a running stage stops (its
//!   inference request closed, its sandbox removed, EVAL skipped). A trainer's cancel
//!   is itself a fence: from its commit, the database lets none of the batch's jobs
//!   start a stage, move on or be scored (an end written after it is recorded
//!   `cancelled`), so nothing of a cancelled batch is scored however long the
//!   cancelling takes. The same [`Driver::cancel_live`] cancels what is left of a plain
//!   batch the trainer cancels;
//! - **publish** accepted groups on `<prefix>.groups.<batch>`.
//!
//! Drivers run in every gateway, woken on `<prefix>.batches.wake` (sent when a group is
//! decided) in a queue group, and the reconciler sweeps every batch with work, so a lost
//! wake or a gateway that died mid-batch costs at most one sweep interval.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::domain::sampling::SamplingStatus;
use crate::domain::{EpochMs, Outcome};
use crate::publish::{publish_result, start_submitted};
use crate::queue::{Queue, QueueError};
use crate::store::{FinishIf, JobStore, ResultStore, SamplingStore, StoreError};

/// The reason a plain batch's jobs carry when the trainer cancels it.
pub const BATCH_CANCELLED: &str = "the batch was cancelled";

/// Jobs cancelled per database read while cancelling the rest of a batch.
const CANCEL_CHUNK: i64 = 256;

/// How long a driver holds a batch's publisher lease: long enough to publish a batch's
/// groups (each a JetStream round trip), short enough that a publisher that died is
/// replaced within a sweep or two.
const PUBLISHER_LEASE_MS: i64 = 30_000;

/// A driver could not finish its work on a batch; the next wake or sweep retries.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DriveError {
    /// The database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// NATS failed.
    #[error(transparent)]
    Queue(#[from] QueueError),
}

/// Acts on sampling batches.
#[derive(Clone)]
pub struct Driver {
    /// The batches, their groups and launches.
    sampling: Arc<dyn SamplingStore>,
    /// The batches' jobs: cancelling what is left of an ended batch.
    jobs: Arc<dyn JobStore>,
    /// Where a cancelled job's result is marked published.
    results: Arc<dyn ResultStore>,
    queue: Queue,
}

impl Driver {
    /// A driver over the service's store (its sampling, jobs and results, usually one
    /// store) and queue.
    pub fn new(
        sampling: Arc<dyn SamplingStore>,
        jobs: Arc<dyn JobStore>,
        results: Arc<dyn ResultStore>,
        queue: Queue,
    ) -> Self {
        Self {
            sampling,
            jobs,
            results,
            queue,
        }
    }

    /// Does whatever batch `id` needs now: launches the groups it has room for,
    /// cancels what is left of it once it has ended, and publishes its accepted groups.
    pub async fn drive(&self, id: &str) -> Result<(), DriveError> {
        let launched = self.launch(id).await?;
        let Some(batch) = self.sampling.sampling_batch(id).await? else {
            return Ok(());
        };
        if batch.status.is_final() && batch.counters.groups_decided < batch.counters.groups_launched
        {
            let reason = match batch.status {
                SamplingStatus::Complete => format!(
                    "not needed: the sampling batch has its {} informative groups",
                    batch.params.target_groups
                ),
                SamplingStatus::Exhausted => "the sampling batch gave up (max_groups)".to_string(),
                _ => "the sampling batch was cancelled".to_string(),
            };
            self.cancel_live(id, &reason).await?;
        }
        self.publish_groups(id).await?;
        if launched > 0 {
            tracing::info!(batch_id = id, groups = launched, "groups launched");
        }
        Ok(())
    }

    /// Launches the groups batch `id` has room for; how many jobs were queued.
    async fn launch(&self, id: &str) -> Result<usize, DriveError> {
        let submitted = {
            use backon::Retryable;
            (|| self.sampling.launch_groups(id, EpochMs::now()))
                .retry(crate::retry::submit_conflicts())
                .when(StoreError::is_conflict)
                .await?
        };
        if submitted.is_empty() {
            return Ok(0);
        }
        metrics::counter!(crate::metrics::JOBS_SUBMITTED)
            .increment(submitted.iter().filter(|s| !s.duplicate).count() as u64);
        // A lost publish is repaired by the reconciler, as for any submitted job.
        start_submitted(&self.queue, &submitted).await?;
        Ok(submitted.len())
    }

    /// Cancels every job of ended batch `id` (a sampling batch or a plain one) that has
    /// not ended, each with its `cancelled` result carrying `reason`, and tells running
    /// workers to stop; how many it cancelled. A cancelled batch's end already stops its
    /// jobs in the database (none starts a stage, moves on or is scored after it), so
    /// the broadcasts go first, to close generations and kill tools at once, and the
    /// ends are handed to the job-ends writer together, which writes them as one
    /// statement rather than one round of the writer each.
    pub async fn cancel_live(&self, id: &str, reason: &str) -> Result<usize, DriveError> {
        let outcome = Outcome::cancelled(reason);
        let mut cancelled = 0usize;
        loop {
            let ids = self.sampling.live_jobs(id, CANCEL_CHUNK).await?;
            if ids.is_empty() {
                break;
            }
            for job in &ids {
                if let Err(e) = self.queue.publish_cancel(job).await {
                    tracing::warn!(job_id = %job, error = %e, "cancel broadcast failed; the worker will notice at its next turn or lease renewal");
                }
            }
            let now = EpochMs::now();
            let ends = futures::future::join_all(
                ids.iter()
                    .map(|job| self.jobs.finish(&FinishIf::Live, job, &outcome, now)),
            )
            .await;
            let mut failed = None;
            for end in ends {
                match end {
                    Ok(Some(ended)) => {
                        cancelled += 1;
                        metrics::counter!(crate::metrics::JOBS_FINISHED, "status" => "cancelled")
                            .increment(1);
                        publish_result(&self.queue, self.results.as_ref(), &ended).await;
                    }
                    Ok(None) => {} // it ended on its own meanwhile
                    Err(e) => failed = Some(e),
                }
            }
            if let Some(e) = failed {
                return Err(e.into());
            }
        }
        if cancelled > 0 {
            tracing::info!(batch_id = %id, jobs = cancelled, "rest of the batch cancelled");
        }
        Ok(cancelled)
    }

    /// Publishes the batch's accepted groups not yet published, in rank order, while
    /// holding the batch's publisher lease: drivers run concurrently (a wake, the
    /// batch's creation, the reconciler's sweep, other gateways), and two publishing at
    /// once would send a core-NATS subscriber a group twice or out of order. A driver
    /// that finds the lease held leaves the work to its holder, which looks again after
    /// giving the lease back, so a group accepted meanwhile is not left for the sweep.
    async fn publish_groups(&self, id: &str) -> Result<(), DriveError> {
        loop {
            if self.sampling.unpublished_groups(id).await?.is_empty() {
                return Ok(());
            }
            let now = EpochMs::now();
            let until = EpochMs(now.0 + PUBLISHER_LEASE_MS);
            if !self.sampling.claim_group_publisher(id, now, until).await? {
                return Ok(());
            }
            let published = self.publish_unpublished(id).await;
            self.sampling.release_group_publisher(id, until).await?;
            published?;
        }
    }

    /// Publishes every accepted group of batch `id` not yet published (the caller holds
    /// the publisher lease).
    async fn publish_unpublished(&self, id: &str) -> Result<(), DriveError> {
        for rank in self.sampling.unpublished_groups(id).await? {
            let Some(group) = self
                .sampling
                .accepted_groups(id, rank - 1, 1, i64::MAX)
                .await?
                .into_iter()
                .next()
            else {
                continue;
            };
            self.queue.publish_group(&group).await?;
            self.sampling
                .mark_group_published(id, rank, EpochMs::now())
                .await?;
        }
        Ok(())
    }

    /// Drives every sampling batch that has work, then cancels what is left of every
    /// ended batch (a canceller that died, jobs submitted as their batch ended): the
    /// reconciler's sweep. How many batches it acted on.
    pub async fn sweep(&self) -> Result<usize, DriveError> {
        let ids = self.sampling.sampling_to_drive().await?;
        for id in &ids {
            if let Err(e) = self.drive(id).await {
                tracing::warn!(batch_id = %id, error = %e, "cannot drive the sampling batch; the next sweep retries");
            }
        }
        let ended = self.jobs.ended_batches_with_live_jobs().await?;
        for id in &ended {
            let reason = self.jobs.batch(id).await?.and_then(|b| b.end_reason);
            let reason = reason.as_deref().unwrap_or(BATCH_CANCELLED);
            if let Err(e) = self.cancel_live(id, reason).await {
                tracing::warn!(batch_id = %id, error = %e, "cannot cancel the rest of the ended batch; the next sweep retries");
            }
        }
        Ok(ids.len() + ended.len())
    }

    /// Drives batches as their wakes arrive on `<prefix>.batches.wake` (one gateway of
    /// the queue group gets each), until `shutdown`. `first` is a subscription made
    /// before the gateway took requests.
    pub async fn serve_wakes(
        self,
        first: Option<async_nats::Subscriber>,
        shutdown: CancellationToken,
    ) {
        let queue = self.queue.clone();
        Queue::follow(
            "batch wakes",
            first,
            || queue.subscribe_wakes(),
            |m| {
                let driver = self.clone();
                async move {
                    let Ok(id) = std::str::from_utf8(&m.payload) else {
                        return;
                    };
                    if let Err(e) = driver.drive(id).await {
                        tracing::warn!(batch_id = id, error = %e, "cannot drive the sampling batch; the reconciler's sweep retries");
                    }
                }
            },
            &shutdown,
        )
        .await;
    }
}
