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
/// (on SGLang its tokens keep the older version, and the turn says a newer one came;
/// vLLM 0.33 labels each token with the weights that sampled it, so there the turn
/// splits exactly at the resume); `wait` answers once it has ended under the old one. Meanwhile no new turn is sent.
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
            wait_stats(server, "is generating", |s| s.generating == 1).await;
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
            // The server reports the new weights under the service's number.
            let label: Value = reqwest::get(format!("{}/weight_info", server.url()))
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            assert_eq!(label["weight_version"], new.to_string(), "{what}");
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
            check_versions(run, (kind, mode), old, new, &what);
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
        // What an operator sees: the version, the held turns, the continued ones.
        let text = reqwest::get(format!("{}/metrics", stand.env.base))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        for metric in [
            "rollout_policy_version",
            "rollout_agent_turn_held_seconds",
            "rollout_agent_generations_continued_total",
        ] {
            assert!(text.contains(metric), "{metric} in {text}");
        }
    }
}

/// Asserts `spans` split the turn `a..b` in two, at a cut inside it: `old` before it,
/// `new` from it on.
fn assert_split(spans: &[VersionSpan], (old, new): (i64, i64), (a, b): (usize, usize), what: &str) {
    assert_eq!(spans.len(), 2, "{what}: {spans:?}");
    let cut = spans[0].to;
    assert_eq!((spans[0].version, spans[0].from), (old, a));
    assert_eq!(
        (spans[1].version, spans[1].from, spans[1].to),
        (new, cut, b)
    );
    assert!(a < cut && cut < b, "{what}: cut inside the turn: {spans:?}");
}

/// The versions on the essay's one turn, caught by an update from `old` to `new` in
/// `mode`, on a server of `kind`.
fn check_versions(
    run: &Value,
    (kind, mode): (WireKind, UpdateMode),
    old: i64,
    new: i64,
    what: &str,
) {
    let turn = &run["turns"][0];
    let [a, b]: [usize; 2] = serde_json::from_value(turn["model_range"].clone()).unwrap();
    let spans = spans(run);
    assert_eq!(turn["policy_version"], old, "{what}: {turn}");
    match mode {
        UpdateMode::Pause if kind == WireKind::Vllm => {
            // One request, frozen and resumed: the server's labels split it where the
            // new weights took over.
            assert!(turn.get("continued").is_none(), "{what}: {turn}");
            assert_split(&spans, (old, new), (a, b), what);
            assert!(turn.get("policy_version_end").is_none(), "{what}: {turn}");
        }
        UpdateMode::Abort => {
            assert!(turn["continued"].as_u64() >= Some(1), "{what}: {turn}");
            assert_split(&spans, (old, new), (a, b), what);
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

/// Registers backend `id`, which nothing answers (port 9), and marks it down, as the
/// health probe would.
async fn add_unreachable_backend(stand: &Stand, id: &str) {
    let spec = rollout::domain::backend::BackendSpec {
        id: id.into(),
        url: "http://127.0.0.1:9".into(),
        kind: WireKind::Vllm,
        model: "elsewhere".into(),
        tokenizer: stand.env.dir.path().join("model").display().to_string(),
        ..Default::default()
    };
    stand.env.client.add_backend(&spec).await.unwrap();
    stand
        .env
        .deps
        .store
        .set_backend_health(id, false, Some("test"), rollout::domain::EpochMs::now())
        .await
        .unwrap();
}

/// A backend the service paused and could not resume (it was away at the resume) is
/// owed a resume, and the reconciler's sweep resumes it once it answers; one that
/// answered owes nothing, and a server paused by someone else (a trainer pausing its
/// servers itself) is never resumed by the service.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_away_at_the_resume_is_resumed_by_the_reconciler() {
    let stand = Stand::start(
        &[WireKind::Vllm],
        |s| s.reconciler.enabled = false,
        |_, _| {},
    )
    .await;
    let client = &stand.env.client;
    let server = stand.servers[0].as_ref().unwrap();
    let store = stand.env.deps.store.clone();
    let live = store.backends().await.unwrap()[0].spec.id.clone();
    add_unreachable_backend(&stand, "away").await;
    client.announce_policy(1).await.unwrap();
    client
        .pause_policy(2, UpdateMode::Pause, Some(60))
        .await
        .unwrap();
    client.resume_policy(2).await.unwrap();
    assert!(!is_paused(server).await);
    assert_eq!(
        store.owed_resumes().await.unwrap(),
        vec!["away".to_string()]
    );
    let settings = rollout::reconciler::SweepSettings::from_settings(&stand.env.deps.settings);
    // Still away: still owed.
    assert_eq!(
        rollout::reconciler::repay_resumes(store.as_ref(), &settings)
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        store.owed_resumes().await.unwrap(),
        vec!["away".to_string()]
    );
    // A server paused by someone else, owing nothing: left paused by the sweep.
    server
        .pause(rollout::scripted::pause::PauseMode::Keep)
        .await;
    rollout::reconciler::repay_resumes(store.as_ref(), &settings)
        .await
        .unwrap();
    assert!(
        is_paused(server).await,
        "a pause the service did not make is not its to end"
    );
    // The same server, as the service left it when its resume did not get through.
    store.owe_resume(&live, true).await.unwrap();
    // Not while an update is in progress: its own resume will.
    client
        .pause_policy(3, UpdateMode::Pause, Some(60))
        .await
        .unwrap();
    assert_eq!(
        rollout::reconciler::repay_resumes(store.as_ref(), &settings)
            .await
            .unwrap(),
        0
    );
    assert!(is_paused(server).await);
    client.resume_policy(3).await.unwrap();
    assert_eq!(
        store.owed_resumes().await.unwrap(),
        vec!["away".to_string()]
    );
    server
        .pause(rollout::scripted::pause::PauseMode::Keep)
        .await;
    store.owe_resume(&live, true).await.unwrap();
    assert_eq!(
        rollout::reconciler::repay_resumes(store.as_ref(), &settings)
            .await
            .unwrap(),
        1
    );
    assert!(!is_paused(server).await);
    assert_eq!(
        store.owed_resumes().await.unwrap(),
        vec!["away".to_string()]
    );
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
    // A backend marked down that cannot be reached: asked, reported, not fatal.
    add_unreachable_backend(&stand, "dead").await;
    let store = stand.env.deps.store.clone();
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
    let view = x.ok().or(y.ok()).unwrap();
    let dead = view.backends.iter().find(|b| b.backend == "dead").unwrap();
    assert!(!dead.ok && dead.error.is_some(), "{view:?}");
    let started = view.pause.unwrap();
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
    // The unreachable one is owed a resume; the reconciler asks it again at each sweep.
    eventually(
        "the away backend to be owed",
        Duration::from_secs(10),
        || async {
            let owed = store.owed_resumes().await.unwrap();
            if owed == ["dead"] { Ok(()) } else { Err(owed) }
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

/// The staleness bound on plain submits: three essays generate under version 1 and
/// version 2 is announced before they finish. The one bounded at 0 ends `stale` (its
/// reward, trajectory and the reason kept; counted as stale), the ones bounded at 1 or
/// not at all end `done`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sample_older_than_its_bound_ends_stale_and_is_kept() {
    let stand = Stand::start(&[WireKind::Vllm], |_| {}, |_, c| c.token_us = 20_000).await;
    let client = &stand.env.client;
    let server = stand.servers[0].as_ref().unwrap();
    client.announce_policy(1).await.unwrap();
    stand.env.workers_in_process(1);
    let tasks: Vec<_> = [Some(0), Some(1), None]
        .into_iter()
        .map(|bound| {
            let mut t = task("Write an essay.", "demo", json!({}));
            t.max_staleness = bound;
            t.client_id = Some(format!("bound-{bound:?}"));
            t
        })
        .collect();
    stand.env.submit(&tasks, "stale-plain").await;
    // Sent under version 1 (an announce fixes nothing of a request already sent, so
    // arriving is enough here).
    wait_stats(server, "has all three", |s| s.in_flight == 3).await;
    client.announce_policy(2).await.unwrap();
    let results = stand
        .env
        .wait_results("stale-plain", 3, Duration::from_secs(60))
        .await;
    let by = |bound: Option<i64>| {
        let id = format!("bound-{bound:?}");
        results
            .iter()
            .find(|r| r.client_id.as_deref() == Some(id.as_str()))
            .unwrap_or_else(|| panic!("{id}: {results:?}"))
    };
    let stale = by(Some(0));
    assert_eq!(stale.status, Status::Stale, "{stale:?}");
    assert!(stale.reward.is_some(), "the reward is kept: {stale:?}");
    let why = stale.error.as_deref().unwrap();
    assert!(
        why.contains("policy version 1")
            && why.contains("current 2")
            && why.contains("max_staleness is 0"),
        "{why}"
    );
    assert_eq!(
        run_output(stale)["policy_version_oldest"],
        1,
        "the trajectory is kept"
    );
    assert_eq!(by(Some(1)).status, Status::Done);
    assert_eq!(by(None).status, Status::Done);
    let counters = client
        .status(Some("stale-plain"))
        .await
        .unwrap()
        .batch
        .unwrap();
    assert_eq!((counters.done, counters.stale), (2, 1), "{counters:?}");
    // A bound below 0 is refused, naming the field.
    let mut bad = task("Write an essay.", "demo", json!({}));
    bad.max_staleness = Some(-1);
    let e = client
        .submit(&[bad], Some("stale-bad"))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("400") && e.contains("tasks[0].max_staleness"),
        "{e}"
    );
}

/// The staleness bound on a sampling batch (`max_staleness: 0`, one group in flight at
/// a time): version 2 is announced while the first group generates, so its samples end
/// `stale`, the group is decided `stale` and not accepted, and the next prompt replaces
/// it, its samples drawn under version 2; the counts are in the batch's counters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_group_is_replaced_by_the_next_prompt() {
    let stand = Stand::start(&[WireKind::Vllm], |_| {}, |_, c| c.token_us = 20_000).await;
    let client = &stand.env.client;
    let server = stand.servers[0].as_ref().unwrap();
    client.announce_policy(1).await.unwrap();
    stand.env.workers_in_process(1);
    let request = rollout::api::batches::BatchRequest {
        batch_id: Some("stale-batch".into()),
        prompts: (0..3)
            .map(|_| task("Write an essay.", "demo", json!({})))
            .collect(),
        group_size: 2,
        target_groups: 3,
        max_groups_in_flight: Some(1),
        max_groups: None,
        informative: Default::default(),
        policy_version: None,
        max_staleness: Some(0),
        on_cancel: Default::default(),
        carry_from: None,
    };
    client.submit_sampling(&request).await.unwrap();
    wait_stats(server, "has the first group", |s| s.in_flight == 2).await;
    client.announce_policy(2).await.unwrap();
    let view = eventually("the batch to end", Duration::from_secs(90), || async {
        let v = client.sampling_batch("stale-batch").await.unwrap();
        if v.batch.counters.groups_decided == 3 {
            Ok(v)
        } else {
            Err(v.batch.counters)
        }
    })
    .await;
    let c = &view.batch.counters;
    assert_eq!(c.stale_groups, 1, "{c:?}");
    assert_eq!(c.groups_launched, 3, "the stale group was replaced: {c:?}");
    let counters = client
        .status(Some("stale-batch"))
        .await
        .unwrap()
        .batch
        .unwrap();
    assert_eq!(
        counters.stale, 2,
        "both samples of the first group: {counters:?}"
    );
    let results = stand
        .env
        .wait_results("stale-batch", 6, Duration::from_secs(30))
        .await;
    for r in &results {
        let oldest = run_output(r)["policy_version_oldest"].as_i64();
        let group = r.group_id.as_deref().unwrap();
        if group == "p0" {
            assert_eq!((r.status, oldest), (Status::Stale, Some(1)), "{r:?}");
        } else {
            assert_eq!((r.status, oldest), (Status::Done, Some(2)), "{r:?}");
        }
    }
    assert!(
        view.groups.iter().all(|g| g.group_id != "p0"),
        "a stale group is never delivered: {:?}",
        view.groups
    );
}

/// A sampling batch `id` of `prompts` agent prompts of model `demo`, G = 2, K = 1, one
/// group in flight at a time.
fn one_at_a_time(
    id: &str,
    prompt: &str,
    on_cancel: rollout::domain::sampling::OnCancel,
    carry_from: Option<&str>,
) -> rollout::api::batches::BatchRequest {
    rollout::api::batches::BatchRequest {
        batch_id: Some(id.into()),
        prompts: vec![task(prompt, "demo", json!({}))],
        group_size: 2,
        target_groups: 1,
        max_groups_in_flight: Some(1),
        max_groups: None,
        informative: Default::default(),
        policy_version: None,
        max_staleness: None,
        on_cancel,
        carry_from: carry_from.map(String::from),
    }
}

/// Partial rollouts across a weight update, end to end: a `keep` batch is cancelled
/// while its two episodes generate; they run on, the trainer updates the weights
/// (abort mode), and the next batch adopts their group. The episodes end `done`, never
/// cancelled, their tokens carrying both versions (the turn cut by the update goes on
/// under the new one, exactly), and the adopter decides the group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_episodes_go_on_under_the_new_version_in_the_next_batch() {
    use rollout::domain::sampling::OnCancel;
    let stand = Stand::start(&[WireKind::Vllm], |_| {}, |_, c| c.token_us = 20_000).await;
    let client = &stand.env.client;
    let server = stand.servers[0].as_ref().unwrap();
    client.announce_policy(1).await.unwrap();
    stand.env.workers_in_process(1);
    client
        .submit_sampling(&one_at_a_time(
            "kept-a",
            "Write an essay.",
            OnCancel::Keep,
            None,
        ))
        .await
        .unwrap();
    wait_stats(server, "is generating both essays", |s| s.generating == 2).await;
    // Both essays must have tokens under version 1 before the update cuts them: the
    // stand-in counts an aborted request's tokens by the time it generated (20 ms each),
    // and a loaded machine can otherwise cancel and pause within the second essay's
    // first token, which then carries version 2 only.
    tokio::time::sleep(Duration::from_millis(300)).await;
    client.cancel_batch("kept-a").await.unwrap();
    let a = client.sampling_batch("kept-a").await.unwrap().batch;
    assert_eq!(
        (a.status, a.counters.kept_groups),
        (rollout::domain::sampling::SamplingStatus::Cancelled, 1)
    );
    client
        .pause_policy(2, UpdateMode::Abort, Some(120))
        .await
        .unwrap();
    client.resume_policy(2).await.unwrap();
    let b = client
        .submit_sampling(&one_at_a_time(
            "kept-b",
            "Quick fix.",
            OnCancel::Discard,
            Some("kept-a"),
        ))
        .await
        .unwrap();
    assert_eq!(b.batch.counters.adopted_groups, 1);
    let b = eventually(
        "the adopter to decide every group",
        Duration::from_secs(90),
        || async {
            let v = client.sampling_batch("kept-b").await.unwrap();
            let c = &v.batch.counters;
            if v.batch.status.is_final() && c.groups_decided == c.groups_launched {
                Ok(v)
            } else {
                Err(v.batch)
            }
        },
    )
    .await;
    let kept = stand
        .env
        .wait_results("kept-a", 2, Duration::from_secs(60))
        .await;
    for r in &kept {
        assert_eq!(r.status, Status::Done, "{r:?}");
        let run = run_output(r);
        assert_eq!(
            (
                run["policy_version_oldest"].as_i64(),
                run["policy_version_newest"].as_i64()
            ),
            (Some(1), Some(2)),
            "{run}"
        );
        assert!(run["turns"][0]["continued"].as_u64() >= Some(1), "{run}");
        assert_token_exact(&stand, run);
    }
    // The adopted group was decided in the adopter (its count of decided groups waited
    // for it), and an accepted group says where it came from exactly when it was adopted.
    assert_eq!(b.batch.counters.groups_launched, 2, "{:?}", b.batch);
    for g in &b.groups {
        let adopted = g.results.iter().all(|r| r.batch_id == "kept-a");
        assert_eq!(
            g.carried_from.as_deref(),
            adopted.then_some("kept-a"),
            "{g:?}"
        );
    }
}
