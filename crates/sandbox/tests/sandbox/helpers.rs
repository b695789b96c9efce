//! Starting a sandbox for a test: its own temporary root, its own label.

use rollout_sandbox::{
    self as sandbox, Label, RuntimeKind, Runtimes, Sandbox, SandboxLimits, StartRequest,
};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The server binary cargo built for this test run, or a copy named by
/// `ROLLOUT_TEST_SANDBOX_BIN` (the unprivileged re-run of the hostile suite uses one
/// that user can read).
pub fn server_bin() -> PathBuf {
    std::env::var_os("ROLLOUT_TEST_SANDBOX_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_rollout-sandbox")))
}

/// A running sandbox and the directory that holds it.
pub struct TestSandbox {
    pub sb: Sandbox,
    /// Kept so the temporary root lives as long as the sandbox.
    pub _root: tempfile::TempDir,
}

impl TestSandbox {
    /// The workspace on the host.
    pub fn workspace(&self) -> PathBuf {
        self.sb.label.dir.join("workspace")
    }

    /// Stops the sandbox through its label and checks nothing of it is left running.
    pub async fn stop(self) {
        self.stop_with(&Runtimes::default()).await
    }

    /// Stops the sandbox with these backends (a test's own stand-in apptainer, say).
    pub async fn stop_with(self, backends: &Runtimes) {
        let pid = self.sb.label.pid.expect("label has a pid");
        let dir = self.sb.label.dir.clone();
        backends.stop(&dir).await.expect("stop");
        assert!(
            self.sb.label.live_pid().is_none() || sandbox::label::is_zombie(pid),
            "the sandbox's root process {pid} outlived stop"
        );
        assert!(!dir.exists(), "stop removes the sandbox directory");
    }
}

impl Drop for TestSandbox {
    /// A test that failed before `stop` must not leave its sandbox running.
    fn drop(&mut self) {
        self.sb.label.kill();
    }
}

/// A start request for `kind` in a fresh temporary root, with `files` in the workspace.
pub fn request(kind: RuntimeKind, files: &[(&str, &str)]) -> (tempfile::TempDir, StartRequest) {
    let root = tempfile::Builder::new()
        .prefix("rsb")
        .tempdir()
        .expect("tempdir");
    let id = uuid::Uuid::new_v4().simple().to_string();
    let dir = root.path().join(&id[..12]);
    let ws = dir.join("workspace");
    std::fs::create_dir_all(&ws).unwrap();
    for (path, content) in files {
        let p = ws.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content).unwrap();
    }
    let req = StartRequest {
        label: Label::new(&id, "test-node", kind, &dir),
        dir,
        server_bin: server_bin(),
        network: false,
        env: BTreeMap::new(),
        limits: SandboxLimits::default(),
        image: None,
        fakeroot: false,
        ro_binds: Vec::new(),
        die_with_parent: false,
        ready_timeout: Duration::from_secs(20),
    };
    (root, req)
}

/// Starts a sandbox for `req`.
pub async fn start_with(root: tempfile::TempDir, req: StartRequest) -> TestSandbox {
    let backends = Runtimes::default();
    let sb = backends
        .get(req.label.backend)
        .start(&req)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "{} sandbox did not start: {e}\nserver log:\n{}",
                req.label.backend.as_str(),
                std::fs::read_to_string(req.dir.join("server.log")).unwrap_or_default()
            )
        });
    TestSandbox { sb, _root: root }
}

/// Starts a `kind` sandbox with `files` in its workspace.
pub async fn start(kind: RuntimeKind, files: &[(&str, &str)]) -> TestSandbox {
    let (root, req) = request(kind, files);
    start_with(root, req).await
}

/// Generates one test per backend for each listed `async fn name(kind: RuntimeKind)`.
#[macro_export]
macro_rules! on_backends {
    ($($name:ident),* $(,)?) => {
        mod local {
            $(#[tokio::test]
            async fn $name() {
                super::$name(rollout_sandbox::RuntimeKind::Local).await
            })*
        }
        mod bwrap {
            $(#[tokio::test]
            async fn $name() {
                super::$name(rollout_sandbox::RuntimeKind::Bwrap).await
            })*
        }
    };
}

/// Copies an executable with `cp` rather than from this process: a file this process
/// has open for writing is inherited by every child another test forks meanwhile, and
/// executing the copy then fails with "Text file busy" until that child has exec'd.
pub fn copy_executable(from: &Path, to: &Path) {
    let copied = std::process::Command::new("cp")
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(
        copied.success(),
        "cp {} {}: {copied}",
        from.display(),
        to.display()
    );
}
