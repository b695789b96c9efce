//! The training view (`GET /v1/training`) against what the results hold: agent episodes
//! under an announced policy version, with a tool the task does not offer (a tool
//! error), a turn limit (a different finish reason) and a job that fails without an
//! episode. Every number of the view is recomputed here from the results' outputs, so
//! the summary columns written with each result (in SQL, from the RUN output) and the
//! view's arithmetic are both checked, on SQLite and, with a Postgres URL, on Postgres.

#![allow(
    clippy::cast_possible_wrap,
    clippy::cast_possible_truncation,
    clippy::cast_precision_loss
)] // counts of a few jobs

use std::collections::BTreeMap;
use std::time::Duration;

use rollout::domain::backend::WireKind;
use rollout::domain::{JobResult, Status};
use serde_json::json;

use crate::agent::{Stand, task};
use crate::helpers::synthetic;

/// What the view should say of a batch, computed from its results' outputs.
#[derive(Debug, Default, PartialEq)]
struct Expected {
    done: i64,
    rewards: Vec<f64>,
    reasons: BTreeMap<String, i64>,
    turns: BTreeMap<i64, i64>,
    lengths: Vec<i64>,
    tool_calls: i64,
    tool_errors: i64,
    versions: BTreeMap<i64, i64>,
}

fn expected(results: &[JobResult]) -> Expected {
    let mut e = Expected::default();
    for r in results {
        let run = &r.output["run"];
        if r.status == Status::Done {
            e.done += 1;
            e.rewards.push(r.reward.unwrap());
        }
        let reason = run["finish_reason"]
            .as_str()
            .map_or_else(|| format!("({})", r.status.as_str()), str::to_string);
        *e.reasons.entry(reason).or_default() += 1;
        if let Some(turns) = run["turns"].as_array() {
            *e.turns.entry(turns.len() as i64).or_default() += 1;
            for t in turns {
                for tool in t["tools"].as_array().unwrap() {
                    let finish = tool["ok"] == json!(true) && tool["call"]["name"] == "finish";
                    if !finish {
                        e.tool_calls += 1;
                        e.tool_errors += i64::from(tool["ok"] != json!(true));
                    }
                }
            }
        }
        if let Some(ids) = run["response_ids"].as_array() {
            e.lengths.push(ids.len() as i64);
        }
        if let Some(v) = run["policy_version_oldest"].as_i64() {
            *e.versions.entry(v).or_default() += 1;
        }
    }
    e
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_training_view_agrees_with_the_results() {
    let stand = Stand::start(&[WireKind::Vllm], |_| {}, |_, _| {}).await;
    let env = &stand.env;
    env.workers_in_process(2);
    env.client.announce_policy(3).await.unwrap();
    let fix = "Fix add() in calc/add.py, then finish.";
    // Episodes until one is tagged 3: the RUN workers have heard of the version, and
    // every episode of the batch below carries it.
    let mut warm = Vec::new();
    for n in 0.. {
        assert!(n < 60, "no episode was tagged with version 3");
        let r = stand
            .run_one(task(fix, "demo", json!({})), &format!("warm-{n}"))
            .await;
        let tagged = r.output["run"]["policy_version_oldest"] == json!(3);
        warm.push(r);
        if tagged {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut tasks = Vec::new();
    for _ in 0..4 {
        tasks.push(task(fix, "demo", json!({})));
    }
    // `python` is not offered: its call is refused, a tool error.
    tasks.push(task(
        fix,
        "demo",
        json!({"tools": ["bash", "file", "finish"]}),
    ));
    // Cut at two turns.
    tasks.push(task(fix, "demo", json!({"limits": {"max_turns": 2}})));
    tasks.push(synthetic(
        json!({"fail_in": "run", "message": "no episode here"}),
    ));
    let n = tasks.len();
    env.submit(&tasks, "train-a").await;
    let results = env
        .wait_results("train-a", n, Duration::from_secs(180))
        .await;
    let e = expected(&results);
    assert_eq!(e.versions.get(&3), Some(&6), "{e:?}");
    assert!(e.tool_errors >= 1, "{e:?}");
    assert!(e.reasons.contains_key("(failed)"), "{e:?}");
    assert!(e.reasons.len() >= 3, "{e:?}");

    let view = env.client.training(100).await.unwrap();
    let b = view
        .batches
        .iter()
        .find(|b| b.batch_id == "train-a")
        .unwrap_or_else(|| panic!("no train-a in {view:?}"));
    assert_eq!((b.results, b.read, b.done), (n as i64, n as i64, e.done));
    let mean = e.rewards.iter().sum::<f64>() / e.rewards.len() as f64;
    assert!((b.reward_mean.unwrap() - mean).abs() < 1e-9, "{b:?}");
    let reasons: BTreeMap<String, i64> = b
        .finish_reasons
        .iter()
        .map(|c| (c.value.clone(), c.jobs))
        .collect();
    assert_eq!(reasons, e.reasons);
    let turns: BTreeMap<i64, i64> = b
        .turns
        .iter()
        .map(|c| (c.value.parse().unwrap(), c.jobs))
        .collect();
    assert_eq!(turns, e.turns);
    assert_eq!(b.response_tokens.count as usize, e.lengths.len());
    assert_eq!(b.response_tokens_max, e.lengths.iter().copied().max());
    let in_histogram: i64 = b.response_tokens_histogram.iter().map(|c| c.jobs).sum();
    assert_eq!(in_histogram, e.lengths.len() as i64);
    assert_eq!((b.tool_calls, b.tool_errors), (e.tool_calls, e.tool_errors));
    let versions: BTreeMap<i64, i64> = view
        .policy_versions
        .iter()
        .map(|v| (v.policy_version, v.results))
        .collect();
    // Over every batch read: the warm-up episodes' versions too.
    let mut all = e.versions.clone();
    for (v, k) in expected(&warm).versions {
        *all.entry(v).or_default() += k;
    }
    assert_eq!(versions, all);
    // The per-minute series counts every result of the run.
    let in_minutes: i64 = view.minutes.iter().map(|m| m.results).sum();
    assert!(in_minutes >= n as i64, "{:?}", view.minutes);
    let stages: Vec<&str> = view
        .stage_latency
        .iter()
        .map(|s| s.stage.as_str())
        .collect();
    for stage in ["init", "run", "eval"] {
        assert!(stages.contains(&stage), "{stages:?}");
    }

    // A batch's job list carries each job's reward and finish reason.
    let jobs = env.client.batch_jobs("train-a").await.unwrap();
    for r in &results {
        let j = jobs.iter().find(|j| j.id == r.job_id).unwrap();
        assert_eq!(j.reward, r.reward, "{}", j.id);
        let reason = r.output["run"]["finish_reason"].as_str();
        assert_eq!(j.finish_reason.as_deref(), reason, "{}", j.id);
    }
}
