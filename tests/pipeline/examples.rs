//! The task files in `examples/` are the first thing a user submits: every one of them
//! is accepted by the gateway as written (a task at the wrong level of its spec, which
//! only a full demo run used to catch, fails here), and `rollout up --submit` with a
//! task the gateway refuses stops with a non-zero exit naming the field.

use std::time::Duration;

use rollout::client::read_tasks_jsonl;

use crate::helpers::TestEnv;

/// Every `examples/*.jsonl` file, read as the CLI reads it and submitted to a gateway
/// with no workers: all its tasks are accepted (and nothing runs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_example_task_file_is_accepted_by_the_gateway() {
    let env = TestEnv::start(|_| {}).await;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .collect();
    files.sort();
    assert!(files.len() >= 6, "examples/*.jsonl: {files:?}");
    for path in files {
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        let tasks = read_tasks_jsonl(&std::fs::read_to_string(&path).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(!tasks.is_empty(), "{} holds no tasks", path.display());
        let resp = env
            .client
            .submit(&tasks, Some(&format!("examples-{name}")))
            .await
            .unwrap_or_else(|e| panic!("{} is refused: {e}", path.display()));
        assert_eq!(resp.jobs.len(), tasks.len(), "{}", path.display());
    }
}

/// Runs `rollout up --submit FILE --exit-when-done` (plus `args`) in a fresh state
/// directory against the test's NATS, with a task the gateway refuses; returns what it
/// printed and its log file.
async fn up_with_a_refused_task(env: &TestEnv, args: &[&str]) -> (std::process::Output, String) {
    let dir = tempfile::tempdir().unwrap();
    let tasks = dir.path().join("tasks.jsonl");
    std::fs::write(
        &tasks,
        "{\"kind\": \"shell\", \"spec\": {\"steps\": [], \"grader\": {\"type\": \"math\"}}}\n",
    )
    .unwrap();
    let config = dir.path().join("rollout.toml");
    std::fs::write(
        &config,
        format!(
            "state_dir = \"{state}\"\n[database]\nurl = \"sqlite://{db}\"\n\
             [gateway]\nlisten = \"127.0.0.1:0\"\n[nats]\nurl = \"{nats}\"\nprefix = \"up{prefix}\"\n",
            state = dir.path().join("state").display(),
            db = dir.path().join("rollout.db").display(),
            nats = env.deps.settings.nats.url,
            prefix = &uuid::Uuid::now_v7().simple().to_string()[24..],
        ),
    )
    .unwrap();
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_rollout"));
    for (k, _) in std::env::vars() {
        if k.starts_with("ROLLOUT") || k == "RUST_LOG" {
            cmd.env_remove(k);
        }
    }
    cmd.env("ROLLOUT__LOG__LEVEL", "info")
        .arg("--config")
        .arg(&config)
        .args(args)
        .args(["up", "--workers", "1", "--exit-when-done", "--submit"])
        .arg(&tasks)
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(120), cmd.output())
        .await
        .expect("rollout up stops within 120 s after its submit is refused")
        .unwrap();
    let log = std::fs::read_to_string(dir.path().join("state/logs/up.log")).unwrap_or_default();
    (out, log)
}

/// `rollout up --submit` with a task the gateway refuses stops (it does not sit there
/// with nothing to do) and exits non-zero with the gateway's reason, which names the
/// field. The terminal shows no routine log lines: they are in the state directory's
/// log file, warnings and errors on both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn up_exits_non_zero_when_its_submit_is_refused_and_logs_to_a_file() {
    let env = TestEnv::start(|_| {}).await;
    let (out, log) = up_with_a_refused_task(&env, &[]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "exit 0 after a refused submit: {stderr}"
    );
    assert!(
        stderr.contains("submitting the batch failed") && stderr.contains("spec.grader"),
        "{stderr}"
    );
    assert!(
        stderr.contains("logs/up.log"),
        "the log file is not named: {stderr}"
    );
    assert!(
        !stderr.contains(" INFO "),
        "info lines on the terminal: {stderr}"
    );
    assert!(
        log.contains(" INFO ") && log.contains("worker stopped"),
        "{log}"
    );
    assert!(!log.contains('\u{1b}'), "colour codes in the log file");

    // --log-format json: the file is JSON lines.
    let (out, log) = up_with_a_refused_task(&env, &["--log-format", "json"]).await;
    assert!(!out.status.success());
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(
        lines
            .iter()
            .any(|l| l["level"] == "INFO" && l["message"] == "worker stopped"),
        "{log}"
    );
}
