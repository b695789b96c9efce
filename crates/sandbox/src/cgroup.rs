//! Per-sandbox control groups: one memory budget and one process budget per sandbox.
//!
//! rlimits are per process (three 2 GB processes hold 6 GB under a 2 GB `RLIMIT_AS`) and,
//! for processes, per host user (a non-root worker's sandboxes share one budget, so one
//! fork bomb starves the others). Where the worker may create cgroups (root, or a
//! delegated cgroup v2 subtree) every bwrap sandbox gets a cgroup of its own with
//! `memory.max` (swap off) and `pids.max`, under the worker's own cgroup; the sandbox's
//! first process joins it before it execs, so everything inside is counted. Both cgroup
//! v2 (the unified hierarchy) and v1 (separate `memory` and `pids` hierarchies) are
//! handled. Where neither works, [`Cgroups::probe`] says why, and the worker says so at
//! start and in `GET /healthz` rather than silently keeping the weaker limits.

use super::{SandboxError, SandboxLimits};
use std::ffi::CString;
use std::path::{Path, PathBuf};

/// How this node limits sandboxes as a whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cgroups {
    /// cgroup v2: sandboxes are children of `parent`, which has `memory` and `pids`
    /// enabled for its children.
    V2 {
        /// The directory sandbox cgroups are made in.
        parent: PathBuf,
    },
    /// cgroup v1: a child in the `memory` hierarchy and one in the `pids` hierarchy.
    V1 {
        /// The directory in the memory hierarchy sandbox cgroups are made in.
        memory: PathBuf,
        /// The directory in the pids hierarchy.
        pids: PathBuf,
    },
    /// No cgroups: limits are rlimits only.
    Unavailable {
        /// Why not, for the operator.
        why: String,
    },
}

/// One sandbox's cgroup directories (one for v2, two for v1).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SandboxCgroup {
    /// The directories, which the label records so a stop can empty and remove them.
    pub dirs: Vec<PathBuf>,
}

const ROOT: &str = "/sys/fs/cgroup";

/// This process's cgroup path in the hierarchy whose `/proc/self/cgroup` line matches.
fn own_path(matches: impl Fn(&str, &str) -> bool) -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    text.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (id, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        matches(id, controllers).then(|| path.to_string())
    })
}

fn writable(dir: &Path) -> bool {
    nix::unistd::access(dir, nix::unistd::AccessFlags::W_OK).is_ok()
}

impl Cgroups {
    /// Finds out what this process may do, preparing the v2 parent when it has to (see
    /// [`Cgroups::V2`]). `parent` overrides the directory (v2 only).
    pub fn probe(parent: Option<&Path>) -> Cgroups {
        let unified = Path::new(ROOT).join("cgroup.controllers");
        if let Ok(controllers) = std::fs::read_to_string(&unified) {
            let has = |c: &str| controllers.split_whitespace().any(|x| x == c);
            if !(has("memory") && has("pids")) {
                return Cgroups::Unavailable {
                    why: format!(
                        "cgroup v2 without the memory and pids controllers (available: {})",
                        controllers.trim()
                    ),
                };
            }
            let dir = match parent {
                Some(p) => p.to_path_buf(),
                None => match own_path(|id, _| id == "0") {
                    Some(p) => Path::new(ROOT).join(p.trim_start_matches('/')),
                    None => {
                        return Cgroups::Unavailable {
                            why: "cannot read this process's cgroup".into(),
                        };
                    }
                },
            };
            return match prepare_v2(&dir) {
                Ok(parent) => Cgroups::V2 { parent },
                Err(why) => Cgroups::Unavailable { why },
            };
        }
        let v1 = |name: &str| -> Option<PathBuf> {
            let own = own_path(|_, c| c.split(',').any(|x| x == name))?;
            let dir = Path::new(ROOT).join(name).join(own.trim_start_matches('/'));
            dir.is_dir().then_some(dir)
        };
        match (v1("memory"), v1("pids")) {
            (Some(memory), Some(pids)) if writable(&memory) && writable(&pids) => {
                Cgroups::V1 { memory, pids }
            }
            (Some(_), Some(_)) => Cgroups::Unavailable {
                why: "the cgroup v1 memory and pids hierarchies are not writable by this user (run the worker as root)".into(),
            },
            _ => Cgroups::Unavailable {
                why: "no cgroup v2 hierarchy and no cgroup v1 memory and pids hierarchies are mounted".into(),
            },
        }
    }

    /// Whether sandboxes get cgroups.
    pub fn enforced(&self) -> bool {
        !matches!(self, Cgroups::Unavailable { .. })
    }

    /// Makes the cgroup of the sandbox named `name` with `limits`; `None` without
    /// cgroups.
    pub fn create(
        &self,
        name: &str,
        limits: &SandboxLimits,
    ) -> Result<Option<SandboxCgroup>, SandboxError> {
        let leaf = format!("rollout-{name}");
        let mk = |dir: &Path| -> Result<PathBuf, SandboxError> {
            let d = dir.join(&leaf);
            match std::fs::create_dir(&d) {
                Ok(()) => Ok(d),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(d),
                Err(e) => Err(SandboxError::Config(format!(
                    "cannot create the sandbox's cgroup {}: {e}",
                    d.display()
                ))),
            }
        };
        let made = match self {
            Cgroups::Unavailable { .. } => return Ok(None),
            Cgroups::V2 { parent } => SandboxCgroup {
                dirs: vec![mk(parent)?],
            },
            Cgroups::V1 { memory, pids } => {
                let m = mk(memory)?;
                let p = match mk(pids) {
                    Ok(p) => p,
                    Err(e) => {
                        let _ = std::fs::remove_dir(&m);
                        return Err(e);
                    }
                };
                SandboxCgroup { dirs: vec![m, p] }
            }
        };
        self.limit(&made, limits)
            .map(|_| Some(made.clone()))
            .inspect_err(|_| made.remove())
    }

    /// Sets `limits` on `cg`, one of this node's sandbox cgroups: on a cgroup that
    /// already holds a process (a launcher's, see [`super::launcher`]) as on a new one.
    /// Plain writes of the limit files, quick, unlike moving a process in.
    pub fn limit(&self, cg: &SandboxCgroup, limits: &SandboxLimits) -> Result<(), SandboxError> {
        let set = |dir: &Path, file: &str, value: String| -> Result<(), SandboxError> {
            std::fs::write(dir.join(file), &value).map_err(|e| {
                SandboxError::Config(format!(
                    "cannot set {} to {value} in the sandbox's cgroup: {e}",
                    file
                ))
            })
        };
        let max = |v: u64| {
            if v == 0 {
                "max".to_string()
            } else {
                v.to_string()
            }
        };
        match (self, cg.dirs.as_slice()) {
            (Cgroups::Unavailable { .. }, _) => Ok(()),
            (Cgroups::V2 { .. }, [d]) => {
                set(d, "memory.max", max(limits.memory_bytes))?;
                if d.join("memory.swap.max").exists() {
                    set(d, "memory.swap.max", "0".into())?;
                }
                set(d, "pids.max", max(limits.processes))
            }
            (Cgroups::V1 { .. }, [m, p]) => {
                if limits.memory_bytes > 0 {
                    set(m, "memory.limit_in_bytes", limits.memory_bytes.to_string())?;
                    // With swap accounting, swap counts too (otherwise the limit only
                    // moves memory to swap).
                    if m.join("memory.memsw.limit_in_bytes").exists() {
                        set(
                            m,
                            "memory.memsw.limit_in_bytes",
                            limits.memory_bytes.to_string(),
                        )?;
                    }
                }
                set(p, "pids.max", max(limits.processes))
            }
            _ => Err(SandboxError::Config(format!(
                "{} is not a sandbox cgroup of this node's kind",
                cg.dirs
                    .iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        }
    }
}

/// Makes `dir` a parent whose children get `memory` and `pids`. A cgroup with processes
/// of its own cannot hand controllers down (cgroup v2's no-internal-process rule), so when
/// the worker sits in `dir` itself, it first moves into a leaf `dir/rollout-worker`.
fn prepare_v2(dir: &Path) -> Result<PathBuf, String> {
    let control = dir.join("cgroup.subtree_control");
    let enable = || std::fs::write(&control, "+memory +pids");
    if let Ok(now) = std::fs::read_to_string(&control)
        && now.split_whitespace().any(|c| c == "memory")
        && now.split_whitespace().any(|c| c == "pids")
    {
        return Ok(dir.to_path_buf());
    }
    match enable() {
        Ok(()) => Ok(dir.to_path_buf()),
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
            let leaf = dir.join("rollout-worker");
            let _ = std::fs::create_dir(&leaf);
            std::fs::write(leaf.join("cgroup.procs"), "0")
                .map_err(|e| format!("cannot move the worker into {}: {e}", leaf.display()))?;
            enable().map_err(|e| {
                format!(
                    "cannot enable the memory and pids controllers in {}: {e}",
                    control.display()
                )
            })?;
            Ok(dir.to_path_buf())
        }
        Err(e) => Err(format!(
            "cannot enable the memory and pids controllers in {} ({e}); run the worker as root or give it a delegated cgroup (sandbox.cgroup_parent)",
            control.display()
        )),
    }
}

impl SandboxCgroup {
    /// The `cgroup.procs` files a process writes `0` to, to join: prepared before fork,
    /// written between fork and exec (see [`SandboxCgroup::join_from_child`]).
    pub fn procs_files(&self) -> Vec<CString> {
        self.dirs
            .iter()
            .filter_map(|d| {
                CString::new(d.join("cgroup.procs").as_os_str().as_encoded_bytes()).ok()
            })
            .collect()
    }

    /// Moves the calling process into every file of `files`. Async-signal-safe: only
    /// `open`, `write` and `close`, for a child between fork and exec.
    pub fn join_from_child(files: &[CString]) -> std::io::Result<()> {
        for f in files {
            // SAFETY: a NUL-terminated path, a constant buffer; the descriptor is closed.
            unsafe {
                let fd = libc::open(f.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let n = libc::write(fd, b"0".as_ptr().cast(), 1);
                libc::close(fd);
                if n != 1 {
                    return Err(std::io::Error::last_os_error());
                }
            }
        }
        Ok(())
    }

    /// Moves the processes `pids` (whole thread groups) into every cgroup of the sandbox,
    /// from outside: bwrap and its namespace's init while the init waits on
    /// `--block-fd`, before anything of the sandbox's own runs (see `launch`).
    ///
    /// Joining is where a start used to wait longest (on a cgroup v1 host the first
    /// move after a quiet spell waits for an RCU grace period, 9 ms here): done this
    /// way, it overlaps bwrap building the sandbox's filesystem.
    pub fn join(&self, pids: &[i32]) -> std::io::Result<()> {
        use std::io::Write;
        for d in &self.dirs {
            let procs = d.join("cgroup.procs");
            for pid in pids {
                // One write per pid: the kernel takes one pid per write.
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(&procs)?
                    .write_all(pid.to_string().as_bytes())
                    .map_err(|e| {
                        std::io::Error::new(
                            e.kind(),
                            format!("cannot move process {pid} into {}: {e}", procs.display()),
                        )
                    })?;
            }
        }
        Ok(())
    }

    /// Kills every process still in the cgroups and removes them. Best effort: a cgroup
    /// that cannot go now is left for the next stop or reaper pass.
    pub fn remove(&self) {
        kill_and_remove(&self.dirs);
    }
}

/// Kills what is in each of `dirs` (cgroup directories) and removes them.
pub fn kill_and_remove(dirs: &[PathBuf]) {
    use nix::sys::signal::{Signal, kill};
    for d in dirs {
        if !d.exists() {
            continue;
        }
        if d.join("cgroup.kill").exists() {
            let _ = std::fs::write(d.join("cgroup.kill"), "1");
        }
        for _ in 0..200 {
            let procs = std::fs::read_to_string(d.join("cgroup.procs")).unwrap_or_default();
            let pids: Vec<i32> = procs
                .lines()
                .filter_map(|l| l.trim().parse().ok())
                .collect();
            if pids.is_empty() {
                break;
            }
            for pid in pids {
                let _ = kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL);
            }
            #[allow(
                clippy::disallowed_methods,
                reason = "stops and failed starts call this from blocking threads"
            )]
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        if let Err(e) = std::fs::remove_dir(d)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(cgroup = %d.display(), error = %e, "cannot remove the sandbox's cgroup");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_names_a_reason_or_a_place() {
        match Cgroups::probe(None) {
            Cgroups::Unavailable { why } => assert!(!why.is_empty()),
            Cgroups::V2 { parent } => assert!(parent.starts_with(ROOT)),
            Cgroups::V1 { memory, pids } => {
                assert!(memory.starts_with(ROOT) && pids.starts_with(ROOT))
            }
        }
    }
}
