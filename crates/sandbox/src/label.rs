//! Sandbox labels: how a sandbox is found again after the worker that started it is gone.
//!
//! Each sandbox directory holds a `label.json` naming the job, the node, the backend and
//! the identity of its root process: the pid *and* that process's start time from
//! `/proc/<pid>/stat`, so a pid reused by an unrelated process after a reboot or a long
//! uptime is never mistaken for the sandbox and never killed. Apptainer sandboxes also
//! carry their instance name. The reaper and [`crate::Runtimes::stop`] act on labels only.

use super::{RuntimeKind, SandboxError};
use rollout_core::domain::EpochMs;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The file name of a label inside a sandbox directory.
pub const LABEL_FILE: &str = "label.json";

/// A sandbox's identity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Label {
    /// The job the sandbox belongs to (its id is also the directory name).
    pub job_id: String,
    /// The node it runs on.
    pub node: String,
    /// The backend that started it.
    pub backend: RuntimeKind,
    /// The sandbox directory on the host.
    pub dir: PathBuf,
    /// The socket on the host.
    pub socket: PathBuf,
    /// The root process on the host (the server, `bwrap`, or `apptainer exec`).
    #[serde(default)]
    pub pid: Option<i32>,
    /// That process's start time in clock ticks since boot (`/proc/<pid>/stat` field 22).
    #[serde(default)]
    pub pid_start: Option<u64>,
    /// bwrap's PID-namespace init on the host: killing it ends every process inside.
    /// It runs in a session of its own, so it must be recorded, not found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ns_init: Option<i32>,
    /// Its start time, as for `pid_start`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ns_init_start: Option<u64>,
    /// The sandbox's network helper (slirp4netns) on the host, when it has network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net_helper: Option<i32>,
    /// Its start time, as for `pid_start`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net_helper_start: Option<u64>,
    /// The sandbox's cgroup directories, when it has any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cgroups: Vec<PathBuf>,
    /// The claim attempt of the stage that started it: a stale attempt of that stage
    /// removes only a sandbox of its own generation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// The host user id the sandbox runs as, when it has one of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// The Apptainer instance name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// When the sandbox was started (ms since the Unix epoch).
    pub created_ms: i64,
    /// The host's count of OOM-killer kills (`/proc/vmstat` `oom_kill`) when the
    /// sandbox started: a sandbox that dies after it grew, without having hit its own
    /// memory limit, may have been a victim of the host running out of memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_oom_kills: Option<u64>,
}

/// The socket of a `backend` sandbox whose directory is `dir`. Apptainer's server binds
/// its socket in a directory bound into the instance; the others' sockets are bound by
/// the launcher outside the sandbox's reach (see `crate::bind_socket`).
pub fn socket_in(dir: &Path, backend: RuntimeKind) -> PathBuf {
    match backend {
        RuntimeKind::Apptainer => dir.join("run").join("sock"),
        RuntimeKind::Local | RuntimeKind::Bwrap => dir.join("sock"),
    }
}

/// The longest of the sockets [`socket_in`] puts in `dir`, whichever backend: what a
/// node checks before it knows which backends its tasks will ask for.
pub fn longest_socket_in(dir: &Path) -> PathBuf {
    [
        RuntimeKind::Local,
        RuntimeKind::Bwrap,
        RuntimeKind::Apptainer,
    ]
    .into_iter()
    .map(|b| socket_in(dir, b))
    .max_by_key(|s| s.as_os_str().len())
    .unwrap_or_else(|| dir.join("sock"))
}

impl Label {
    /// A label for a sandbox not started yet.
    pub fn new(job_id: &str, node: &str, backend: RuntimeKind, dir: &Path) -> Self {
        Label {
            job_id: job_id.to_string(),
            node: node.to_string(),
            backend,
            dir: dir.to_path_buf(),
            socket: socket_in(dir, backend),
            pid: None,
            pid_start: None,
            ns_init: None,
            ns_init_start: None,
            net_helper: None,
            net_helper_start: None,
            cgroups: Vec::new(),
            generation: None,
            uid: None,
            instance: None,
            created_ms: EpochMs::now().as_millis(),
            host_oom_kills: host_oom_kills(),
        }
    }

    /// Why the sandbox died, judged after the fact (see [`Death`]): the host's OOM killer
    /// ran since it started and the sandbox's own cgroups never hit their memory limit,
    /// or neither, which leaves what ran inside it.
    pub fn death(&self) -> Death {
        self.death_given(host_oom_kills())
    }

    /// [`Label::death`] with the host's OOM-kill count now being `now`.
    fn death_given(&self, now: Option<u64>) -> Death {
        let (Some(then), Some(now)) = (self.host_oom_kills, now) else {
            return Death::Workload;
        };
        if now <= then || self.cgroups.iter().any(|c| own_oom(c)) {
            return Death::Workload;
        }
        Death::Infrastructure(format!(
            "the host's OOM killer killed {} process(es) while the sandbox ran, and the sandbox was within its own memory limit",
            now - then
        ))
    }

    /// The sandbox server's process, when the root process is still this label's.
    pub fn server(&self) -> Option<i32> {
        let root = self.pid?;
        if process_start(root) != self.pid_start {
            return None;
        }
        server_process(root)
    }

    /// Records `pid` (and its start time) as the sandbox's root process.
    pub fn set_process(&mut self, pid: i32) {
        self.pid = Some(pid);
        self.pid_start = process_start(pid);
    }

    /// Writes the label atomically (temporary file, then rename).
    pub fn write(&self) -> Result<(), SandboxError> {
        let tmp = self.dir.join(format!("{LABEL_FILE}.tmp"));
        std::fs::write(
            &tmp,
            serde_json::to_vec_pretty(self).expect("labels serialise"),
        )?;
        std::fs::rename(&tmp, self.dir.join(LABEL_FILE))?;
        Ok(())
    }

    /// Reads the label in `dir`, if there is one.
    pub fn read(dir: &Path) -> Result<Option<Label>, SandboxError> {
        match std::fs::read(dir.join(LABEL_FILE)) {
            Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
                SandboxError::Protocol(format!(
                    "unreadable sandbox label in {}: {e}",
                    dir.display()
                ))
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Every sandbox directory under `root` (with or without a label yet); hidden
    /// entries (the node's shared tool copies) are not sandboxes.
    pub fn dirs(root: &Path) -> Vec<PathBuf> {
        let Ok(entries) = std::fs::read_dir(root) else {
            return Vec::new();
        };
        let mut dirs: Vec<PathBuf> = entries
            .flatten()
            .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
            .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
            .map(|e| e.path())
            .collect();
        dirs.sort();
        dirs
    }

    /// The root process, if it is still the one this label recorded.
    pub fn live_pid(&self) -> Option<i32> {
        still_running(self.pid, self.pid_start)
    }

    /// The namespace init, if it is still the one this label recorded.
    pub fn live_ns_init(&self) -> Option<i32> {
        still_running(self.ns_init, self.ns_init_start)
    }

    /// The network helper, if it is still the one this label recorded.
    pub fn live_net_helper(&self) -> Option<i32> {
        still_running(self.net_helper, self.net_helper_start)
    }

    /// Kills every process the label records, with their descendants.
    pub fn kill(&self) {
        if let Some(pid) = self.live_pid() {
            kill_tree(pid);
        }
        if let Some(pid) = self.live_ns_init() {
            kill_tree(pid);
        }
        if let Some(pid) = self.live_net_helper() {
            kill_tree(pid);
        }
        // Whatever escaped the process tree (a double fork into another session) is
        // still in the cgroup.
        super::cgroup::kill_and_remove(&self.cgroups);
    }
}

impl Label {
    /// Waits up to `limit` until the root process, the namespace's init and the network
    /// helper have exited (or are only zombies awaiting their parent), so a stop is
    /// complete when it returns: a killed process lives on until the kernel delivers
    /// the signal, and a helper still running after a stop would hold the sandbox's
    /// network open.
    pub async fn wait_gone(&self, limit: Duration) {
        let deadline = std::time::Instant::now() + limit;
        let running = |pid: Option<i32>| pid.is_some_and(|pid| !is_zombie(pid));
        while running(self.live_pid())
            || running(self.live_ns_init())
            || running(self.live_net_helper())
        {
            if std::time::Instant::now() >= deadline {
                tracing::warn!(job_id = %self.job_id, pid = ?self.pid, "sandbox process still running after stop");
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// `pid`, if a process with that pid and that start time still exists (a reused pid is
/// another process).
fn still_running(pid: Option<i32>, start: Option<u64>) -> Option<i32> {
    let pid = pid?;
    (start.is_some() && process_start(pid) == start).then_some(pid)
}

/// Whether `pid` has exited and waits only to be reaped.
pub fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rfind(')')
                .map(|i| s[i + 1..].trim_start().starts_with('Z'))
        })
        .unwrap_or(true)
}

/// A process's start time (`/proc/<pid>/stat` field 22), `None` if it does not exist.
pub fn process_start(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    // After the name: state(3) ppid(4) ... starttime is field 22, the 20th after the name.
    after.split_whitespace().nth(19)?.parse().ok()
}

/// The sandbox server's process under `root` (the sandbox's root process, host pid):
/// the topmost descendant running the server's binary (`rollout-sandbox`), found once
/// so that a waiting call can watch it cheaply ([`crate::client::SandboxClient::watch`]).
pub fn server_process(root: i32) -> Option<i32> {
    let rows = process_table();
    let is_server = |pid: i32| {
        std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .is_ok_and(|comm| comm.trim_end() == "rollout-sandbox")
    };
    // Breadth first from the root: the first server found is the topmost.
    let mut frontier = vec![root];
    while !frontier.is_empty() {
        if let Some(&pid) = frontier.iter().find(|&&pid| is_server(pid)) {
            return Some(pid);
        }
        frontier = rows
            .iter()
            .filter(|r| frontier.contains(&r.ppid))
            .map(|r| r.pid)
            .collect();
    }
    None
}

/// One row of the process table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessRow {
    /// The process.
    pub pid: i32,
    /// Its parent.
    pub ppid: i32,
    /// Its session.
    pub session: i32,
    /// Its threads (each counts against RLIMIT_NPROC).
    pub threads: u64,
    /// Its (effective) user id.
    pub uid: u32,
    /// Its start time in clock ticks since boot: with the pid, its identity.
    pub start: u64,
}

/// Every process visible in `/proc`, read once.
pub fn process_table() -> Vec<ProcessRow> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse::<i32>().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // The fields after the command name, which is in parentheses and may hold
            // spaces: state ppid pgrp session ...
            let after = &stat[stat.rfind(')')? + 1..];
            let fields: Vec<&str> = after.split_whitespace().collect();
            let uid = std::os::unix::fs::MetadataExt::uid(&entry.metadata().ok()?);
            Some(ProcessRow {
                pid,
                ppid: fields.get(1)?.parse().ok()?,
                session: fields.get(3)?.parse().ok()?,
                threads: fields.get(17)?.parse().ok()?,
                uid,
                start: fields.get(19)?.parse().ok()?,
            })
        })
        .collect()
}

/// The user ids of every running process: a `stat` of each `/proc/<pid>` (cheaper than
/// [`process_table`], which reads each process's `stat` file too).
pub fn process_uids() -> std::collections::HashSet<u32> {
    use std::os::unix::fs::MetadataExt;
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Default::default();
    };
    dir.flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        })
        .filter_map(|e| e.metadata().ok().map(|m| m.uid()))
        .collect()
}

/// All descendants of `pid` (children first found, then theirs), from `/proc`.
pub fn descendants(pid: i32) -> Vec<i32> {
    let table = process_table();
    let mut found = vec![pid];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        found.extend(table.iter().filter(|r| r.ppid == parent).map(|r| r.pid));
        i += 1;
    }
    found.remove(0);
    found
}

/// SIGKILLs `pid` and all its descendants (the process tree is frozen first with
/// SIGSTOP so nothing forks away while it is walked).
pub fn kill_tree(pid: i32) {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let _ = kill(Pid::from_raw(pid), Signal::SIGSTOP);
    let mut all = descendants(pid);
    for p in &all {
        let _ = kill(Pid::from_raw(*p), Signal::SIGSTOP);
    }
    // A second walk catches children forked before their parent stopped.
    for p in descendants(pid) {
        if !all.contains(&p) {
            all.push(p);
        }
    }
    all.push(pid);
    for p in all {
        let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
    }
}

/// Why a sandbox died while a stage was using it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Death {
    /// Something outside it: the node shutting down, the host out of memory. The job's
    /// stage starts again in a fresh sandbox.
    Infrastructure(String),
    /// What ran inside it (the episode killed its own processes, or ran into its own
    /// limits): the episode is scored as it stands, never run again.
    Workload,
}

/// The host's `oom_kill` counter, where the kernel has one.
pub fn host_oom_kills() -> Option<u64> {
    let vmstat = std::fs::read_to_string("/proc/vmstat").ok()?;
    vmstat
        .lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|n| n.trim().parse().ok())
}

/// Whether the cgroup in `dir` hit its own memory limit (`oom` in `memory.events` on
/// cgroup v2, `under_oom`'s history in `memory.oom_control` on v1).
fn own_oom(dir: &Path) -> bool {
    let count = |file: &str, key: &str| -> Option<u64> {
        std::fs::read_to_string(dir.join(file))
            .ok()?
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|n| n.trim().parse().ok())
    };
    count("memory.events", "oom ").is_some_and(|n| n > 0)
        || count("memory.oom_control", "oom_kill ").is_some_and(|n| n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only a host OOM kill while the sandbox stayed inside its own memory limit is the
    /// infrastructure's; everything else, unknown counts included, is the workload's.
    #[test]
    fn a_death_is_the_infrastructures_only_on_a_host_oom_outside_the_sandboxs_limit() {
        let dir = tempfile::tempdir().unwrap();
        let mut label = Label::new("j", "n", RuntimeKind::Bwrap, dir.path());
        label.host_oom_kills = Some(5);
        assert_eq!(label.death_given(Some(5)), Death::Workload);
        assert_eq!(label.death_given(None), Death::Workload);
        assert!(matches!(
            label.death_given(Some(7)),
            Death::Infrastructure(why) if why.contains("killed 2 process")
        ));
        // The sandbox's own cgroup hit its limit: the OOM kill was its own doing.
        let cg = dir.path().join("cg");
        std::fs::create_dir_all(&cg).unwrap();
        std::fs::write(
            cg.join("memory.events"),
            "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n",
        )
        .unwrap();
        label.cgroups = vec![cg];
        assert_eq!(label.death_given(Some(7)), Death::Workload);
        label.host_oom_kills = None;
        assert_eq!(label.death_given(Some(7)), Death::Workload);
    }

    #[test]
    fn labels_round_trip_and_know_their_process() {
        let dir = tempfile::tempdir().unwrap();
        let mut label = Label::new("job-1", "node-a", RuntimeKind::Local, dir.path());
        let pid = i32::try_from(std::process::id()).unwrap();
        label.set_process(pid);
        label.write().unwrap();
        let back = Label::read(dir.path()).unwrap().unwrap();
        assert_eq!(back, label);
        assert_eq!(back.live_pid(), Some(pid));
        let mut stale = back.clone();
        stale.pid_start = stale.pid_start.map(|s| s + 1);
        assert_eq!(stale.live_pid(), None, "a reused pid is not the sandbox");
    }
}
