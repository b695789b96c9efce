//! Sandboxes as settings and tasks describe them: which runtime runs one, the resource
//! limits it gets, and the networks it may or may not reach. Plain data shared by the
//! configuration, task specs and the sandbox runtimes.

use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};

/// Which runtime runs a sandbox (the `sandbox.backend` setting and a task's choice).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Hash)]
#[serde(rename_all = "snake_case")]
pub enum RuntimeKind {
    /// A plain child process in a directory: no isolation.
    Local,
    /// bubblewrap.
    Bwrap,
    /// Apptainer / Singularity.
    Apptainer,
}

impl RuntimeKind {
    /// Parses a configuration or task value.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "local" => Some(RuntimeKind::Local),
            "bwrap" => Some(RuntimeKind::Bwrap),
            "apptainer" => Some(RuntimeKind::Apptainer),
            _ => None,
        }
    }

    /// The name used in configuration and labels.
    pub fn as_str(self) -> &'static str {
        match self {
            RuntimeKind::Local => "local",
            RuntimeKind::Bwrap => "bwrap",
            RuntimeKind::Apptainer => "apptainer",
        }
    }
}

/// Resource limits applied to everything in a sandbox. `0` leaves a limit unset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SandboxLimits {
    /// Maximum processes (RLIMIT_NPROC, counted in the sandbox's own user namespace).
    pub processes: u64,
    /// Address space per process in bytes (RLIMIT_AS).
    pub memory_bytes: u64,
    /// Largest file a process may write, in bytes (RLIMIT_FSIZE).
    pub file_size_bytes: u64,
    /// CPU seconds per process (RLIMIT_CPU).
    pub cpu_seconds: u64,
    /// Size of the private `/tmp` (tmpfs), in bytes.
    pub tmp_bytes: u64,
    /// Size of the private `/dev/shm` (tmpfs), in bytes.
    pub shm_bytes: u64,
    /// Size of the workspace's own filesystem, in bytes, where the node can give it one
    /// (a root worker with loop devices, see `sandbox::quota`); elsewhere reported as not held.
    pub workspace_bytes: u64,
}

impl Default for SandboxLimits {
    fn default() -> Self {
        SandboxLimits {
            processes: 256,
            memory_bytes: 8 << 30,
            file_size_bytes: 1 << 30,
            cpu_seconds: 3600,
            tmp_bytes: 512 << 20,
            shm_bytes: 64 << 20,
            workspace_bytes: 10 << 30,
        }
    }
}

impl SandboxLimits {
    /// The operator's default ceilings (`sandbox.max_limits`): generous for a training
    /// node, but no task can lift a limit (0) or ask for what no node has.
    pub fn default_maximums() -> Self {
        SandboxLimits {
            processes: 4096,
            memory_bytes: 64 << 30,
            file_size_bytes: 64 << 30,
            cpu_seconds: 86_400,
            tmp_bytes: 16 << 30,
            shm_bytes: 16 << 30,
            workspace_bytes: 256 << 30,
        }
    }

    /// Each limit with its name (the key under `limits`), in declaration order.
    pub fn named(&self) -> [(&'static str, u64); 7] {
        [
            ("processes", self.processes),
            ("memory_bytes", self.memory_bytes),
            ("file_size_bytes", self.file_size_bytes),
            ("cpu_seconds", self.cpu_seconds),
            ("tmp_bytes", self.tmp_bytes),
            ("shm_bytes", self.shm_bytes),
            ("workspace_bytes", self.workspace_bytes),
        ]
    }
}

/// The smallest workspace a node can give its own filesystem: `mkfs.ext4` refuses to
/// format less (64 KiB fails, 1 MiB works), so a smaller `workspace_bytes` would fail
/// every INIT.
pub const MIN_WORKSPACE_BYTES: u64 = 1 << 20;

/// The largest workspace image a node can make: the image is one sparse file, and ext4
/// (with 4 KiB blocks) holds no file over 16 TiB, so a larger `workspace_bytes` would
/// fail every INIT ("File too large").
pub const MAX_WORKSPACE_BYTES: u64 = 16 << 40;

/// Why `value` cannot be the limit `name` under the ceiling `max` (0: none), or `None`
/// when it can. 0 means "no limit", allowed only where the ceiling is 0 too; a
/// workspace size must also be one a node can make (see [`MIN_WORKSPACE_BYTES`]).
/// Shared by the configuration's check of its defaults and the submit-time check of a
/// task's overrides, so both refuse the same values.
pub fn limit_problem(name: &str, value: u64, max: u64) -> Option<String> {
    if value == 0 && max > 0 {
        return Some(format!(
            "0 (no limit) is above this service's maximum of {max} (sandbox.max_limits.{name}); \
             ask for at most {max}"
        ));
    }
    if max > 0 && value > max {
        return Some(format!(
            "{value} is above this service's maximum of {max} (sandbox.max_limits.{name})"
        ));
    }
    if name == "workspace_bytes"
        && value != 0
        && !(MIN_WORKSPACE_BYTES..=MAX_WORKSPACE_BYTES).contains(&value)
    {
        return Some(format!(
            "{name} = {value} is not a workspace a node can make: its filesystem takes \
             {MIN_WORKSPACE_BYTES} to {MAX_WORKSPACE_BYTES} bytes"
        ));
    }
    None
}

/// An IPv4 network, `addr/prefix`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Ipv4Net {
    /// The network's first address (host bits cleared).
    pub addr: Ipv4Addr,
    /// The prefix length, 0..=32.
    pub prefix: u8,
}

impl Ipv4Net {
    /// `addr/prefix` with the host bits cleared.
    pub fn new(addr: Ipv4Addr, prefix: u8) -> Self {
        let prefix = prefix.min(32);
        let mask = if prefix == 0 {
            0
        } else {
            u32::MAX << (32 - prefix)
        };
        Ipv4Net {
            addr: Ipv4Addr::from(u32::from(addr) & mask),
            prefix,
        }
    }

    /// Parses `a.b.c.d/n` (or a bare address, a /32).
    pub fn parse(s: &str) -> Option<Self> {
        let (a, p) = s.split_once('/').unwrap_or((s, "32"));
        let prefix: u8 = p.parse().ok().filter(|p| *p <= 32)?;
        Some(Ipv4Net::new(a.parse().ok()?, prefix))
    }

    /// Whether `other` lies wholly inside this network.
    pub fn contains(&self, other: &Ipv4Net) -> bool {
        other.prefix >= self.prefix && Ipv4Net::new(other.addr, self.prefix).addr == self.addr
    }
}

impl std::fmt::Display for Ipv4Net {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}
