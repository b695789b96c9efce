//! The workspace's disk quota: each sandbox's workspace as a filesystem of its own size.
//!
//! A workspace is otherwise a directory on the node's disk, and one episode that writes
//! without end fills the disk every other sandbox, the worker and the database share.
//! Where the worker is root and the kernel has loop devices, [`WorkspaceQuota::mount`]
//! gives each sandbox a sparse file `<dir>/workspace.img`, formatted as ext4 of
//! `limits.workspace_bytes`, loop-mounted (`nosuid`, `nodev`) on `<dir>/workspace`
//! before the task's files are put there. Writing past the quota then fails inside the
//! sandbox with "No space left on device"; the image takes only the blocks actually
//! written; a setuid file made in it is inert on the host.
//!
//! Formatting costs tens of milliseconds, so each size is formatted once per node, into
//! `<root>/.tools/`, and copied (holes and all, a few megabytes) for each sandbox. The
//! copy and the mount still take tens of milliseconds, so a node does them ahead of time
//! ([`super::pool`]) and a sandbox's start takes a mounted image from there.
//! [`unmount_under`] detaches such mounts when a sandbox is stopped, also after a worker
//! crash, since the reaper stops through the same path. Without root (or without loop
//! devices), the quota is reported as not enforced (see `NodeSandboxes::report`).

use super::SandboxError;
use std::path::{Path, PathBuf};

/// How this node gives workspaces a size.
#[derive(Debug, Clone)]
pub enum WorkspaceQuota {
    /// A loop-mounted ext4 image per sandbox.
    Loop {
        /// `mkfs.ext4`.
        mkfs: PathBuf,
        /// `mount`.
        mount: PathBuf,
    },
    /// Not on this node, and why.
    Unavailable {
        /// What is missing, for the limits report.
        why: String,
    },
}

impl WorkspaceQuota {
    /// What this node can do: loop mounts need root, `/dev/loop-control`, `mkfs.ext4`
    /// and `mount` (e2fsprogs and util-linux's mount, both in `scripts/setup.sh`).
    pub fn probe() -> Self {
        let unavailable = |why: &str| WorkspaceQuota::Unavailable { why: why.into() };
        if !nix::unistd::geteuid().is_root() {
            return unavailable(
                "the worker is not root, so it cannot mount a filesystem of the workspace's size",
            );
        }
        if !Path::new("/dev/loop-control").exists() {
            return unavailable("this kernel (or container) has no loop devices");
        }
        let find = |name: &str| {
            ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
                .iter()
                .map(|d| Path::new(d).join(name))
                .find(|p| p.exists())
        };
        match (find("mkfs.ext4"), find("mount")) {
            (Some(mkfs), Some(mount)) => WorkspaceQuota::Loop { mkfs, mount },
            _ => unavailable("mkfs.ext4 or mount is missing (install e2fsprogs and mount)"),
        }
    }

    /// Whether workspaces get their size here.
    pub fn enforced(&self) -> bool {
        matches!(self, WorkspaceQuota::Loop { .. })
    }

    /// Makes `workspace` (inside the sandbox directory `dir`, not yet holding anything)
    /// a filesystem of `bytes`. `0` leaves it a plain directory, as does a node without
    /// the means ([`WorkspaceQuota::Unavailable`], reported at start).
    pub async fn mount(
        &self,
        dir: &Path,
        workspace: &Path,
        bytes: u64,
    ) -> Result<(), SandboxError> {
        if bytes == 0 || !self.enforced() {
            return Ok(());
        }
        let tools = dir.parent().unwrap_or(Path::new("/")).join(".tools");
        self.mount_image(&tools, &dir.join("workspace.img"), workspace, bytes)
            .await
    }

    /// Copies the formatted template of `bytes` (made once in `tools`) to `image` and
    /// mounts it on `workspace` (`nosuid`, `nodev`, `noatime`), without the filesystem's
    /// `lost+found`.
    pub(crate) async fn mount_image(
        &self,
        tools: &Path,
        image: &Path,
        workspace: &Path,
        bytes: u64,
    ) -> Result<(), SandboxError> {
        let WorkspaceQuota::Loop { mkfs, mount } = self else {
            return Ok(());
        };
        let fail = |what: String| SandboxError::Start {
            backend: "workspace quota",
            message: what,
        };
        let template = ensure_template(mkfs, tools, bytes)
            .await
            .map_err(|e| fail(format!("cannot format a {bytes}-byte workspace image: {e}")))?;
        let (from, to) = (template.clone(), image.to_path_buf());
        tokio::task::spawn_blocking(move || copy_sparse(&from, &to))
            .await
            .map_err(|e| fail(format!("the image copy panicked: {e}")))?
            .map_err(|e| fail(format!("cannot copy the workspace image: {e}")))?;
        std::fs::create_dir_all(workspace)?;
        run(tokio::process::Command::new(mount)
            .args(["-t", "ext4", "-o", "loop,nosuid,nodev,noatime"])
            .arg(image)
            .arg(workspace))
        .await
        .map_err(|e| fail(format!("cannot mount the workspace image: {e}")))?;
        // The workspace is the task's, with nothing of the filesystem's own in it.
        let _ = std::fs::remove_dir(workspace.join("lost+found"));
        Ok(())
    }
}

/// The formatted image of `bytes` in `tools`, made once: formatted under a temporary
/// name and renamed, so concurrent starts (of several workers too) never see half of one.
async fn ensure_template(mkfs: &Path, tools: &Path, bytes: u64) -> std::io::Result<PathBuf> {
    let template = tools.join(format!("workspace-{bytes}.img"));
    if template.exists() {
        return Ok(template);
    }
    {
        use std::os::unix::fs::DirBuilderExt;
        // Shared with the shell's execute-only copy (see `bwrap::shell_copy`).
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o711)
            .create(tools)?;
    }
    let tmp = tools.join(format!(
        "workspace-{bytes}.img.{}",
        uuid::Uuid::new_v4().simple()
    ));
    {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?
            .set_len(bytes)?;
    }
    // No journal (a workspace does not outlive its sandbox, so nothing to recover), no
    // blocks reserved for root (nothing in a sandbox is root on the host), inode tables
    // initialised lazily: a few megabytes written whatever the size.
    let made = run(tokio::process::Command::new(mkfs)
        .args(["-q", "-F", "-O", "^has_journal", "-m", "0"])
        .args(["-E", "nodiscard,lazy_itable_init=1"])
        .arg(&tmp))
    .await;
    if let Err(e) = made {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, &template)?;
    Ok(template)
}

/// Runs `cmd` to its end; a failure carries what it printed.
async fn run(cmd: &mut tokio::process::Command) -> std::io::Result<()> {
    let out = cmd
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await?;
    if out.status.success() {
        return Ok(());
    }
    Err(std::io::Error::other(format!(
        "{:?} failed ({}): {}",
        cmd.as_std().get_program(),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    )))
}

/// Copies `from` to a new file `to` (mode 0600) keeping its holes: only the data
/// extents are read and written, so a sparse 10 GiB image costs its few megabytes.
pub fn copy_sparse(from: &Path, to: &Path) -> std::io::Result<()> {
    use nix::unistd::{Whence, lseek};
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let src = std::fs::File::open(from)?;
    let len = src.metadata()?.len();
    let dst = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(to)?;
    dst.set_len(len)?;
    let mut buf = vec![0u8; 1 << 20];
    // Offsets are lseek's `off_t` (i64), which holds any file's size; lseek returns none
    // below 0 and a read is at most the buffer's 1 MiB, so the conversions below do not
    // fail.
    let offset = |o| u64::try_from(o).map_err(std::io::Error::other);
    let end_of_file = i64::try_from(len).map_err(std::io::Error::other)?;
    let mut pos: i64 = 0;
    while pos < end_of_file {
        let start = match lseek(&src, pos, Whence::SeekData) {
            Ok(o) => o,
            // No data after `pos`: the rest is a hole.
            Err(nix::errno::Errno::ENXIO) => break,
            Err(e) => return Err(e.into()),
        };
        let end = lseek(&src, start, Whence::SeekHole)?;
        let mut at = start;
        while at < end {
            let want = usize::try_from(end - at).map_or(buf.len(), |left| left.min(buf.len()));
            let n = src.read_at(&mut buf[..want], offset(at)?)?;
            if n == 0 {
                break;
            }
            dst.write_all_at(&buf[..n], offset(at)?)?;
            at += i64::try_from(n).map_err(std::io::Error::other)?;
        }
        pos = end;
    }
    Ok(())
}

/// The mount points at or below `dir`, from `/proc/self/mountinfo` (none where there is
/// no such file).
fn mount_points_under(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let info = match std::fs::read_to_string("/proc/self/mountinfo") {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    Ok(info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape(p)))
        .filter(|p| p.starts_with(dir))
        .collect())
}

/// Whether anything is mounted at or below `dir` (an unreadable mount table counts as
/// yes: the caller is about to remove `dir`).
pub fn mounted_under(dir: &Path) -> bool {
    mount_points_under(dir).map_or(true, |p| !p.is_empty())
}

/// Detaches every mount at or below `dir` (a sandbox directory), deepest first, so the
/// directory can be removed. Lazy (`MNT_DETACH`): a mount still held by a dying
/// sandbox's namespace goes when that does. Reads `/proc/self/mountinfo`, so it also
/// finds what an earlier, crashed worker mounted.
pub fn unmount_under(dir: &Path) -> std::io::Result<()> {
    let mut points = mount_points_under(dir)?;
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    points.dedup();
    for p in points {
        match nix::mount::umount2(&p, nix::mount::MntFlags::MNT_DETACH) {
            Ok(()) | Err(nix::errno::Errno::EINVAL) | Err(nix::errno::Errno::ENOENT) => {}
            Err(e) => {
                return Err(std::io::Error::other(format!(
                    "cannot unmount {}: {e}",
                    p.display()
                )));
            }
        }
    }
    Ok(())
}

/// Undoes mountinfo's octal escapes (`\040` for a space, and so on).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(unescape(r"/a\040b\011c"), "/a b\tc");
        assert_eq!(unescape(r"/plain"), "/plain");
        assert_eq!(unescape(r"/trailing\04"), r"/trailing\04");
    }

    #[test]
    fn a_sparse_copy_keeps_data_and_holes() {
        let d = tempfile::tempdir().unwrap();
        let (a, b) = (d.path().join("a"), d.path().join("b"));
        let f = std::fs::File::create(&a).unwrap();
        f.set_len(64 << 20).unwrap();
        use std::os::unix::fs::FileExt;
        f.write_all_at(b"head", 0).unwrap();
        f.write_all_at(b"middle", 32 << 20).unwrap();
        f.write_all_at(b"tail", (64 << 20) - 4).unwrap();
        drop(f);
        copy_sparse(&a, &b).unwrap();
        assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
        use std::os::unix::fs::MetadataExt;
        // Holes stay holes: far fewer blocks than the length.
        assert!(std::fs::metadata(&b).unwrap().blocks() * 512 < 8 << 20);
    }
}
