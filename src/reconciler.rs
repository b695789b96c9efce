//! The reconciler: repairs hand-offs lost between the database and the queue.
//!
//! A stage commits to the database, then publishes, then acks. If a process dies between
//! the commit and the publish (or a server failure loses a message), the database says a
//! job is queued but no message exists. Redelivered messages repair most of these; the
//! reconciler catches the rest:
//!
//! - a **queued** job whose hand-off is `republish_after_ms` old (10 s by default) and
//!   that has not changed since has it published once more, in case the process that
//!   wrote the job died before publishing (a copy of a message that exists is dropped by
//!   the server, as this is well inside its duplicate window);
//! - a **queued** job with no change for `stale_after_ms` has its hand-off re-published
//!   with the same `Nats-Msg-Id` (deduplicated by the server within its duplicate window;
//!   after it, a second copy reaches a worker, which waits while the stage is held by the
//!   first and drops the copy once the job has moved on — it never starts the stage
//!   twice or counts against the delivery limit);
//! - a **running** job whose lease lapsed `stale_after_ms` ago and that no redelivery took
//!   over has lost its message (or the message ran out of deliveries): it is queued again
//!   under a new stage entry, so the new message has a fresh id and fresh deliveries —
//!   unless it has already been started `3 × delivery_limit` times, when it is failed;
//! - a job **queued for RUN** whose sandbox's lease ran out (its node stopped renewing
//!   it: the node died) is sent back to INIT for a new sandbox elsewhere, at most
//!   `sandbox.max_restarts` times, then failed;
//! - results written but never marked published are published;
//! - backend assignments of jobs that left RUN or ended (written by a version that did
//!   not check) are deleted, so backends' active counts are right again;
//! - a message that reached the consumer's delivery maximum without a worker giving up on
//!   it (deliveries wasted on workers that died) is reported by the server's
//!   max-deliveries advisory; the reconciler dead-letters it and fails its job — unless
//!   the stage is held under a live lease or has moved on, when the message was a
//!   duplicate — and deletes it.
//!
//! Any number of reconcilers may run at once: every action is a compare-and-set or a
//! deduplicated publish.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::{ReconcilerSettings, Settings};
use crate::domain::{EpochMs, Outcome, Status, WorkMessage};
use crate::queue::{Queue, QueueError};
use crate::store::{AbandonedRun, FinishIf, StaleJob, Store, StoreError};

/// A failed sweep (retried at the next interval).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReconcileError {
    /// The queue.
    #[error(transparent)]
    Queue(#[from] QueueError),
    /// The database.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Dead-lettering.
    #[error(transparent)]
    DeadLetter(#[from] crate::publish::DeadLetterError),
}

/// What one sweep did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Sweep {
    /// Queued jobs whose message was re-published.
    pub republished: usize,
    /// Running jobs with a lapsed lease queued again.
    pub requeued: usize,
    /// Jobs failed for being stuck too often.
    pub failed: usize,
    /// Jobs sent back to INIT because their sandbox's node is gone.
    pub restarted: usize,
    /// Results published.
    pub results_published: usize,
    /// Fresh hand-offs published again in case they were lost (see
    /// `reconciler.republish_after_ms`).
    pub handoffs_checked: usize,
    /// Backend assignments of jobs no longer in RUN deleted (see
    /// [`BackendStore::release_leaked_assignments`](crate::store::BackendStore::release_leaked_assignments)).
    pub assignments_released: usize,
    /// Jobs that could not be repaired this time (each logged with its id).
    pub errors: usize,
}

/// The settings the reconciler reads: its own section, and the queue's and sandboxes'
/// limits it enforces on jobs it repairs.
#[derive(Debug, Clone)]
pub struct SweepSettings {
    /// How often, how far back, how many.
    pub reconciler: ReconcilerSettings,
    /// `queue.delivery_limit`: a running job whose claims reach three times this is
    /// failed instead of requeued.
    pub delivery_limit: i64,
    /// `queue.duplicate_window_ms`: overdue hand-offs are re-published only inside half
    /// of it, where the server still drops a copy of one that exists.
    pub duplicate_window_ms: u64,
    /// `sandbox.max_restarts`: how often an abandoned RUN may go back to INIT.
    pub max_restarts: i64,
    /// The `pool` section's timeouts, for resuming the backends of a weight update whose
    /// lease ran out.
    pub client: crate::backends::client::ClientSettings,
}

impl SweepSettings {
    /// The reconciler's part of `settings`.
    pub fn from_settings(settings: &Settings) -> Self {
        Self {
            reconciler: settings.reconciler.clone(),
            delivery_limit: settings.queue.delivery_limit,
            duplicate_window_ms: settings.queue.duplicate_window_ms,
            max_restarts: settings.sandbox.max_restarts,
            client: (&settings.pool).into(),
        }
    }
}

/// Runs sweeps every `reconciler.interval_ms`, and handles max-deliveries advisories,
/// until `shutdown` fires.
pub async fn run(
    store: Arc<dyn Store>,
    queue: Queue,
    settings: SweepSettings,
    shutdown: CancellationToken,
) {
    // Its failure is logged and shuts the process down (see `supervise`); the sweeps
    // stop with it.
    let _advisories = crate::supervise::spawn_essential(
        "max-deliveries watcher",
        &shutdown,
        watch_max_deliveries(store.clone(), queue.clone(), shutdown.clone()),
    );
    let driver =
        crate::sampling::Driver::new(store.clone(), store.clone(), store.clone(), queue.clone());
    let mut tick = tokio::time::interval(Duration::from_millis(settings.reconciler.interval_ms));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.cancelled() => return,
        }
        match sweep(store.as_ref(), &queue, &settings).await {
            Ok(s) if s != Sweep::default() => tracing::info!(
                republished = s.republished,
                requeued = s.requeued,
                failed = s.failed,
                restarted = s.restarted,
                results_published = s.results_published,
                handoffs_checked = s.handoffs_checked,
                assignments_released = s.assignments_released,
                errors = s.errors,
                "reconciler repaired hand-offs"
            ),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "reconciler sweep failed"),
        }
        // A weight update whose trainer (or gateway) died holds the GPUs until here.
        if let Err(e) = expire_pause(store.as_ref(), &queue, &settings).await {
            tracing::warn!(error = %e, "cannot check the weight update's lease");
        }
        // A backend that was away when generation resumed stays paused until here.
        if let Err(e) = repay_resumes(store.as_ref(), &settings).await {
            tracing::warn!(error = %e, "cannot resume the backends owed a resume");
        }
        // Sampling batches whose wake was lost, or whose driver died mid-batch.
        if let Err(e) = driver.sweep().await {
            tracing::warn!(error = %e, "sampling batch sweep failed");
        }
    }
}

/// Ends a weight update whose lease ran out with no resume (its trainer or gateway
/// died): the backends are resumed and the RUN workers told, and the version it was
/// for does not become current (the trainer never said its weights were in place).
/// Returns whether there was one.
pub async fn expire_pause(
    store: &dyn Store,
    queue: &Queue,
    settings: &SweepSettings,
) -> Result<bool, ReconcileError> {
    let Some(pause) = store.expire_pause(EpochMs::now()).await? else {
        return Ok(false);
    };
    tracing::warn!(
        version = pause.version,
        mode = pause.mode.as_str(),
        "the weight update's lease ran out with no resume: resuming the backends; the version does not become current"
    );
    let policy = store.policy_state().await?;
    crate::policy::broadcast(queue, &policy).await;
    let backends: Vec<_> = store
        .backends()
        .await?
        .into_iter()
        .map(|b| b.spec)
        .collect();
    let client = crate::backends::client::InferenceClient::new(settings.client.clone());
    // A backend that does not answer now is owed a resume: the next sweeps ask again.
    for a in crate::backends::control::resume_all_owed(&client, store, &backends).await {
        if !a.ok {
            tracing::warn!(backend = %a.backend, error = ?a.error, "backend not resumed after the weight update's lease ran out; the reconciler asks again at every sweep");
        }
    }
    Ok(true)
}

/// Resumes the backends the service paused and could not resume (they were down or
/// did not answer at the resume: [`crate::backends::control::resume_all_owed`]), unless
/// a weight update is in progress, whose own resume will. Only the service's own
/// pauses are repaid: a server a trainer paused itself is never resumed from here.
/// Returns how many were resumed.
pub async fn repay_resumes(
    store: &dyn Store,
    settings: &SweepSettings,
) -> Result<usize, ReconcileError> {
    let owed = store.owed_resumes().await?;
    if owed.is_empty() || store.policy_state().await?.pause.is_some() {
        return Ok(0);
    }
    let backends: Vec<_> = store
        .backends()
        .await?
        .into_iter()
        .map(|b| b.spec)
        .filter(|b| owed.contains(&b.id))
        .collect();
    let client = crate::backends::client::InferenceClient::new(settings.client.clone());
    let mut resumed = 0;
    for a in crate::backends::control::resume_all_owed(&client, store, &backends).await {
        if a.ok {
            resumed += 1;
            tracing::info!(backend = %a.backend, "backend resumed: it was owed a resume since a weight update");
        } else {
            tracing::debug!(backend = %a.backend, error = ?a.error, "backend still owed a resume");
        }
    }
    Ok(resumed)
}

/// One sweep. Each job is repaired on its own: one that cannot be (a row the database
/// rejects, a publish that fails) is logged with its id and counted in
/// [`Sweep::errors`], and the sweep goes on to the others. Only a failure to list the
/// work at all ends a sweep early.
pub async fn sweep(
    store: &dyn Store,
    queue: &Queue,
    settings: &SweepSettings,
) -> Result<Sweep, ReconcileError> {
    let r = &settings.reconciler;
    let now = EpochMs::now();
    let mut out = Sweep::default();
    for job in store
        .stale_jobs(
            now.before(Duration::from_millis(r.stale_after_ms)),
            r.batch_limit,
        )
        .await?
    {
        let id = job.msg.job_id.clone();
        let (what, done, counter) = match job.status {
            Status::Queued => (
                "re-publish",
                republish(store, queue, &job, now, true).await,
                &mut out.republished,
            ),
            _ if job.attempts >= 3 * settings.delivery_limit => (
                "fail",
                fail_stuck(store, queue, &job, now).await,
                &mut out.failed,
            ),
            _ => (
                "requeue",
                requeue(store, queue, &job, now).await,
                &mut out.requeued,
            ),
        };
        count(&id, what, done, counter, &mut out.errors);
    }
    // Hand-offs overdue by a short margin, while the server would still drop a copy of
    // one that exists: checked once each, with no event (most are only waiting for a
    // free worker).
    let window = Duration::from_millis(settings.duplicate_window_ms) / 2;
    let after = Duration::from_millis(r.republish_after_ms);
    if !after.is_zero() && after < window {
        republish_overdue(
            store,
            queue,
            (now.before(after), now.before(window)),
            r.batch_limit,
            now,
            &mut out,
        )
        .await?;
    }
    for run in store.abandoned_runs(now, r.batch_limit).await? {
        let id = run.msg.job_id.clone();
        let max = settings.max_restarts;
        if run.restarts >= max {
            let done = fail_abandoned(store, queue, &run, max, now).await;
            count(&id, "fail", done, &mut out.failed, &mut out.errors);
        } else {
            let done = restart_abandoned(store, queue, &run, max, now).await;
            count(&id, "restart", done, &mut out.restarted, &mut out.errors);
        }
    }
    // Backend counts leaked by assignments written after their job left RUN: routing
    // reads these counts, so they are put right at once. A failure is counted, and the
    // sweep goes on.
    match store.release_leaked_assignments().await {
        Ok(n) => out.assignments_released = usize::try_from(n).unwrap_or(usize::MAX),
        Err(e) => {
            out.errors += 1;
            tracing::warn!(error = %e, "reconciler cannot release leaked backend assignments");
        }
    }
    // Results are normally marked within milliseconds; give in-flight publishes time.
    for res in store
        .unpublished_results(now.before(Duration::from_secs(10)), r.batch_limit)
        .await?
    {
        // One result that cannot be published must not hold up the others.
        let done = async {
            queue.publish_result(&res).await?;
            store.mark_published(&[res.seq], EpochMs::now()).await?;
            Ok(true)
        }
        .await;
        count(
            &res.job_id,
            "publish the result of",
            done,
            &mut out.results_published,
            &mut out.errors,
        );
    }
    Ok(out)
}

/// How many re-publications of overdue hand-offs run at once: each is a write (the
/// touch) and a publish awaiting its ack, so a backlog of thousands is worked through
/// in parallel rather than one round trip after another.
const REPUBLISH_CONCURRENCY: usize = 64;

/// Re-publishes every queued job handed off between `since` and `before` and untouched
/// since (oldest first), page by page of `limit`, until none is left: the
/// whole backlog in this sweep, however many jobs a crash orphaned (a gateway killed
/// between the commit and the publish of a 10,000-task submit), so none of them ages
/// out of the window into the `stale_after_ms` wait. Each re-published job is touched,
/// so the next page does not list it again; a page in which nothing could be touched
/// (every job failed to publish, or moved on under another reconciler) ends the loop,
/// which the next sweep takes up again.
async fn republish_overdue(
    store: &dyn Store,
    queue: &Queue,
    (before, since): (EpochMs, EpochMs),
    limit: i64,
    now: EpochMs,
    out: &mut Sweep,
) -> Result<(), ReconcileError> {
    use futures::StreamExt;
    loop {
        let page = store.overdue_handoffs(before, since, limit).await?;
        let full = i64::try_from(page.len()).unwrap_or(i64::MAX) >= limit;
        let mut done = futures::stream::iter(page)
            .map(|job| async move {
                let r = republish(store, queue, &job, now, false).await;
                (job.msg.job_id, r)
            })
            .buffer_unordered(REPUBLISH_CONCURRENCY);
        let mut progressed = false;
        while let Some((id, r)) = done.next().await {
            progressed |= matches!(r, Ok(true));
            count(
                &id,
                "re-publish",
                r,
                &mut out.handoffs_checked,
                &mut out.errors,
            );
        }
        if !full || !progressed {
            return Ok(());
        }
    }
}

/// Adds one job's repair to its counter, or logs why it failed and counts the error.
fn count(
    id: &str,
    what: &str,
    done: Result<bool, ReconcileError>,
    counter: &mut usize,
    errors: &mut usize,
) {
    match done {
        Ok(true) => *counter += 1,
        Ok(false) => {}
        Err(e) => {
            *errors += 1;
            tracing::warn!(job_id = %id, error = %e, "reconciler cannot {what} this job; going on with the others");
        }
    }
}

/// Re-publishes a queued job's hand-off. An overdue one (`stale` false: its publish may
/// have been lost with the process that committed it) goes under its own message id, so
/// the server drops it if the first still exists. A stale one (`stale`: queued, and
/// unchanged for `stale_after_ms`) goes under an id of its own, since its first message
/// may be gone while the server still remembers its id (delivered, then acknowledged by
/// a worker whose claim had been superseded); it is noted in the job's events.
async fn republish(
    store: &dyn Store,
    queue: &Queue,
    job: &StaleJob,
    now: EpochMs,
    stale: bool,
) -> Result<bool, ReconcileError> {
    if !store.touch(&job.msg, now).await? {
        return Ok(false);
    }
    let route = job.route.as_deref();
    if !stale {
        queue.publish_work(&job.msg, route).await?;
        return Ok(true);
    }
    queue.publish_work_again(&job.msg, route, now).await?;
    record(
        store,
        &job.msg.job_id,
        "republished",
        Some(job.msg.stage),
        None,
        now,
    )
    .await;
    Ok(true)
}

/// Fails a job whose stage was started too often by workers that then died.
async fn fail_stuck(
    store: &dyn Store,
    queue: &Queue,
    job: &StaleJob,
    now: EpochMs,
) -> Result<bool, ReconcileError> {
    let error = format!(
        "{} stage stuck: started {} times, and its last worker stopped renewing \
         its lease; giving up",
        job.msg.stage, job.attempts
    );
    fail_unleased(store, queue, &job.msg, error, now).await
}

/// Fails the stage entry `msg` if nobody holds it, and publishes the result.
async fn fail_unleased(
    store: &dyn Store,
    queue: &Queue,
    msg: &WorkMessage,
    error: String,
    now: EpochMs,
) -> Result<bool, ReconcileError> {
    let outcome = Outcome::failed(error);
    let cond = FinishIf::Unleased(msg.clone());
    let Some(result) = store.finish(&cond, &msg.job_id, &outcome, now).await? else {
        return Ok(false);
    };
    crate::publish::publish_result(queue, store, &result).await;
    Ok(true)
}

/// Queues again a running job whose lease lapsed with no redelivery taking over.
async fn requeue(
    store: &dyn Store,
    queue: &Queue,
    job: &StaleJob,
    now: EpochMs,
) -> Result<bool, ReconcileError> {
    let Some(next) = store.requeue(&job.msg, now).await? else {
        return Ok(false);
    };
    queue.publish_work(&next, job.route.as_deref()).await?;
    record(
        store,
        &job.msg.job_id,
        "requeued",
        Some(next.stage),
        Some("lease lapsed"),
        now,
    )
    .await;
    Ok(true)
}

/// Fails a job whose sandbox's node is gone, once it was sent back to INIT `max` times.
async fn fail_abandoned(
    store: &dyn Store,
    queue: &Queue,
    run: &AbandonedRun,
    max: i64,
    now: EpochMs,
) -> Result<bool, ReconcileError> {
    let error = format!(
        "node {} stopped renewing the lease of the job's sandbox (the node is gone) \
         and the job was already sent back to INIT {max} times; giving up",
        run.node
    );
    if !fail_unleased(store, queue, &run.msg, error, now).await? {
        return Ok(false);
    }
    store.delete_sandbox(&run.msg.job_id).await?;
    Ok(true)
}

/// Sends a job whose sandbox's node is gone back to INIT for a sandbox elsewhere.
async fn restart_abandoned(
    store: &dyn Store,
    queue: &Queue,
    run: &AbandonedRun,
    max: i64,
    now: EpochMs,
) -> Result<bool, ReconcileError> {
    let id = &run.msg.job_id;
    let Some(next) = store.restart_queued(&run.msg, max, now).await? else {
        return Ok(false);
    };
    store.delete_sandbox(id).await?;
    queue.publish_work(&next, None).await?;
    let why = format!("the sandbox's node {} is gone", run.node);
    record(store, id, "restarted", Some(next.stage), Some(&why), now).await;
    Ok(true)
}

/// Logs a repair in the job's event log; bookkeeping only, so a failure is a warning.
async fn record(
    store: &dyn Store,
    id: &str,
    event: &str,
    stage: Option<crate::domain::Stage>,
    detail: Option<&str>,
    now: EpochMs,
) {
    if let Err(e) = store
        .record_event(id, event, stage, None, detail, now)
        .await
    {
        tracing::warn!(job_id = %id, error = %e, "cannot log the {event} event");
    }
}

/// The fields of a max-deliveries advisory that matter here.
#[derive(Debug, serde::Deserialize)]
struct MaxDeliveries {
    stream_seq: u64,
    deliveries: i64,
}

async fn watch_max_deliveries(store: Arc<dyn Store>, queue: Queue, shutdown: CancellationToken) {
    let stream_name = queue.subjects().stream("WORK");
    Queue::follow(
        "max-deliveries advisories",
        None,
        || queue.subscribe_max_deliveries(),
        |m| {
            let (store, queue, stream_name) = (&store, &queue, &stream_name);
            async move {
                tracing::debug!(advisory = %String::from_utf8_lossy(&m.payload), "max-deliveries advisory");
                let Ok(adv) = serde_json::from_slice::<MaxDeliveries>(&m.payload) else {
                    tracing::warn!("unreadable max-deliveries advisory ignored");
                    return;
                };
                if let Err(e) = handle_max_deliveries(store.as_ref(), queue, stream_name, &adv).await {
                    tracing::warn!(error = %e, seq = adv.stream_seq, "cannot dead-letter an exhausted message; the sweep will repair its job");
                }
            }
        },
        &shutdown,
    )
    .await;
}

async fn handle_max_deliveries(
    store: &dyn Store,
    queue: &Queue,
    stream_name: &str,
    adv: &MaxDeliveries,
) -> Result<(), ReconcileError> {
    let js_err = |what: &'static str| move |e: String| QueueError::JetStream { what, detail: e };
    let stream = queue
        .jetstream()
        .get_stream(stream_name)
        .await
        .map_err(|e| js_err("stream lookup")(e.to_string()))?;
    let Ok(raw) = stream.get_raw_message(adv.stream_seq).await else {
        return Ok(()); // already removed (a worker gave up on it in time)
    };
    let Ok(work) = serde_json::from_slice::<WorkMessage>(&raw.payload) else {
        return Ok(());
    };
    let error = format!(
        "{} stage delivered {} times without finishing (the workers running it crashed or \
         were killed); giving up",
        work.stage, adv.deliveries
    );
    // Never ends a stage someone holds a live lease on: then this message was a
    // duplicate copy, and the holder's own message carries the job on.
    let cond = FinishIf::Unleased(work);
    crate::publish::dead_letter(queue, store, store, &cond, adv.deliveries, &error, None).await?;
    stream
        .delete_message(adv.stream_seq)
        .await
        .map_err(|e| js_err("message delete")(e.to_string()))?;
    Ok(())
}
