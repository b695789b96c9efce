//! NATS clusters: a three-server JetStream cluster losing the server that leads the
//! work stream in the middle of a batch (with three copies of every stream, the batch
//! still ends with every job ended exactly once and nothing lost, the service's
//! connection moves to another server, and the killed server, started again, catches up
//! and rejoins); streams scaled to `nats.replicas`; and copies a single server cannot
//! keep refused with advice.

use std::collections::HashSet;
use std::time::Duration;

use async_nats::jetstream::stream::ClusterInfo;
use rollout::domain::{JobResult, Stage, Status, Task};
use rollout::queue::Queue;

use crate::eventually::{eventually, holds};
use crate::helpers::{TestEnv, count_status, synthetic};
use crate::nats_cluster::NatsCluster;

/// Jobs in the batch: enough that the kill lands with many in every stage.
const JOBS: usize = 150;

/// The stream suffixes the service creates.
const STREAMS: [&str; 4] = ["WORK", "RESULTS", "DEAD", "GROUPS"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_the_work_stream_leader_mid_batch_loses_no_job_and_the_server_rejoins() {
    let cluster_dir = tempfile::tempdir().expect("temp dir");
    let mut cluster = NatsCluster::start(cluster_dir.path(), 3).await;
    let env = TestEnv::start_on_nats(cluster.url(), |s| {
        s.nats.replicas = 3;
        // Few slots, so the batch is still under way when the server dies.
        s.stages.init.concurrency = 8;
        s.stages.run.concurrency = 4;
        s.stages.eval.concurrency = 8;
    })
    .await;
    let queue = &env.deps.queue;
    for suffix in STREAMS {
        let info = stream_cluster(queue, suffix).await.expect("stream info");
        assert_eq!(info.replicas.len(), 2, "{suffix} has 3 copies: {info:?}");
    }

    // Make the server the service is connected to the work stream's leader, so the kill
    // takes both away at once: the connection must move and the stream must fail over.
    let leader = lead_from_the_connected_server(queue).await;

    env.workers_in_process(1);
    let tasks: Vec<Task> = (0..JOBS)
        .map(|i| {
            let mut t = synthetic(serde_json::json!({
                "init_ms": 10, "run_ms": 120, "eval_ms": 10, "seed": i
            }));
            t.group_id = Some(format!("g{}", i / 10));
            t
        })
        .collect();
    let ids = env.submit(&tasks, "failover").await;
    assert_eq!(ids.len(), JOBS);
    let before = env
        .wait_results("failover", JOBS / 6, Duration::from_secs(120))
        .await;

    let killed = cluster.index_of(&leader);
    cluster.kill(killed);
    // The kill must land mid-batch, or it tests nothing.
    let at_kill = env.client.results(Some("failover"), 0, 0).await.unwrap();
    assert!(
        at_kill.results.len() < JOBS,
        "the batch ended before the server was killed ({} results when {} were awaited)",
        at_kill.results.len(),
        before.len()
    );

    let results = env
        .wait_results("failover", JOBS, Duration::from_secs(240))
        .await;

    assert_each_ended_once_and_done(&env, &ids, &results).await;
    // The surviving servers hold the whole queue: nothing left behind, and one result
    // message per job (a result whose publish failed in the failover is published by
    // the reconciler a little later; a second copy would be a duplicate).
    env.wait_work_drained().await;
    let jobs = u64::try_from(JOBS).unwrap();
    eventually(
        "every result is on the results stream",
        Duration::from_secs(60),
        || async {
            let n = env.stream_len("RESULTS").await;
            assert!(n <= jobs, "{n} result messages for {jobs} jobs");
            holds(n == jobs, format!("{n} result messages"))
        },
    )
    .await;
    let now_leader = stream_cluster(queue, "WORK").await.unwrap().leader;
    assert!(
        now_leader.is_some() && now_leader.as_deref() != Some(leader.as_str()),
        "work stream leader after the kill: {now_leader:?}"
    );
    let connected = queue.client().server_info().server_name;
    assert_ne!(
        connected, leader,
        "the service is still connected to the dead server"
    );

    // Started again, the killed server catches up.
    cluster.restart(killed);
    wait_rejoined(queue, &leader).await;
}

/// Whether `server` leads the group or is one of its current, online replicas.
fn has_current(c: &ClusterInfo, server: &str) -> bool {
    c.leader.as_deref() == Some(server)
        || c.replicas
            .iter()
            .any(|p| p.name == server && p.current && !p.offline)
}

/// The cluster part of a stream's info (`$JS.API.STREAM.INFO.<name>`): its leader and
/// replicas.
async fn stream_cluster(queue: &Queue, suffix: &str) -> Result<ClusterInfo, String> {
    let mut stream = queue
        .jetstream()
        .get_stream(queue.subjects().stream(suffix))
        .await
        .map_err(|e| e.to_string())?;
    let info = stream.info().await.map_err(|e| e.to_string())?;
    info.cluster.clone().ok_or_else(|| "no cluster info".into())
}

/// The cluster part of a work-stream consumer's info.
async fn consumer_cluster(queue: &Queue, name: &str) -> Result<ClusterInfo, String> {
    let stream = queue
        .jetstream()
        .get_stream(queue.subjects().stream("WORK"))
        .await
        .map_err(|e| e.to_string())?;
    let mut consumer: async_nats::jetstream::consumer::PullConsumer =
        stream.get_consumer(name).await.map_err(|e| e.to_string())?;
    let info = consumer.info().await.map_err(|e| e.to_string())?;
    info.cluster.clone().ok_or_else(|| "no cluster info".into())
}

/// Asks the leader of a stream to step down, so another replica is elected.
async fn step_down(queue: &Queue, suffix: &str) {
    let subject = format!(
        "$JS.API.STREAM.LEADER.STEPDOWN.{}",
        queue.subjects().stream(suffix)
    );
    // An error (no leader at the moment) just means the next round asks again.
    let _ = queue.client().request(subject, "".into()).await;
}

/// Steps the work stream's leader down until the server `queue` is connected to leads
/// it; returns that server's name.
async fn lead_from_the_connected_server(queue: &Queue) -> String {
    eventually(
        "the work stream is led by the server the service is connected to",
        Duration::from_secs(60),
        || async {
            let connected = queue.client().server_info().server_name;
            let leader = stream_cluster(queue, "WORK")
                .await
                .ok()
                .and_then(|c| c.leader);
            if leader.as_deref() == Some(connected.as_str()) {
                return Ok(connected);
            }
            if leader.is_some() {
                step_down(queue, "WORK").await;
            }
            Err(format!("connected to {connected}, leader {leader:?}"))
        },
    )
    .await
}

/// Every job of `ids` ended exactly once, done, with one result each, as the results,
/// the batch's counters and the jobs' stage timings say.
async fn assert_each_ended_once_and_done(env: &TestEnv, ids: &[String], results: &[JobResult]) {
    // Every job ended exactly once, done, with one result each.
    assert_eq!(results.len(), JOBS);
    let unique: HashSet<_> = results.iter().map(|r| r.job_id.clone()).collect();
    assert_eq!(unique.len(), JOBS, "a job has two results");
    assert_eq!(unique, ids.iter().cloned().collect::<HashSet<_>>());
    assert_eq!(count_status(results, Status::Done), JOBS);
    let jobs = i64::try_from(JOBS).unwrap();
    let status = env.client.status(Some("failover")).await.unwrap();
    let batch = status.batch.unwrap();
    assert_eq!(
        (batch.submitted, batch.finished, batch.done),
        (jobs, jobs, jobs)
    );
    for id in ids.iter().step_by(7) {
        let job = env.client.job(id).await.unwrap().job;
        for (stage, t) in [
            (Stage::Init, &job.timings.init),
            (Stage::Run, &job.timings.run),
            (Stage::Eval, &job.timings.eval),
        ] {
            assert!(t.finished_at.is_some(), "job {id}: {stage} never finished");
        }
    }
}

/// Waits until `server` is a current replica (or the leader) of every stream and of
/// every consumer the batch used.
async fn wait_rejoined(queue: &Queue, server: &str) {
    // Started again, the killed server catches up: every stream and every consumer the
    // batch used lists it as a current replica (or it leads). (`run-test-node` carried
    // nothing; nats-server 2.9 brings a follower of an idle consumer up to date only
    // with its next change, so it may stay a few entries behind, online, for good.)
    let consumers = ["init", "run-any", "eval"];
    eventually(
        &format!("{server} rejoined every stream and consumer"),
        Duration::from_secs(120),
        || async {
            let mut behind = Vec::new();
            for suffix in STREAMS {
                match stream_cluster(queue, suffix).await {
                    Ok(c) if has_current(&c, server) => {}
                    other => behind.push(format!("{suffix}: {other:?}")),
                }
            }
            for name in consumers {
                match consumer_cluster(queue, name).await {
                    Ok(c) if has_current(&c, server) => {}
                    other => behind.push(format!("consumer {name}: {other:?}")),
                }
            }
            holds(behind.is_empty(), behind)
        },
    )
    .await;
}

/// Streams made with one copy are scaled to `nats.replicas` when a process starts with
/// three, and so are the consumers on them; a process started later with one copy
/// leaves them at three.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn existing_streams_are_scaled_to_the_configured_replicas() {
    let cluster_dir = tempfile::tempdir().expect("temp dir");
    let cluster = NatsCluster::start(cluster_dir.path(), 3).await;
    let env = TestEnv::start_on_nats(cluster.url(), |s| s.nats.replicas = 1).await;
    let one = &env.deps.queue;
    one.consumers(Stage::Init, "test-node").await.unwrap();
    for suffix in STREAMS {
        let info = stream_cluster(one, suffix).await.unwrap();
        assert!(info.replicas.is_empty(), "{suffix}: {info:?}");
    }

    let mut settings = (*env.deps.settings).clone();
    settings.nats.replicas = 3;
    let three = Queue::connect(&settings, "scaled", true).await.unwrap();
    three.consumers(Stage::Init, "test-node").await.unwrap();
    eventually(
        "every stream and the consumer have three copies",
        Duration::from_secs(60),
        || async {
            let mut short = Vec::new();
            for suffix in STREAMS {
                match stream_cluster(&three, suffix).await {
                    Ok(c) if c.replicas.len() == 2 => {}
                    other => short.push(format!("{suffix}: {other:?}")),
                }
            }
            match consumer_cluster(&three, "init").await {
                Ok(c) if c.replicas.len() == 2 => {}
                other => short.push(format!("consumer init: {other:?}")),
            }
            holds(short.is_empty(), short)
        },
    )
    .await;

    // A process still configured for one copy does not take the copies away.
    Queue::connect(&env.deps.settings, "unscaled", false)
        .await
        .unwrap();
    for suffix in STREAMS {
        let info = stream_cluster(&three, suffix).await.unwrap();
        assert_eq!(info.replicas.len(), 2, "{suffix} lost copies: {info:?}");
    }
}

/// Three copies asked of a single nats-server (no cluster) stop the start with an error
/// that names `nats.replicas` and says what to do; one copy works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_a_single_server_cannot_keep_are_refused_with_advice() {
    let dir = tempfile::tempdir().unwrap();
    let server = rollout::natsd::NatsServer::start(dir.path(), "127.0.0.1:0".parse().unwrap())
        .expect("start nats-server (is it installed? see README)");
    let mut settings = rollout::config::Settings::default();
    settings.nats.url = server.url();
    settings.nats.prefix = format!("t{}", &uuid::Uuid::now_v7().simple().to_string()[20..]);
    settings.nats.replicas = 3;
    let e = Queue::connect(&settings, "test", false)
        .await
        .expect_err("three copies on one server")
        .to_string();
    assert!(e.contains("nats.replicas = 3"), "{e}");
    assert!(e.contains("not part of a JetStream cluster"), "{e}");
    settings.nats.replicas = 1;
    Queue::connect(&settings, "test", false).await.unwrap();
}
