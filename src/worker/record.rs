//! Recording a stage's end: the next stage's hand-off, the job's terminal state and
//! result, a restart from INIT, a retry, or the dead-letter subject; then the publish
//! and the acknowledgement, in that order, so a crash between any two steps is repaired
//! by the redelivered message or the reconciler.

use std::time::Duration;

use super::Worker;
use super::held::Held;
use super::lease::{HookOutput, StageEnd};
use crate::domain::{EpochMs, Job, Outcome, Stage, Status, WorkMessage};
use crate::publish::{dead_letter, publish_result};
use crate::queue::ANY_ROUTE;
use crate::queue::{Answer, Delivery};
use crate::stage::{Route, StageError, TaskKind};

impl Worker {
    /// Records how the claimed stage of `job` ended and acknowledges `msg`.
    pub(super) async fn record(
        &self,
        msg: &dyn Delivery,
        held: &Held,
        job: &Job,
        kind: &dyn TaskKind,
        end: StageEnd,
    ) {
        match end {
            StageEnd::Finished(Ok(out)) => self.complete(msg, held, job, out).await,
            StageEnd::Finished(Err(StageError::Failed(e))) => {
                tracing::info!(error = %e, "stage failed");
                kind.cleanup(job).await;
                self.end_job(msg, held, Status::Failed, e).await;
            }
            StageEnd::Finished(Err(StageError::FailedWith { message, output })) => {
                tracing::info!(error = %message, "stage failed with partial output");
                kind.cleanup(job).await;
                let outcome = Outcome::failed(message)
                    .with_run_output((held.work.stage == Stage::Run).then_some(output));
                self.finish(msg, held, &outcome).await;
            }
            StageEnd::Finished(Err(StageError::Transient(e))) => {
                self.give_up_or_retry(msg, held, e).await;
            }
            StageEnd::Finished(Err(StageError::Restart(e))) => {
                kind.cleanup(job).await;
                self.restart(msg, held, job, e, true, None).await;
            }
            StageEnd::Finished(Err(StageError::RestartWith { message, output })) => {
                kind.cleanup(job).await;
                self.restart(msg, held, job, message, true, Some(output))
                    .await;
            }
            StageEnd::TimedOut => {
                let timeout = self.settings.stages.get(held.work.stage).timeout_ms;
                let e = format!(
                    "{} stage exceeded its timeout of {timeout} ms",
                    held.work.stage
                );
                tracing::info!("{e}");
                kind.cleanup(job).await;
                self.end_job(msg, held, Status::TimedOut, e).await;
            }
            StageEnd::Cancelled => {
                tracing::info!("stage stopped: job cancelled");
                kind.cleanup(job).await;
                ack(msg, Answer::Ack).await;
            }
            StageEnd::HandBack if held.work.stage == Stage::Run && kind.restart_on_hand_back() => {
                // Its sandbox goes with this worker's cleanup; a fresh one it is.
                kind.cleanup(job).await;
                let why = "RUN was handed back at shutdown".to_string();
                self.restart(msg, held, job, why, false, None).await;
            }
            StageEnd::HandBack => {
                kind.cleanup(job).await;
                match self
                    .jobs
                    .release(&held.work, held.attempt, true, EpochMs::now())
                    .await
                {
                    Ok(_) => tracing::info!("stage handed back to the queue"),
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot release the claim; the lease will expire")
                    }
                }
                ack(msg, Answer::Nak(None)).await;
            }
        }
    }

    /// Records a successful stage and hands the job on.
    pub(super) async fn complete(
        &self,
        msg: &dyn Delivery,
        held: &Held,
        job: &Job,
        out: HookOutput,
    ) {
        let work = &held.work;
        let (output, route) = match out {
            HookOutput::Eval(e) => {
                let mut outcome = Outcome::done(e.reward, e.details);
                match self.staleness(job).await {
                    Ok(None) => {}
                    Ok(Some(why)) => {
                        tracing::info!(reason = %why, "sample is stale: kept, not a training sample");
                        outcome.status = Status::Stale;
                        outcome.error = Some(why);
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot read the current policy version to bound the sample's staleness; will retry");
                        self.release_and_nak(msg, held).await;
                        return;
                    }
                }
                self.finish(msg, held, &outcome).await;
                return;
            }
            HookOutput::Init(i) => {
                let route = match i.route {
                    Route::Any => ANY_ROUTE.to_string(),
                    Route::ThisNode => self.node().to_string(),
                };
                (i.output, Some(route))
            }
            HookOutput::Run(v) => (v, None),
        };
        match self
            .jobs
            .advance(
                work,
                held.attempt,
                &output,
                route.as_deref(),
                EpochMs::now(),
            )
            .await
        {
            Ok(Some(next)) => {
                let route = route.or_else(|| job.route.clone());
                self.hand_off(msg, held, &next, route.as_deref()).await;
            }
            Ok(None) => {
                tracing::info!("stage output discarded: the job moved on while it ran");
                ack(msg, Answer::Ack).await;
            }
            Err(e) if e.is_rejected() => {
                // Retrying the same output would be refused again: end the job with the
                // reason instead.
                let reason = format!(
                    "the {} stage's output could not be recorded: {e}",
                    work.stage
                );
                self.end_job(msg, held, Status::Failed, reason).await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot record the stage output; will retry");
                self.release_and_nak(msg, held).await;
            }
        }
    }

    /// Why a scored sample is stale, if it is: its task has a `max_staleness` and its
    /// oldest model token came from a policy version more than that behind the current
    /// one. A sample without versions (none was announced while it ran) is never stale.
    async fn staleness(&self, job: &Job) -> Result<Option<String>, crate::store::StoreError> {
        let Some(bound) = job
            .task
            .get("max_staleness")
            .and_then(serde_json::Value::as_i64)
        else {
            return Ok(None);
        };
        let Some(oldest) = job
            .run_output
            .as_ref()
            .and_then(|o| o.get("policy_version_oldest"))
            .and_then(serde_json::Value::as_i64)
        else {
            return Ok(None);
        };
        let Some(current) = self.policy.current_policy().await?.map(|p| p.version) else {
            return Ok(None);
        };
        let behind = current.saturating_sub(oldest);
        Ok((behind > bound).then(|| {
            format!(
                "stale: its oldest model token is from policy version {oldest}, {behind} behind the current {current}, and its max_staleness is {bound}"
            )
        }))
    }

    /// Sends the job back to INIT (its sandbox is gone), or fails it once it has been
    /// sent back `sandbox.max_restarts` times, with `output` (what the stage produced) as
    /// the result's RUN output when there is one; an uncounted restart (a graceful
    /// hand-back) is always allowed and not counted.
    pub(super) async fn restart(
        &self,
        msg: &dyn Delivery,
        held: &Held,
        job: &Job,
        error: String,
        counted: bool,
        output: Option<serde_json::Value>,
    ) {
        let max = if counted {
            self.settings.max_restarts
        } else {
            i64::MAX
        };
        if job.restarts >= max {
            let e = format!("{error}; already sent back to INIT {max} times, giving up");
            tracing::info!("{e}");
            match output {
                // What the stage produced is the result's RUN output.
                Some(output) => {
                    let outcome = Outcome::failed(e)
                        .with_run_output((held.work.stage == Stage::Run).then_some(output));
                    self.finish(msg, held, &outcome).await;
                }
                None => self.end_job(msg, held, Status::Failed, e).await,
            }
            return;
        }
        match self
            .jobs
            .restart(&held.work, held.attempt, max, counted, EpochMs::now())
            .await
        {
            Ok(Some(next)) => {
                tracing::info!(reason = %error, counted, "job sent back to INIT");
                self.hand_off(msg, held, &next, None).await;
            }
            Ok(None) => {
                tracing::info!("restart discarded: the job moved on meanwhile");
                ack(msg, Answer::Ack).await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot send the job back to INIT; will retry");
                self.release_and_nak(msg, held).await;
            }
        }
    }

    /// Publishes the job's next stage entry, recorded already, and acks `msg`; if the
    /// publish fails, `msg` is nakked: the database already says where the job is, so
    /// the redelivery finds the message stale and re-publishes the hand-off.
    async fn hand_off(
        &self,
        msg: &dyn Delivery,
        held: &Held,
        next: &WorkMessage,
        route: Option<&str>,
    ) {
        match self.queue.publish_work(next, route).await {
            Ok(()) => ack(msg, Answer::Ack).await,
            Err(e) => {
                tracing::warn!(error = %e, "hand-off publish failed; will repair on redelivery");
                ack(msg, Answer::Nak(Some(self.nak_delay(held.delivered)))).await;
            }
        }
    }

    /// Ends the job with a non-`done` terminal status.
    pub(super) async fn end_job(
        &self,
        msg: &dyn Delivery,
        held: &Held,
        status: Status,
        error: String,
    ) {
        let outcome = Outcome::ended(status, error);
        self.finish(msg, held, &outcome).await;
    }

    /// Writes the terminal state and result, publishes the result, acks.
    /// (A store refuses no end: one the database rejects is recorded as a failure with
    /// the reason, see `Store::finish`.)
    pub(super) async fn finish(&self, msg: &dyn Delivery, held: &Held, outcome: &Outcome) {
        let cond = held.cond();
        match self
            .jobs
            .finish(&cond, &held.work.job_id, outcome, EpochMs::now())
            .await
        {
            Ok(Some(result)) => {
                metrics::counter!(crate::metrics::JOBS_FINISHED, "status" => outcome.status.as_str())
                    .increment(1);
                tracing::debug!(status = %outcome.status, reward = ?result.result.reward, "job finished");
                publish_result(self.queue.as_ref(), self.results.as_ref(), &result).await;
                ack(msg, Answer::Ack).await;
            }
            Ok(None) => {
                tracing::info!("job already ended elsewhere; outcome discarded");
                ack(msg, Answer::Ack).await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot record the job's end; will retry");
                self.release_and_nak(msg, held).await;
            }
        }
    }

    /// A transient fault: retry with backoff, or give up at the delivery limit.
    pub(super) async fn give_up_or_retry(&self, msg: &dyn Delivery, held: &Held, error: String) {
        let limit = self.settings.queue.delivery_limit;
        if held.stage_attempts >= limit {
            let error = format!("gave up after {} attempts: {error}", held.stage_attempts);
            self.dead_letter(msg, held, &error).await;
        } else {
            tracing::info!(error = %error, "transient fault; retrying with backoff");
            self.release_and_nak(msg, held).await;
        }
    }

    pub(super) async fn release_and_nak(&self, msg: &dyn Delivery, held: &Held) {
        let w = &held.work;
        if let Err(e) = self
            .jobs
            .release(w, held.attempt, false, EpochMs::now())
            .await
        {
            tracing::warn!(error = %e, "cannot release the claim; the lease will expire");
        }
        let delay = self.nak_delay(held.stage_attempts.max(held.delivered));
        ack(msg, Answer::Nak(Some(delay))).await;
    }

    /// Keeps the message on the dead-letter subject, fails the job, acks.
    pub(super) async fn dead_letter(&self, msg: &dyn Delivery, held: &Held, error: &str) {
        let cond = held.cond();
        let attempts = held.stage_attempts;
        let node = Some(self.node());
        match dead_letter(
            self.queue.as_ref(),
            self.jobs.as_ref(),
            self.results.as_ref(),
            &cond,
            attempts,
            error,
            node,
        )
        .await
        {
            Ok(()) => ack(msg, Answer::Ack).await,
            Err(e) => {
                tracing::warn!(error = %e, "cannot dead-letter the job; will retry");
                ack(msg, Answer::Nak(Some(self.nak_delay(held.delivered)))).await;
            }
        }
    }

    /// A message whose job moved on: make sure the job's current hand-off exists. While
    /// the re-publish keeps failing (a cluster electing a new stream leader refuses
    /// publishes for a few seconds), the message comes back after the nak delay of its
    /// `delivered`-th delivery, so the retries back off as any other's do.
    pub(super) async fn repair_stale(
        &self,
        msg: &dyn Delivery,
        work: &WorkMessage,
        job: &Job,
        delivered: i64,
    ) {
        if !job.status.is_terminal() && (job.stage, job.epoch) != (work.stage, work.epoch) {
            let current = WorkMessage {
                job_id: job.id.clone(),
                stage: job.stage,
                epoch: job.epoch,
            };
            if job.status == Status::Queued
                && let Err(e) = self
                    .queue
                    .publish_work(&current, job.route.as_deref())
                    .await
            {
                tracing::warn!(error = %e, "cannot re-publish the job's hand-off; will retry");
                ack(msg, Answer::Nak(Some(self.nak_delay(delivered)))).await;
                return;
            }
        }
        tracing::debug!(status = %job.status, current_stage = %job.stage, "stale message dropped");
        ack(msg, Answer::Ack).await;
    }

    /// The nak delay after `delivered` deliveries (exponential, capped).
    pub(super) fn nak_delay(&self, delivered: i64) -> Duration {
        let q = &self.settings.queue;
        crate::retry::nak_delay(
            Duration::from_millis(q.nak_delay_ms),
            Duration::from_millis(q.nak_delay_max_ms),
            delivered,
        )
    }
}

/// Answers `msg`; a failure only means the message comes back.
pub(super) async fn ack(msg: &dyn Delivery, answer: Answer) {
    if let Err(e) = msg.answer(answer).await {
        tracing::warn!(error = %e, "acknowledgement failed; the message will be redelivered");
    }
}
