//! Many nodes on one machine: three `rollout node` processes, each in a network namespace
//! of its own (its own INIT, RUN and EVAL workers and sandboxes), reaching NATS and the
//! database over a bridge, as three hosts on a rack switch would. RUN happens on the node
//! whose INIT made the sandbox; a node killed mid-batch (its processes, then its
//! namespace) loses nothing: what it held starts again from INIT on the others.
//!
//! The node killed is the first one seen holding a job in RUN (not a fixed one): which
//! node gets which job is the queue's business, and a fixed victim whose share of the
//! work ran between two looks would leave nothing to kill.

use std::net::SocketAddr;
use std::time::Duration;

use rollout::domain::{Stage, Status, Task};

use crate::eventually::eventually;
use crate::helpers::{TestEnv, slow_shell_job};
use crate::rack::{NodeProc, Rack, database_for_nodes};

/// A shell job whose RUN takes several seconds in its sandbox (two steps of three).
fn job(i: usize) -> Task {
    slow_shell_job(format!("n-{i}"), 3)
}

/// The node of the last `running` event of `stage` in a job's event log.
fn ran_on(view: &rollout::api::jobs::JobView, stage: Stage) -> Option<String> {
    view.events
        .iter()
        .rev()
        .find(|e| e.event == "running" && e.stage.as_deref() == Some(stage.as_str()))
        .and_then(|e| e.node.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_namespaced_nodes_keep_run_on_its_node_and_survive_losing_one() {
    let mut rack = Rack::new(3);
    let env = TestEnv::start_with_nats(Some(SocketAddr::from((rack.host_ip, 0))), |s| {
        // Nodes renew their sandboxes' leases often; a dead node's lapse soon.
        s.sandbox.lease_ms = 3_000;
        s.sandbox.reaper_interval_ms = 500;
        s.stages.init.concurrency = 3;
    })
    .await;
    let mut settings = (*env.deps.settings).clone();
    settings.database.url = database_for_nodes(&settings.database.url, rack.host_ip).await;
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_rollout"));
    let mut nodes: Vec<NodeProc> = (0..3)
        .map(|i| {
            let name = format!("ns-node-{i}");
            NodeProc::start(bin, &settings, env.dir.path(), &rack.namespaces[i], &name)
        })
        .collect();
    for n in &nodes {
        n.started().await;
    }
    let tasks: Vec<Task> = (0..24).map(job).collect();
    let ids = env.submit(&tasks, "nodes").await;

    // Kill the first node seen holding a RUN.
    let names: Vec<String> = nodes.iter().map(|n| n.name.clone()).collect();
    let (victim_at, held): (usize, Vec<String>) = eventually(
        "a node holds a job in RUN",
        Duration::from_secs(120),
        || async {
            let jobs = env
                .client
                .batch_jobs("nodes")
                .await
                .map_err(|e| e.to_string())?;
            let in_run = |node: &str| -> Vec<String> {
                jobs.iter()
                    .filter(|j| {
                        j.status == Status::Running
                            && j.stage == Stage::Run
                            && j.node.as_deref() == Some(node)
                    })
                    .map(|j| j.id.clone())
                    .collect()
            };
            names
                .iter()
                .enumerate()
                .map(|(i, name)| (i, in_run(name)))
                .find(|(_, held)| !held.is_empty())
                .ok_or_else(|| {
                    format!(
                        "{:?}",
                        jobs.iter()
                            .map(|j| (&j.node, j.stage, j.status))
                            .collect::<Vec<_>>()
                    )
                })
        },
    )
    .await;
    let victim = names[victim_at].clone();
    nodes[victim_at].kill();
    rack.unplug(victim_at);

    let results = env
        .wait_results("nodes", tasks.len(), Duration::from_secs(300))
        .await;
    assert_eq!(results.len(), ids.len());
    for r in &results {
        assert_eq!(r.status, Status::Done, "{r:?}");
        assert_eq!(r.reward, Some(1.0), "{r:?}");
    }
    let mut ran_on_nodes = std::collections::BTreeSet::new();
    for id in &ids {
        let view = env.client.job(id).await.unwrap();
        let (init, run) = (ran_on(&view, Stage::Init), ran_on(&view, Stage::Run));
        assert!(init.is_some(), "{:?}", view.events);
        assert_eq!(
            init, run,
            "RUN left the node whose INIT made the sandbox: {:?}",
            view.events
        );
        ran_on_nodes.insert(run.unwrap());
        if held.contains(id) {
            // Started again from INIT on a node that is still there.
            assert!(view.job.restarts >= 1, "{:?}", view.events);
            assert_ne!(ran_on(&view, Stage::Run).as_deref(), Some(victim.as_str()));
        }
    }
    assert!(ran_on_nodes.len() >= 2, "the jobs ran on {ran_on_nodes:?}");
    for n in nodes.iter().filter(|n| n.name != victim) {
        let log = std::fs::read_to_string(&n.log).unwrap_or_default();
        assert!(log.contains("worker started"), "{}: {log}", n.name);
    }
    // Stopped with SIGTERM, the nodes leave nothing of theirs behind; nor does the one
    // that lost its power, whose processes, mount namespace and with it its workspaces'
    // mounts all went at once.
    drop(nodes);
    for name in names {
        let state = env.dir.path().join(format!("node-{name}"));
        crate::leftovers::assert_nothing_left(&state, &format!("node {name}")).await;
    }
}
