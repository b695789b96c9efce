//! Weight updates without draining, end to end over both wire formats: the trainer stops
//! generation (`POST /v1/policy` with a mode), the service holds new turns and stops
//! every backend in its own words, the trainer resumes (`POST /v1/policy/{N}/resume`),
//! and every model token of the episodes caught in the middle carries the version that
//! produced it; a pause whose trainer never resumes ends with its lease.

use std::time::Duration;

use rollout::api::policy::UpdateMode;
use rollout::domain::Status;
use rollout::domain::backend::WireKind;
use rollout::domain::policy::VersionSpan;
use rollout::scripted::ScriptedServer;
use serde_json::{Value, json};

use crate::agent::{Stand, assert_token_exact, run_output, task, wait_stats};
use crate::eventually::eventually;

/// Whether the stand-in says it is paused.
async fn is_paused(server: &ScriptedServer) -> bool {
    let v: Value = reqwest::get(format!("{}/is_paused", server.url()))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["is_paused"].as_bool().unwrap()
}

fn spans(run: &Value) -> Vec<VersionSpan> {
    serde_json::from_value(run["policy_versions"].clone()).unwrap_or_else(|e| panic!("{e}: {run}"))
}

/// For each mode, on each wire: an episode mid-turn when the update starts. `abort`
/// cuts the turn, which goes on after the resume from its tokens under the new version
/// (its tokens carry both versions, exactly where the cut was); `pause` freezes it
/// (its tokens keep the older version, and the turn says a newer one came); `wait`
/// answers once it has ended under the old one. Meanwhile no new turn is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_weight_update_stops_generation_and_every_token_keeps_its_version() {
    for kind in [WireKind::Vllm, WireKind::Sglang] {
        // 20 ms a token: the essay's turn takes seconds.
        let stand = Stand::start(&[kind], |_| {}, |_, c| c.token_us = 20_000).await;
        let client = &stand.env.client;
        let server = stand.servers[0].as_ref().unwrap();
        // Announced before the workers start, which read it first thing.
        client.announce_policy(1).await.unwrap();
        stand.env.workers_in_process(1);
        for (round, mode) in [UpdateMode::Abort, UpdateMode::Pause, UpdateMode::Wait]
            .into_iter()
            .enumerate()
        {
            let what = format!("{kind:?} {mode:?}");
            let old = i64::try_from(round).unwrap() + 1;
            let new = old + 1;
            let batch = format!("wu-{}-{}", kind.as_str(), mode.as_str());
            stand
                .env
                .submit(&[task("Write an essay.", "demo", json!({}))], &batch)
                .await;
            wait_stats(server, "is generating", |s| s.in_flight == 1).await;
            tokio::time::sleep(Duration::from_millis(300)).await;
            let paused = client.pause_policy(new, mode, Some(120)).await.unwrap();
            assert_eq!(paused.current.map(|c| c.version), Some(old), "{what}");
            assert_eq!(paused.pause.map(|p| (p.version, p.mode)), Some((new, mode)));
            assert!(paused.backends.iter().all(|b| b.ok), "{what}: {paused:?}");
            assert!(is_paused(server).await, "{what}");
            let held = format!("{batch}-held");
            if mode != UpdateMode::Wait {
                // A new episode's first turn is held by the service: nothing new reaches
                // the server (the frozen turn stays in it; the aborted one left).
                stand
                    .env
                    .submit(&[task("Quick fix.", "demo", json!({}))], &held)
                    .await;
                tokio::time::sleep(Duration::from_millis(800)).await;
                let frozen = u64::from(mode == UpdateMode::Pause);
                assert_eq!(server.stats().in_flight, frozen, "{what}");
            }
            let seen = client.policy().await.unwrap();
            assert_eq!(seen.pause.map(|p| p.version), Some(new), "{what}");
            let resumed = client.resume_policy(new).await.unwrap();
            assert_eq!(resumed.current.map(|c| c.version), Some(new));
            assert_eq!(resumed.changed, Some(true));
            assert!(!is_paused(server).await, "{what}");
            // Resuming again is a repeat.
            assert_eq!(
                client.resume_policy(new).await.unwrap().changed,
                Some(false)
            );

            let r = stand
                .env
                .wait_results(&batch, 1, Duration::from_secs(60))
                .await
                .remove(0);
            assert_eq!(r.status, Status::Done, "{what}: {r:?}");
            let run = run_output(&r);
            check_versions(run, mode, old, new, &what);
            assert_token_exact(&stand, run);
            if mode != UpdateMode::Wait {
                let r = stand
                    .env
                    .wait_results(&held, 1, Duration::from_secs(60))
                    .await
                    .remove(0);
                let run = run_output(&r);
                for turn in run["turns"].as_array().unwrap() {
                    assert_eq!(turn["policy_version"], new, "{what}: the held turn: {turn}");
                }
                assert_token_exact(&stand, run);
            }
        }
    }
}

/// The versions on the essay's one turn, caught by an update from `old` to `new` in
/// `mode`.
fn check_versions(run: &Value, mode: UpdateMode, old: i64, new: i64, what: &str) {
    let turn = &run["turns"][0];
    let [a, b]: [usize; 2] = serde_json::from_value(turn["model_range"].clone()).unwrap();
    let spans = spans(run);
    assert_eq!(turn["policy_version"], old, "{what}: {turn}");
    match mode {
        UpdateMode::Abort => {
            assert!(turn["continued"].as_u64() >= Some(1), "{what}: {turn}");
            assert_eq!(spans.len(), 2, "{what}: {spans:?}");
            let cut = spans[0].to;
            assert_eq!((spans[0].version, spans[0].from), (old, a));
            assert_eq!(
                (spans[1].version, spans[1].from, spans[1].to),
                (new, cut, b)
            );
            assert!(a < cut && cut < b, "{what}: cut inside the turn: {spans:?}");
            assert_eq!(
                (
                    run["policy_version_oldest"].as_i64(),
                    run["policy_version_newest"].as_i64()
                ),
                (Some(old), Some(new))
            );
        }
        UpdateMode::Pause | UpdateMode::Wait => {
            assert!(turn.get("continued").is_none(), "{what}: {turn}");
            assert_eq!(spans.len(), 1, "{what}: {spans:?}");
            assert_eq!((spans[0].version, spans[0].from, spans[0].to), (old, a, b));
            // A frozen turn ends after the resume: it says a newer version came; a turn
            // `wait` let finish ended before it.
            if mode == UpdateMode::Pause {
                assert_eq!(turn["policy_version_end"], new, "{what}: {turn}");
            } else {
                assert!(turn.get("policy_version_end").is_none(), "{what}: {turn}");
            }
        }
    }
}

/// A trainer that pauses and never resumes (it died) holds the GPUs only until the
/// pause's lease runs out: the reconciler resumes the backends, the held episodes go on
/// under the old version, and the version that was never put in place does not become
/// current. Two updates asked for at once get one order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_weight_update_whose_trainer_dies_ends_with_its_lease() {
    let stand = Stand::start(&[WireKind::Vllm], |_| {}, |_, _| {}).await;
    let client = &stand.env.client;
    let server = stand.servers[0].as_ref().unwrap();
    client.announce_policy(1).await.unwrap();
    stand.env.workers_in_process(1);
    // Two at once: one starts, the other is told another update is in progress.
    let (x, y) = tokio::join!(
        client.pause_policy(2, UpdateMode::Pause, Some(2)),
        client.pause_policy(3, UpdateMode::Abort, Some(2)),
    );
    assert!(x.is_ok() != y.is_ok(), "exactly one starts: {x:?} {y:?}");
    let refused = x.as_ref().err().or(y.as_ref().err()).unwrap().to_string();
    assert!(
        refused.contains("409") && refused.contains("in progress"),
        "{refused}"
    );
    let started = x.ok().or(y.ok()).unwrap().pause.unwrap();
    assert!(is_paused(server).await);
    stand
        .env
        .submit(&[task("Quick fix.", "demo", json!({}))], "lease")
        .await;
    // Nobody resumes.
    eventually("the lease to run out", Duration::from_secs(30), || async {
        let p = client.policy().await.unwrap();
        if p.pause.is_none() { Ok(p) } else { Err(p) }
    })
    .await;
    eventually(
        "the backend to be resumed",
        Duration::from_secs(10),
        || async {
            if is_paused(server).await {
                Err("paused")
            } else {
                Ok(())
            }
        },
    )
    .await;
    let r = stand
        .env
        .wait_results("lease", 1, Duration::from_secs(60))
        .await
        .remove(0);
    assert_eq!(r.status, Status::Done, "{r:?}");
    for turn in run_output(&r)["turns"].as_array().unwrap() {
        assert_eq!(turn["policy_version"], 1, "{turn}");
    }
    let p = client.policy().await.unwrap();
    assert_eq!(
        p.current.map(|c| c.version),
        Some(1),
        "the version never put in place is not current"
    );
    // Its resume is refused now; the same version may be updated to afresh.
    let e = client
        .resume_policy(started.version)
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("409"), "{e}");
    client
        .pause_policy(started.version, UpdateMode::Abort, None)
        .await
        .unwrap();
    client.resume_policy(started.version).await.unwrap();
    assert_eq!(
        client.policy().await.unwrap().current.map(|c| c.version),
        Some(started.version)
    );
}
