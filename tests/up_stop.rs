//! `rollout up` leaves nothing of its own behind when it stops: its nats-server child,
//! its sandboxes' processes, their loop-mounted workspaces and loop devices. Stopped with
//! SIGTERM, it removes every sandbox before it exits; killed (SIGKILL, which runs no
//! clean-up), its children end with it, and the next `rollout up` on the same state
//! removes what the killed one could not (the workspaces it had mounted).
//!
//! Each test runs its own `rollout up` in a directory of its own and looks only at what
//! names that directory (see `common/leftovers.rs`): other runs share the machine.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use rollout::client::Client;
use rollout::domain::{Stage, Status, Task};
use serde_json::json;

use host::{free_port, shared_tempdir};
use leftovers::{Service, assert_nothing_left};
use rollout_test_support::eventually::eventually;
use rollout_test_support::{host, leftovers};

const TOKEN: &str = "up-stop-test-token-0123456789";

/// `rollout up`'s settings file in `dir`: its state, database, gateway and a NATS port
/// nothing answers on (so it starts its own nats-server). Returns the config's path and
/// the gateway's URL.
fn config(dir: &Path) -> (PathBuf, String) {
    let port = free_port();
    let config = dir.join("rollout.toml");
    std::fs::write(
        &config,
        format!(
            "state_dir = \"{state}\"\n[database]\nurl = \"sqlite://{db}\"\n\
             [gateway]\nlisten = \"127.0.0.1:{port}\"\ntoken = \"{TOKEN}\"\n\
             [nats]\nurl = \"nats://127.0.0.1:{nats}\"\nprefix = \"upstop\"\n\
             [stages.run]\nconcurrency = 1\n",
            state = dir.join("state").display(),
            db = dir.join("rollout.db").display(),
            nats = free_port(),
        ),
    )
    .unwrap();
    (config, format!("http://127.0.0.1:{port}"))
}

/// Starts `rollout up` with `config` and waits until its gateway answers.
async fn start_up(config: &Path, url: &str, log: &Path) -> Service {
    let child = Command::new(env!("CARGO_BIN_EXE_rollout"))
        .arg("--config")
        .arg(config)
        .args(["up", "--workers", "1", "--logs-on-screen"])
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .expect("start rollout up");
    let mut up = Service::new(child, "rollout up");
    let health = format!("{url}/healthz");
    eventually("rollout up answers", Duration::from_secs(90), || {
        assert!(up.try_wait().is_none(), "rollout up exited: {}", tail(log));
        let health = health.clone();
        async move {
            match reqwest::get(&health).await {
                Ok(r) if r.status().is_success() => Ok(()),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;
    up
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text[text.len().saturating_sub(4000)..].to_string()
}

/// A job whose RUN holds its sandbox (and workspace) for as long as the test needs.
fn long_job() -> Task {
    Task::new(
        "shell",
        json!({
            "steps": [{"tool": "bash", "args": {"command": "sleep 600"}, "timeout_ms": 600_000}],
            "check": {"command": "true"},
        }),
    )
}

/// Submits two [`long_job`]s and waits until one's RUN holds its sandbox and the other's
/// sandbox, made by its INIT, waits for RUN (one job at a time there), both seen by the
/// leftover check (their processes, and as root their mounted workspaces with their
/// loop devices): otherwise the check after the stop would prove nothing. The waiting
/// one is what no stage holds when the stop comes.
async fn hold_sandboxes(url: &str, dir: &Path, log: &Path) {
    let client = Client::new(url).with_token(Some(TOKEN.into()));
    let ids: Vec<String> = client
        .submit(&[long_job(), long_job()], Some("hold"))
        .await
        .expect("submit")
        .jobs
        .into_iter()
        .map(|j| j.id)
        .collect();
    let root = nix::unistd::geteuid().is_root();
    eventually(
        "one job in RUN, the other's sandbox waiting for it",
        Duration::from_secs(120),
        || async {
            let mut running = 0;
            for id in &ids {
                let job = client.job(id).await.map_err(|e| e.to_string())?.job;
                if job.stage == Stage::Run && job.status == Status::Running {
                    running += 1;
                }
            }
            let left = leftovers::under(dir);
            let sandboxes = left
                .processes
                .iter()
                .filter(|p| p.contains("rollout-sandbox serve"))
                .count();
            let mounted = !root || (left.mounts.len() >= 2 && left.loop_devices.len() >= 2);
            if running == 1 && sandboxes >= 2 && mounted {
                Ok(())
            } else {
                Err(format!("{running} running; {left:#?}\n{}", tail(log)))
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_leaves_no_process_mount_or_loop_device_of_rollout_up() {
    let dir = shared_tempdir();
    let (config, url) = config(dir.path());
    let log = dir.path().join("up.log");
    let mut up = start_up(&config, &url, &log).await;
    hold_sandboxes(&url, dir.path(), &log).await;
    let status = up.stop().expect("rollout up exits");
    assert!(status.success(), "rollout up: {status}\n{}", tail(&log));
    assert_nothing_left(dir.path(), "rollout up stopped with SIGTERM").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_rollout_up_takes_its_children_and_the_next_one_clears_its_mounts() {
    let dir = shared_tempdir();
    let (config, url) = config(dir.path());
    let log = dir.path().join("up.log");
    let mut up = start_up(&config, &url, &log).await;
    hold_sandboxes(&url, dir.path(), &log).await;
    up.stop_with(nix::sys::signal::Signal::SIGKILL);
    // No process of its own outlives it: not its nats-server, not its sandboxes.
    eventually(
        "the killed rollout up's children ended",
        Duration::from_secs(30),
        || async {
            let left = leftovers::under(dir.path());
            if left.processes.is_empty() {
                Ok(())
            } else {
                Err(format!("{:#?}", left.processes))
            }
        },
    )
    .await;
    // The workspaces it had mounted are the next one's to remove.
    let log2 = dir.path().join("up-again.log");
    let mut again = start_up(&config, &url, &log2).await;
    let status = again.stop().expect("rollout up exits");
    assert!(status.success(), "rollout up: {status}\n{}", tail(&log2));
    assert_nothing_left(
        dir.path(),
        "rollout up killed, then started and stopped again",
    )
    .await;
}
