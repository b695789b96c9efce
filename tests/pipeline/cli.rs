//! The `rollout` commands that talk to a gateway, run as a user runs them: a refused
//! task named by its file and line, `submit --wait` listing why jobs failed and
//! `--fail-on-error`, `results` as rows and as JSON lines, `cancel` of jobs and of a
//! batch, `batches list / submit / show` with every group's verdict, a 404 printed as a
//! sentence, and `backends list` in aligned columns.

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use rollout::domain::Status;
use serde_json::{Value, json};

use crate::helpers::{TestEnv, synthetic};

/// Runs `rollout ARGS --gateway <env>` with nothing of the caller's `ROLLOUT*`
/// environment.
async fn rollout(env: &TestEnv, args: &[&str]) -> Output {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_rollout"));
    cmd.args(args).arg("--gateway").arg(&env.base);
    for (k, _) in std::env::vars() {
        if k.starts_with("ROLLOUT") {
            cmd.env_remove(k);
        }
    }
    cmd.env("ROLLOUT__LOG__LEVEL", "warn");
    cmd.output().await.unwrap()
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn write_tasks(dir: &Path, name: &str, lines: &[String]) -> String {
    let path = dir.join(name);
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path.display().to_string()
}

fn line(spec: Value) -> String {
    json!({"kind": "synthetic", "spec": spec}).to_string()
}

/// `submit`: a refused task by its file and line; `--wait` with the failure reasons and
/// `--fail-on-error`; `results` as rows and as JSON lines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_names_refused_lines_and_lists_why_jobs_failed() {
    let env = TestEnv::start(|_| {}).await;
    env.workers_in_process(2);
    let dir = env.dir.path();

    // A refused task is named by its file and line (a comment and a blank line before).
    let bad = write_tasks(
        dir,
        "bad.jsonl",
        &[
            "# two tasks".into(),
            line(json!({"run_ms": 1})),
            String::new(),
            line(json!({"run_ms": -5})),
        ],
    );
    let out = rollout(&env, &["submit", &bad]).await;
    let (_, err) = text(&out);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains(&format!(
            "{bad}:4: the gateway refused this task at `spec.run_ms`"
        )),
        "{err}"
    );
    assert!(!err.contains("tasks[1]") && !err.contains("{\""), "{err}");

    // `--wait` says why jobs failed; `--fail-on-error` exits 1 for it.
    let mixed = write_tasks(
        dir,
        "mixed.jsonl",
        &[
            line(json!({"reward": 1.0})),
            line(json!({"fail_in": "run", "message": "the widget broke"})),
            line(json!({"fail_in": "run", "message": "the widget broke"})),
        ],
    );
    let out = rollout(
        &env,
        &[
            "submit",
            &mixed,
            "--batch",
            "cli-mixed",
            "--wait",
            "--fail-on-error",
        ],
    )
    .await;
    let (stdout, err) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(stdout.trim(), "cli-mixed");
    assert!(err.contains("why jobs did not end done"), "{err}");
    let reason = err
        .lines()
        .find(|l| l.contains("the widget broke"))
        .unwrap_or_else(|| panic!("no failure reason in {err}"));
    assert!(reason.trim_start().starts_with("2 failed"), "{reason}");
    assert!(reason.contains("(e.g. job "), "{reason}");
    assert!(err.contains("2 jobs ended failed or timed out"), "{err}");
    // Without the flag the same wait succeeds.
    let out = rollout(
        &env,
        &["submit", &mixed, "--batch", "cli-mixed-2", "--wait"],
    )
    .await;
    assert!(out.status.success(), "{}", text(&out).1);

    // `results`: a row per result, or the API's results as JSON lines.
    let results = env
        .wait_results("cli-mixed", 3, Duration::from_secs(60))
        .await;
    let out = rollout(&env, &["results", "--batch", "cli-mixed", "--json"]).await;
    let (stdout, err) = text(&out);
    assert!(out.status.success(), "{err}");
    let printed: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(printed.len(), 3);
    for (p, r) in printed.iter().zip(&results) {
        assert_eq!(p["job_id"], json!(r.job_id));
        assert_eq!(p["seq"], json!(r.seq));
    }
    let out = rollout(&env, &["results", "--batch", "cli-mixed", "--count", "2"]).await;
    let (stdout, _) = text(&out);
    let rows: Vec<&str> = stdout.lines().collect();
    assert_eq!(rows.len(), 3, "{stdout}");
    assert!(
        rows[0].starts_with("SEQ") && rows[0].contains("REWARD"),
        "{stdout}"
    );
    assert!(rows[1].contains(&results[0].job_id), "{stdout}");
}

/// `cancel`: a running job, an ended one, an unknown one, a whole batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_says_what_happened_to_each_job_and_batch() {
    let env = TestEnv::start(|_| {}).await;
    env.workers_in_process(2);
    // `cancel`: a running job ends cancelled, an ended one keeps its result, an unknown
    // one is an error; then a whole batch.
    let ids = env
        .submit(
            &[
                synthetic(json!({"hang_in": "run"})),
                synthetic(json!({"hang_in": "run"})),
            ],
            "cli-hang",
        )
        .await;
    let done = env
        .submit(&[synthetic(json!({"reward": 1.0}))], "cli-done")
        .await;
    env.wait_results("cli-done", 1, Duration::from_secs(60))
        .await;
    let out = rollout(&env, &["cancel", &ids[0], &done[0]]).await;
    let (_, err) = text(&out);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains(&format!("job {} ended cancelled", ids[0])),
        "{err}"
    );
    assert!(
        err.contains(&format!("job {}: job already ended", done[0]))
            && err.contains("its result stands"),
        "{err}"
    );
    let out = rollout(&env, &["cancel", "no-such-job"]).await;
    let (_, err) = text(&out);
    assert!(!out.status.success());
    assert!(
        err.contains("no job with id `no-such-job` (HTTP 404)"),
        "{err}"
    );
    assert!(!err.contains("{\""), "raw JSON in {err}");
    let out = rollout(&env, &["cancel", "--batch", "cli-hang"]).await;
    let (_, err) = text(&out);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("batch cli-hang cancelled"), "{err}");
    let ended = env
        .wait_results("cli-hang", 2, Duration::from_secs(60))
        .await;
    assert!(
        ended.iter().all(|r| r.status == Status::Cancelled),
        "{ended:?}"
    );
}

/// `batches submit --wait`, `show` (every group's verdict), `list`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_are_listed_submitted_and_shown_with_every_verdict() {
    let env = TestEnv::start(|_| {}).await;
    env.workers_in_process(2);
    let dir = env.dir.path();
    // `batches`: a sampling batch submitted from a prompt file, followed to its end,
    // then shown with every group's verdict; the list has it and the plain batches.
    let prompts = write_tasks(
        dir,
        "prompts.jsonl",
        &[
            line(json!({"reward": 1.0})),
            line(json!({"pass_rate": 0.5})),
            line(json!({"pass_rate": 0.5})),
            line(json!({"pass_rate": 0.5})),
        ],
    );
    let out = rollout(
        &env,
        &[
            "batches",
            "submit",
            &prompts,
            "--group-size",
            "4",
            "--target-groups",
            "1",
            "--batch",
            "cli-sampling",
            "--max-groups-in-flight",
            "1",
            "--wait",
        ],
    )
    .await;
    let (stdout, err) = text(&out);
    assert!(out.status.success(), "{err}");
    assert_eq!(stdout.trim(), "cli-sampling");
    assert!(err.contains("batch cli-sampling is "), "{err}");
    let verdicts = env.client.sampling_verdicts("cli-sampling").await.unwrap();
    // The first prompt always passes: its group is uniform, never accepted.
    assert_eq!(verdicts.groups[0].state, "uniform", "{verdicts:?}");
    let out = rollout(&env, &["batches", "show", "cli-sampling"]).await;
    let (stdout, err) = text(&out);
    assert!(out.status.success(), "{err}");
    let lines: Vec<&str> = stdout.lines().collect();
    let header = lines
        .iter()
        .position(|l| l.starts_with("GROUP"))
        .unwrap_or_else(|| panic!("no table in {stdout}"));
    assert_eq!(lines.len() - header - 1, verdicts.groups.len(), "{stdout}");
    for (g, row) in verdicts.groups.iter().zip(&lines[header + 1..]) {
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(
            (cells[0], cells[2]),
            (g.group_id.as_str(), g.state.as_str()),
            "{row}"
        );
    }
    assert!(
        lines[header + 1].contains("1.00 1.00 1.00 1.00"),
        "{stdout}"
    );
    env.submit(&[synthetic(json!({"reward": 1.0}))], "cli-plain")
        .await;
    env.wait_results("cli-plain", 1, Duration::from_secs(60))
        .await;
    let out = rollout(&env, &["batches", "show", "cli-plain"]).await;
    assert!(
        text(&out).0.contains("not a sampling batch"),
        "{}",
        text(&out).0
    );
    let out = rollout(&env, &["batches", "list"]).await;
    let (stdout, _) = text(&out);
    for id in ["cli-plain", "cli-sampling"] {
        assert!(stdout.contains(id), "{stdout}");
    }
    let sampled = stdout
        .lines()
        .find(|l| l.starts_with("cli-sampling"))
        .unwrap();
    assert!(sampled.contains("1/1 groups"), "{sampled}");
}

/// `backends list`: columns aligned whatever the lengths of the cells.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backends_are_listed_in_aligned_columns() {
    let env = TestEnv::start(|_| {}).await;
    for (id, url) in [
        ("b", "http://127.0.0.1:9"),
        ("a-backend-with-a-rather-long-name", "http://127.0.0.1:10"),
    ] {
        let out = rollout(
            &env,
            &[
                "backends",
                "add",
                "--id",
                id,
                "--url",
                url,
                "--kind",
                "vllm",
                "--model",
                "m",
                "--tokenizer",
                "/nonexistent",
            ],
        )
        .await;
        assert!(out.status.success(), "{}", text(&out).1);
    }
    let out = rollout(&env, &["backends", "list"]).await;
    let (stdout, _) = text(&out);
    let lines: Vec<&str> = stdout.lines().collect();
    let at = lines[0].find("URL").unwrap();
    for l in &lines[1..] {
        assert!(l[at..].starts_with("http://"), "{stdout}");
    }
    assert_eq!(lines.len(), 3, "{stdout}");
}
