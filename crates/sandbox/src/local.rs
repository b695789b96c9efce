//! The `local` backend: the sandbox server as a plain child process, for development.
//!
//! Nothing is isolated: the agent's commands run as the worker's user with the worker's
//! view of the machine, so every start logs a warning. It is the backend to use on a
//! laptop without bubblewrap, and the reference the other backends are tested against.

use super::{Label, RuntimeKind, Sandbox, SandboxError, SandboxRuntime, StartRequest};

/// See the module documentation.
#[derive(Debug, Default)]
pub struct LocalRuntime;

#[async_trait::async_trait]
impl SandboxRuntime for LocalRuntime {
    fn kind(&self) -> RuntimeKind {
        RuntimeKind::Local
    }

    async fn start(&self, req: &StartRequest) -> Result<Sandbox, SandboxError> {
        tracing::warn!(
            job_id = %req.label.job_id,
            "the local sandbox backend does not isolate: the agent's commands run as this worker's user"
        );
        std::fs::create_dir_all(req.workspace())?;
        let mut pass_fds = vec![super::bind_socket(&req.socket())?];
        // The parent-death signal ends the server with this process already; the
        // lifeline is the same guarantee as every other backend's (see `lifeline`).
        let lifeline = if req.die_with_parent {
            pass_fds.push(super::lifeline::reader()?);
            Some(super::FIRST_PASSED_FD + 1)
        } else {
            None
        };
        let mut cmd = tokio::process::Command::new(&req.server_bin);
        cmd.args(super::serve_args(
            super::ServeOn::Fd(super::FIRST_PASSED_FD),
            &req.workspace(),
            &req.dir.join("ctl"),
            lifeline,
        ))
        .current_dir(req.workspace());
        super::clean_env(&mut cmd, &["HOME", "USER", "TMPDIR"]);
        cmd.envs(&req.env);
        super::launch(
            req,
            super::Launch {
                backend: "local",
                cmd: cmd.into(),
                label: req.label.clone(),
                rlimits: None,
                pass_fds,
                info_read: None,
                net: None,
                cgroup_procs: Vec::new(),
                hold: None,
                become_user: None,
                die_with_parent: req.die_with_parent,
                profile: super::StartProfile::begin(),
            },
        )
        .await
    }

    async fn stop(&self, label: &Label) -> Result<(), SandboxError> {
        label.kill();
        Ok(())
    }
}
