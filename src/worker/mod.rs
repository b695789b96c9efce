//! The stage worker: pulls a stage's messages, runs the task kind's hook, records the
//! outcome, hands the job on.
//!
//! One loop serves all three stage binaries. For each message:
//!
//! 1. **Claim** the stage with a compare-and-set on the job row (`queued` → `running`,
//!    with a lease). A message for a job that moved on is stale: its hand-off is
//!    re-published (the server drops it if it is a duplicate) and the message is acked.
//!    A message whose job has a live lease elsewhere is nakked until the lease ends.
//!    ([`claim`])
//! 2. **Run** the hook under the stage timeout (queue wait does not count: the clock
//!    starts at the claim), while a ticker sends in-progress acks and renews the lease,
//!    and while the job's cancel token and the worker's hand-back token are watched.
//!    ([`lease`])
//! 3. **Record** the outcome in the database (the next stage, or the terminal status with
//!    its result), then **publish** the next message or the result, then **ack**. A crash
//!    between any two steps is repaired by the redelivered message or the reconciler.
//!    ([`record`])
//!
//! Flow control ([`pull`]): a worker asks the server for at most as many messages as it
//! has free slots, so nothing waits in a local buffer while its ack timer runs. Transient
//! faults nak with exponential delay. The delivery limit counts stage starts recorded by
//! the claims (not the queue's delivery counter, which also counts copies that found the
//! stage busy): a claim past the limit, or a transient fault at it, fails the job and
//! keeps the message on the dead-letter subject. Every statement of a claimed stage also
//! matches the claim's token (the job's `attempts`), so a worker whose lease lapsed and
//! was taken over can neither renew, release nor record the stage. On shutdown (SIGTERM)
//! the worker stops pulling, lets running stages finish for a grace period, then hands
//! the rest back (release the claim, nak) so other workers pick them up at once.

mod claim;
mod held;
mod lease;
mod pull;
mod record;
mod running;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{QueueSettings, Settings, StagesSettings};
use crate::domain::Stage;
use crate::queue::{Queue, QueueError, WorkQueue};
use crate::stage::Registry;
use crate::store::{JobStore, PolicyStore, ResultStore};
use crate::supervise::spawn_essential;
use running::RunningJobs;

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

/// The settings a worker reads: its node, the stages' limits, the queue's timers and the
/// restart limit. Taken from [`Settings`] by [`WorkerSettings::from_settings`].
#[derive(Debug, Clone)]
pub struct WorkerSettings {
    /// The node the worker runs on (its RUN subject, its claims' owner).
    pub node: String,
    /// Concurrency, timeouts and the grace period of each stage.
    pub stages: StagesSettings,
    /// Lease length, delivery limit and nak delays.
    pub queue: QueueSettings,
    /// How often a job may be sent back to INIT (`sandbox.max_restarts`).
    pub max_restarts: i64,
}

impl WorkerSettings {
    /// The worker's part of `settings`.
    pub fn from_settings(settings: &Settings) -> Self {
        Self {
            node: settings.node.name.clone(),
            stages: settings.stages.clone(),
            queue: settings.queue.clone(),
            max_restarts: settings.sandbox.max_restarts,
        }
    }
}

/// A worker of one stage on one node.
pub struct Worker {
    stage: Stage,
    /// Claims, leases, hand-offs and ends of this stage's jobs.
    jobs: Arc<dyn JobStore>,
    /// Where an ended job's result is marked published.
    results: Arc<dyn ResultStore>,
    /// The current policy version, which a finished sample's staleness is measured
    /// against.
    policy: Arc<dyn PolicyStore>,
    /// Deliveries, hand-offs, results and cancels ([`Queue`] over JetStream).
    queue: Arc<dyn WorkQueue>,
    kinds: Registry,
    settings: WorkerSettings,
    /// The jobs this worker is running, for cancel broadcasts.
    running: RunningJobs,
    /// Fires when the grace period after shutdown is over: hand everything back.
    hand_back: CancellationToken,
}

impl Worker {
    /// A worker for `stage`, running `kinds`' hooks, recording in `jobs` and marking
    /// published results in `results` (usually one store), pulling from and publishing
    /// to `queue` (a [`Queue`]; in memory in the worker's unit tests).
    pub fn new(
        stage: Stage,
        jobs: Arc<dyn JobStore>,
        results: Arc<dyn ResultStore>,
        policy: Arc<dyn PolicyStore>,
        queue: Arc<dyn WorkQueue>,
        kinds: Registry,
        settings: WorkerSettings,
    ) -> Arc<Self> {
        Arc::new(Self {
            stage,
            jobs,
            results,
            policy,
            queue,
            kinds,
            settings,
            running: RunningJobs::default(),
            hand_back: CancellationToken::new(),
        })
    }

    fn node(&self) -> &str {
        &self.settings.node
    }

    /// Runs until `shutdown` fires, then drains as described in the module docs.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) -> Result<(), WorkerError> {
        let source = self.queue.source(self.stage, self.node()).await?;
        let concurrency = self.settings.stages.get(self.stage).concurrency;
        let slots = Arc::new(Semaphore::new(concurrency));
        let tracker = TaskTracker::new();
        tracing::info!(stage = %self.stage, node = %self.node(), concurrency, "worker started");

        // Subscribed before the first pull, so no job runs while cancels go unheard.
        let cancels = self.queue.cancels().await?;
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
                .pull(source, slots.clone(), tracker.clone(), shutdown.clone()),
        );
        shutdown.cancelled().await;
        let pulled = puller.finish().await;
        tracker.close();
        let grace = Duration::from_millis(self.settings.stages.grace_ms);
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
        first: Option<futures::stream::BoxStream<'static, String>>,
        done: CancellationToken,
    ) {
        Queue::follow(
            "cancels",
            first,
            || self.queue.cancels(),
            |id| {
                if self.running.cancel(&id) {
                    tracing::info!(job_id = %id, "cancel received");
                }
                std::future::ready(())
            },
            &done,
        )
        .await;
    }
}
