//! Claim and dispatch: decode a message, claim its stage on the job row, check the
//! delivery limit and the task kind, run the hook, and hand its end to the recorder.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OwnedSemaphorePermit;
use tracing::Instrument;

use super::Worker;
use super::held::Held;
use super::lease::StageEnd;
use super::record::ack;
use crate::domain::{EpochMs, Job, StageTimes, WorkMessage};
use crate::queue::{Answer, Delivery};
use crate::stage::{StageContext, StageError};
use crate::store::Claim;

impl Worker {
    /// Handles one pulled message; `_permit` holds its slot until the stage is done.
    pub(super) async fn handle(
        self: Arc<Self>,
        msg: Box<dyn Delivery>,
        _permit: OwnedSemaphorePermit,
    ) {
        let delivered = msg.delivered();
        let work: WorkMessage = match serde_json::from_slice(msg.payload()) {
            Ok(w) => w,
            Err(e) => {
                tracing::error!(subject = %msg.subject(), error = %e, "malformed stage message dropped");
                return ack(msg.as_ref(), Answer::Term).await;
            }
        };
        let span = tracing::info_span!(
            "stage",
            job_id = %work.job_id,
            stage = %work.stage,
            epoch = work.epoch,
            delivery = delivered,
        );
        self.process(msg, work, delivered).instrument(span).await;
    }

    async fn process(&self, msg: Box<dyn Delivery>, work: WorkMessage, delivered: i64) {
        let msg = msg.as_ref();
        // Registered before the claim, so a cancel broadcast that arrives between the
        // claim's commit and the hook's start is not missed; unregistered when this
        // function returns, whichever way.
        let registration = self.running.register(&work.job_id);
        let now = EpochMs::now();
        let lease = Duration::from_millis(self.settings.queue.ack_wait_ms);
        let claim = self
            .jobs
            .claim(&work, self.node(), now.after(lease), now)
            .await;
        let job = match claim {
            Ok(Claim::Started(job)) => *job,
            Ok(Claim::Missing) => {
                tracing::warn!("message for an unknown job dropped");
                return ack(msg, Answer::Ack).await;
            }
            Ok(Claim::Busy(until)) => {
                // A lease that has already lapsed waits only the margin.
                let wait = now.until(until) + Duration::from_millis(50);
                tracing::debug!(?wait, "stage is leased by another delivery; retrying later");
                return ack(msg, Answer::Nak(Some(wait))).await;
            }
            Ok(Claim::Stale(job)) => {
                return self.repair_stale(msg, &work, &job, delivered).await;
            }
            Ok(Claim::BatchEnded) => {
                tracing::info!(
                    "the job's batch has ended: message dropped, the job is being cancelled"
                );
                return ack(msg, Answer::Ack).await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot claim the stage; will retry");
                return ack(msg, Answer::Nak(Some(self.nak_delay(delivered)))).await;
            }
        };
        let held = Held {
            work,
            attempt: job.attempts,
            stage_attempts: job.stage_attempts,
            delivered,
        };
        if held.stage_attempts > self.settings.queue.delivery_limit {
            let error = format!(
                "{} stage started {} times without finishing (the workers running it \
                 crashed or were killed); giving up",
                held.work.stage,
                held.stage_attempts - 1
            );
            return self.dead_letter(msg, &held, &error).await;
        }
        if let Some(q) = stage_times(&job, &held.work).queued_at {
            metrics::histogram!(crate::metrics::QUEUE_WAIT, "stage" => held.work.stage.as_str())
                .record(EpochMs(q).until(now).as_secs_f64());
        }
        let Some(kind) = self.kinds.get(&job.kind).cloned() else {
            let error = format!("this worker does not know task kind `{}`", job.kind);
            return self.give_up_or_retry(msg, &held, error).await;
        };
        let ctx = StageContext {
            job,
            node: self.node().to_string(),
            cancel: registration.token().clone(),
        };
        let started = std::time::Instant::now();
        let end = self.run_hook(msg, &held, &ctx, kind.as_ref()).await;
        // Cancels that arrive while the end is recorded have nothing left to stop.
        drop(registration);
        metrics::histogram!(
            crate::metrics::STAGE_DURATION,
            "stage" => held.work.stage.as_str(),
            "outcome" => end.label()
        )
        .record(started.elapsed().as_secs_f64());
        self.record(msg, &held, &ctx.job, kind.as_ref(), end).await;
    }
}

/// When the job's current stage entry was queued, started and ended.
fn stage_times<'a>(job: &'a Job, work: &WorkMessage) -> &'a StageTimes {
    match work.stage {
        crate::domain::Stage::Init => &job.timings.init,
        crate::domain::Stage::Run => &job.timings.run,
        crate::domain::Stage::Eval => &job.timings.eval,
    }
}

impl StageEnd {
    /// The stage-duration metric's `outcome` label.
    fn label(&self) -> &'static str {
        match self {
            StageEnd::Finished(Ok(_)) => "ok",
            StageEnd::Finished(Err(StageError::Failed(_) | StageError::FailedWith { .. })) => {
                "failed"
            }
            StageEnd::Finished(Err(_)) => "transient",
            StageEnd::TimedOut => "timed_out",
            StageEnd::Cancelled => "cancelled",
            StageEnd::HandBack => "handed_back",
        }
    }
}
