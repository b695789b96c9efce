//! The worker's protocol driven in memory: a queue that records every answer and
//! publish, a task kind whose hooks wait at a gate the test opens, and a real SQLite
//! store. Each test waits for the state it checks (a hook started, an answer given),
//! never for a length of time; the end-to-end tests run the same worker on JetStream.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::sync::{Notify, Semaphore, broadcast};
use tokio_util::sync::CancellationToken;

use super::{Worker, WorkerError, WorkerSettings};
use crate::config::{QueueSettings, StagesSettings};
use crate::domain::{EpochMs, JobResult, Outcome, Stage, Status, WorkMessage};
use crate::queue::{Answer, Delivery, Outbox, QueueError, WorkQueue, WorkSource};
use crate::stage::{
    EvalOutput, InitOutput, Registry, Route, SpecError, StageContext, StageError, TaskKind,
};
use crate::store::{FinishIf, NewJob, Store};

/// The safety net of every wait: far beyond what any step takes, never a measure.
const PATIENCE: Duration = Duration::from_secs(60);

/// Waits until `check` returns something, re-checking each time `notify` fires (the
/// wake-up is armed before each check, so one that comes between the check and the wait
/// is not missed). The callers bound the wait.
async fn when<T>(notify: &Notify, mut check: impl FnMut() -> Option<T>) -> T {
    loop {
        let fired = notify.notified();
        tokio::pin!(fired);
        fired.as_mut().enable();
        if let Some(v) = check() {
            return v;
        }
        fired.await;
    }
}

/// What the queue saw, in order.
#[derive(Debug, Clone, PartialEq)]
enum Seen {
    /// A delivery of `job` (its `n`th) was answered.
    Answered {
        job: String,
        delivered: i64,
        answer: Answer,
    },
    /// A pull asked for at most this many messages.
    Asked(usize),
    /// A hand-off was published.
    Work(WorkMessage),
    /// A result was published.
    Result { job: String, status: Status },
    /// A dead-letter copy was kept.
    Dead { job: String, error: String },
}

#[derive(Default)]
struct QueueState {
    waiting: VecDeque<(Vec<u8>, i64)>,
    seen: Vec<Seen>,
    /// Pull requests still to refuse (a server that is down).
    refuse_pulls: usize,
}

/// A work queue in memory: messages wait in a list, a nak puts one back (after its
/// delay, delivered once more), and everything the worker does is recorded. A handle:
/// the worker and the test hold clones of one queue.
#[derive(Clone)]
struct MemoryQueue(Arc<Inner>);

struct Inner {
    state: Mutex<QueueState>,
    /// Fires when a message is queued.
    arrived: Notify,
    /// Fires when anything is recorded.
    changed: Notify,
    cancels: broadcast::Sender<String>,
}

impl std::ops::Deref for MemoryQueue {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.0
    }
}

impl MemoryQueue {
    fn new() -> Self {
        Self(Arc::new(Inner {
            state: Mutex::default(),
            arrived: Notify::new(),
            changed: Notify::new(),
            cancels: broadcast::channel(64).0,
        }))
    }

    fn put(&self, payload: Vec<u8>, delivered: i64) {
        self.state
            .lock()
            .unwrap()
            .waiting
            .push_back((payload, delivered));
        self.arrived.notify_waiters();
        self.changed.notify_waiters();
    }

    fn queue_work(&self, msg: &WorkMessage) {
        self.put(serde_json::to_vec(msg).unwrap(), 1);
    }

    fn record(&self, seen: Seen) {
        self.state.lock().unwrap().seen.push(seen);
        self.changed.notify_waiters();
    }

    fn seen(&self) -> Vec<Seen> {
        self.state.lock().unwrap().seen.clone()
    }

    /// Waits until `cond` holds of what the queue saw, and returns that.
    async fn wait_until(&self, what: &str, cond: impl Fn(&[Seen]) -> bool) -> Vec<Seen> {
        let waited = tokio::time::timeout(
            PATIENCE,
            when(&self.changed, || Some(self.seen()).filter(|s| cond(s))),
        )
        .await;
        waited.unwrap_or_else(|_| panic!("{what}: never so; the queue saw {:#?}", self.seen()))
    }
}

/// The answers given to `job`'s deliveries, in order.
fn answers(seen: &[Seen], of: &str) -> Vec<Answer> {
    seen.iter()
        .filter_map(|s| match s {
            Seen::Answered { job, answer, .. } if job == of => Some(*answer),
            _ => None,
        })
        .collect()
}

fn final_answers(seen: &[Seen], of: &str) -> Vec<Answer> {
    answers(seen, of)
        .into_iter()
        .filter(|a| *a != Answer::Progress)
        .collect()
}

struct MemoryDelivery {
    queue: MemoryQueue,
    payload: Vec<u8>,
    delivered: i64,
}

#[async_trait]
impl Delivery for MemoryDelivery {
    fn payload(&self) -> &[u8] {
        &self.payload
    }

    fn subject(&self) -> &str {
        "memory.init"
    }

    fn delivered(&self) -> i64 {
        self.delivered
    }

    async fn answer(&self, answer: Answer) -> Result<(), QueueError> {
        let job = serde_json::from_slice::<WorkMessage>(&self.payload)
            .map(|w| w.job_id)
            .unwrap_or_else(|_| "<malformed>".into());
        self.queue.record(Seen::Answered {
            job,
            delivered: self.delivered,
            answer,
        });
        if let Answer::Nak(delay) = answer {
            let (queue, payload, next) =
                (self.queue.clone(), self.payload.clone(), self.delivered + 1);
            tokio::spawn(async move {
                tokio::time::sleep(delay.unwrap_or_default()).await;
                queue.put(payload, next);
            });
        }
        Ok(())
    }
}

struct MemorySource(MemoryQueue);

#[async_trait]
impl WorkSource for MemorySource {
    async fn pull(
        &mut self,
        max: usize,
        deliver: &mut (dyn FnMut(Box<dyn Delivery>) + Send),
    ) -> Result<usize, QueueError> {
        {
            let mut state = self.0.state.lock().unwrap();
            if state.refuse_pulls > 0 {
                state.refuse_pulls -= 1;
                drop(state);
                self.0.changed.notify_waiters();
                return Err(QueueError::JetStream {
                    what: "pull request",
                    detail: "no server".into(),
                });
            }
        }
        self.0.record(Seen::Asked(max));
        // A long poll: wait for a message, briefly, as a server's pull request does.
        let _ = tokio::time::timeout(
            Duration::from_millis(100),
            when(&self.0.arrived, || {
                (!self.0.state.lock().unwrap().waiting.is_empty()).then_some(())
            }),
        )
        .await;
        let taken: Vec<_> = {
            let mut state = self.0.state.lock().unwrap();
            let n = max.min(state.waiting.len());
            state.waiting.drain(..n).collect()
        };
        let n = taken.len();
        for (payload, delivered) in taken {
            deliver(Box::new(MemoryDelivery {
                queue: self.0.clone(),
                payload,
                delivered,
            }));
        }
        Ok(n)
    }
}

#[async_trait]
impl Outbox for MemoryQueue {
    async fn publish_work(
        &self,
        msg: &WorkMessage,
        _route: Option<&str>,
    ) -> Result<(), QueueError> {
        self.record(Seen::Work(msg.clone()));
        Ok(())
    }

    async fn publish_result(&self, result: &JobResult) -> Result<(), QueueError> {
        self.record(Seen::Result {
            job: result.job_id.clone(),
            status: result.status,
        });
        Ok(())
    }

    async fn publish_dead(
        &self,
        msg: &WorkMessage,
        _attempts: i64,
        error: &str,
    ) -> Result<(), QueueError> {
        self.record(Seen::Dead {
            job: msg.job_id.clone(),
            error: error.to_string(),
        });
        Ok(())
    }

    async fn publish_wake(&self, _batch_id: &str) -> Result<(), QueueError> {
        Ok(())
    }
}

#[async_trait]
impl WorkQueue for MemoryQueue {
    async fn source(&self, _stage: Stage, _node: &str) -> Result<Box<dyn WorkSource>, QueueError> {
        Ok(Box::new(MemorySource(self.clone())))
    }

    async fn cancels(&self) -> Result<BoxStream<'static, String>, QueueError> {
        let rx = self.cancels.subscribe();
        Ok(futures::stream::unfold(rx, |mut rx| async move {
            loop {
                match rx.recv().await {
                    Ok(id) => return Some((id, rx)),
                    Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        })
        .boxed())
    }
}

/// A task kind whose INIT does what its spec's `init` says: `gate` waits until the test
/// lets it through, `forever` never ends, `flaky` fails transiently, `fail` fails.
struct GateKind {
    /// Closed at first: each permit the test adds lets one `gate` hook through.
    gate: Semaphore,
    running: AtomicUsize,
    peak: AtomicUsize,
    started: AtomicUsize,
    cleaned: AtomicUsize,
    /// Fires when a hook starts or ends.
    moved: Notify,
}

impl Default for GateKind {
    fn default() -> Self {
        Self {
            gate: Semaphore::new(0),
            running: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            started: AtomicUsize::new(0),
            cleaned: AtomicUsize::new(0),
            moved: Notify::new(),
        }
    }
}

/// Counts a running hook for as long as it lives (a dropped hook included).
struct Running<'a>(&'a GateKind);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::SeqCst);
        self.0.moved.notify_waiters();
    }
}

impl GateKind {
    async fn wait_started(&self, n: usize) {
        let started = || (self.started.load(Ordering::SeqCst) >= n).then_some(());
        tokio::time::timeout(PATIENCE, when(&self.moved, started))
            .await
            .unwrap_or_else(|_| panic!("{n} hooks never started"));
    }
}

#[async_trait]
impl TaskKind for GateKind {
    fn name(&self) -> &'static str {
        "gate"
    }

    fn validate(&self, _spec: &serde_json::Value) -> Result<(), SpecError> {
        Ok(())
    }

    async fn init(&self, ctx: &StageContext) -> Result<InitOutput, StageError> {
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
        self.started.fetch_add(1, Ordering::SeqCst);
        self.moved.notify_waiters();
        let _running = Running(self);
        match ctx.job.task["spec"]["init"].as_str() {
            Some("gate") => self.gate.acquire().await.expect("gate open").forget(),
            Some("forever") => std::future::pending::<()>().await,
            Some("flaky") => return Err(StageError::Transient("flaky backend".into())),
            Some("fail") => return Err(StageError::Failed("bad task".into())),
            _ => {}
        }
        Ok(InitOutput {
            output: serde_json::json!({"sandbox": "memory"}),
            route: Route::Any,
        })
    }

    async fn run(&self, _ctx: &StageContext) -> Result<serde_json::Value, StageError> {
        Ok(serde_json::json!({}))
    }

    async fn eval(&self, _ctx: &StageContext) -> Result<EvalOutput, StageError> {
        Ok(EvalOutput {
            reward: 1.0,
            details: serde_json::json!({}),
        })
    }

    async fn cleanup(&self, _job: &crate::domain::Job) {
        self.cleaned.fetch_add(1, Ordering::SeqCst);
    }
}

/// An INIT worker on a real SQLite store and a [`MemoryQueue`].
struct Harness {
    _dir: tempfile::TempDir,
    store: Arc<dyn Store>,
    queue: MemoryQueue,
    kind: Arc<GateKind>,
    shutdown: CancellationToken,
    worker: tokio::task::JoinHandle<Result<(), WorkerError>>,
}

impl Harness {
    async fn start(concurrency: usize, tune: impl FnOnce(&mut WorkerSettings)) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("worker.db").display());
        let store = crate::store::connect(&url, 4).await.unwrap();
        let queue = MemoryQueue::new();
        let kind = Arc::new(GateKind::default());
        let mut kinds = Registry::new();
        kinds.register(kind.clone());
        let mut settings = WorkerSettings {
            node: "memory-node".into(),
            stages: StagesSettings::default(),
            queue: QueueSettings {
                nak_delay_ms: 5,
                nak_delay_max_ms: 20,
                ..QueueSettings::default()
            },
            max_restarts: 2,
        };
        settings.stages.init.concurrency = concurrency;
        tune(&mut settings);
        let worker = Worker::new(
            Stage::Init,
            store.clone(),
            store.clone(),
            store.clone(),
            Arc::new(queue.clone()),
            kinds,
            settings,
        );
        let shutdown = CancellationToken::new();
        let worker = tokio::spawn(worker.run(shutdown.clone()));
        Self {
            _dir: dir,
            store,
            queue,
            kind,
            shutdown,
            worker,
        }
    }

    /// Submits `n` jobs whose INIT does `init`, and queues their INIT messages.
    async fn submit(&self, n: usize, init: &str) -> Vec<String> {
        let jobs: Vec<NewJob> = (0..n)
            .map(|i| NewJob {
                id: format!("job-{init}-{i}"),
                kind: "gate".into(),
                client_id: None,
                group_id: None,
                task: serde_json::json!({"kind": "gate", "spec": {"init": init}}),
            })
            .collect();
        let submitted = self
            .store
            .submit("memory", &jobs, EpochMs::now())
            .await
            .unwrap();
        for s in &submitted {
            self.queue.queue_work(&WorkMessage {
                job_id: s.id.clone(),
                stage: Stage::Init,
                epoch: s.epoch,
            });
        }
        submitted.into_iter().map(|s| s.id).collect()
    }

    async fn job(&self, id: &str) -> crate::domain::Job {
        self.store.job(id).await.unwrap().unwrap()
    }

    async fn stop(&mut self) {
        self.shutdown.cancel();
        let stopped = tokio::time::timeout(PATIENCE, &mut self.worker).await;
        stopped
            .expect("the worker stops")
            .expect("the worker task did not panic")
            .expect("the worker stopped cleanly");
    }
}

#[tokio::test]
async fn a_worker_never_holds_more_messages_than_free_slots() {
    let mut h = Harness::start(2, |_| {}).await;
    let ids = h.submit(5, "gate").await;
    h.kind.wait_started(2).await;
    // Both slots are taken: whatever it asks for next, it asks for nothing while both
    // hooks wait at the gate, and nothing else has been handed to it.
    let seen = h.queue.seen();
    assert!(
        seen.iter().all(|s| !matches!(s, Seen::Asked(n) if *n > 2)),
        "{seen:#?}"
    );
    assert_eq!(h.queue.state.lock().unwrap().waiting.len(), 3);
    assert_eq!(h.kind.started.load(Ordering::SeqCst), 2);

    h.kind.gate.add_permits(5);
    let seen = h
        .queue
        .wait_until("every job handed on to RUN", |s| {
            s.iter().filter(|s| matches!(s, Seen::Work(_))).count() == 5
        })
        .await;
    assert_eq!(
        h.kind.peak.load(Ordering::SeqCst),
        2,
        "never more hooks than slots"
    );
    for id in &ids {
        assert_eq!(
            final_answers(&seen, id),
            vec![Answer::Ack],
            "{id}: {seen:#?}"
        );
        let job = h.job(id).await;
        assert_eq!((job.stage, job.status), (Stage::Run, Status::Queued));
        // The hand-off was recorded before it was published, and published before the ack.
        let published = seen
            .iter()
            .position(|s| matches!(s, Seen::Work(w) if &w.job_id == id))
            .unwrap();
        let acked = seen
            .iter()
            .position(|s| matches!(s, Seen::Answered { job, answer: Answer::Ack, .. } if job == id))
            .unwrap();
        assert!(published < acked, "{seen:#?}");
    }
    h.stop().await;
}

#[tokio::test]
async fn a_running_stage_reports_progress_and_renews_its_lease() {
    let mut h = Harness::start(1, |s| s.queue.ack_wait_ms = 300).await;
    let ids = h.submit(1, "gate").await;
    h.kind.wait_started(1).await;
    let first_lease = h.job(&ids[0]).await.lease_until.unwrap();
    h.queue
        .wait_until("two in-progress answers", |s| {
            answers(s, &ids[0])
                .iter()
                .filter(|a| **a == Answer::Progress)
                .count()
                >= 2
        })
        .await;
    let renewed = h.job(&ids[0]).await;
    assert_eq!(renewed.status, Status::Running);
    assert!(
        renewed.lease_until.unwrap() > first_lease,
        "the lease moved on"
    );
    h.kind.gate.add_permits(1);
    h.queue
        .wait_until("the stage acked", |s| {
            final_answers(s, &ids[0]) == [Answer::Ack]
        })
        .await;
    h.stop().await;
}

#[tokio::test]
async fn a_cancel_broadcast_stops_the_hook_and_nothing_is_recorded_after_it() {
    let mut h = Harness::start(2, |_| {}).await;
    let ids = h.submit(1, "forever").await;
    h.kind.wait_started(1).await;
    let cancelled = h
        .store
        .finish(
            &FinishIf::Live,
            &ids[0],
            &Outcome::cancelled("cancelled by the test"),
            EpochMs::now(),
        )
        .await
        .unwrap();
    assert!(cancelled.is_some());
    h.queue.cancels.send(ids[0].clone()).unwrap();
    let seen = h
        .queue
        .wait_until("the cancelled stage acked", |s| {
            final_answers(s, &ids[0]) == [Answer::Ack]
        })
        .await;
    assert_eq!(
        h.kind.running.load(Ordering::SeqCst),
        0,
        "the hook was dropped"
    );
    assert_eq!(
        h.kind.cleaned.load(Ordering::SeqCst),
        1,
        "the kind cleaned up"
    );
    assert!(
        !seen
            .iter()
            .any(|s| matches!(s, Seen::Work(_) | Seen::Result { .. })),
        "nothing handed on or published for a cancelled job: {seen:#?}"
    );
    assert_eq!(h.job(&ids[0]).await.status, Status::Cancelled);
    h.stop().await;
}

#[tokio::test]
async fn shutdown_lets_stages_finish_within_the_grace_and_hands_back_the_rest() {
    let mut h = Harness::start(4, |s| s.stages.grace_ms = 0).await;
    let ids = h.submit(2, "forever").await;
    h.kind.wait_started(2).await;
    h.stop().await;
    let seen = h.queue.seen();
    for id in &ids {
        assert_eq!(
            final_answers(&seen, id),
            vec![Answer::Nak(None)],
            "{seen:#?}"
        );
        let job = h.job(id).await;
        assert_eq!((job.stage, job.status), (Stage::Init, Status::Queued));
        assert_eq!(
            job.stage_attempts, 0,
            "a hand-back does not count as a start"
        );
    }
}

#[tokio::test]
async fn a_transient_fault_is_retried_until_the_delivery_limit_then_dead_lettered() {
    let mut h = Harness::start(1, |s| s.queue.delivery_limit = 3).await;
    let ids = h.submit(1, "flaky").await;
    let seen = h
        .queue
        .wait_until("the last delivery acked", |s| {
            final_answers(s, &ids[0]).last() == Some(&Answer::Ack)
        })
        .await;
    let answers = final_answers(&seen, &ids[0]);
    assert_eq!(answers.len(), 3, "{seen:#?}");
    assert!(matches!(answers[0], Answer::Nak(Some(_))), "{answers:?}");
    assert!(matches!(answers[1], Answer::Nak(Some(_))), "{answers:?}");
    assert_eq!(answers[2], Answer::Ack);
    assert!(seen.iter().any(
        |s| matches!(s, Seen::Dead { job, error } if job == &ids[0] && error.contains("flaky backend"))
    ));
    assert!(seen.contains(&Seen::Result {
        job: ids[0].clone(),
        status: Status::Failed
    }));
    let job = h.job(&ids[0]).await;
    assert_eq!(job.status, Status::Failed);
    assert_eq!(job.stage_attempts, 3);
    h.stop().await;
}

#[tokio::test]
async fn a_failed_stage_ends_the_job_once_with_its_result() {
    let mut h = Harness::start(1, |_| {}).await;
    let ids = h.submit(1, "fail").await;
    let seen = h
        .queue
        .wait_until("the stage acked", |s| {
            final_answers(s, &ids[0]) == [Answer::Ack]
        })
        .await;
    assert_eq!(
        seen.iter()
            .filter(|s| matches!(s, Seen::Result { .. }))
            .count(),
        1
    );
    assert_eq!(h.job(&ids[0]).await.status, Status::Failed);
    h.stop().await;
}

#[tokio::test]
async fn a_second_delivery_of_a_held_stage_waits_for_the_lease() {
    let mut h = Harness::start(2, |_| {}).await;
    let ids = h.submit(1, "gate").await;
    h.kind.wait_started(1).await;
    // The queue hands the same message out again (its ack timer ran out).
    let msg = WorkMessage {
        job_id: ids[0].clone(),
        stage: Stage::Init,
        epoch: h.job(&ids[0]).await.epoch,
    };
    h.queue.put(serde_json::to_vec(&msg).unwrap(), 2);
    let seen = h
        .queue
        .wait_until("the copy nakked", |s| {
            s.iter().any(|s| {
                matches!(
                    s,
                    Seen::Answered {
                        delivered: 2,
                        answer: Answer::Nak(Some(_)),
                        ..
                    }
                )
            })
        })
        .await;
    assert_eq!(h.kind.started.load(Ordering::SeqCst), 1, "{seen:#?}");
    h.kind.gate.add_permits(1);
    let seen = h
        .queue
        .wait_until("the first delivery acked and RUN handed on once", |s| {
            s.iter().any(|s| matches!(s, Seen::Work(_)))
                && answers(s, &ids[0]).contains(&Answer::Ack)
        })
        .await;
    assert_eq!(
        seen.iter().filter(|s| matches!(s, Seen::Work(_))).count(),
        1,
        "{seen:#?}"
    );
    h.stop().await;
}

#[tokio::test]
async fn a_malformed_message_is_terminated_and_a_refused_pull_is_retried() {
    let mut h = Harness::start(1, |_| {}).await;
    h.queue.state.lock().unwrap().refuse_pulls = 2;
    h.queue.put(b"not json".to_vec(), 1);
    h.queue
        .wait_until("the malformed message terminated", |s| {
            s.contains(&Seen::Answered {
                job: "<malformed>".into(),
                delivered: 1,
                answer: Answer::Term,
            })
        })
        .await;
    let ids = h.submit(1, "ok").await;
    h.queue
        .wait_until("the good one handed on", |s| {
            final_answers(s, &ids[0]) == [Answer::Ack]
        })
        .await;
    assert_eq!(h.queue.state.lock().unwrap().refuse_pulls, 0);
    h.stop().await;
}
