//! What a task says about its sandbox, and how the workspace is made from it.
//!
//! The same spec builds the RUN sandbox in INIT and the fresh EVAL sandbox, which then
//! also receives the changes RUN exported (applied inside it by the sandbox server, after
//! setup), so EVAL scores what the agent did in a sandbox the agent never touched.

use super::{RuntimeKind, SandboxLimits};
use rollout_core::config::SandboxSettings;
use rollout_core::domain::SpecError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Component, Path};

/// A task's sandbox.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxSpec {
    /// `bwrap`, `apptainer` or `local`; absent = the node's configured backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    /// Apptainer image: a `.sif` path on the node, or a URI Apptainer understands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Files to create in the workspace: relative path → UTF-8 content.
    #[serde(default)]
    pub files: BTreeMap<String, String>,
    /// A git repository to clone into the workspace (before `files` are written).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repo: Option<RepoSpec>,
    /// Shell commands run in the sandbox, in order, before the tools are handed over; the
    /// first that fails fails the stage.
    #[serde(default)]
    pub setup: Vec<String>,
    /// Timeout of each setup command (ms).
    #[serde(default = "default_setup_timeout")]
    pub setup_timeout_ms: u64,
    /// Whether the sandbox may use the network.
    #[serde(default)]
    pub network: bool,
    /// Environment for the shell and the interpreter.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Limits that differ from the node's defaults.
    #[serde(default)]
    pub limits: LimitOverrides,
    /// Apptainer `--fakeroot`.
    #[serde(default)]
    pub fakeroot: bool,
}

fn default_setup_timeout() -> u64 {
    300_000
}

/// A repository and the commit to check out.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RepoSpec {
    /// Anything `git clone` accepts: a URL or a path on the node.
    pub url: String,
    /// Commit, tag or branch; absent = the default branch's head.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
}

/// Per-task limit overrides; absent fields keep the node's value.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitOverrides {
    /// See [`SandboxLimits::processes`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub processes: Option<u64>,
    /// See [`SandboxLimits::memory_bytes`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    /// See [`SandboxLimits::file_size_bytes`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_size_bytes: Option<u64>,
    /// See [`SandboxLimits::cpu_seconds`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_seconds: Option<u64>,
    /// See [`SandboxLimits::tmp_bytes`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tmp_bytes: Option<u64>,
    /// See [`SandboxLimits::shm_bytes`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shm_bytes: Option<u64>,
    /// See [`SandboxLimits::workspace_bytes`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_bytes: Option<u64>,
}

impl LimitOverrides {
    /// `base` with these overrides applied.
    pub fn apply(&self, base: SandboxLimits) -> SandboxLimits {
        SandboxLimits {
            processes: self.processes.unwrap_or(base.processes),
            memory_bytes: self.memory_bytes.unwrap_or(base.memory_bytes),
            file_size_bytes: self.file_size_bytes.unwrap_or(base.file_size_bytes),
            cpu_seconds: self.cpu_seconds.unwrap_or(base.cpu_seconds),
            tmp_bytes: self.tmp_bytes.unwrap_or(base.tmp_bytes),
            shm_bytes: self.shm_bytes.unwrap_or(base.shm_bytes),
            workspace_bytes: self.workspace_bytes.unwrap_or(base.workspace_bytes),
        }
    }
}

impl LimitOverrides {
    /// Checks each limit the task sets against the operator's ceiling in `max` (see
    /// [`rollout_core::domain::sandbox::limit_problem`]): what INIT would refuse or fail on is
    /// refused here, at submit. `prefix` is the spec's path in the task.
    pub fn check(&self, prefix: &str, max: &SandboxLimits) -> Result<(), SpecError> {
        // Unset limits keep the node's defaults, which the configuration keeps within
        // `max`; only the task's own values are checked (and named).
        let unset = SandboxLimits {
            processes: 1,
            memory_bytes: 1,
            file_size_bytes: 1,
            cpu_seconds: 1,
            tmp_bytes: 1,
            shm_bytes: 1,
            workspace_bytes: rollout_core::domain::sandbox::MIN_WORKSPACE_BYTES,
        };
        let asked = self.apply(unset).named();
        let set = [
            self.processes,
            self.memory_bytes,
            self.file_size_bytes,
            self.cpu_seconds,
            self.tmp_bytes,
            self.shm_bytes,
            self.workspace_bytes,
        ];
        for (((name, value), (_, ceiling)), given) in asked.into_iter().zip(max.named()).zip(set) {
            if given.is_none() {
                continue;
            }
            if let Some(message) =
                rollout_core::domain::sandbox::limit_problem(name, value, ceiling)
            {
                return Err(SpecError {
                    path: format!("{prefix}.limits.{name}"),
                    message,
                });
            }
        }
        Ok(())
    }
}

impl SandboxSpec {
    /// Checks what serde cannot, and what the node's `settings` would refuse at INIT;
    /// `prefix` is the spec's path in the task (for messages). Without
    /// `sandbox.allow_local` a task may not ask for the `local` backend, which would run
    /// the agent unsandboxed on the host; its limits must keep within
    /// `sandbox.max_limits`; a `network: true` task on the `apptainer` backend needs
    /// `sandbox.apptainer_host_network`.
    pub fn validate(&self, prefix: &str, settings: &SandboxSettings) -> Result<(), SpecError> {
        let allow_local = settings.allow_local;
        let err = |path: &str, message: String| SpecError {
            path: format!("{prefix}.{path}"),
            message,
        };
        if let Some(b) = &self.backend
            && RuntimeKind::parse(b).is_none()
        {
            return Err(err(
                "backend",
                format!("unknown backend `{b}`: use bwrap, apptainer or local"),
            ));
        }
        if self.backend.as_deref() == Some("local") && !allow_local {
            return Err(err(
                "backend",
                "the local backend runs the agent's commands unsandboxed on the host and is refused here; use bwrap or apptainer (an operator may allow it with sandbox.allow_local = true)".into(),
            ));
        }
        if self.backend.as_deref() == Some("apptainer") && self.image.is_none() {
            return Err(err(
                "image",
                "the apptainer backend needs an image (a .sif file or URI)".into(),
            ));
        }
        check_file_paths(&format!("{prefix}.files"), self.files.keys())?;
        for key in self.env.keys() {
            let ok = !key.is_empty()
                && !key.starts_with(|c: char| c.is_ascii_digit())
                && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !ok {
                return Err(err(
                    &format!("env.{key}"),
                    "environment names are letters, digits and `_`, not starting with a digit"
                        .into(),
                ));
            }
        }
        if let Some(r) = &self.repo
            && r.url.trim().is_empty()
        {
            return Err(err("repo.url", "must not be empty".into()));
        }
        let default = RuntimeKind::parse(&settings.backend).unwrap_or(RuntimeKind::Bwrap);
        if self.network
            && self.backend_or(default) == RuntimeKind::Apptainer
            && !settings.apptainer_host_network
        {
            return Err(err(
                "network",
                "network: true on the apptainer backend would share the host's network, which this service refuses (an operator may allow it with sandbox.apptainer_host_network = true)".into(),
            ));
        }
        self.limits.check(prefix, &settings.max_limits)
    }

    /// The backend to use: the task's, else the node's default.
    pub fn backend_or(&self, default: RuntimeKind) -> RuntimeKind {
        self.backend
            .as_deref()
            .and_then(RuntimeKind::parse)
            .unwrap_or(default)
    }

    /// Fills `workspace` (an empty directory): clone the repository, then write the files.
    pub async fn prepare(&self, workspace: &Path) -> Result<(), String> {
        if let Some(repo) = &self.repo {
            run_git(
                None,
                &["clone", "--quiet", &repo.url, &workspace.to_string_lossy()],
            )
            .await?;
            if let Some(commit) = &repo.commit {
                run_git(
                    Some(workspace),
                    &["checkout", "--quiet", "--detach", commit],
                )
                .await?;
            }
        }
        for (path, content) in &self.files {
            let p = workspace.join(path);
            if let Some(parent) = p.parent() {
                std::fs::create_dir_all(parent)
                    .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
            }
            std::fs::write(&p, content)
                .map_err(|e| format!("cannot write {}: {e}", p.display()))?;
        }
        Ok(())
    }
}

/// Checks that every path in `paths` is relative and stays inside the workspace;
/// `prefix` is their map's path in the task (for messages).
pub fn check_file_paths<'a>(
    prefix: &str,
    paths: impl IntoIterator<Item = &'a String>,
) -> Result<(), SpecError> {
    for path in paths {
        if !is_relative_inside(path) {
            return Err(SpecError {
                path: format!("{prefix}.{path}"),
                message: "file paths must be relative and stay inside the workspace (no `..`, no leading `/`)".into(),
            });
        }
    }
    Ok(())
}

/// Whether `path` is relative and stays inside the directory it is joined to.
pub(crate) fn is_relative_inside(path: &str) -> bool {
    let p = Path::new(path);
    !path.is_empty()
        && p.components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
}

async fn run_git(dir: Option<&Path>, args: &[&str]) -> Result<(), String> {
    let mut cmd = tokio::process::Command::new("git");
    if let Some(d) = dir {
        cmd.arg("-C").arg(d);
    }
    let out = cmd
        .args(args)
        .env("GIT_TERMINAL_PROMPT", "0")
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| format!("cannot run git: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "git {} failed: {}",
            args.first().copied().unwrap_or_default(),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_are_checked_with_paths() {
        let strict = SandboxSettings::default();
        let local_ok = SandboxSettings {
            allow_local: true,
            ..SandboxSettings::default()
        };
        let spec: SandboxSpec = serde_json::from_value(serde_json::json!({
            "files": {"../escape": "x"}
        }))
        .unwrap();
        let e = spec.validate("sandbox", &strict).unwrap_err();
        assert_eq!(e.path, "sandbox.files.../escape");
        let spec: SandboxSpec =
            serde_json::from_value(serde_json::json!({"backend": "docker"})).unwrap();
        assert!(
            spec.validate("sandbox", &strict)
                .unwrap_err()
                .message
                .contains("unknown backend")
        );
        let spec: SandboxSpec = serde_json::from_value(
            serde_json::json!({"files": {"a/b.py": ""}, "env": {"A_1": "x"}}),
        )
        .unwrap();
        spec.validate("sandbox", &strict).unwrap();
        let local: SandboxSpec =
            serde_json::from_value(serde_json::json!({"backend": "local"})).unwrap();
        let e = local.validate("sandbox", &strict).unwrap_err();
        assert_eq!(e.path, "sandbox.backend");
        local.validate("sandbox", &local_ok).unwrap();
    }

    #[test]
    fn limits_keep_within_the_operators_maximums() {
        let settings = SandboxSettings::default();
        let check = |limits: serde_json::Value| {
            let spec: SandboxSpec =
                serde_json::from_value(serde_json::json!({ "limits": limits })).unwrap();
            spec.validate("sandbox", &settings)
        };
        check(serde_json::json!({"memory_bytes": 1u64 << 30, "processes": 64})).unwrap();
        let max = settings.max_limits.workspace_bytes;
        check(serde_json::json!({ "workspace_bytes": max })).unwrap();
        for (limits, field, words) in [
            (
                serde_json::json!({"workspace_bytes": 1_000_000_000_000_000u64}),
                "workspace_bytes",
                max.to_string(),
            ),
            (
                serde_json::json!({"processes": 0}),
                "processes",
                "0 (no limit)".to_string(),
            ),
            (
                serde_json::json!({"workspace_bytes": 4096}),
                "workspace_bytes",
                "not a workspace a node can make".to_string(),
            ),
        ] {
            let e = check(limits.clone()).unwrap_err();
            assert_eq!(e.path, format!("sandbox.limits.{field}"), "{limits}");
            assert!(e.message.contains(&words), "{limits}: {}", e.message);
        }
        // A maximum of 0 lets tasks lift the limit.
        let lifted = SandboxSettings {
            max_limits: SandboxLimits {
                processes: 0,
                ..SandboxLimits::default_maximums()
            },
            ..SandboxSettings::default()
        };
        let spec: SandboxSpec =
            serde_json::from_value(serde_json::json!({"limits": {"processes": 0}})).unwrap();
        spec.validate("sandbox", &lifted).unwrap();
    }

    #[test]
    fn overrides_keep_unset_limits() {
        let o = LimitOverrides {
            processes: Some(8),
            ..Default::default()
        };
        let l = o.apply(SandboxLimits::default());
        assert_eq!(l.processes, 8);
        assert_eq!(l.tmp_bytes, SandboxLimits::default().tmp_bytes);
    }
}
