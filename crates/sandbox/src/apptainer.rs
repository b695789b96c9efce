//! The `apptainer` backend: Apptainer (or Singularity) instances from `.sif` images, the
//! container runtime HPC clusters allow.
//!
//! A sandbox is an instance named `rollout-<job id>` (the label), started with
//! `apptainer instance start --containall --writable-tmpfs` (the image stays read-only;
//! writes outside the binds go to a throw-away overlay), `--net --network none` unless the
//! task allows network (the host's network then, so refused unless
//! `sandbox.apptainer_host_network` accepts it), optionally `--fakeroot`, and three binds: the workspace at
//! `/workspace`, the socket directory at `/run/rollout`, and the `rollout-sandbox` binary
//! at `/run/rollout-sandbox` (read-only). The server then runs through
//! `apptainer exec instance://<name> …`, and `apptainer instance stop <name>` ends it all.
//!
//! The server binary runs with the image's C library, so build it static for images
//! older than the host (see `docs/apptainer.md`). The process limit is not applied here:
//! without a user namespace of its own it would count every process of the user.

use super::{Label, RuntimeKind, Sandbox, SandboxError, SandboxRuntime, StartRequest};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The worker's environment variables `apptainer` keeps (its own configuration, and the
/// user's home and temporary directory); nothing else of the worker's reaches it.
const KEEP_ENV: &[&str] = &["APPTAINER", "SINGULARITY", "HOME", "USER", "TMPDIR"];

/// Where the server binary appears inside the instance.
pub const SERVER_PATH: &str = "/run/rollout-sandbox";

/// See the module documentation.
#[derive(Debug, Clone)]
pub struct ApptainerRuntime {
    /// The `apptainer` (or `singularity`) executable.
    pub program: PathBuf,
    /// Whether a `network: true` sandbox may share the host's network. Apptainer gives
    /// an instance a network of its own only through its setuid helper and a CNI
    /// configuration; without those, network means the host's, loopback services (the
    /// gateway, NATS) included, so it is refused unless the operator accepts that.
    pub host_network: bool,
}

impl Default for ApptainerRuntime {
    fn default() -> Self {
        ApptainerRuntime {
            program: PathBuf::from("apptainer"),
            host_network: false,
        }
    }
}

/// The instance name of the sandbox in directory `dir`, `rollout-<directory name>` (the
/// job id, or `<job id>-eval-<generation>` for EVAL's): the label Apptainer itself knows.
pub fn instance_name(dir: &Path) -> String {
    let name = dir.file_name().unwrap_or_default().to_string_lossy();
    let clean: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("rollout-{clean}")
}

impl ApptainerRuntime {
    /// `apptainer instance start …` arguments (public so tests can check them).
    pub fn start_args(&self, req: &StartRequest, image: &str) -> Vec<OsString> {
        let mut a: Vec<OsString> = vec!["instance".into(), "start".into()];
        a.push("--containall".into());
        a.push("--writable-tmpfs".into());
        if !req.network {
            a.extend(["--net".into(), "--network".into(), "none".into()]);
        }
        if req.fakeroot {
            a.push("--fakeroot".into());
        }
        let bind = |host: &Path, inside: &str, ro: bool| -> OsString {
            let mut s = host.as_os_str().to_os_string();
            s.push(":");
            s.push(inside);
            if ro {
                s.push(":ro");
            }
            s
        };
        a.extend(["--bind".into(), bind(&req.workspace(), "/workspace", false)]);
        a.extend(["--bind".into(), bind(&req.run_dir(), "/run/rollout", false)]);
        a.extend(["--bind".into(), bind(&req.server_bin, SERVER_PATH, true)]);
        for p in &req.ro_binds {
            a.extend(["--bind".into(), bind(p, &p.to_string_lossy(), true)]);
        }
        for (k, v) in &req.env {
            a.extend(["--env".into(), format!("{k}={v}").into()]);
        }
        a.push(image.into());
        a.push(instance_name(&req.dir).into());
        a
    }

    /// `apptainer exec instance://… rollout-sandbox serve …` arguments.
    pub fn exec_args(&self, req: &StartRequest) -> Vec<OsString> {
        let mut a: Vec<OsString> = vec![
            "exec".into(),
            "--pwd".into(),
            "/workspace".into(),
            format!("instance://{}", instance_name(&req.dir)).into(),
            SERVER_PATH.into(),
        ];
        a.extend(super::serve_args(
            super::ServeOn::Socket(Path::new("/run/rollout/sock")),
            Path::new("/workspace"),
            Path::new("/run/rollout/ctl"),
            // An instance is a daemon of its own; it does not end with the worker.
            None,
        ));
        a
    }
}

#[async_trait::async_trait]
impl SandboxRuntime for ApptainerRuntime {
    fn kind(&self) -> RuntimeKind {
        RuntimeKind::Apptainer
    }

    async fn start(&self, req: &StartRequest) -> Result<Sandbox, SandboxError> {
        let image = req.image.as_deref().ok_or_else(|| {
            SandboxError::Config(
                "the apptainer backend needs an image: set `sandbox.image` in the task (a .sif file or a docker:// URI)".into(),
            )
        })?;
        if req.network && !self.host_network {
            return Err(SandboxError::Config(
                "an apptainer sandbox with network: true would share the host's network, its loopback services included; run such tasks on the bwrap backend (a network of their own), or set sandbox.apptainer_host_network = true to accept it".into(),
            ));
        }
        std::fs::create_dir_all(req.workspace())?;
        std::fs::create_dir_all(req.run_dir())?;
        let mut label = req.label.clone();
        let name = instance_name(&req.dir);
        label.instance = Some(name.clone());
        // Written before the instance exists, so a crash right after still leaves the
        // reaper a label that names it.
        label.write()?;
        let mut start = tokio::process::Command::new(&self.program);
        super::clean_env(&mut start, KEEP_ENV);
        let out = start
            .args(self.start_args(req, image))
            .kill_on_drop(true)
            .output()
            .await
            .map_err(|e| SandboxError::Start {
                backend: "apptainer",
                message: format!("cannot run {}: {e}", self.program.display()),
            })?;
        if !out.status.success() {
            return Err(SandboxError::Start {
                backend: "apptainer",
                message: format!(
                    "`{} instance start` failed ({}): {}",
                    self.program.display(),
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            });
        }
        let mut cmd = tokio::process::Command::new(&self.program);
        cmd.args(self.exec_args(req));
        super::clean_env(&mut cmd, KEEP_ENV);
        let limits = super::SandboxLimits {
            processes: 0,
            ..req.limits
        };
        let started = super::launch(
            req,
            super::Launch {
                backend: "apptainer",
                cmd: cmd.into(),
                label: label.clone(),
                rlimits: Some(limits),
                pass_fds: Vec::new(),
                info_read: None,
                net: None,
                cgroup_procs: Vec::new(),
                hold: None,
                become_user: None,
                die_with_parent: false,
                profile: super::StartProfile::begin(),
            },
        )
        .await;
        if started.is_err() {
            let _ = self.stop(&label).await;
        }
        started
    }

    async fn stop(&self, label: &Label) -> Result<(), SandboxError> {
        label.kill();
        let name = label
            .instance
            .clone()
            .unwrap_or_else(|| instance_name(&label.dir));
        let out = tokio::process::Command::new(&self.program)
            .args(["instance", "stop", &name])
            .kill_on_drop(true)
            .output()
            .await
            .map_err(|e| {
                SandboxError::Config(format!("cannot run {}: {e}", self.program.display()))
            })?;
        let said = String::from_utf8_lossy(&out.stderr);
        if out.status.success() || said.contains("no instance found") {
            Ok(())
        } else {
            Err(SandboxError::Config(format!(
                "`{} instance stop {name}` failed ({}): {}",
                self.program.display(),
                out.status,
                said.trim()
            )))
        }
    }
}
