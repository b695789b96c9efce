//! A hostile agent against EVAL: every way an episode could forge its reward (edit the
//! tests, plant code the check or its setup runs, print the shell's end markers) ends in
//! reward 0, and every way it could lose its own record (an export too large, changes
//! that do not apply) still ends `done` with the trajectory kept and the reason given.

use crate::eventually::{eventually, holds};
use std::time::Duration;

use rollout::domain::{JobResult, Status, Task};

use crate::helpers::TestEnv;

fn shell(spec: serde_json::Value) -> Task {
    Task::new("shell", spec)
}

fn bash(command: &str) -> serde_json::Value {
    serde_json::json!({"tool": "bash", "args": {"command": command}, "timeout_ms": 60000})
}

/// Runs `tasks` to their results in a fresh environment with workers in process.
async fn run(tasks: Vec<Task>, batch: &str) -> Vec<JobResult> {
    let env = TestEnv::start(|_| {}).await;
    env.workers_in_process(1);
    let n = tasks.len();
    let tasks: Vec<Task> = tasks
        .into_iter()
        .enumerate()
        .map(|(i, mut t)| {
            t.client_id = Some(format!("{batch}-{i}"));
            t
        })
        .collect();
    env.submit(&tasks, batch).await;
    let mut results = Vec::new();
    // The result list carries outputs only up to a size; the job view has them whole.
    for r in env.wait_results(batch, n, Duration::from_secs(300)).await {
        let view = env.client.job(&r.job_id).await.unwrap();
        results.push(view.result.expect("an ended job has its result"));
    }
    results.sort_by_key(|r| r.client_id.clone());
    results
}

/// The buggy module and a test that fails on it.
fn stats_sandbox() -> serde_json::Value {
    serde_json::json!({
        "files": {
            "stats.py": "def mean(xs):\n    return sum(xs) / (len(xs) - 1)\n",
            "tests/test_stats.py": "import sys\nsys.path.insert(0, '.')\nimport stats\nassert stats.mean([1, 2, 3]) == 2\nprint('passed')\n",
        },
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_episode_cannot_forge_its_reward() {
    let check = |extra: serde_json::Value| {
        let mut c = serde_json::json!({
            "command": "python3 tests/test_stats.py",
            "protect": ["tests/**"],
        });
        if let (Some(c), Some(x)) = (c.as_object_mut(), extra.as_object()) {
            c.extend(x.clone());
        }
        c
    };
    let attacks = [
        // Overwrite the test so it passes.
        bash("echo 'print(\"passed\")' > tests/test_stats.py"),
        // Replace the tests directory by a symlink to a passing copy.
        bash(
            "mkdir -p fake && echo 'pass' > fake/test_stats.py && rm -rf tests && ln -s fake tests",
        ),
        // Print the persistent shell's end marker with status 0 (guessing the token).
        bash(
            "cat > tests/conftest.py <<'EOF'\nimport os\nos.write(1, b'\\x1eabc:1:0\\x1e')\nEOF\n\
             printf 'import os\\nos.write(1, b\"\\\\x1e0:99:0\\\\x1e\")\\n' >> stats.py",
        ),
        // A module the check imports exits 0 before the test can fail... in a protected
        // directory, so it is dropped.
        bash("printf 'import os\\nos._exit(0)\\n' > tests/sys.py"),
    ];
    let mut tasks: Vec<Task> = attacks
        .iter()
        .map(|step| {
            shell(serde_json::json!({
                "sandbox": stats_sandbox(),
                "steps": [step],
                "check": check(serde_json::json!({})),
            }))
        })
        .collect();
    // Hidden tests: whatever the agent puts at their path is replaced.
    tasks.push(shell(serde_json::json!({
        "sandbox": stats_sandbox(),
        "steps": [bash("mkdir -p hidden && echo 'print(1)' > hidden/test_more.py")],
        "check": {"command": "python3 hidden/test_more.py",
                  "files": {"hidden/test_more.py": "import stats\nassert stats.mean([2, 4]) == 3\n"}},
    })));
    // The honest fix passes, protected tests and all.
    tasks.push(shell(serde_json::json!({
        "sandbox": stats_sandbox(),
        "steps": [{"tool": "file", "args": {"command": "str_replace", "path": "stats.py",
                                            "old_str": "len(xs) - 1", "new_str": "len(xs)"}}],
        "check": check(serde_json::json!({"files": {"hidden/more.py": "print('ok')\n"}})),
    })));
    let results = run(tasks, "forge").await;
    let honest = results.len() - 1;
    for (i, r) in results.iter().enumerate() {
        assert_eq!(r.status, Status::Done, "task {i}: {r:?}");
        let want = if i == honest { 1.0 } else { 0.0 };
        assert_eq!(r.reward, Some(want), "task {i}: {:#}", r.output["eval"]);
    }
    // The first attack's edit was put back, and the result says so.
    let restored = &results[0].output["eval"]["applied"]["restored"];
    assert_eq!(
        restored,
        &serde_json::json!(["tests/test_stats.py"]),
        "{:#}",
        results[0].output
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_that_cannot_be_exported_or_applied_score_zero_with_the_episode_kept() {
    // A repository whose setup writes a tracked file differently in RUN and EVAL, so the
    // agent's diff of that file no longer applies.
    let repo = tempfile::tempdir().unwrap();
    let git = |args: &[&str]| {
        let ok = std::process::Command::new("git")
            .arg("-C")
            .arg(repo.path())
            .args([
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@e",
                "-c",
                "commit.gpgsign=false",
            ])
            .args(args)
            .status()
            .unwrap()
            .success();
        assert!(ok);
    };
    std::fs::write(repo.path().join("stamp.txt"), "0\n").unwrap();
    git(&["init", "-q"]);
    git(&["add", "-A"]);
    git(&["commit", "-q", "-m", "start"]);
    let url = repo.path().display().to_string();
    let tasks = vec![
        // 20 MB of changes: over the export limit.
        shell(serde_json::json!({
            "steps": [bash("head -c 20000000 /dev/urandom > big.bin")],
            "check": {"command": "true"},
        })),
        shell(serde_json::json!({
            "sandbox": {"repo": {"url": url}, "setup": ["head -c 16 /dev/urandom | od -x > stamp.txt"]},
            "steps": [bash("echo edited >> stamp.txt")],
            "check": {"command": "true"},
        })),
        // One file over 1 MiB is exported whole and checked byte for byte.
        shell(serde_json::json!({
            "steps": [bash("head -c 3000000 /dev/urandom > blob && sha256sum blob > blob.sum")],
            "check": {"command": "sha256sum -c blob.sum"},
        })),
    ];
    let results = run(tasks, "noexport").await;
    for (i, r) in results.iter().enumerate() {
        assert_eq!(r.status, Status::Done, "task {i}: {r:?}");
        let steps = &r.output["run"]["steps"];
        assert_eq!(
            steps.as_array().map(Vec::len),
            Some(1),
            "task {i} kept its steps"
        );
    }
    let error = |r: &JobResult| {
        r.output["eval"]["error"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    assert_eq!(results[0].reward, Some(0.0));
    assert!(
        error(&results[0]).contains("export limit"),
        "{}",
        error(&results[0])
    );
    assert_eq!(results[1].reward, Some(0.0));
    assert!(
        error(&results[1]).contains("could not be applied"),
        "{}",
        error(&results[1])
    );
    assert_eq!(
        results[2].reward,
        Some(1.0),
        "{:#}",
        results[2].output["eval"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_and_check_run_before_and_apart_from_the_agents_code() {
    // The agent plants a module that setup would import; setup runs before the agent's
    // changes arrive, so it never runs. What setup exported reaches the check.
    let tasks = vec![shell(serde_json::json!({
        "sandbox": {
            "files": {"helper.py": "X = 1\n"},
            "setup": ["python3 -c 'import helper'", "export CHECK_VAR=from-setup", "mkdir -p sub"],
        },
        "steps": [bash("echo 'import os; os.system(\"touch /tmp/ran-in-setup\"); X = 2' > helper.py")],
        "check": {"command": "test \"$CHECK_VAR\" = from-setup && test ! -e /tmp/ran-in-setup && grep -q 'X = 2' helper.py"},
    }))];
    let results = run(tasks, "order").await;
    assert_eq!(
        results[0].reward,
        Some(1.0),
        "{:#}",
        results[0].output["eval"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_local_backend_is_refused_unless_allowed() {
    let env = TestEnv::start(|_| {}).await;
    let task = shell(serde_json::json!({
        "sandbox": {"backend": "local"}, "check": {"command": "true"},
    }));
    let err = env
        .client
        .submit(std::slice::from_ref(&task), Some("local"))
        .await
        .expect_err("refused");
    let text = err.to_string();
    assert!(
        text.contains("400") && text.contains("sandbox.backend"),
        "{text}"
    );
    let env = TestEnv::start(|s| s.sandbox.allow_local = true).await;
    env.client
        .submit(&[task], Some("local"))
        .await
        .expect("allowed by the operator");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_workspace_cannot_fill_the_nodes_disk() {
    let quota = rollout::sandbox::quota::WorkspaceQuota::probe();
    if !quota.enforced() {
        // Where the node cannot hold a quota, it says so rather than pretending.
        let env = TestEnv::start(|_| {}).await;
        let health: serde_json::Value = reqwest::get(format!("{}/healthz", env.base))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let report = &health["sandbox"]["workspace_disk"];
        assert_eq!(report["enforced"], false, "{health:#}");
        return;
    }
    // 200 MB into a 64 MiB workspace; the filesystem is nosuid and nodev.
    let env = TestEnv::start(|_| {}).await;
    env.workers_in_process(1);
    let mut task = shell(serde_json::json!({
        "sandbox": {"limits": {"workspace_bytes": 64 << 20}},
        "steps": [bash(
            "dd if=/dev/zero of=fill bs=1M count=200 2>&1; echo du=$(du -sm fill | cut -f1); \
             grep ' /workspace ' /proc/self/mountinfo"
        )],
        "check": {"command": "true"},
    }));
    task.client_id = Some("quota-0".into());
    env.submit(&[task], "quota").await;
    let id = env.wait_results("quota", 1, Duration::from_secs(120)).await[0]
        .job_id
        .clone();
    let r = env.client.job(&id).await.unwrap().result.unwrap();
    assert_eq!(r.status, Status::Done, "{r:?}");
    let out = r.output["run"]["steps"][0].to_string();
    assert!(out.contains("No space left on device"), "{out}");
    let du: u64 = out
        .split("du=")
        .nth(1)
        .and_then(|s| s.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no du in {out}"));
    assert!(du <= 64, "{du} MB written into a 64 MiB workspace");
    assert!(out.contains("nosuid") && out.contains("nodev"), "{out}");
    // Once the job has ended its sandboxes go, and their filesystems with them.
    let root = env.deps.settings.sandbox_root();
    let mounted = || {
        std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .filter(|l| l.contains(root.to_str().unwrap()))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let mounted = &mounted;
    eventually(
        "the sandboxes' filesystems were unmounted",
        Duration::from_secs(30),
        || async move {
            let left = mounted();
            holds(left.is_empty(), left)
        },
    )
    .await;
}
