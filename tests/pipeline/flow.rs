//! Jobs flowing through the whole pipeline.

use crate::eventually::{eventually, holds};
use std::collections::HashSet;
use std::time::Duration;

use rollout::domain::{Stage, Status, Task};

use crate::helpers::{TestEnv, count_status, synthetic, unpublished_synthetic};
use rollout::domain::EpochMs;

/// 500 synthetic jobs through 2 worker processes per stage: every one done exactly once —
/// in the jobs table, the results table and the results stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hundred_jobs_through_two_worker_processes_per_stage_end_exactly_once() {
    let mut env = TestEnv::start(|_| {}).await;
    for stage in Stage::ALL {
        env.spawn_worker_process(stage);
        env.spawn_worker_process(stage);
    }
    let tasks: Vec<Task> = (0..500)
        .map(|i| {
            let mut t = synthetic(serde_json::json!({
                "init_ms": i % 3, "run_ms": i % 5, "eval_ms": i % 2, "seed": i
            }));
            t.group_id = Some(format!("g{}", i / 10));
            t
        })
        .collect();
    let ids = env.submit(&tasks, "b500").await;
    assert_eq!(ids.len(), 500);
    let results = env
        .wait_results("b500", 500, Duration::from_secs(240))
        .await;

    // Results: 500, one per job, all done, rewards as seeded.
    assert_eq!(results.len(), 500);
    let unique: HashSet<_> = results.iter().map(|r| r.job_id.clone()).collect();
    assert_eq!(unique.len(), 500, "a job has two results");
    assert_eq!(unique, ids.iter().cloned().collect::<HashSet<_>>());
    assert_eq!(count_status(&results, Status::Done), 500);
    let seqs: Vec<i64> = results.iter().map(|r| r.seq).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "results out of order");

    // Jobs table: every job done, each stage started and finished.
    let status = env.client.status(Some("b500")).await.unwrap();
    let done: i64 = status
        .counts
        .iter()
        .filter(|c| c.status == Status::Done)
        .map(|c| c.count)
        .sum();
    let total: i64 = status.counts.iter().map(|c| c.count).sum();
    assert_eq!((done, total), (500, 500));
    let batch = status.batch.unwrap();
    assert_eq!(
        (batch.submitted, batch.finished, batch.done),
        (500, 500, 500)
    );
    let group = env.deps.store.group("b500", "g7").await.unwrap().unwrap();
    assert_eq!((group.submitted, group.finished), (10, 10));
    assert!(group.reward_min.is_some() && group.reward_max.is_some());

    // Results stream: exactly 500 messages, no duplicates.
    env.wait_work_drained().await;
    assert_eq!(env.stream_len("RESULTS").await, 500);
    let job = env.client.job(&ids[123]).await.unwrap();
    let t = &job.job.timings;
    for st in [&t.init, &t.run, &t.eval] {
        assert!(st.queued_at.is_some() && st.started_at.is_some() && st.finished_at.is_some());
    }
    assert!(job.events.len() >= 7, "events: {:?}", job.events);
}

/// A job whose RUN must stay on its node is routed to `run.<node>` and still completes;
/// stage outputs reach the result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_bound_jobs_run_on_their_node_and_outputs_reach_the_result() {
    let env = TestEnv::start(|_| {}).await;
    env.workers_in_process(1);
    let mut t = synthetic(serde_json::json!({"node_bound": true, "reward": 0.5}));
    t.metadata = serde_json::json!({"prompt": 3});
    let ids = env.submit(&[t], "bound").await;
    let results = env.wait_results("bound", 1, Duration::from_secs(30)).await;
    let r = &results[0];
    assert_eq!(r.status, Status::Done);
    assert_eq!(r.reward, Some(0.5));
    assert_eq!(r.output["init"]["node"], "test-node");
    assert_eq!(r.output["run"]["answer"], "synthetic");
    assert_eq!(r.output["metadata"]["prompt"], 3);
    let job = env.client.job(&ids[0]).await.unwrap().job;
    assert_eq!(job.route.as_deref(), Some("test-node"));
}

/// A hand-off lost by a gateway that died between its commit and its publish is
/// repaired within seconds (`reconciler.republish_after_ms`), not after the stale
/// threshold of minutes; a hand-off that was not lost is not run twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_hand_off_is_repaired_within_seconds() {
    let env = TestEnv::start(|s| {
        s.reconciler.stale_after_ms = 600_000;
        s.reconciler.republish_after_ms = 1_000;
    })
    .await;
    env.workers_in_process(1);
    let lost = unpublished_synthetic(None);
    env.deps
        .store
        .submit("lost", std::slice::from_ref(&lost), EpochMs::now())
        .await
        .unwrap();
    // And jobs submitted normally, some still queued when their check comes.
    let tasks: Vec<_> = (0..20)
        .map(|_| synthetic(serde_json::json!({"run_ms": 300})))
        .collect();
    env.submit(&tasks, "kept").await;
    let results = env.wait_results("lost", 1, Duration::from_secs(60)).await;
    assert_eq!(results[0].status, Status::Done);
    let kept = env.wait_results("kept", 20, Duration::from_secs(60)).await;
    for r in &kept {
        let job = env.client.job(&r.job_id).await.unwrap().job;
        assert_eq!(job.attempts, 3, "each stage claimed once: {job:?}");
    }
}

/// Twenty thousand hand-offs orphaned at once (two 10,000-task submits whose gateway
/// died between commit and publish), all overdue, are published again by one sweep of
/// the reconciler: the repair is sized to the backlog, not to `batch_limit` per sweep,
/// so none of them ages out of the re-publish window into the stale wait. Sweeps are
/// counted, not timed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_thousand_orphaned_hand_offs_are_republished_in_one_sweep() {
    const ORPHANS: u64 = 20_000;
    let env = TestEnv::start(|s| {
        // Sweeps are run by the test, one at a time; the defaults otherwise.
        s.reconciler.enabled = false;
        s.reconciler.stale_after_ms = 300_000;
        s.reconciler.republish_after_ms = 10_000;
        s.reconciler.batch_limit = 1_000;
    })
    .await;
    // Committed 15 s ago, never published.
    let then = EpochMs::now().before(Duration::from_secs(15));
    for batch in ["crash-1", "crash-2"] {
        let jobs: Vec<_> = (0..ORPHANS / 2)
            .map(|_| unpublished_synthetic(None))
            .collect();
        env.deps.store.submit(batch, &jobs, then).await.unwrap();
    }
    assert_eq!(env.stream_len("WORK").await, 0);
    let settings = rollout::reconciler::SweepSettings::from_settings(&env.deps.settings);
    let mut sweeps = 0;
    while env.stream_len("WORK").await < ORPHANS && sweeps < 30 {
        rollout::reconciler::sweep(env.deps.store.as_ref(), &env.deps.queue, &settings)
            .await
            .unwrap();
        sweeps += 1;
    }
    assert_eq!(env.stream_len("WORK").await, ORPHANS);
    assert_eq!(sweeps, 1, "the backlog took {sweeps} sweeps");
}

/// A hand-off lost between the database and NATS (a gateway that died after writing the
/// job but before publishing it) is repaired by the reconciler, and every result ends up
/// marked published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reconciler_repairs_a_lost_hand_off() {
    let env = TestEnv::start(|s| s.reconciler.stale_after_ms = 1_000).await;
    env.workers_in_process(1);
    // Written, never published.
    let job = unpublished_synthetic(None);
    env.deps
        .store
        .submit("lost", std::slice::from_ref(&job), EpochMs::now())
        .await
        .unwrap();
    let results = env.wait_results("lost", 1, Duration::from_secs(30)).await;
    assert_eq!(results[0].status, Status::Done);
    let view = env.client.job(&job.id).await.unwrap();
    assert!(
        view.events.iter().any(|e| e.event == "republished"),
        "{:?}",
        view.events
    );
    eventually(
        "the published result was marked published",
        Duration::from_secs(10),
        || async {
            let pending = env
                .deps
                .store
                .unpublished_results(EpochMs::MAX, 10)
                .await
                .unwrap();
            holds(pending.is_empty(), pending.len())
        },
    )
    .await;
}
