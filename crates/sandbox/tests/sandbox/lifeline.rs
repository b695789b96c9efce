//! A bwrap sandbox that must end with its worker does, even when the worker dies while
//! bwrap waits on `--block-fd` for it to finish the start. bwrap asks for its own death
//! signal in the namespace's init only after that wait, and reads the go-ahead pipe
//! closing unwritten as a go-ahead: before the lifeline, a node killed there left bwrap,
//! the server and its shell running, holding their workspace's loop device. Here bwrap
//! runs with the arguments the backend gives it and the descriptors where the backend
//! puts them; the test plays the worker, holding the go-ahead and the lifeline.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::Duration;

use rollout_sandbox::bwrap::{BwrapRuntime, Descriptors};
use rollout_sandbox::{RuntimeKind, SandboxClient, StartRequest};

use crate::helpers;

/// What the test holds of a bwrap it started: the process, and the write ends the
/// worker would hold.
struct Held {
    child: Child,
    release: Option<OwnedFd>,
    lifeline: Option<OwnedFd>,
    /// The namespace's init, as bwrap reported it.
    ns_init: i32,
}

fn pipe() -> (OwnedFd, OwnedFd) {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap()
}

/// Starts bwrap for `req` as the backend would with a go-ahead and a lifeline (fds 3 to
/// 6: bwrap's report, the listening socket, the go-ahead, the lifeline), and waits for
/// its report, so the sandbox is built and held.
fn start_held(req: &StartRequest) -> Held {
    let rt = BwrapRuntime::default();
    let shell = std::fs::canonicalize("/bin/bash").unwrap();
    let listener = std::os::unix::net::UnixListener::bind(req.socket()).unwrap();
    let (info_read, info_write) = pipe();
    let (block_read, release) = pipe();
    let (lifeline_read, lifeline) = pipe();
    let log = std::fs::File::create(req.dir.join("server.log")).unwrap();
    let mut cmd = std::process::Command::new(&rt.program);
    let fds = Descriptors::plan(false, false, false, true, true);
    assert_eq!((fds.block, fds.lifeline), (Some(5), Some(6)));
    cmd.args(rt.args(req, &shell, &fds))
        .env_clear()
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log);
    let sources = [
        info_write.as_raw_fd(),
        listener.as_raw_fd(),
        block_read.as_raw_fd(),
        lifeline_read.as_raw_fd(),
    ];
    // SAFETY: fcntl, dup2 and close are async-signal-safe.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(move || {
            // Out of the way of the targets first, then into place (not close-on-exec).
            let mut high = [-1; 4];
            for (h, fd) in high.iter_mut().zip(sources) {
                *h = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 64);
                if *h < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            for (target, fd) in (3..).zip(high) {
                if libc::dup2(fd, target) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let child = cmd.spawn().expect("run bwrap");
    drop((info_write, listener, block_read, lifeline_read));
    let mut report = String::new();
    std::io::Read::read_to_string(&mut std::fs::File::from(info_read), &mut report).unwrap();
    let v: serde_json::Value = serde_json::from_str(&report)
        .unwrap_or_else(|e| panic!("bwrap's report {report:?}: {e}; log: {}", log_of(req)));
    Held {
        child,
        release: Some(release),
        lifeline: Some(lifeline),
        ns_init: i32::try_from(v["child-pid"].as_i64().unwrap()).unwrap(),
    }
}

fn log_of(req: &StartRequest) -> String {
    std::fs::read_to_string(req.dir.join("server.log")).unwrap_or_default()
}

/// Waits until bwrap has exited and its namespace's init is gone.
async fn ended(held: &mut Held, req: &StartRequest, what: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let exited = held.child.try_wait().unwrap().is_some();
        let init_gone = !Path::new(&format!("/proc/{}", held.ns_init)).exists()
            || rollout_sandbox::label::is_zombie(held.ns_init);
        if exited && init_gone {
            return;
        }
        if std::time::Instant::now() > deadline {
            let _ = held.child.kill();
            rollout_sandbox::label::kill_tree(held.ns_init);
            panic!(
                "{what}: the sandbox still runs (bwrap exited: {exited}); log: {}",
                log_of(req)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn request() -> (tempfile::TempDir, StartRequest) {
    let (root, mut req) = helpers::request(RuntimeKind::Bwrap, &[("a.txt", "a")]);
    req.die_with_parent = true;
    (root, req)
}

#[tokio::test]
async fn a_sandbox_whose_worker_dies_while_it_is_held_ends_by_itself() {
    let (_root, req) = request();
    let mut held = start_held(&req);
    // The worker dies: everything it held closes at once, nothing written.
    held.release.take();
    held.lifeline.take();
    ended(&mut held, &req, "worker gone while the sandbox was held").await;
    assert!(
        log_of(&req).contains("has ended"),
        "the server says why it stopped: {}",
        log_of(&req)
    );
}

#[tokio::test]
async fn a_sandbox_serves_while_its_worker_lives_and_ends_when_it_dies() {
    let (_root, req) = request();
    let mut held = start_held(&req);
    nix::unistd::write(held.release.as_ref().unwrap(), b"1").unwrap();
    let client = connected(&req.socket()).await;
    client
        .ping()
        .await
        .expect("a sandbox whose worker lives serves");
    let out = client
        .bash("cat a.txt", Some(Duration::from_secs(10)))
        .await
        .unwrap();
    assert_eq!(out.output.trim(), "a", "{out:?}");
    held.release.take();
    held.lifeline.take();
    ended(&mut held, &req, "worker gone while the sandbox served").await;
}

/// A client of the server at `socket`, once it answers.
async fn connected(socket: &Path) -> SandboxClient {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(c) = SandboxClient::connect(socket).await
            && c.ping().await.is_ok()
        {
            return c;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the sandbox never answered"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
