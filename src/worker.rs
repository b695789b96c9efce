//! The stage worker: pulls a stage's messages, runs the task kind's hook, records the
//! outcome, hands the job on.
//!
//! One loop serves all three stage binaries. For each message:
//!
//! 1. **Claim** the stage with a compare-and-set on the job row (`queued` → `running`,
//!    with a lease). A message for a job that moved on is stale: its hand-off is
//!    re-published (the server drops it if it is a duplicate) and the message is acked.
//!    A message whose job has a live lease elsewhere is nakked until the lease ends.
//! 2. **Run** the hook under the stage timeout (queue wait does not count: the clock
//!    starts at the claim), while a ticker sends in-progress acks and renews the lease,
//!    and while the job's cancel token and the worker's hand-back token are watched.
//! 3. **Record** the outcome in the database (the next stage, or the terminal status with
//!    its result), then **publish** the next message or the result, then **ack**. A crash
//!    between any two steps is repaired by the redelivered message or the reconciler.
//!
//! Flow control: a worker asks the server for at most as many messages as it has free
//! slots, so nothing waits in a local buffer while its ack timer runs. Transient faults
//! nak with exponential delay. The delivery limit counts stage starts recorded by the
//! claims (not the queue's delivery counter, which also counts copies that found the
//! stage busy): a claim past the limit, or a transient fault at it, fails the job and
//! keeps the message on the dead-letter subject. Every statement of a claimed stage also
//! matches the claim's token (the job's `attempts`), so a worker whose lease lapsed and
//! was taken over can neither renew, release nor record the stage. On shutdown (SIGTERM) the worker stops
//! pulling, lets running stages finish for a grace period, then hands the rest back
//! (release the claim, nak) so other workers pick them up at once.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::{self, AckKind};
use futures::StreamExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::config::Settings;
use crate::domain::now_ms;
use crate::domain::{Job, Outcome, Stage, Status, WorkMessage};
use crate::ending::{dead_letter, publish_result};
use crate::kinds::{EvalOutput, InitOutput, Registry, Route, StageContext, StageError};
use crate::queue::{ANY_ROUTE, Queue, QueueError};
use crate::store::{Claim, FinishIf, Store};
use crate::supervise::spawn_essential;

/// Why a worker stopped abnormally.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerError {
    /// The queue could not be set up.
    #[error(transparent)]
    Queue(#[from] QueueError),
    /// One of the worker's own tasks (the puller, the cancel listener) stopped early.
    #[error(transparent)]
    Task(#[from] crate::supervise::TaskFailed),
}

/// What a worker needs; cheap to clone.
#[derive(Clone)]
pub struct WorkerDeps {
    /// Job state.
    pub store: Arc<dyn Store>,
    /// The queue.
    pub queue: Queue,
    /// Known task kinds.
    pub kinds: Registry,
    /// This node's sandboxes (for the reaper; the kinds hold their own handle).
    pub sandboxes: Arc<crate::sandbox::NodeSandboxes>,
    /// Settings.
    pub settings: Arc<Settings>,
}

/// A worker of one stage on one node.
pub struct Worker {
    stage: Stage,
    deps: WorkerDeps,
    node: String,
    /// Cancel tokens of the jobs this worker is running, by job id.
    running: Mutex<HashMap<String, CancellationToken>>,
    /// Fires when the grace period after shutdown is over: hand everything back.
    hand_back: CancellationToken,
}

type HookFuture<'a> = Pin<Box<dyn Future<Output = Result<HookOutput, StageError>> + Send + 'a>>;

enum HookOutput {
    Init(InitOutput),
    Run(serde_json::Value),
    Eval(EvalOutput),
}

/// A stage entry this worker has claimed.
struct Held {
    /// The stage entry.
    work: WorkMessage,
    /// The claim's token (the job's `attempts` after the claim).
    attempt: i64,
    /// Starts of this stage entry, this one included.
    stage_attempts: i64,
    /// The queue's delivery count of the message.
    delivered: i64,
}

impl Held {
    /// The condition under which this claim may end the job.
    fn cond(&self) -> FinishIf {
        FinishIf::Claimed {
            msg: self.work.clone(),
            attempt: self.attempt,
        }
    }
}

/// How a claimed stage ended, from the worker's point of view.
enum StageEnd {
    Finished(Result<HookOutput, StageError>),
    TimedOut,
    Cancelled,
    HandBack,
}

impl Worker {
    /// A worker for `stage`.
    pub fn new(stage: Stage, deps: WorkerDeps) -> Arc<Self> {
        let node = deps.settings.node.name.clone();
        Arc::new(Self {
            stage,
            deps,
            node,
            running: Mutex::new(HashMap::new()),
            hand_back: CancellationToken::new(),
        })
    }

    /// Runs until `shutdown` fires, then drains as described in the module docs.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) -> Result<(), WorkerError> {
        let settings = &self.deps.settings;
        let consumers = self.deps.queue.consumers(self.stage, &self.node).await?;
        let concurrency = settings.stages.get(self.stage).concurrency;
        let slots = Arc::new(Semaphore::new(concurrency));
        let tracker = TaskTracker::new();
        tracing::info!(stage = %self.stage, node = %self.node, concurrency, "worker started");

        // Subscribed before the first pull, so no job runs while cancels go unheard.
        let cancels = self.deps.queue.subscribe_cancel().await?;
        // Cancels matter until the last job has stopped, so the listener runs past
        // shutdown, until `listening` ends it; the puller stops at shutdown. Either one
        // failing earlier shuts the worker down and is its error.
        let listening = CancellationToken::new();
        let cancel_listener = spawn_essential(
            "cancel listener",
            &shutdown,
            self.clone()
                .listen_for_cancels(Some(cancels), listening.clone()),
        );
        let puller = spawn_essential(
            "puller",
            &shutdown,
            self.clone()
                .pull(consumers, slots.clone(), tracker.clone(), shutdown.clone()),
        );
        shutdown.cancelled().await;
        let pulled = puller.finish().await;
        tracker.close();
        let grace = Duration::from_millis(settings.stages.grace_ms);
        let in_flight = tracker.len();
        if in_flight > 0 {
            tracing::info!(
                in_flight,
                ?grace,
                "stopped pulling; letting running stages finish"
            );
        }
        if tokio::time::timeout(grace, tracker.wait()).await.is_err() {
            tracing::warn!(
                in_flight = tracker.len(),
                "grace period over; handing running stages back to the queue"
            );
            self.hand_back.cancel();
            tracker.wait().await;
        }
        listening.cancel();
        let listened = cancel_listener.finish().await;
        tracing::info!(stage = %self.stage, "worker stopped");
        pulled?;
        listened?;
        Ok(())
    }

    /// Relays cancel broadcasts to the running jobs' tokens. Runs until `done`, at the
    /// very end of [`Worker::run`], so stages finishing during the grace period still
    /// hear cancels.
    async fn listen_for_cancels(
        self: Arc<Self>,
        mut first: Option<async_nats::Subscriber>,
        done: CancellationToken,
    ) {
        let mut delays = crate::retry::reconnect();
        loop {
            let next = match first.take() {
                Some(s) => Ok(s),
                None => tokio::select! {
                    s = self.deps.queue.subscribe_cancel() => s,
                    _ = done.cancelled() => return,
                },
            };
            let mut sub = match next {
                Ok(s) => s,
                Err(e) => {
                    let wait = delays.next().unwrap_or(Duration::from_secs(5));
                    tracing::warn!(error = %e, ?wait, "cannot subscribe to cancels; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => continue,
                        _ = done.cancelled() => return,
                    }
                }
            };
            delays = crate::retry::reconnect();
            loop {
                let m = tokio::select! {
                    m = sub.next() => match m {
                        Some(m) => m,
                        None => break,
                    },
                    _ = done.cancelled() => return,
                };
                let id = String::from_utf8_lossy(&m.payload).to_string();
                if let Some(t) = self.running.lock().expect("lock").get(&id) {
                    tracing::info!(job_id = %id, "cancel received");
                    t.cancel();
                }
            }
        }
    }

    /// Pulls from the stage's consumers, never asking for more messages than free slots.
    ///
    /// Slots are reserved before a pull request is made, so a request waiting on an empty
    /// consumer holds them. With one consumer that is what we want (a long-poll that
    /// delivers the moment a message arrives). A RUN worker has two (its node's subject
    /// and `any`), and usually only one of them carries traffic; so it first sweeps both
    /// without waiting, and long-polls only the one that last had messages, briefly, so
    /// a message on the other waits at most that long.
    async fn pull(
        self: Arc<Self>,
        consumers: Vec<jetstream::consumer::PullConsumer>,
        slots: Arc<Semaphore>,
        tracker: TaskTracker,
        shutdown: CancellationToken,
    ) {
        let mut failures = 0u32;
        let mut delays = crate::retry::pull_errors();
        let mut primary = 0usize;
        let long_poll = if consumers.len() > 1 {
            Duration::from_millis(250)
        } else {
            Duration::from_secs(2)
        };
        'outer: loop {
            let first = tokio::select! {
                p = slots.clone().acquire_owned() => p.expect("semaphore never closed"),
                _ = shutdown.cancelled() => break,
            };
            let mut permits = vec![first];
            while permits.len() < 256 {
                match slots.clone().try_acquire_owned() {
                    Ok(p) => permits.push(p),
                    Err(_) => break,
                }
            }
            if consumers.len() > 1 {
                let mut got = false;
                for (i, c) in consumers.iter().enumerate() {
                    if permits.is_empty() {
                        break;
                    }
                    match c.fetch().max_messages(permits.len()).messages().await {
                        Ok(mut batch) => {
                            while let Some(Ok(msg)) = batch.next().await {
                                let permit = permits.pop().expect("one permit per message");
                                tracker.spawn(self.clone().handle(msg, permit));
                                got = true;
                                primary = i;
                            }
                        }
                        Err(e) => tracing::debug!(error = %e, "fetch failed"),
                    }
                }
                if got {
                    continue;
                }
            }
            let batch = consumers[primary]
                .batch()
                .max_messages(permits.len())
                .expires(long_poll)
                .messages()
                .await;
            let mut batch = match batch {
                Ok(b) => {
                    if failures > 0 {
                        failures = 0;
                        delays = crate::retry::pull_errors();
                    }
                    b
                }
                Err(e) => {
                    failures += 1;
                    let backoff = delays.next().unwrap_or(Duration::from_millis(6_400));
                    tracing::warn!(error = %e, failures, ?backoff, "pull request failed; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => continue,
                        _ = shutdown.cancelled() => break,
                    }
                }
            };
            loop {
                tokio::select! {
                    m = batch.next() => match m {
                        Some(Ok(msg)) => {
                            let permit = permits.pop().expect("one permit per requested message");
                            tracker.spawn(self.clone().handle(msg, permit));
                        }
                        Some(Err(e)) => {
                            tracing::debug!(error = %e, "pull batch ended with an error");
                            break;
                        }
                        None => break,
                    },
                    _ = shutdown.cancelled() => break 'outer,
                }
            }
        }
    }

    async fn handle(self: Arc<Self>, msg: jetstream::Message, _permit: OwnedSemaphorePermit) {
        let delivered = msg.info().map(|i| i.delivered).unwrap_or(1);
        let work: WorkMessage = match serde_json::from_slice(&msg.payload) {
            Ok(w) => w,
            Err(e) => {
                tracing::error!(subject = %msg.subject, error = %e, "malformed stage message dropped");
                let _ = msg.ack_with(AckKind::Term).await;
                return;
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

    async fn process(&self, msg: jetstream::Message, work: WorkMessage, delivered: i64) {
        let s = &self.deps.settings;
        let store = &self.deps.store;
        // Registered before the claim, so a cancel broadcast that arrives between the
        // claim's commit and the hook's start is not missed.
        let token = CancellationToken::new();
        self.running
            .lock()
            .expect("lock")
            .insert(work.job_id.clone(), token.clone());
        let now = now_ms();
        let lease_ms = s.queue.ack_wait_ms as i64;
        let claim = store.claim(&work, &self.node, now + lease_ms, now).await;
        let job = match claim {
            Ok(Claim::Started(job)) => *job,
            other => {
                self.running.lock().expect("lock").remove(&work.job_id);
                match other {
                    Ok(Claim::Missing) => {
                        tracing::warn!("message for an unknown job dropped");
                        ack(&msg, AckKind::Ack).await;
                    }
                    Ok(Claim::Busy(until)) => {
                        let wait = Duration::from_millis((until - now).max(0) as u64 + 50);
                        tracing::debug!(
                            ?wait,
                            "stage is leased by another delivery; retrying later"
                        );
                        ack(&msg, AckKind::Nak(Some(wait))).await;
                    }
                    Ok(Claim::Stale(job)) => self.repair_stale(&msg, &work, &job).await,
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot claim the stage; will retry");
                        ack(&msg, AckKind::Nak(Some(self.nak_delay(delivered)))).await;
                    }
                    Ok(Claim::Started(_)) => unreachable!("handled above"),
                }
                return;
            }
        };
        let held = Held {
            work,
            attempt: job.attempts,
            stage_attempts: job.stage_attempts,
            delivered,
        };
        let limit = s.queue.delivery_limit;
        if held.stage_attempts > limit {
            self.running.lock().expect("lock").remove(&held.work.job_id);
            let error = format!(
                "{} stage started {} times without finishing (the workers running it \
                 crashed or were killed); giving up",
                held.work.stage,
                held.stage_attempts - 1
            );
            self.dead_letter(&msg, &held, &error).await;
            return;
        }
        if let Some(q) = job_stage_times(&job, held.work.stage).queued_at {
            metrics::histogram!(crate::metrics::QUEUE_WAIT, "stage" => held.work.stage.as_str())
                .record((now - q).max(0) as f64 / 1000.0);
        }
        let Some(kind) = self.deps.kinds.get(&job.kind).cloned() else {
            self.running.lock().expect("lock").remove(&held.work.job_id);
            let error = format!("this worker does not know task kind `{}`", job.kind);
            self.give_up_or_retry(&msg, &held, error).await;
            return;
        };
        let ctx = StageContext {
            job,
            node: self.node.clone(),
            cancel: token.clone(),
        };
        let started = std::time::Instant::now();
        let end = self.run_hook(&msg, &held, &ctx, kind.as_ref()).await;
        self.running.lock().expect("lock").remove(&held.work.job_id);
        let outcome_label = match &end {
            StageEnd::Finished(Ok(_)) => "ok",
            StageEnd::Finished(Err(StageError::Failed(_) | StageError::FailedWith { .. })) => {
                "failed"
            }
            StageEnd::Finished(Err(_)) => "transient",
            StageEnd::TimedOut => "timed_out",
            StageEnd::Cancelled => "cancelled",
            StageEnd::HandBack => "handed_back",
        };
        metrics::histogram!(crate::metrics::STAGE_DURATION, "stage" => held.work.stage.as_str(), "outcome" => outcome_label)
            .record(started.elapsed().as_secs_f64());
        match end {
            StageEnd::Finished(Ok(out)) => self.complete(&msg, &held, &ctx.job, out).await,
            StageEnd::Finished(Err(StageError::Failed(e))) => {
                tracing::info!(error = %e, "stage failed");
                kind.cleanup(&ctx.job).await;
                self.end_job(&msg, &held, Status::Failed, e).await;
            }
            StageEnd::Finished(Err(StageError::FailedWith { message, output })) => {
                tracing::info!(error = %message, "stage failed with partial output");
                kind.cleanup(&ctx.job).await;
                let outcome = Outcome::failed(message)
                    .with_run_output((held.work.stage == Stage::Run).then_some(output));
                self.finish(&msg, &held, &outcome).await;
            }
            StageEnd::Finished(Err(StageError::Transient(e))) => {
                self.give_up_or_retry(&msg, &held, e).await;
            }
            StageEnd::Finished(Err(StageError::Restart(e))) => {
                kind.cleanup(&ctx.job).await;
                self.restart(&msg, &held, &ctx.job, e, true).await;
            }
            StageEnd::TimedOut => {
                let timeout = s.stages.get(held.work.stage).timeout_ms;
                let e = format!(
                    "{} stage exceeded its timeout of {timeout} ms",
                    held.work.stage
                );
                tracing::info!("{e}");
                kind.cleanup(&ctx.job).await;
                self.end_job(&msg, &held, Status::TimedOut, e).await;
            }
            StageEnd::Cancelled => {
                tracing::info!("stage stopped: job cancelled");
                kind.cleanup(&ctx.job).await;
                ack(&msg, AckKind::Ack).await;
            }
            StageEnd::HandBack if held.work.stage == Stage::Run && kind.restart_on_hand_back() => {
                // Its sandbox goes with this worker's cleanup; a fresh one it is.
                kind.cleanup(&ctx.job).await;
                let why = "RUN was handed back at shutdown".to_string();
                self.restart(&msg, &held, &ctx.job, why, false).await;
            }
            StageEnd::HandBack => {
                kind.cleanup(&ctx.job).await;
                let w = &held.work;
                match store.release(w, held.attempt, true, now_ms()).await {
                    Ok(_) => tracing::info!("stage handed back to the queue"),
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot release the claim; the lease will expire")
                    }
                }
                ack(&msg, AckKind::Nak(None)).await;
            }
        }
    }

    /// Runs the stage hook under the timeout, renewing the lease and watching cancels.
    async fn run_hook(
        &self,
        msg: &jetstream::Message,
        held: &Held,
        ctx: &StageContext,
        kind: &dyn crate::kinds::TaskKind,
    ) -> StageEnd {
        let s = &self.deps.settings;
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
                if let Err(e) = msg.ack_with(AckKind::Progress).await {
                    tracing::warn!(error = %e, "in-progress ack failed; the message may be redelivered");
                }
                let until = now_ms() + s.queue.ack_wait_ms as i64;
                match self
                    .deps
                    .store
                    .extend_lease(work, held.attempt, until)
                    .await
                {
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

    /// Records a successful stage and hands the job on.
    async fn complete(&self, msg: &jetstream::Message, held: &Held, job: &Job, out: HookOutput) {
        let store = &self.deps.store;
        let work = &held.work;
        let (output, route) = match out {
            HookOutput::Eval(e) => {
                let outcome = Outcome::done(e.reward, e.details);
                self.finish(msg, held, &outcome).await;
                return;
            }
            HookOutput::Init(i) => {
                let route = match i.route {
                    Route::Any => ANY_ROUTE.to_string(),
                    Route::ThisNode => self.node.clone(),
                };
                (i.output, Some(route))
            }
            HookOutput::Run(v) => (v, None),
        };
        match store
            .advance(work, held.attempt, &output, route.as_deref(), now_ms())
            .await
        {
            Ok(Some(next)) => {
                let route = route.or_else(|| job.route.clone());
                match self.deps.queue.publish_work(&next, route.as_deref()).await {
                    Ok(()) => ack(msg, AckKind::Ack).await,
                    Err(e) => {
                        // The database already says where the job is; the redelivery of
                        // this message will find it stale and re-publish the hand-off.
                        tracing::warn!(error = %e, "hand-off publish failed; will repair on redelivery");
                        ack(msg, AckKind::Nak(Some(self.nak_delay(held.delivered)))).await;
                    }
                }
            }
            Ok(None) => {
                tracing::info!("stage output discarded: the job moved on while it ran");
                ack(msg, AckKind::Ack).await;
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

    /// Sends the job back to INIT (its sandbox is gone), or fails it once it has been
    /// sent back `sandbox.max_restarts` times; an uncounted restart (a graceful
    /// hand-back) is always allowed and not counted.
    async fn restart(
        &self,
        msg: &jetstream::Message,
        held: &Held,
        job: &Job,
        error: String,
        counted: bool,
    ) {
        let max = if counted {
            self.deps.settings.sandbox.max_restarts
        } else {
            i64::MAX
        };
        if job.restarts >= max {
            let e = format!("{error}; already sent back to INIT {max} times, giving up");
            tracing::info!("{e}");
            self.end_job(msg, held, Status::Failed, e).await;
            return;
        }
        match self
            .deps
            .store
            .restart(&held.work, held.attempt, max, counted, now_ms())
            .await
        {
            Ok(Some(next)) => {
                tracing::info!(reason = %error, counted, "job sent back to INIT");
                match self.deps.queue.publish_work(&next, None).await {
                    Ok(()) => ack(msg, AckKind::Ack).await,
                    Err(e) => {
                        tracing::warn!(error = %e, "hand-off publish failed; will repair on redelivery");
                        ack(msg, AckKind::Nak(Some(self.nak_delay(held.delivered)))).await;
                    }
                }
            }
            Ok(None) => {
                tracing::info!("restart discarded: the job moved on meanwhile");
                ack(msg, AckKind::Ack).await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot send the job back to INIT; will retry");
                self.release_and_nak(msg, held).await;
            }
        }
    }

    /// Ends the job with a non-`done` terminal status.
    async fn end_job(&self, msg: &jetstream::Message, held: &Held, status: Status, error: String) {
        let outcome = Outcome::ended(status, error);
        self.finish(msg, held, &outcome).await;
    }

    /// Writes the terminal state and result, publishes the result, acks.
    /// (A store refuses no end: one the database rejects is recorded as a failure with
    /// the reason, see `Store::finish`.)
    async fn finish(&self, msg: &jetstream::Message, held: &Held, outcome: &Outcome) {
        let cond = held.cond();
        match self
            .deps
            .store
            .finish(&cond, &held.work.job_id, outcome, now_ms())
            .await
        {
            Ok(Some(result)) => {
                metrics::counter!(crate::metrics::JOBS_FINISHED, "status" => outcome.status.as_str())
                    .increment(1);
                tracing::debug!(status = %outcome.status, reward = ?result.reward, "job finished");
                publish_result(&self.deps.queue, self.deps.store.as_ref(), &result).await;
                ack(msg, AckKind::Ack).await;
            }
            Ok(None) => {
                tracing::info!("job already ended elsewhere; outcome discarded");
                ack(msg, AckKind::Ack).await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot record the job's end; will retry");
                self.release_and_nak(msg, held).await;
            }
        }
    }

    /// A transient fault: retry with backoff, or give up at the delivery limit.
    async fn give_up_or_retry(&self, msg: &jetstream::Message, held: &Held, error: String) {
        let limit = self.deps.settings.queue.delivery_limit;
        if held.stage_attempts >= limit {
            let error = format!("gave up after {} attempts: {error}", held.stage_attempts);
            self.dead_letter(msg, held, &error).await;
        } else {
            tracing::info!(error = %error, "transient fault; retrying with backoff");
            self.release_and_nak(msg, held).await;
        }
    }

    async fn release_and_nak(&self, msg: &jetstream::Message, held: &Held) {
        let w = &held.work;
        if let Err(e) = self
            .deps
            .store
            .release(w, held.attempt, false, now_ms())
            .await
        {
            tracing::warn!(error = %e, "cannot release the claim; the lease will expire");
        }
        let delay = self.nak_delay(held.stage_attempts.max(held.delivered));
        ack(msg, AckKind::Nak(Some(delay))).await;
    }

    /// Keeps the message on the dead-letter subject, fails the job, acks.
    async fn dead_letter(&self, msg: &jetstream::Message, held: &Held, error: &str) {
        let deps = &self.deps;
        let cond = held.cond();
        let attempts = held.stage_attempts;
        let node = Some(self.node.as_str());
        match dead_letter(
            &deps.queue,
            deps.store.as_ref(),
            &cond,
            attempts,
            error,
            node,
        )
        .await
        {
            Ok(()) => ack(msg, AckKind::Ack).await,
            Err(e) => {
                tracing::warn!(error = %e, "cannot dead-letter the job; will retry");
                ack(msg, AckKind::Nak(Some(self.nak_delay(held.delivered)))).await;
            }
        }
    }

    /// A message whose job moved on: make sure the job's current hand-off exists.
    async fn repair_stale(&self, msg: &jetstream::Message, work: &WorkMessage, job: &Job) {
        if !job.status.is_terminal() && (job.stage, job.epoch) != (work.stage, work.epoch) {
            let current = WorkMessage {
                job_id: job.id.clone(),
                stage: job.stage,
                epoch: job.epoch,
            };
            if job.status == Status::Queued
                && let Err(e) = self
                    .deps
                    .queue
                    .publish_work(&current, job.route.as_deref())
                    .await
            {
                tracing::warn!(error = %e, "cannot re-publish the job's hand-off; will retry");
                ack(msg, AckKind::Nak(Some(self.nak_delay(1)))).await;
                return;
            }
        }
        tracing::debug!(status = %job.status, current_stage = %job.stage, "stale message dropped");
        ack(msg, AckKind::Ack).await;
    }

    fn nak_delay(&self, delivered: i64) -> Duration {
        let q = &self.deps.settings.queue;
        crate::retry::nak_delay(
            Duration::from_millis(q.nak_delay_ms),
            Duration::from_millis(q.nak_delay_max_ms),
            delivered,
        )
    }
}

fn job_stage_times(job: &Job, stage: Stage) -> &crate::domain::StageTimes {
    match stage {
        Stage::Init => &job.timings.init,
        Stage::Run => &job.timings.run,
        Stage::Eval => &job.timings.eval,
    }
}

async fn ack(msg: &jetstream::Message, kind: AckKind) {
    if let Err(e) = msg.ack_with(kind).await {
        tracing::warn!(error = %e, "acknowledgement failed; the message will be redelivered");
    }
}
