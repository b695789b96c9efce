//! Launchers made ahead of time (`sandbox.launcher_pool`): a sandbox started from one is
//! the launcher's process, in the launcher's cgroup with the sandbox's own limits and
//! user; and whatever way a start or the pool ends (a cancelled start, a closed pool,
//! the owning process killed with SIGKILL), no launcher, sandbox or cgroup is left.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rollout_sandbox::bwrap::BwrapRuntime;
use rollout_sandbox::cgroup::Cgroups;
use rollout_sandbox::launcher::LauncherPool;
use rollout_sandbox::{Label, RuntimeKind, SandboxRuntime, StartRequest};

use crate::helpers::{TestSandbox, request};

/// A bwrap runtime with a pool of `depth` launchers.
fn runtime(depth: usize) -> BwrapRuntime {
    BwrapRuntime {
        launchers: LauncherPool::new(depth),
        ..Default::default()
    }
}

/// Whether `pid` is a running process (not gone, not a zombie).
fn running(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists() && !rollout_sandbox::label::is_zombie(pid)
}

/// Waits (up to a generous deadline, for a loaded machine) until `done` holds, and
/// fails with `what` if it never does.
async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Starts and stops one sandbox on `rt` (the pool's first start makes its launcher on
/// its path and has the pool filled), then waits until `depth` launchers are ready.
async fn filled(rt: &BwrapRuntime, depth: usize) {
    let (_root, req) = request(RuntimeKind::Bwrap, &[]);
    let sb = rt.start(&req).await.expect("the first start");
    drop(sb.client);
    rollout_sandbox::Runtimes::default()
        .stop(&req.dir)
        .await
        .unwrap();
    eventually("the pool fills", || rt.launchers.ready() == depth).await;
}

/// The value of `file` in the first of `dirs` that has it.
fn cgroup_value(dirs: &[PathBuf], file: &str) -> Option<String> {
    dirs.iter()
        .find_map(|d| std::fs::read_to_string(d.join(file)).ok())
        .map(|s| s.trim().to_string())
}

/// The real user id of `pid`.
fn uid_of(pid: i32) -> u32 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|u| u.parse().ok())
        .unwrap()
}

#[tokio::test]
async fn a_sandbox_from_a_launcher_is_the_launcher_in_its_cgroup_with_its_limits_and_user() {
    let rt = runtime(1);
    filled(&rt, 1).await;
    let ready = rt.launchers.ready_launchers();
    let [(launcher, launcher_cgroups)] = &ready[..] else {
        panic!("one launcher ready: {ready:?}");
    };
    let (launcher, launcher_cgroups) = (*launcher, launcher_cgroups.clone());
    let (root, mut req) = request(RuntimeKind::Bwrap, &[("a.txt", "a")]);
    req.limits.memory_bytes = 256 << 20;
    req.limits.processes = 64;
    let sb = rt.start(&req).await.expect("a start from the launcher");
    let t = TestSandbox { sb, _root: root };
    let label = &t.sb.label;
    assert_eq!(
        label.pid,
        Some(launcher),
        "the sandbox's root process is the launcher that was ready"
    );
    let exe = std::fs::read_link(format!("/proc/{launcher}/exe")).unwrap();
    assert!(
        exe.file_name().is_some_and(|n| n == "bwrap"),
        "the launcher became bwrap: {}",
        exe.display()
    );
    assert_eq!(
        rt.launchers.misses(),
        1,
        "only the first start found none ready"
    );
    let r =
        t.sb.client
            .bash("cat a.txt; echo $$", Some(Duration::from_secs(30)))
            .await
            .unwrap();
    assert!(r.output.starts_with('a'), "{r:?}");
    if Cgroups::probe(None).enforced() {
        assert_eq!(
            label.cgroups, launcher_cgroups,
            "the sandbox's cgroups are the launcher's"
        );
        for d in &label.cgroups {
            let procs = std::fs::read_to_string(d.join("cgroup.procs")).unwrap();
            for pid in [Some(launcher), label.ns_init].into_iter().flatten() {
                assert!(
                    procs.lines().any(|l| l.trim() == pid.to_string()),
                    "process {pid} is in {}: {procs}",
                    d.display()
                );
            }
        }
        let memory = cgroup_value(&label.cgroups, "memory.max")
            .or_else(|| cgroup_value(&label.cgroups, "memory.limit_in_bytes"));
        assert_eq!(memory, Some((256u64 << 20).to_string()));
        assert_eq!(
            cgroup_value(&label.cgroups, "pids.max"),
            Some("64".to_string())
        );
    }
    if nix::unistd::geteuid().is_root() {
        let uid = label
            .uid
            .expect("a root worker's sandbox has a user of its own");
        assert_eq!(uid_of(launcher), uid, "bwrap runs as the sandbox's user");
    }
    let dirs = label.cgroups.clone();
    t.stop().await;
    assert!(dirs.iter().all(|d| !d.exists()), "stop removes the cgroups");
    rt.launchers.close();
}

#[tokio::test]
async fn cancelled_starts_and_a_closed_pool_leave_no_launcher_or_cgroup() {
    let rt = runtime(2);
    filled(&rt, 2).await;
    let mut seen: Vec<(i32, Vec<PathBuf>)> = rt.launchers.ready_launchers();
    // Cancelled at different points of the start: whatever it had made goes with it.
    for wait_us in [0u64, 200, 1_000, 3_000, 10_000] {
        let (_root, req) = request(RuntimeKind::Bwrap, &[]);
        let ready_before = rt.launchers.ready_launchers();
        let _ = tokio::time::timeout(Duration::from_micros(wait_us), rt.start(&req)).await;
        // A start that finished anyway is stopped like any other.
        rollout_sandbox::Runtimes::default()
            .stop(&req.dir)
            .await
            .unwrap();
        let still: Vec<i32> = rt.launchers.ready_launchers().iter().map(|l| l.0).collect();
        for (pid, dirs) in ready_before.iter().filter(|(p, _)| !still.contains(p)) {
            eventually(&format!("the taken launcher {pid} ends"), || !running(*pid)).await;
            assert!(dirs.iter().all(|d| !d.exists()), "its cgroups go: {dirs:?}");
        }
        seen.extend(rt.launchers.ready_launchers());
    }
    eventually("the pool is refilled", || rt.launchers.filling() == 0).await;
    seen.extend(rt.launchers.ready_launchers());
    rt.launchers.close();
    for (pid, dirs) in &seen {
        eventually(&format!("launcher {pid} ends"), || !running(*pid)).await;
        eventually(&format!("the cgroups of launcher {pid} go"), || {
            dirs.iter().all(|d| !d.exists())
        })
        .await;
    }
    let (_root, req) = request(RuntimeKind::Bwrap, &[]);
    let sb = rt
        .start(&req)
        .await
        .expect("a closed pool still starts sandboxes");
    assert!(
        rt.launchers.ready() == 0 && rt.launchers.filling() == 0,
        "a closed pool makes no launchers"
    );
    drop(sb.client);
    rollout_sandbox::Runtimes::default()
        .stop(&req.dir)
        .await
        .unwrap();
}

/// Set in the process the SIGKILL test kills.
const OWNER: &str = "ROLLOUT_TEST_LAUNCHER_OWNER";

/// In the process the SIGKILL test starts: fills a pool, starts a sandbox that ends with
/// this process from one of its launchers, prints the pids and cgroups that must go with
/// it (`pid <n>`, `cgroup <dir>`), then waits to be killed.
async fn own_a_pool(dir: &Path) {
    let rt = runtime(2);
    filled(&rt, 2).await;
    let id = uuid::Uuid::new_v4().simple().to_string();
    let sdir = dir.join(&id[..12]);
    std::fs::create_dir_all(sdir.join("workspace")).unwrap();
    let (_r, template) = request(RuntimeKind::Bwrap, &[]);
    let req = StartRequest {
        label: Label::new(&id, "test-node", RuntimeKind::Bwrap, &sdir),
        dir: sdir,
        die_with_parent: true,
        ..template
    };
    let sb = rt.start(&req).await.expect("a start from the pool");
    eventually("the pool is refilled", || rt.launchers.filling() == 0).await;
    let mut lines = Vec::new();
    for pid in [sb.label.pid, sb.label.ns_init].into_iter().flatten() {
        lines.push(format!("pid {pid}"));
    }
    for (pid, dirs) in rt.launchers.ready_launchers() {
        lines.push(format!("pid {pid}"));
        lines.extend(dirs.iter().map(|d| format!("cgroup {}", d.display())));
    }
    lines.extend(
        sb.label
            .cgroups
            .iter()
            .map(|d| format!("cgroup {}", d.display())),
    );
    println!("{}\nready", lines.join("\n"));
    std::future::pending::<()>().await;
}

#[tokio::test]
async fn sigkill_of_the_owner_leaves_no_launcher_sandbox_or_cgroup() {
    use std::io::BufRead;
    if let Some(dir) = std::env::var_os(OWNER) {
        own_a_pool(Path::new(&dir)).await;
        return;
    }
    let dir = tempfile::Builder::new().prefix("rsb").tempdir().unwrap();
    let mut owner = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "launchers::sigkill_of_the_owner_leaves_no_launcher_sandbox_or_cgroup",
            "--exact",
            "--nocapture",
        ])
        .env(OWNER, dir.path())
        .env("ROLLOUT_TEST_SANDBOX_BIN", crate::helpers::server_bin())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut pids = Vec::new();
    let mut cgroups = Vec::new();
    for line in std::io::BufReader::new(owner.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if line == "ready" {
            break;
        }
        if let Some(p) = line.strip_prefix("pid ") {
            pids.push(p.parse::<i32>().unwrap());
        } else if let Some(c) = line.strip_prefix("cgroup ") {
            cgroups.push(PathBuf::from(c));
        }
    }
    assert!(pids.len() >= 3, "a sandbox and launchers ready: {pids:?}");
    assert!(
        pids.iter().all(|p| running(*p)),
        "all running before the kill"
    );
    owner.kill().unwrap();
    owner.wait().unwrap();
    for pid in &pids {
        eventually(&format!("process {pid} of the killed owner ends"), || {
            !running(*pid)
        })
        .await;
    }
    // What a killed owner cannot remove itself goes with the next pool made on the
    // node (its first refill looks for dead owners' launcher cgroups).
    if Cgroups::probe(None).enforced() {
        let rt = runtime(1);
        filled(&rt, 1).await;
        eventually("the killed owner's cgroups go", || {
            cgroups.iter().all(|d| !d.exists())
        })
        .await;
        rt.launchers.close();
    }
}

#[tokio::test]
async fn two_pools_of_one_process_never_share_a_launcher_cgroup() {
    if !Cgroups::probe(None).enforced() {
        crate::prerequisite::missing(
            "two_pools_of_one_process_never_share_a_launcher_cgroup",
            "this machine gives the worker no cgroups",
        );
        return;
    }
    let (a, b) = (runtime(1), runtime(1));
    filled(&a, 1).await;
    filled(&b, 1).await;
    let (of_a, of_b) = (a.launchers.ready_launchers(), b.launchers.ready_launchers());
    let (pid_b, dirs_b) = of_b[0].clone();
    assert!(
        of_a[0].1.iter().all(|d| !dirs_b.contains(d)),
        "{of_a:?} and {of_b:?} share a cgroup"
    );
    // Closing one pool removes its launchers' cgroups, killing what is in them: the
    // other pool's launcher must not be there.
    a.launchers.close();
    assert!(running(pid_b), "the other pool's launcher lives on");
    assert!(dirs_b.iter().all(|d| d.exists()));
    b.launchers.close();
}
