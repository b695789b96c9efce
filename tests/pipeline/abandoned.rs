//! Sandbox starts that never finish: a job cancelled, or its worker stopped, while its
//! sandbox is starting leaves nothing of that sandbox behind (no process, no mount, no
//! loop device, no cgroup, no directory).
//!
//! The start is held at its worst moment by a `bwrap` that waits at a gate before it
//! runs the real one: the sandbox's first process exists, and bwrap has not yet said
//! which namespace it made.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rollout::domain::{Stage, Status, Task};
use tokio_util::sync::CancellationToken;

use crate::eventually::{eventually, holds};
use crate::helpers::{TestEnv, processes_running};

/// A `bwrap` for the node that waits until `gate` exists, then runs the real one with
/// the same arguments and descriptors.
struct GatedBwrap {
    dir: tempfile::TempDir,
}

impl GatedBwrap {
    fn new() -> GatedBwrap {
        use std::os::unix::fs::PermissionsExt;
        let find = |name: &str| {
            std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
                .map(|d| d.join(name))
                .find(|p| p.is_file())
                .unwrap_or_else(|| panic!("{name} is not on PATH (scripts/setup.sh installs it)"))
        };
        let dir = tempfile::Builder::new().prefix("gate").tempdir().unwrap();
        // A root worker runs bwrap as the sandbox's own user, who must reach the script.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let gated = GatedBwrap { dir };
        let draft = gated.dir.path().join("draft");
        std::fs::write(
            &draft,
            format!(
                "#!/bin/sh\nwhile [ ! -e '{}' ]; do '{}' 0.05; done\nexec '{}' \"$@\"\n",
                gated.gate().display(),
                find("sleep").display(),
                find("bwrap").display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&draft, std::fs::Permissions::from_mode(0o755)).unwrap();
        // Copied by another process: a file this one had open for writing could be held
        // by a child another test forks meanwhile, and running it would fail as busy.
        let copied = std::process::Command::new("cp")
            .arg("-p")
            .arg(&draft)
            .arg(gated.program())
            .status()
            .unwrap();
        assert!(copied.success());
        gated
    }

    fn program(&self) -> PathBuf {
        self.dir.path().join("bwrap")
    }

    fn gate(&self) -> PathBuf {
        self.dir.path().join("open")
    }

    fn open(&self) {
        std::fs::write(self.gate(), "").unwrap();
    }
}

/// A shell task whose sandbox carries `mark` (in bwrap's arguments, so its processes can
/// be found).
fn marked_task(mark: &str) -> Task {
    Task::new(
        "shell",
        serde_json::json!({
            "sandbox": {"env": {"ROLLOUT_TEST_MARK": mark}},
            "steps": [{"tool": "bash", "args": {"command": "true"}}],
            "check": {"command": "true"},
        }),
    )
}

/// Lines of `text` that mention `root`.
fn mentioning(text: &str, root: &Path) -> Vec<String> {
    text.lines()
        .filter(|l| l.contains(root.to_str().unwrap()))
        .map(str::to_string)
        .collect()
}

/// Loop devices whose backing file is under `root`.
fn loop_devices_under(root: &Path) -> Vec<String> {
    let Ok(devices) = std::fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    devices
        .flatten()
        .filter_map(|d| std::fs::read_to_string(d.path().join("loop/backing_file")).ok())
        .filter(|f| f.contains(root.to_str().unwrap()))
        .collect()
}

/// Waits until nothing of job `id`'s sandbox is left on this node.
async fn nothing_left(env: &TestEnv, id: &str, mark: &str) {
    let root = env.deps.settings.sandbox_root();
    let dir = root.join(id);
    let cgroup = match &env.deps.sandboxes.runtimes().bwrap.cgroups {
        rollout::sandbox::cgroup::Cgroups::V2 { parent } => {
            vec![parent.join(format!("rollout-{id}"))]
        }
        rollout::sandbox::cgroup::Cgroups::V1 { memory, pids } => vec![
            memory.join(format!("rollout-{id}")),
            pids.join(format!("rollout-{id}")),
        ],
        rollout::sandbox::cgroup::Cgroups::Unavailable { .. } => Vec::new(),
    };
    let (root, dir, cgroup) = (&root, &dir, &cgroup);
    eventually(
        "nothing of the sandbox is left",
        Duration::from_secs(30),
        || async move {
            let mounts = mentioning(
                &std::fs::read_to_string("/proc/self/mountinfo").unwrap(),
                root,
            );
            let left = (
                processes_running(mark),
                mounts,
                loop_devices_under(root),
                cgroup.iter().filter(|c| c.exists()).collect::<Vec<_>>(),
                dir.exists(),
            );
            holds(
                left.0 == 0
                    && left.1.is_empty()
                    && left.2.is_empty()
                    && left.3.is_empty()
                    && !left.4,
                format!(
                    "processes {}, mounts {:?}, loop devices {:?}, cgroups {:?}, directory {}",
                    left.0, left.1, left.2, left.3, left.4
                ),
            )
        },
    )
    .await;
}

/// Starts an INIT worker (stopped by `stop`) on a node whose bwrap waits at a gate,
/// submits a marked job and waits until its sandbox's first process is held there.
async fn held_at_the_gate(stop: &CancellationToken) -> (TestEnv, GatedBwrap, String, String) {
    let gated = GatedBwrap::new();
    let program = gated.program();
    let env = TestEnv::start(move |s| {
        s.sandbox.bwrap = program;
        s.stages.grace_ms = 200;
    })
    .await;
    env.stage_workers_with(Stage::Init, 1, stop.clone());
    let mark = uuid::Uuid::new_v4().simple().to_string();
    let ids = env.submit(&[marked_task(&mark)], "gated").await;
    let mark_ref = &mark;
    eventually(
        "the sandbox's first process started",
        Duration::from_secs(30),
        || async move { holds(processes_running(mark_ref) > 0, "not yet") },
    )
    .await;
    let id = ids[0].clone();
    (env, gated, id, mark)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_cancelled_while_its_sandbox_starts_leaves_nothing_behind() {
    let stop = CancellationToken::new();
    let (env, gated, id, mark) = held_at_the_gate(&stop).await;
    env.client.cancel(&id).await.unwrap();
    let results = env.wait_results("gated", 1, Duration::from_secs(60)).await;
    assert_eq!(results[0].status, Status::Cancelled, "{:?}", results[0]);
    // Were anything of the start still running, it would now go on to a whole sandbox.
    gated.open();
    nothing_left(&env, &id, &mark).await;
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_stopped_while_a_sandbox_starts_leaves_nothing_behind() {
    let stop = CancellationToken::new();
    let (env, gated, id, mark) = held_at_the_gate(&stop).await;
    stop.cancel();
    env.wait_job(&id, "handed back to the queue", |j| {
        j.status == Status::Queued && j.stage == Stage::Init
    })
    .await;
    gated.open();
    nothing_left(&env, &id, &mark).await;
}
