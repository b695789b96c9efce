//! Crashes, signals, cancels, timeouts, failures and the delivery limit.

use std::time::Duration;

use nix::sys::signal::Signal;
use rollout::domain::{Stage, Status};

use crate::helpers::{TestEnv, synthetic};
use rollout::domain::EpochMs;

fn running_in(stage: Stage) -> impl Fn(&rollout::domain::Job) -> bool {
    move |j| j.status == Status::Running && j.stage == stage
}

/// SIGKILL of the RUN worker mid-stage: the message is redelivered to another worker
/// after the ack wait, and the job still ends exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_stage_has_its_job_redelivered_and_finished_once() {
    let mut env = TestEnv::start(|s| s.queue.ack_wait_ms = 1_500).await;
    env.stage_workers_in_process(Stage::Init, 1);
    env.stage_workers_in_process(Stage::Eval, 1);
    let victim = env.spawn_worker_process(Stage::Run);
    let ids = env
        .submit(&[synthetic(serde_json::json!({"run_ms": 2500}))], "kill")
        .await;
    env.wait_job(&ids[0], "running in RUN", running_in(Stage::Run))
        .await;
    env.signal_worker(victim, Signal::SIGKILL);
    env.wait_worker(victim).await;
    env.spawn_worker_process(Stage::Run);

    let results = env.wait_results("kill", 1, Duration::from_secs(60)).await;
    assert_eq!(results[0].status, Status::Done);
    let view = env.client.job(&ids[0]).await.unwrap();
    // INIT once, RUN twice (killed, then redelivered), EVAL once.
    assert_eq!(view.job.attempts, 4, "events: {:?}", view.events);
    env.wait_work_drained().await;
    assert_eq!(env.stream_len("RESULTS").await, 1);
    let again = env.client.results(Some("kill"), 0, 0).await.unwrap();
    assert_eq!(again.results.len(), 1);
}

/// SIGTERM mid-stage: a stage that ends within the grace period finishes; one that does
/// not is handed back and finished by another worker. No job is lost; the worker exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_short_stages_and_hands_long_ones_back() {
    let mut env = TestEnv::start(|s| s.stages.grace_ms = 1_500).await;
    env.stage_workers_in_process(Stage::Init, 1);
    env.stage_workers_in_process(Stage::Eval, 1);
    let w = env.spawn_worker_process(Stage::Run);
    let ids = env
        .submit(
            &[
                synthetic(serde_json::json!({"run_ms": 800})),
                synthetic(serde_json::json!({"run_ms": 4000})),
            ],
            "term",
        )
        .await;
    for id in &ids {
        env.wait_job(id, "running in RUN", running_in(Stage::Run))
            .await;
    }
    env.signal_worker(w, Signal::SIGTERM);
    assert_eq!(
        env.wait_worker(w).await,
        Some(0),
        "{}",
        env.worker_log(Stage::Run, w)
    );
    let log = env.worker_log(Stage::Run, w);
    assert!(log.contains("handed back"), "{log}");
    // The short job finished on the first worker; the long one waits for another.
    let short = env.client.job(&ids[0]).await.unwrap().job;
    assert_eq!(short.stage, Stage::Eval, "short job: {short:?}");
    let long = env.client.job(&ids[1]).await.unwrap().job;
    assert_eq!((long.stage, long.status), (Stage::Run, Status::Queued));

    env.spawn_worker_process(Stage::Run);
    let results = env.wait_results("term", 2, Duration::from_secs(60)).await;
    assert!(results.iter().all(|r| r.status == Status::Done));
    env.wait_work_drained().await;
    assert_eq!(env.stream_len("RESULTS").await, 2);
}

/// Cancel of a queued job: it never runs, and its message is dropped on pickup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_queued_job_stops_it_before_it_runs() {
    let env = TestEnv::start(|_| {}).await;
    let ids = env.submit(&[synthetic(serde_json::json!({}))], "cq").await;
    let resp = env.client.cancel(&ids[0]).await.unwrap();
    assert_eq!(resp.status, Status::Cancelled);
    env.workers_in_process(1);
    env.wait_work_drained().await;
    let view = env.client.job(&ids[0]).await.unwrap();
    assert_eq!(view.job.status, Status::Cancelled);
    assert_eq!(
        view.job.attempts, 0,
        "a cancelled queued job must never start"
    );
    assert!(view.job.timings.init.started_at.is_none());
    let results = env.wait_results("cq", 1, Duration::from_secs(10)).await;
    assert_eq!(results[0].status, Status::Cancelled);
    assert_eq!(results[0].error.as_deref(), Some("cancelled by request"));
    // A second cancel is a conflict, not a second result.
    let again = env.client.cancel(&ids[0]).await.unwrap_err().to_string();
    assert!(again.contains("409"), "{again}");
    assert_eq!(env.stream_len("RESULTS").await, 1);
}

/// Cancel of a running job: the worker is told and stops the stage (the stage would
/// otherwise hang for its whole 60 s timeout); the job ends cancelled with its partial
/// output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_running_job_stops_its_stage() {
    let env = TestEnv::start(|_| {}).await;
    env.workers_in_process(1);
    let ids = env
        .submit(&[synthetic(serde_json::json!({"hang_in": "run"}))], "cr")
        .await;
    env.wait_job(&ids[0], "running in RUN", running_in(Stage::Run))
        .await;
    env.client.cancel(&ids[0]).await.unwrap();
    // The worker acks the RUN message once it has stopped the stage.
    env.wait_work_drained().await;
    let results = env.wait_results("cr", 1, Duration::from_secs(10)).await;
    assert_eq!(results[0].status, Status::Cancelled);
    assert_eq!(
        results[0].output["init"]["node"], "test-node",
        "partial output kept"
    );
    let view = env.client.job(&ids[0]).await.unwrap();
    assert_eq!(view.job.status, Status::Cancelled);
    assert!(view.events.iter().any(|e| e.event == "cancelled"));
}

/// A worker that missed the cancel broadcast still stops at its next lease renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missed_cancel_broadcast_is_caught_at_lease_renewal() {
    let env = TestEnv::start(|s| s.queue.ack_wait_ms = 900).await;
    env.workers_in_process(1);
    let ids = env
        .submit(&[synthetic(serde_json::json!({"hang_in": "init"}))], "cm")
        .await;
    env.wait_job(&ids[0], "running in INIT", running_in(Stage::Init))
        .await;
    // Cancel in the database only, as if the broadcast had been lost.
    let outcome = rollout::domain::Outcome::cancelled("cancelled by request");
    env.deps
        .store
        .finish(
            &rollout::store::FinishIf::Live,
            &ids[0],
            &outcome,
            EpochMs::now(),
        )
        .await
        .unwrap()
        .unwrap();
    env.wait_work_drained().await;
}

/// A stage that hangs ends `timed_out` after its stage timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_stage_times_out() {
    let env = TestEnv::start(|s| s.stages.eval.timeout_ms = 800).await;
    env.workers_in_process(1);
    env.submit(&[synthetic(serde_json::json!({"hang_in": "eval"}))], "hang")
        .await;
    let r = &env.wait_results("hang", 1, Duration::from_secs(30)).await[0];
    assert_eq!(r.status, Status::TimedOut);
    assert_eq!(r.reward, None);
    assert!(
        r.error
            .as_deref()
            .unwrap()
            .contains("eval stage exceeded its timeout of 800 ms")
    );
    assert_eq!(r.output["run"]["answer"], "synthetic", "RUN output kept");
}

/// Queue wait does not count against a stage's timeout: a job that waits behind another
/// for longer than the timeout still runs its own short stage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_wait_does_not_count_against_the_stage_timeout() {
    let env = TestEnv::start(|s| {
        s.stages.run.timeout_ms = 1_500;
        s.stages.run.concurrency = 1;
    })
    .await;
    env.workers_in_process(1);
    let tasks: Vec<_> = (0..3)
        .map(|_| synthetic(serde_json::json!({"run_ms": 1000})))
        .collect();
    env.submit(&tasks, "qwait").await;
    let results = env.wait_results("qwait", 3, Duration::from_secs(60)).await;
    assert!(
        results.iter().all(|r| r.status == Status::Done),
        "{results:?}"
    );
}

/// A stage that fails ends the job `failed` with the stage's error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_stage_fails_the_job_with_its_error() {
    let env = TestEnv::start(|_| {}).await;
    env.workers_in_process(1);
    env.submit(
        &[synthetic(
            serde_json::json!({"fail_in": "init", "message": "disk full"}),
        )],
        "fail",
    )
    .await;
    let r = &env.wait_results("fail", 1, Duration::from_secs(30)).await[0];
    assert_eq!(r.status, Status::Failed);
    assert_eq!(r.error.as_deref(), Some("disk full"));
    assert_eq!(
        env.stream_len("DEAD").await,
        0,
        "a permanent failure is not dead-lettered"
    );
}

/// A job whose stage keeps failing transiently is retried up to the delivery limit, then
/// failed, with its message kept on the dead-letter subject.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exhausting_the_delivery_limit_fails_the_job_and_dead_letters_it() {
    let env = TestEnv::start(|s| s.queue.delivery_limit = 3).await;
    env.workers_in_process(1);
    let ids = env
        .submit(
            &[synthetic(
                serde_json::json!({"flaky_in": "run", "message": "backend down"}),
            )],
            "dead",
        )
        .await;
    let r = &env.wait_results("dead", 1, Duration::from_secs(30)).await[0];
    assert_eq!(r.status, Status::Failed);
    let err = r.error.as_deref().unwrap();
    assert!(
        err.contains("gave up after 3 attempts: backend down"),
        "{err}"
    );
    env.wait_work_drained().await;
    assert_eq!(env.stream_len("DEAD").await, 1);
    let view = env.client.job(&ids[0]).await.unwrap();
    assert!(view.events.iter().any(|e| e.event == "dead_lettered"));
    let dead = env
        .deps
        .queue
        .jetstream()
        .get_stream(env.deps.queue.subjects().stream("DEAD"))
        .await
        .unwrap()
        .get_raw_message(1)
        .await
        .unwrap();
    let body: serde_json::Value = serde_json::from_slice(&dead.payload).unwrap();
    assert_eq!(body["message"]["job_id"], ids[0]);
    assert_eq!(body["attempts"], 3);
}

/// A stage whose workers die on every delivery is not retried for ever: once the
/// deliveries are used up (by a worker that finds itself past the limit, or by the
/// reconciler acting on the server's max-deliveries advisory when the last deliveries
/// went to dead workers) the job fails and its message is dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stage_that_crashed_on_every_delivery_is_dead_lettered() {
    let mut env = TestEnv::start(|s| {
        s.queue.delivery_limit = 2;
        s.queue.ack_wait_ms = 1_000;
        s.reconciler.stale_after_ms = 600_000;
    })
    .await;
    env.stage_workers_in_process(Stage::Init, 1);
    let ids = env
        .submit(
            &[synthetic(serde_json::json!({"run_ms": 600000}))],
            "crashy",
        )
        .await;
    let mut seen_attempts = 1; // INIT
    let mut kills = 0;
    loop {
        let w = env.spawn_worker_process(Stage::Run);
        let job = env
            .wait_job(&ids[0], "claimed again or ended", |j| {
                j.status.is_terminal() || (j.stage == Stage::Run && j.attempts > seen_attempts)
            })
            .await;
        if job.status.is_terminal() || job.stage_attempts > 2 {
            // Past the limit: this worker gives up on the job; let it ack the message.
            break;
        }
        env.signal_worker(w, Signal::SIGKILL);
        env.wait_worker(w).await;
        seen_attempts = job.attempts;
        kills += 1;
        assert!(kills <= 2, "more claims than the delivery limit allows");
    }
    let r = &env.wait_results("crashy", 1, Duration::from_secs(30)).await[0];
    assert_eq!(r.status, Status::Failed);
    let err = r.error.as_deref().unwrap();
    assert!(err.contains("times without finishing"), "{err}");
    env.wait_work_drained().await;
    assert_eq!(env.stream_len("DEAD").await, 1);
}

/// When every delivery of a message went to workers that died before even claiming it
/// (here the test plays such workers; the server allows `4 × limit + 10` deliveries),
/// the server's max-deliveries advisory lets the reconciler fail the job and keep the
/// message on the dead-letter subject, instead of leaving the job stuck.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_out_of_deliveries_are_dead_lettered_from_the_advisory() {
    let env = TestEnv::start(|s| {
        s.queue.delivery_limit = 2;
        s.queue.ack_wait_ms = 500;
        s.reconciler.stale_after_ms = 600_000;
    })
    .await;
    env.stage_workers_in_process(Stage::Init, 1);
    let ids = env
        .submit(&[synthetic(serde_json::json!({}))], "advisory")
        .await;
    env.wait_job(&ids[0], "queued for RUN", |j| j.stage == Stage::Run)
        .await;
    // Play a worker that dies on receipt: take every delivery and never answer.
    let consumers = env
        .deps
        .queue
        .consumers(Stage::Run, "test-node")
        .await
        .unwrap();
    let any = &consumers[1];
    let mut deliveries = 0;
    while deliveries < env.deps.queue.max_deliver() {
        let mut batch = any
            .fetch()
            .max_messages(1)
            .expires(Duration::from_secs(2))
            .messages()
            .await
            .unwrap();
        if let Some(Ok(m)) = futures::StreamExt::next(&mut batch).await {
            deliveries = m.info().unwrap().delivered;
        } else {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    // The server notices the exhausted message (and advises) when a worker next pulls.
    env.stage_workers_in_process(Stage::Run, 1);
    let r = &env
        .wait_results("advisory", 1, Duration::from_secs(30))
        .await[0];
    assert_eq!(r.status, Status::Failed);
    let err = r.error.as_deref().unwrap();
    let want = format!(
        "delivered {} times without finishing",
        env.deps.queue.max_deliver()
    );
    assert!(err.contains(&want), "{err}");
    env.wait_work_drained().await;
    assert_eq!(env.stream_len("DEAD").await, 1);
}

/// A duplicate copy of a running stage's message (a re-publish after the server's
/// duplicate window) neither runs the stage twice nor fails the job: it waits while the
/// stage is held, then finds the job moved on and is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_copy_of_a_running_stage_does_not_fail_the_job() {
    let env = TestEnv::start(|s| {
        s.queue.delivery_limit = 1;
        s.queue.ack_wait_ms = 600;
    })
    .await;
    env.workers_in_process(1);
    let ids = env
        .submit(&[synthetic(serde_json::json!({"run_ms": 2500}))], "dup")
        .await;
    let job = env
        .wait_job(&ids[0], "running in RUN", running_in(Stage::Run))
        .await;
    let copy = rollout::domain::WorkMessage {
        job_id: ids[0].clone(),
        stage: Stage::Run,
        epoch: job.epoch,
    };
    let js = env.deps.queue.jetstream();
    js.send_publish(
        env.deps.queue.subjects().run("any"),
        async_nats::jetstream::message::PublishMessage::build()
            .payload(serde_json::to_vec(&copy).unwrap().into())
            .message_id("a-later-copy"),
    )
    .await
    .unwrap()
    .await
    .unwrap();
    let r = &env.wait_results("dup", 1, Duration::from_secs(30)).await[0];
    assert_eq!(r.status, Status::Done, "{:?}", r.error);
    env.wait_work_drained().await;
    assert_eq!(env.stream_len("DEAD").await, 0);
    let view = env.client.job(&ids[0]).await.unwrap();
    assert_eq!(
        view.job.attempts, 3,
        "the copy must not start the stage again"
    );
}

/// A kind whose RUN finishes its episode and then loses its sandbox at the export, every
/// time (what a node's sandboxes being killed between the episode and its export looks
/// like to the worker): `StageError::RestartWith` with the episode.
struct EpisodeThenLostSandbox;

#[async_trait::async_trait]
impl rollout::stage::TaskKind for EpisodeThenLostSandbox {
    fn name(&self) -> &'static str {
        "episode_then_lost_sandbox"
    }

    fn validate(&self, _spec: &serde_json::Value) -> Result<(), rollout::stage::SpecError> {
        Ok(())
    }

    async fn init(
        &self,
        _ctx: &rollout::stage::StageContext,
    ) -> Result<rollout::stage::InitOutput, rollout::stage::StageError> {
        Ok(rollout::stage::InitOutput {
            output: serde_json::json!({}),
            route: rollout::stage::Route::ThisNode,
        })
    }

    async fn run(
        &self,
        ctx: &rollout::stage::StageContext,
    ) -> Result<serde_json::Value, rollout::stage::StageError> {
        Err(rollout::stage::StageError::RestartWith {
            message: "the sandbox is gone at the export".into(),
            output: serde_json::json!({"episode": ctx.job.id, "restarts": ctx.job.restarts}),
        })
    }

    async fn eval(
        &self,
        _ctx: &rollout::stage::StageContext,
    ) -> Result<rollout::stage::EvalOutput, rollout::stage::StageError> {
        Err(rollout::stage::StageError::Failed(
            "EVAL must not run without RUN's export".into(),
        ))
    }
}

/// A finished episode whose sandbox keeps dying at the export goes back to INIT until
/// the restarts are used up, and then the job fails with the last episode kept as the
/// result's RUN output: never a job that ran and recorded nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_episode_whose_sandbox_dies_at_export_once_restarts_are_used_up_fails_with_the_episode_kept()
 {
    let env = TestEnv::start(|s| s.sandbox.max_restarts = 1).await;
    let mut deps = env.deps.clone();
    deps.kinds
        .register(std::sync::Arc::new(EpisodeThenLostSandbox));
    for stage in Stage::ALL {
        tokio::spawn(rollout::wiring::run_workers(
            deps.clone(),
            stage,
            1,
            env.shutdown.clone(),
        ));
    }
    // The gateway does not know the test's kind: write the job and publish its INIT as
    // the gateway would.
    let job = rollout::store::NewJob {
        id: uuid::Uuid::now_v7().to_string(),
        kind: "episode_then_lost_sandbox".into(),
        client_id: None,
        group_id: None,
        task: serde_json::json!({"kind": "episode_then_lost_sandbox", "spec": {}}),
    };
    deps.store
        .submit("export", std::slice::from_ref(&job), EpochMs::now())
        .await
        .unwrap();
    let init = rollout::domain::WorkMessage {
        job_id: job.id.clone(),
        stage: Stage::Init,
        epoch: 0,
    };
    deps.queue.publish_work(&init, None).await.unwrap();

    let results = env.wait_results("export", 1, Duration::from_secs(60)).await;
    let r = &results[0];
    assert_eq!(r.status, Status::Failed, "{r:?}");
    let e = r.error.as_deref().unwrap_or_default();
    assert!(
        e.contains("the sandbox is gone at the export") && e.contains("giving up"),
        "{e}"
    );
    assert_eq!(
        r.output["run"],
        serde_json::json!({"episode": job.id, "restarts": 1}),
        "the last episode is the result's RUN output: {r:?}"
    );
    let stored = env.client.job(&job.id).await.unwrap().job;
    assert_eq!((stored.restarts, stored.status), (1, Status::Failed));
}

/// A queued job whose message is gone while the server still remembers its id (it was
/// delivered, and acknowledged by a worker whose claim had been superseded, after another
/// claim handed the job back to its queue) runs once the reconciler finds it stale: the
/// copy it publishes has a message id of its own, which the server does not drop as a
/// duplicate of the first for the duplicate window's two minutes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_job_whose_message_was_acknowledged_elsewhere_runs_after_a_republish() {
    use futures::StreamExt;
    let env = TestEnv::start(|_| {}).await;
    assert!(
        env.deps.settings.queue.duplicate_window_ms >= 60_000,
        "the check needs a window longer than its wait"
    );
    let ids = env
        .submit(&[synthetic(serde_json::json!({}))], "acked")
        .await;
    // The INIT message taken and acknowledged the way the superseded worker did, with
    // the job left queued for INIT.
    let consumers = env
        .deps
        .queue
        .consumers(Stage::Init, &env.deps.settings.node.name)
        .await
        .unwrap();
    let mut taken = consumers[0]
        .fetch()
        .max_messages(1)
        .messages()
        .await
        .unwrap();
    let message = taken.next().await.expect("the INIT message").unwrap();
    message.ack().await.unwrap();
    let job = env.client.job(&ids[0]).await.unwrap().job;
    assert_eq!((job.status, job.stage), (Status::Queued, Stage::Init));
    env.workers_in_process(1);
    // Well inside the duplicate window: a copy under the first id would be dropped.
    let results = env.wait_results("acked", 1, Duration::from_secs(45)).await;
    assert_eq!(results[0].status, Status::Done, "{:?}", results[0]);
    let events = env.client.job(&ids[0]).await.unwrap().events;
    assert!(
        events.iter().any(|e| e.event == "republished"),
        "{events:?}"
    );
}
