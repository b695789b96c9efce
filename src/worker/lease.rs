//! Running a claimed stage's hook: under the stage's timeout, with in-progress acks and
//! lease renewal beside it, and the job's cancel token and the worker's hand-back token
//! watched.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use super::Worker;
use super::held::Held;
use crate::domain::{EpochMs, Stage};
use crate::queue::{Answer, Delivery};
use crate::stage::{EvalOutput, InitOutput, StageContext, StageError, TaskKind};

type HookFuture<'a> = Pin<Box<dyn Future<Output = Result<HookOutput, StageError>> + Send + 'a>>;

/// What a stage's hook produced.
pub(super) enum HookOutput {
    Init(InitOutput),
    Run(serde_json::Value),
    Eval(EvalOutput),
}

/// How a claimed stage ended, from the worker's point of view.
pub(super) enum StageEnd {
    /// The hook returned.
    Finished(Result<HookOutput, StageError>),
    /// The stage's timeout fired first.
    TimedOut,
    /// The job was cancelled, or the row moved on without this worker.
    Cancelled,
    /// The grace period after shutdown ended first.
    HandBack,
}

impl Worker {
    /// Runs the stage hook under the timeout, renewing the lease and watching cancels.
    pub(super) async fn run_hook(
        &self,
        msg: &dyn Delivery,
        held: &Held,
        ctx: &StageContext,
        kind: &dyn TaskKind,
    ) -> StageEnd {
        let s = &self.settings;
        let work = &held.work;
        let mut hook: HookFuture<'_> = match work.stage {
            Stage::Init => Box::pin(async move { kind.init(ctx).await.map(HookOutput::Init) }),
            Stage::Run => Box::pin(async move { kind.run(ctx).await.map(HookOutput::Run) }),
            Stage::Eval => Box::pin(async move { kind.eval(ctx).await.map(HookOutput::Eval) }),
        };
        let timeout =
            tokio::time::sleep(Duration::from_millis(s.stages.get(work.stage).timeout_ms));
        tokio::pin!(timeout);
        let period = Duration::from_millis((s.queue.ack_wait_ms / 3).max(100));
        // The lease is renewed by a future polled beside the hook, not in a select arm:
        // an arm's body would stop polling the hook while it awaits the database, and a
        // hook holding a connection (or a lock others wait on with theirs) would then
        // leave renewal waiting for a connection that only the paused hook can free.
        let renewal = async {
            let mut progress =
                tokio::time::interval_at(tokio::time::Instant::now() + period, period);
            loop {
                progress.tick().await;
                if let Err(e) = msg.answer(Answer::Progress).await {
                    tracing::warn!(error = %e, "in-progress ack failed; the message may be redelivered");
                }
                let until = EpochMs::now().after(Duration::from_millis(s.queue.ack_wait_ms));
                match self.jobs.extend_lease(work, held.attempt, until).await {
                    Ok(true) => {}
                    // The row moved without us: cancelled (broadcast missed) or taken
                    // over after our lease lapsed. Either way, stop.
                    Ok(false) => return,
                    Err(e) => tracing::warn!(error = %e, "cannot renew the lease"),
                }
            }
        };
        tokio::pin!(renewal);
        tokio::select! {
            r = &mut hook => StageEnd::Finished(r),
            _ = &mut timeout => StageEnd::TimedOut,
            _ = ctx.cancel.cancelled() => StageEnd::Cancelled,
            _ = self.hand_back.cancelled() => StageEnd::HandBack,
            () = &mut renewal => {
                tracing::info!("job no longer held by this worker; stopping the stage");
                StageEnd::Cancelled
            }
        }
    }
}
