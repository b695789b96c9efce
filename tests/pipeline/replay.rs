//! Replays: a finished episode's model side played back from its result, the tools run
//! for real in a fresh sandbox, with no inference backend (the stand-in server is
//! stopped before the replays run); the first divergence is reported where the
//! environment answers otherwise.

use std::time::Duration;

use rollout::agent::replay::{ReplayReport, describe, replay_task};
use rollout::domain::backend::WireKind;
use rollout::domain::{JobResult, Status};
use serde_json::json;

use crate::agent::{Stand, run_output, task};
use crate::program::{SDK_AGENT, agent_site, program_task};

/// Submits the replay of `original` into its own batch and waits for its result.
async fn replay(stand: &Stand, original: &JobResult) -> (JobResult, ReplayReport) {
    let job = stand.env.client.job(&original.job_id).await.unwrap().job;
    let batch = format!("replay-{}", original.job_id);
    let t = replay_task(&job, &batch).unwrap();
    // Another batch's job: the task says it may replay it.
    assert_eq!(t.spec["replay_across_batches"], true);
    stand.env.submit(&[t], &batch).await;
    let r = stand
        .env
        .wait_results(&batch, 1, Duration::from_secs(120))
        .await
        .remove(0);
    let report: ReplayReport = serde_json::from_value(run_output(&r)["replay"].clone())
        .unwrap_or_else(|e| panic!("no replay report ({e}): {r:?}"));
    (r, report)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replays_run_the_tools_again_and_find_where_the_environment_changed() {
    let mut stand = Stand::start(&[WireKind::Vllm], |_| {}, |_, _| {}).await;
    stand.env.workers_in_process(1);
    let mut fix = task("Fix add() in calc/add.py, then finish.", "demo", json!({}));
    fix.client_id = Some("fix".into());
    let mut stamp = task(
        "Read the stamp, then finish.",
        "demo",
        json!({"sandbox": {
            "files": {"calc/add.py": "def add(a, b):\n    return a - b\n"},
            "setup": ["head -c 12 /dev/urandom | od -An -tx1 > stamp.txt"],
        }, "check": {"command": "true"}}),
    );
    stamp.client_id = Some("stamp".into());
    stand.env.submit(&[fix, stamp], "recorded").await;
    let results = stand
        .env
        .wait_results("recorded", 2, Duration::from_secs(120))
        .await;
    let by = |id: &str| {
        results
            .iter()
            .find(|r| r.client_id.as_deref() == Some(id))
            .unwrap()
            .clone()
    };
    let (fix, stamp) = (by("fix"), by("stamp"));
    assert_eq!(fix.status, Status::Done, "{fix:?}");
    assert_eq!(stamp.status, Status::Done, "{stamp:?}");
    // No backend from here on: a replay that called one would fail.
    stand.servers[0].take().unwrap().stop().await;

    let (again, report) = replay(&stand, &fix).await;
    assert_eq!(again.status, Status::Done, "{again:?}");
    assert_eq!(again.reward, fix.reward, "the same fix scores the same");
    assert_eq!(report.divergence, None, "{}", describe(&report));
    assert_eq!(report.tool_divergence, None, "{}", describe(&report));
    assert_eq!((report.recorded_calls, report.replayed_calls), (4, 4));
    assert_eq!(
        run_output(&again)["response_ids"],
        run_output(&fix)["response_ids"]
    );
    assert_eq!(run_output(&again)["backend"], "replay");
    // The recording as the stand-in's script plays the same turns for the same task.
    let job = stand.env.client.job(&fix.job_id).await.unwrap().job;
    let script = rollout::agent::replay::as_policy(&job).unwrap();
    let script = rollout::scripted::script::Script::from_json(&script.to_string()).unwrap();
    let turns = run_output(&fix)["turns"].as_array().unwrap().clone();
    for (t, turn) in turns.iter().enumerate() {
        let prompt = format!(
            "<|im_start|>user\nFix add() in calc/add.py, then finish.<|im_end|>\n{}",
            "<|im_start|>assistant\n".repeat(t + 1)
        );
        let pick = script.pick(&prompt, 7);
        assert_eq!(
            (pick.turn, pick.text.as_str()),
            (t, turn["text"].as_str().unwrap())
        );
    }

    let (again, report) = replay(&stand, &stamp).await;
    assert_eq!(again.status, Status::Done, "{again:?}");
    let d = report.divergence.clone().unwrap_or_else(|| {
        panic!(
            "the stamp differs: {}\nthen: {}\nnow: {}",
            describe(&report),
            run_output(&stamp)["turns"],
            run_output(&again)["turns"]
        )
    });
    assert_eq!(
        d.call, 1,
        "the second request carries the first tool's output"
    );
    let t = report
        .tool_divergence
        .clone()
        .expect("the tool that differs");
    assert_eq!((t.turn, t.tool), (0, 0));
    assert_eq!(t.call["arguments"]["command"], "cat stamp.txt");
    assert_ne!(t.recorded, t.replayed);
    let text = describe(&report);
    assert!(
        text.contains("request 1 first left the recording"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_program_replays_without_a_backend() {
    let Some(site) = agent_site("an_agent_program_replays_without_a_backend") else {
        return;
    };
    let bind = site.clone();
    let mut stand = Stand::start(
        &[WireKind::Vllm],
        move |s| s.sandbox.ro_binds.push(bind),
        |_, _| {},
    )
    .await;
    stand.env.workers_in_process(1);
    let gateway = stand.env.base.trim_start_matches("http://").to_string();
    let t = program_task(
        "python3 sdk_agent.py",
        json!({"PYTHONPATH": site.display().to_string(), "GATEWAY": gateway}),
        json!({"files": {
            "calc/add.py": "def add(a, b):\n    return a - b\n",
            "sdk_agent.py": SDK_AGENT,
        }}),
        json!({"check": {"command": "cd calc && python3 -c 'import add; assert add.add(2, 3) == 5'"}}),
    );
    stand.env.submit(&[t], "recorded").await;
    let original = stand
        .env
        .wait_results("recorded", 1, Duration::from_secs(120))
        .await
        .remove(0);
    assert_eq!(original.reward, Some(1.0), "{original:?}");
    stand.servers[0].take().unwrap().stop().await;
    let (again, report) = replay(&stand, &original).await;
    assert_eq!(again.status, Status::Done, "{again:?}");
    assert_eq!(again.reward, Some(1.0), "{again:?}");
    assert_eq!(report.divergence, None, "{}", describe(&report));
    assert_eq!((report.recorded_calls, report.replayed_calls), (4, 4));
    let (then, now) = (run_output(&original), run_output(&again));
    // The same tokens: the program asked the same things and got the recorded answers.
    for key in ["prompt_ids", "response_ids", "loss_mask", "logprobs"] {
        for (a, b) in then["samples"]
            .as_array()
            .unwrap()
            .iter()
            .zip(now["samples"].as_array().unwrap())
        {
            assert_eq!(a[key], b[key], "{key}");
        }
    }
}

/// A replay shows the recorded episode in its result, so a task replays jobs of its own
/// batch only, unless its spec permits another batch's: the gateway refuses the rest at
/// submit, naming the field, whichever way the tasks come (`POST /v1/jobs` or a sampling
/// batch's prompts).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replays_are_scoped_to_their_own_batch() {
    let env = crate::helpers::TestEnv::start(|_| {}).await;
    let original = env
        .submit(&[task("Fix add().", "demo", json!({}))], "theirs")
        .await
        .remove(0);
    let replaying = |extra: serde_json::Value| {
        let mut spec = json!({"replay_of": original});
        if let (serde_json::Value::Object(s), serde_json::Value::Object(e)) = (&mut spec, extra) {
            s.extend(e);
        }
        task("Fix add().", "demo", spec)
    };
    let refused =
        |r: Result<rollout::api::jobs::SubmitResponse, rollout::client::ClientError>| match r {
            Err(rollout::client::ClientError::Api {
                status,
                field,
                message,
            }) => (status, field.unwrap_or_default(), message),
            other => panic!("not refused: {other:?}"),
        };

    // Another batch's job, without the permission: refused.
    let (status, field, message) = refused(
        env.client
            .submit(&[replaying(json!({}))], Some("mine"))
            .await,
    );
    assert_eq!(status, 400);
    assert_eq!(field, "tasks[0].spec.replay_of");
    assert!(message.contains("replay_across_batches"), "{message}");
    assert!(message.contains("theirs"), "{message}");
    // The same as a sampling batch's prompt.
    let batch = json!({"batch_id": "sampled", "prompts": [replaying(json!({}))],
        "group_size": 2, "target_groups": 1});
    let http = reqwest::Client::new();
    let r = http
        .post(format!("{}/v1/batches", env.base))
        .json(&batch)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["field"], "prompts[0].spec.replay_of", "{body}");
    // No such job at all.
    let mut ghost = replaying(json!({"replay_across_batches": true}));
    ghost.spec["replay_of"] = json!("no-such-job");
    let (status, field, _) = refused(env.client.submit(&[ghost], Some("mine")).await);
    assert_eq!((status, field.as_str()), (400, "tasks[0].spec.replay_of"));
    // The permission alone is no replay.
    let alone = task("Fix add().", "demo", json!({"replay_across_batches": true}));
    let (status, field, _) = refused(env.client.submit(&[alone], Some("mine")).await);
    assert_eq!(
        (status, field.as_str()),
        (400, "tasks[0].spec.replay_across_batches")
    );

    // Its own batch's job, or another's with the permission: accepted.
    env.submit(&[replaying(json!({}))], "theirs").await;
    env.submit(&[replaying(json!({"replay_across_batches": true}))], "mine")
        .await;
}
