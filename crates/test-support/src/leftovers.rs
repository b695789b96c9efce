//! What a test leaves on the machine, and stopping its services so that it leaves nothing.
//!
//! Other test runs share the machine (their own nats-servers, sandboxes, mounts and loop
//! devices), so a test only ever looks at what is *its own*: everything is found by the
//! test's own temporary directory. A process is the test's when its command line, working
//! directory or environment names that directory, or when it lives in a mount namespace
//! of its own (a sandbox) whose mounts come from that directory; a mount is when its
//! mount point is below it; a loop device is when its backing file is (deleted or not).
//!
//! [`Service`] runs a program (`rollout up`, a node) the way an operator stops one: SIGTERM
//! on drop, then waiting for it to exit. [`assert_nothing_left`] then fails the test with
//! a list of whatever of its own is still there.

use std::path::Path;
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

/// How long a stopped service may take to hand its work back and exit before it is
/// killed (and the test, through [`assert_nothing_left`], fails).
const STOP_GRACE: Duration = Duration::from_secs(120);

/// A child process stopped with SIGTERM (and waited for) when dropped.
pub struct Service {
    child: Option<Child>,
    what: String,
}

impl Service {
    /// Takes charge of `child`, called `what` in messages.
    pub fn new(child: Child, what: &str) -> Service {
        Service {
            child: Some(child),
            what: what.to_string(),
        }
    }

    /// Whether it has exited (and how).
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.as_mut()?.try_wait().ok().flatten()
    }

    /// Sends `signal` and waits for the process to exit (SIGKILL after
    /// [`STOP_GRACE`]); returns how it exited. Later calls, and the drop, do nothing.
    pub fn stop_with(&mut self, signal: nix::sys::signal::Signal) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).ok()?);
        let _ = nix::sys::signal::kill(pid, signal);
        let deadline = Instant::now() + STOP_GRACE;
        loop {
            match child.try_wait() {
                Ok(Some(st)) => return Some(st),
                Ok(None) if Instant::now() < deadline => {
                    #[allow(clippy::disallowed_methods, reason = "a test's teardown")]
                    std::thread::sleep(Duration::from_millis(50));
                }
                _ => {
                    eprintln!(
                        "{} did not exit within {STOP_GRACE:?} of {signal}; killing it",
                        self.what
                    );
                    let _ = child.kill();
                    return child.wait().ok();
                }
            }
        }
    }

    /// Stops it as an operator would: SIGTERM, then waiting.
    pub fn stop(&mut self) -> Option<ExitStatus> {
        self.stop_with(nix::sys::signal::Signal::SIGTERM)
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What of a test's is still on the machine.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Leftovers {
    /// `pid command line` of each process.
    pub processes: Vec<String>,
    /// Mount points.
    pub mounts: Vec<String>,
    /// `/dev/loopN -> backing file`.
    pub loop_devices: Vec<String>,
}

impl Leftovers {
    /// Whether nothing is left.
    pub fn is_empty(&self) -> bool {
        self.processes.is_empty() && self.mounts.is_empty() && self.loop_devices.is_empty()
    }
}

/// Everything of the test's whose directory is `dir` that is still on the machine (this
/// test process itself aside).
pub fn under(dir: &Path) -> Leftovers {
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let text = dir.to_string_lossy().into_owned();
    let in_fs = within_its_filesystem(&text);
    Leftovers {
        processes: processes(&text, &in_fs),
        mounts: mount_points("/proc/self/mountinfo")
            .into_iter()
            .filter(|m| is_under(m, &text))
            .collect(),
        loop_devices: loop_devices()
            .into_iter()
            .filter(|(_, backing)| is_under(backing.trim_end_matches(" (deleted)"), &text))
            .map(|(dev, backing)| format!("{dev} -> {backing}"))
            .collect(),
    }
}

/// Waits (a loop device is released only once the last sandbox holding its mount is
/// gone) until nothing of the test's in `dir` is left, and fails with the list if
/// something stays.
pub async fn assert_nothing_left(dir: &Path, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = under(dir);
        if left.is_empty() {
            return;
        }
        if Instant::now() > deadline {
            panic!("{what} left behind: {left:#?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn is_under(path: &str, dir: &str) -> bool {
    path == dir
        || path
            .strip_prefix(dir)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// `dir` as a mount table's `root` field names it: its path within the filesystem that
/// holds it (the longest mount point above it, whose own root it is joined to). A
/// sandbox's binds from `dir` show this path, whatever the sandbox calls them.
fn within_its_filesystem(dir: &str) -> String {
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut best: Option<(usize, String)> = None;
    for line in table.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let (Some(root), Some(point)) = (fields.get(3), fields.get(4)) else {
            continue;
        };
        let above = *point == "/" || is_under(dir, point);
        if !above || best.as_ref().is_some_and(|(len, _)| *len >= point.len()) {
            continue;
        }
        let rest = dir
            .strip_prefix(point)
            .unwrap_or("")
            .trim_start_matches('/');
        let joined = match rest {
            "" => (*root).to_string(),
            _ => format!("{}/{rest}", root.trim_end_matches('/')),
        };
        best = Some((point.len(), joined));
    }
    best.map_or_else(|| dir.to_string(), |(_, p)| p)
}

/// Processes naming `dir` (`in_fs` within its filesystem), this one aside.
fn processes(dir: &str, in_fs: &str) -> Vec<String> {
    let me = std::process::id().to_string();
    let my_ns = std::fs::read_link("/proc/self/ns/mnt").ok();
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in entries.flatten() {
        let pid = e.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|b| b.is_ascii_digit()) || pid == me {
            continue;
        }
        let p = e.path();
        let cmdline = std::fs::read(p.join("cmdline")).unwrap_or_default();
        if cmdline.is_empty() {
            continue; // a kernel thread, or already gone
        }
        let named = |bytes: &[u8]| {
            bytes
                .split(|&b| b == 0)
                .any(|s| String::from_utf8_lossy(s).contains(dir))
        };
        let cwd = std::fs::read_link(p.join("cwd"))
            .map(|c| is_under(&c.to_string_lossy(), dir))
            .unwrap_or(false);
        let environ = std::fs::read(p.join("environ")).unwrap_or_default();
        // A sandbox's processes see none of the host's paths; their mount namespace's
        // table still says where its binds come from.
        let sandboxed = std::fs::read_link(p.join("ns/mnt")).ok() != my_ns
            && std::fs::read_to_string(p.join("mountinfo"))
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.split(' ').nth(3))
                .any(|root| is_under(root, dir) || is_under(root, in_fs));
        if named(&cmdline) || cwd || named(&environ) || sandboxed {
            let cmd: Vec<String> = cmdline
                .split(|&b| b == 0)
                .filter(|s| !s.is_empty())
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect();
            let mut cmd = cmd.join(" ");
            cmd.truncate(200);
            out.push(format!("{pid} {cmd}"));
        }
    }
    out
}

/// The mount points listed in a `mountinfo` file.
fn mount_points(path: &str) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(unescape)
        .collect()
}

/// Loop devices in use with their backing files.
fn loop_devices() -> Vec<(String, String)> {
    let Ok(entries) = std::fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let backing = std::fs::read_to_string(e.path().join("loop/backing_file")).ok()?;
            Some((format!("/dev/{name}"), backing.trim_end().to_string()))
        })
        .collect()
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(u8::is_ascii_digit) {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
