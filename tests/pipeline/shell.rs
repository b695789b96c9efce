//! The `shell` kind end to end: sandboxes made by INIT on the node, used and stopped by
//! RUN, a fresh one for EVAL, and the reaper after crashes and cancels.

use crate::eventually::eventually;
use std::path::Path;
use std::time::Duration;

use nix::sys::signal::Signal;
use rollout::domain::{Stage, Status, Task};
use rollout::sandbox::Label;

use crate::helpers::{TestEnv, json_answer, wait_gone};

fn shell(spec: serde_json::Value) -> Task {
    Task::new("shell", spec)
}

/// A task whose agent fixes `add` correctly when `right`, wrongly otherwise.
fn fix_task(right: bool) -> Task {
    let fix = if right { "a + b" } else { "a * b" };
    shell(serde_json::json!({
        "sandbox": {
            "files": {"calc/add.py": "def add(a, b):\n    return a - b\n"},
            "setup": ["test -f calc/add.py"],
        },
        "steps": [
            {"tool": "bash", "args": {"command": "cd calc && ls"}},
            {"tool": "file", "args": {"command": "str_replace", "path": "calc/add.py",
                                      "old_str": "a - b", "new_str": fix}},
            {"tool": "python", "args": {"code": "import sys; sys.path.insert(0, 'calc')\nimport add\nadd.add(2, 3)"}},
            {"tool": "bash", "args": {"command": "pwd"}},
        ],
        "check": {"command": "cd calc && python3 -c 'import add; assert add.add(2, 3) == 5'"},
    }))
}

fn root(env: &TestEnv) -> std::path::PathBuf {
    env.deps.settings.sandbox_root()
}

/// Sandbox directories left under the node's root.
fn leftovers(root: &Path) -> Vec<String> {
    Label::dirs(root)
        .iter()
        .map(|d| d.file_name().unwrap().to_string_lossy().into_owned())
        .collect()
}

/// Nothing of any sandbox is left: no directory, no row, no process.
async fn assert_no_sandboxes(env: &TestEnv, labels: &[Label]) {
    let reaped = env.deps.sandboxes.reap(false).await.unwrap();
    assert!(
        leftovers(&root(env)).is_empty(),
        "left: {:?} (reaped {reaped:?})",
        leftovers(&root(env))
    );
    assert!(
        env.deps
            .store
            .sandboxes_of_node("test-node")
            .await
            .unwrap()
            .is_empty()
    );
    for l in labels {
        for pid in [l.live_pid(), l.live_ns_init()].into_iter().flatten() {
            assert!(
                rollout::sandbox::label::is_zombie(pid),
                "process {pid} of {} survived",
                l.job_id
            );
        }
    }
}

/// Waits until the job's RUN sandbox has a label, and returns it.
async fn wait_label(env: &TestEnv, job_id: &str) -> Label {
    let dir = &root(env).join(job_id);
    let what = format!("a sandbox started for {job_id}");
    eventually(&what, Duration::from_secs(20), || async move {
        match Label::read(dir) {
            Ok(Some(l)) if l.pid.is_some() => Ok(l),
            other => Err(format!("{other:?}")),
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_shell_jobs_get_the_rewards_their_changes_earn() {
    let env = TestEnv::start(|s| {
        s.stages.init.concurrency = 8;
        s.stages.run.concurrency = 8;
        s.stages.eval.concurrency = 8;
    })
    .await;
    env.workers_in_process(1);
    let tasks: Vec<Task> = (0..100usize)
        .map(|i| {
            let mut t = fix_task(!i.is_multiple_of(3));
            t.client_id = Some(format!("job-{i}"));
            t
        })
        .collect();
    env.submit(&tasks, "shell100").await;
    let results = env
        .wait_results("shell100", 100, Duration::from_secs(600))
        .await;
    assert_eq!(results.len(), 100);
    for r in &results {
        let i: usize = r.client_id.as_deref().unwrap()[4..].parse().unwrap();
        assert_eq!(r.status, Status::Done, "{r:?}");
        let expected = if i.is_multiple_of(3) { 0.0 } else { 1.0 };
        assert_eq!(r.reward, Some(expected), "job {i}: {r:?}");
    }
    // One job's record in full: the observations and their latencies.
    let view = env.client.job(&results[0].job_id).await.unwrap();
    let run = view.job.run_output.unwrap();
    let steps = run["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 4);
    assert_eq!(steps[0]["observation"]["output"], "add.py\n");
    assert_eq!(
        steps[2]["observation"]["value"],
        if results[0].reward == Some(1.0) {
            "5"
        } else {
            "6"
        }
    );
    assert!(steps.iter().all(|s| s["latency_us"].as_u64().unwrap() > 0));
    let files = run["export"]["files"].as_array().unwrap();
    assert!(
        files
            .iter()
            .any(|f| f["path"] == "calc/add.py" && f["status"] == "modified"),
        "{}",
        run["export"]
    );
    let init = view.job.init_output.unwrap();
    assert_eq!(init["sandbox"]["backend"], "bwrap");
    assert_no_sandboxes(&env, &[]).await;
}

/// Starts INIT and EVAL workers in this process and a RUN worker as a process of its
/// own, submits a task whose first step sleeps `sleep_secs`, and waits until RUN runs
/// it: the worker's index, the job ids and the sandbox's label.
async fn running_in_a_worker_process(
    env: &mut TestEnv,
    sleep_secs: u32,
    batch: &str,
) -> (usize, Vec<String>, Label) {
    env.stage_workers_in_process(Stage::Init, 1);
    env.stage_workers_in_process(Stage::Eval, 1);
    let victim = env.spawn_worker_process(Stage::Run);
    let mut task = fix_task(true);
    if let Some(steps) = task.spec["steps"].as_array_mut() {
        let sleep = format!("sleep {sleep_secs}");
        steps.insert(
            0,
            serde_json::json!({"tool": "bash", "args": {"command": sleep}}),
        );
    }
    let ids = env.submit(&[task], batch).await;
    env.wait_job(&ids[0], "running in RUN", |j| {
        j.status == Status::Running && j.stage == Stage::Run
    })
    .await;
    let label = wait_label(env, &ids[0]).await;
    (victim, ids, label)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_worker_killed_mid_run_leaves_no_sandbox_behind() {
    let mut env = TestEnv::start(|s| s.queue.ack_wait_ms = 1_500).await;
    let (victim, ids, first) = running_in_a_worker_process(&mut env, 3, "killrun").await;
    env.signal_worker(victim, Signal::SIGKILL);
    env.wait_worker(victim).await;
    env.spawn_worker_process(Stage::Run);

    let results = env
        .wait_results("killrun", 1, Duration::from_secs(120))
        .await;
    assert_eq!(results[0].status, Status::Done, "{:?}", results[0]);
    assert_eq!(results[0].reward, Some(1.0));
    let view = env.client.job(&ids[0]).await.unwrap();
    assert_eq!(
        view.job.restarts, 1,
        "the half-used sandbox was not reused: {:?}",
        view.events
    );
    assert_no_sandboxes(&env, &[first]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_removes_the_sandbox() {
    let env = TestEnv::start(|_| {}).await;
    env.workers_in_process(1);
    let task = shell(serde_json::json!({
        "steps": [{"tool": "bash", "args": {"command": "sleep 100000"}, "timeout_ms": 600000}],
        "check": {"command": "true"},
    }));
    let ids = env.submit(&[task], "cancel").await;
    env.wait_job(&ids[0], "running in RUN", |j| {
        j.status == Status::Running && j.stage == Stage::Run
    })
    .await;
    let label = wait_label(&env, &ids[0]).await;
    env.client.cancel(&ids[0]).await.unwrap();
    let results = env.wait_results("cancel", 1, Duration::from_secs(60)).await;
    assert_eq!(results[0].status, Status::Cancelled);
    // The worker's cleanup stops the sandbox as the stage ends.
    let dir = root(&env).join(&ids[0]);
    wait_gone(&dir, Duration::from_secs(20)).await;
    assert!(!dir.exists(), "the cancelled job's sandbox is still there");
    assert_no_sandboxes(&env, &[label]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_job_waiting_for_run_loses_its_sandbox_to_the_reaper() {
    let env = TestEnv::start(|s| s.sandbox.reaper_interval_ms = 100).await;
    env.stage_workers_in_process(Stage::Init, 1);
    tokio::spawn(env.deps.sandboxes.clone().run_reaper(env.shutdown.clone()));
    let ids = env.submit(&[fix_task(true)], "idle").await;
    env.wait_job(&ids[0], "queued for RUN", |j| {
        j.status == Status::Queued && j.stage == Stage::Run
    })
    .await;
    let label = wait_label(&env, &ids[0]).await;
    env.client.cancel(&ids[0]).await.unwrap();
    let dir = root(&env).join(&ids[0]);
    wait_gone(&dir, Duration::from_secs(20)).await;
    assert!(!dir.exists(), "the reaper left the cancelled job's sandbox");
    assert_no_sandboxes(&env, &[label]).await;
}

/// Runs one job until it waits for RUN, kills its sandbox (as a node restart would), then
/// lets RUN start, and returns its result and job row.
async fn lose_the_sandbox(max_restarts: i64) -> (rollout::domain::JobResult, rollout::domain::Job) {
    let env = TestEnv::start(|s| s.sandbox.max_restarts = max_restarts).await;
    env.stage_workers_in_process(Stage::Init, 1);
    env.stage_workers_in_process(Stage::Eval, 1);
    let ids = env.submit(&[fix_task(true)], "lost").await;
    env.wait_job(&ids[0], "queued for RUN", |j| {
        j.status == Status::Queued && j.stage == Stage::Run
    })
    .await;
    let label = wait_label(&env, &ids[0]).await;
    label.kill();
    label.wait_gone(Duration::from_secs(5)).await;
    env.stage_workers_in_process(Stage::Run, 1);
    let results = env.wait_results("lost", 1, Duration::from_secs(120)).await;
    let job = env.client.job(&ids[0]).await.unwrap().job;
    assert_no_sandboxes(&env, &[label]).await;
    (results[0].clone(), job)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_sandbox_sends_the_job_back_to_init() {
    let (result, job) = lose_the_sandbox(2).await;
    assert_eq!(result.status, Status::Done, "{result:?}");
    assert_eq!(result.reward, Some(1.0));
    assert_eq!(job.restarts, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_whose_sandbox_is_lost_too_often_fails_with_the_reason() {
    let (result, job) = lose_the_sandbox(0).await;
    assert_eq!(result.status, Status::Failed, "{result:?}");
    let e = result.error.unwrap();
    assert!(
        e.contains("sandbox is gone") && e.contains("giving up"),
        "{e}"
    );
    assert_eq!(job.restarts, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_shell_specs_are_refused_with_the_field_named() {
    let env = TestEnv::start(|_| {}).await;
    let bad = [
        (serde_json::json!({"steps": []}), "check"),
        (
            serde_json::json!({"steps": [{"tool": "bash", "args": {"cmd": "ls"}}], "check": {"command": "true"}}),
            "steps[0].args",
        ),
        (
            serde_json::json!({"steps": [{"tool": "rm", "args": {}}], "check": {"command": "true"}}),
            "steps[0].tool",
        ),
        (
            serde_json::json!({"sandbox": {"files": {"/etc/x": ""}}, "check": {"command": "true"}}),
            "sandbox.files",
        ),
    ];
    crate::helpers::assert_specs_refused(&env, "shell", &bad).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repository_task_is_cloned_at_its_commit_and_scored_on_its_diff() {
    let env = TestEnv::start(|_| {}).await;
    env.workers_in_process(1);
    // A repository on the node with two commits; the task pins the first.
    let repo = env.dir.path().join("upstream");
    std::fs::create_dir_all(&repo).unwrap();
    let git = |args: &[&str]| {
        let out = std::process::Command::new("git")
            .arg("-C")
            .arg(&repo)
            .args([
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@t",
                "-c",
                "commit.gpgsign=false",
            ])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    git(&["init", "-q"]);
    std::fs::write(repo.join("VERSION"), "1\n").unwrap();
    std::fs::write(repo.join("logo.bin"), [0u8, 159, 146, 150]).unwrap();
    git(&["add", "-A"]);
    git(&["commit", "-q", "-m", "one"]);
    let first = git(&["rev-parse", "HEAD"]).trim().to_string();
    std::fs::write(repo.join("VERSION"), "2\n").unwrap();
    git(&["commit", "-qam", "two"]);
    let task = shell(serde_json::json!({
        "sandbox": {"repo": {"url": repo.display().to_string(), "commit": first}},
        "steps": [
            {"tool": "bash", "args": {"command": "cat VERSION && echo 1.1 > VERSION && printf '\\x01\\x02' > logo.bin && mkdir -p docs && echo hi > docs/new.md"}},
        ],
        "check": {"command": "test \"$(cat VERSION)\" = 1.1 && test -f docs/new.md && test \"$(od -An -tx1 logo.bin | tr -d ' ')\" = 0102"},
    }));
    let ids = env.submit(&[task], "repo").await;
    let results = env.wait_results("repo", 1, Duration::from_secs(120)).await;
    assert_eq!(results[0].status, Status::Done, "{:?}", results[0]);
    assert_eq!(results[0].reward, Some(1.0), "{:?}", results[0]);
    let run = env
        .client
        .job(&ids[0])
        .await
        .unwrap()
        .job
        .run_output
        .unwrap();
    assert_eq!(
        run["steps"][0]["observation"]["output"], "1\n",
        "the pinned commit was checked out"
    );
    assert_eq!(run["export"]["kind"], "git_diff");
    let diff = run["export"]["diff"].as_str().unwrap();
    assert!(
        diff.contains("+1.1") && diff.contains("docs/new.md") && diff.contains("GIT binary patch"),
        "{diff}"
    );
    assert_no_sandboxes(&env, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_waiting_for_run_on_a_dead_node_goes_back_to_init() {
    // No reaper renews the node's leases at first: to the reconciler, the node is dead.
    let env = TestEnv::start(|s| {
        s.sandbox.lease_ms = 1_500;
        s.sandbox.reaper_interval_ms = 500;
        s.sandbox.max_restarts = 5;
    })
    .await;
    env.stage_workers_in_process(Stage::Init, 1);
    let ids = env.submit(&[fix_task(true)], "deadnode").await;
    env.wait_job(&ids[0], "sent back to INIT by the reconciler", |j| {
        j.restarts >= 1
    })
    .await;
    // The node comes back: its reaper renews leases again, and RUN workers start.
    tokio::spawn(env.deps.sandboxes.clone().run_reaper(env.shutdown.clone()));
    env.stage_workers_in_process(Stage::Run, 1);
    env.stage_workers_in_process(Stage::Eval, 1);
    let results = env
        .wait_results("deadnode", 1, Duration::from_secs(120))
        .await;
    assert_eq!(results[0].status, Status::Done, "{:?}", results[0]);
    let view = env.client.job(&ids[0]).await.unwrap();
    assert!(view.job.restarts >= 1);
    assert!(
        view.events.iter().any(|e| e.event == "restarted"),
        "{:?}",
        view.events
    );
    assert_no_sandboxes(&env, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_mid_run_starts_the_job_again_without_using_up_its_restarts() {
    let mut env = TestEnv::start(|s| {
        s.stages.grace_ms = 300;
        s.sandbox.max_restarts = 0;
    })
    .await;
    let (victim, ids, first) = running_in_a_worker_process(&mut env, 5, "term").await;
    // Twice, as a cancelled Slurm job delivers it (to every process of the job, and
    // again through its batch script): the repeat is the same request, not "exit now".
    env.signal_worker(victim, Signal::SIGTERM);
    tokio::time::sleep(Duration::from_millis(100)).await;
    env.signal_worker(victim, Signal::SIGTERM);
    assert_eq!(
        env.wait_worker(victim).await,
        Some(0),
        "{}",
        env.worker_log(Stage::Run, victim)
    );
    env.spawn_worker_process(Stage::Run);
    let results = env.wait_results("term", 1, Duration::from_secs(120)).await;
    // With max_restarts = 0, a counted restart would have failed the job.
    assert_eq!(results[0].status, Status::Done, "{:?}", results[0]);
    assert_eq!(env.client.job(&ids[0]).await.unwrap().job.restarts, 0);
    assert_no_sandboxes(&env, &[first]).await;
}

/// A stale INIT attempt whose sandbox start comes after a newer attempt made the job's
/// RUN sandbox (its lease lapsed while it waited, under load) is refused, and leaves the
/// newer sandbox alone: RUN connects to it. (Seen once under load: the stale start
/// replaced the newer sandbox, and RUN found it gone.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_init_attempt_never_replaces_a_newer_run_sandbox() {
    use rollout::sandbox::{Purpose, SandboxError, SandboxSpec};
    let env = TestEnv::start(|_| {}).await;
    let sandboxes = &env.deps.sandboxes;
    let spec: SandboxSpec =
        serde_json::from_value(serde_json::json!({"files": {"fix.py": "base\n"}})).unwrap();
    let job = "0193aaaa-init-race";
    let newer = sandboxes.start(job, &spec, Purpose::Run, 6).await.unwrap();
    sh(&newer.client, "echo newer > fix.py").await;
    let stale = sandboxes.start(job, &spec, Purpose::Run, 5).await;
    assert!(
        matches!(&stale, Err(SandboxError::Unavailable(m)) if m.contains("newer attempt")),
        "{:?}",
        stale.as_ref().err()
    );
    // The newer sandbox still answers, and RUN finds it.
    assert_eq!(sh(&newer.client, "cat fix.py").await, "newer\n");
    let run = sandboxes.connect(job, 6).await.unwrap();
    assert_eq!(sh(&run, "cat fix.py").await, "newer\n");
    sandboxes.remove(job, Purpose::Run, Some(6)).await;
    drop((newer, run));
}

/// A stale EVAL attempt (its lease lapsed while it went on working) and the attempt that
/// took over each get a sandbox of their own: the newer start neither stops the older
/// sandbox nor starts in the workspace the older one is changing (which once applied an
/// agent's patch twice and scored a correct fix 0), and each removes only its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_eval_attempts_of_one_job_never_share_a_sandbox() {
    use rollout::sandbox::{Purpose, SandboxSpec};
    let env = TestEnv::start(|_| {}).await;
    let sandboxes = &env.deps.sandboxes;
    let spec: SandboxSpec =
        serde_json::from_value(serde_json::json!({"files": {"fix.py": "base\n"}})).unwrap();
    let job = "0193aaaa-eval-race";
    let stale = sandboxes.start(job, &spec, Purpose::Eval, 5).await.unwrap();
    sh(&stale.client, "echo patched > fix.py").await;
    let newer = sandboxes.start(job, &spec, Purpose::Eval, 6).await.unwrap();
    assert_eq!(
        sh(&newer.client, "cat fix.py").await,
        "base\n",
        "the newer attempt's workspace is fresh"
    );
    assert_eq!(
        sh(&stale.client, "cat fix.py").await,
        "patched\n",
        "the older sandbox still runs"
    );
    // The stale attempt ends and removes its sandbox: the newer one is untouched.
    sandboxes.remove(job, Purpose::Eval, Some(5)).await;
    assert!(
        stale.client.ping().await.is_err(),
        "the stale sandbox is gone"
    );
    newer.client.ping().await.unwrap();
    assert_eq!(sh(&newer.client, "cat fix.py").await, "base\n");
    let labels = [stale.label.clone(), newer.label.clone()];
    drop((stale, newer));
    sandboxes.remove(job, Purpose::Eval, Some(6)).await;
    assert_no_sandboxes(&env, &labels).await;
}

/// Runs `command` in the sandbox and returns its output.
async fn sh(client: &rollout::sandbox::SandboxClient, command: &str) -> String {
    let args = rollout::sandbox::protocol::ExecArgs {
        env: Default::default(),
        command: command.into(),
        max_output_bytes: None,
        shell_state: false,
        printable: false,
    };
    client.exec(&args, None).await.unwrap().output
}

/// A task's `sandbox.limits` above the operator's maximums (`sandbox.max_limits`) — a
/// 1e15-byte workspace, a limit lifted with 0 where the operator set a ceiling, a
/// workspace too small for a filesystem — is refused at submit with a 400 naming the
/// limit and the maximum, by `POST /v1/jobs` and `POST /v1/batches` alike, rather than
/// failing INIT five times; limits within them, and 0 where the operator's maximum is
/// 0, are accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_limits_above_the_operators_maximums_are_refused_at_submit() {
    let env = TestEnv::start(|s| {
        s.reconciler.enabled = false;
        s.sandbox.max_limits.workspace_bytes = 100 << 30;
        s.sandbox.max_limits.cpu_seconds = 0; // no ceiling: 0 (unlimited) allowed
    })
    .await;
    let task = |limits: serde_json::Value| {
        serde_json::json!({
            "kind": "shell",
            "spec": {
                "sandbox": {"limits": limits},
                "steps": [],
                "check": {"command": "true"}
            }
        })
    };
    let max = (100u64 << 30).to_string();
    let refused = [
        (
            serde_json::json!({"workspace_bytes": 1_000_000_000_000_000u64}),
            "workspace_bytes",
            max.as_str(),
        ),
        (
            serde_json::json!({"memory_bytes": 0}),
            "memory_bytes",
            "0 (no limit)",
        ),
        (
            serde_json::json!({"processes": 0}),
            "processes",
            "0 (no limit)",
        ),
        (
            serde_json::json!({"workspace_bytes": 4096}),
            "workspace_bytes",
            "not a workspace",
        ),
    ];
    let http = reqwest::Client::new();
    for (limits, name, words) in &refused {
        let field = format!("spec.sandbox.limits.{name}");
        let (status, body) = json_answer(
            http.post(format!("{}/v1/jobs", env.base))
                .json(&serde_json::json!({"tasks": [task(limits.clone())]})),
            "submit",
        )
        .await;
        assert_eq!(status, 400, "{limits}: {body}");
        assert_eq!(body["field"], format!("tasks[0].{field}"), "{body}");
        let error = body["error"].as_str().unwrap();
        assert!(error.contains(words) && error.contains(name), "{error}");
        let (status, body) = json_answer(
            http.post(format!("{}/v1/batches", env.base))
                .json(&serde_json::json!({
                    "prompts": [task(limits.clone())],
                    "group_size": 2,
                    "target_groups": 1,
                })),
            "batch",
        )
        .await;
        assert_eq!(status, 400, "{limits}: {body}");
        assert_eq!(body["field"], format!("prompts[0].{field}"), "{body}");
    }
    let (status, body) = json_answer(
        http.post(format!("{}/v1/jobs", env.base))
            .json(&serde_json::json!({
                "batch_id": "within",
                "tasks": [task(serde_json::json!({
                    "workspace_bytes": 100u64 << 30,
                    "memory_bytes": 1u64 << 30,
                    "cpu_seconds": 0,
                }))]
            })),
        "submit within the maximums",
    )
    .await;
    assert_eq!(status, 201, "{body}");
}
