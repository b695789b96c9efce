//! Workspace filesystems made ahead of time, so a sandbox with a disk quota does not wait
//! for one.
//!
//! Giving a workspace its own size (see [`super::quota`]) means copying a formatted image,
//! attaching it to a loop device and mounting it: a `mount` process, the loop device's
//! set-up and ext4 reading its metadata, tens of milliseconds that used to come before
//! every such sandbox's start. The pool does that work in the background, off the start
//! path: it keeps up to `depth` images of each size asked for mounted (`nosuid`,
//! `nodev`, `noatime`, exactly as [`WorkspaceQuota::mount`] mounts them) under a
//! directory of its own, `<root>/.pool-<pid>-<start time>/`. Taking one bind-mounts it
//! onto the sandbox's `workspace/` (a bind keeps the mount's flags) and moves the image
//! file into the sandbox's directory, where it is removed with it. Every image is fresh:
//! none is ever used by two sandboxes.
//!
//! Two chores follow a take, and both wait until the sandbox has started
//! ([`WorkspacePool::settle`], given the [`Taken`] the take returned): detaching the
//! pool's own mount point (then the workspace's mount is the filesystem's only one on the
//! host, and the sandbox's stop, [`super::quota::unmount_under`], frees it and its loop
//! device as before), and topping the pool up. Done at once they ran beside bwrap's own
//! mounts, for the kernel's mount lock and the node's cores: a detach waits out an RCU
//! grace period, and a refill copies an image and mounts it (tens of milliseconds).
//!
//! [`WorkspacePool::close`] (the node stopping) unmounts and removes everything the pool
//! holds, after waiting for images being made; a pool directory left by a process that
//! died (pid and start time, as labels name processes) is removed by the next pool made
//! under the same root. A miss (the pool empty, or closed) mounts the slow way.

use super::SandboxError;
use super::quota::WorkspaceQuota;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// An image mounted in the pool, not yet any sandbox's.
struct Ready {
    /// The image file.
    image: PathBuf,
    /// Where it is mounted.
    mountpoint: PathBuf,
}

/// The pool's state, shared with its filling tasks.
#[derive(Default)]
struct State {
    /// Mounted images by size in bytes.
    ready: HashMap<u64, Vec<Ready>>,
    /// Sizes being filled now (one filling task per size).
    filling: std::collections::HashSet<u64>,
    /// Set by [`WorkspacePool::close`]: nothing more is made, and what a filling task
    /// finishes after this is taken down at once.
    closed: bool,
}

/// What taking a workspace left to do once its sandbox has started: the pool's own
/// mount point to detach, and the pool to top up. Hand it to [`WorkspacePool::settle`]
/// (on every path, a failed start too); one dropped instead leaves the mount point to
/// [`WorkspacePool::close`] and the refill to the next take.
#[must_use = "hand it to WorkspacePool::settle once the sandbox has started"]
#[derive(Debug, Default)]
pub struct Taken {
    /// The workspace's size; 0 when it has none (nothing to top up).
    bytes: u64,
    /// The pool's mount point of an image taken from it.
    pool_mount: Option<PathBuf>,
}

/// See the module documentation.
pub struct WorkspacePool {
    quota: WorkspaceQuota,
    /// `<root>/.pool-<pid>-<start time>`.
    dir: PathBuf,
    /// The node's `.tools` directory, where each size's formatted template lives.
    tools: PathBuf,
    depth: usize,
    state: Arc<Mutex<State>>,
    /// The filling tasks, which [`WorkspacePool::close`] waits for.
    tasks: tokio_util::task::TaskTracker,
}

/// The prefix of pool directories under a node's sandbox root.
const POOL_PREFIX: &str = ".pool-";

impl WorkspacePool {
    /// A pool of up to `depth` mounted images per size under `root` (a node's sandbox
    /// root), made the way `quota` makes them; depth 0, or a quota this node cannot
    /// enforce, makes a pool that never holds anything. Removes the pools of dead
    /// processes under `root`.
    pub fn new(quota: WorkspaceQuota, root: &Path, depth: usize) -> Self {
        let me = std::process::id();
        let start = super::label::process_start(i32::try_from(me).unwrap_or(-1)).unwrap_or(0);
        if quota.enforced() {
            remove_dead_pools(root);
        }
        WorkspacePool {
            depth: if quota.enforced() { depth } else { 0 },
            quota,
            dir: root.join(format!("{POOL_PREFIX}{me}-{start}")),
            tools: root.join(".tools"),
            state: Arc::default(),
            tasks: tokio_util::task::TaskTracker::new(),
        }
    }

    /// The quota images are made with.
    pub fn quota(&self) -> &WorkspaceQuota {
        &self.quota
    }

    /// Makes `workspace` (inside the sandbox directory `dir`, empty) a filesystem of
    /// `bytes`, from the pool when it holds one of that size, else the slow way. `0`
    /// leaves a plain directory. What is left to do after the sandbox's start comes back
    /// as a [`Taken`], for [`WorkspacePool::settle`].
    pub async fn mount(
        &self,
        dir: &Path,
        workspace: &Path,
        bytes: u64,
    ) -> Result<Taken, SandboxError> {
        if bytes == 0 || !self.quota.enforced() {
            return Ok(Taken::default());
        }
        let taken = self
            .state
            .lock()
            .expect("pool lock")
            .ready
            .get_mut(&bytes)
            .and_then(Vec::pop);
        let Some(ready) = taken else {
            self.quota.mount(dir, workspace, bytes).await?;
            return Ok(Taken {
                bytes,
                pool_mount: None,
            });
        };
        let (dir, workspace) = (dir.to_path_buf(), workspace.to_path_buf());
        let hand = tokio::task::spawn_blocking(move || hand_over(&ready, &dir, &workspace));
        let handed = hand
            .await
            .map_err(|e| SandboxError::Io(std::io::Error::other(e)))?;
        match handed {
            Ok(pool_mount) => Ok(Taken {
                bytes,
                pool_mount: Some(pool_mount),
            }),
            Err(e) => {
                self.refill(bytes);
                Err(SandboxError::Start {
                    backend: "workspace quota",
                    message: format!("cannot take a prepared workspace image: {e}"),
                })
            }
        }
    }

    /// Does what a take left for after its sandbox's start (see [`Taken`]), in the
    /// background: detaches the pool's mount point of the image taken (the kernel waits
    /// out an RCU grace period for it; [`WorkspacePool::close`] waits for it and sweeps
    /// the pool directory's mounts anyway) and tops the pool up.
    pub fn settle(&self, taken: Taken) {
        if let Some(pool_mount) = taken.pool_mount {
            self.tasks.spawn_blocking(move || {
                if let Err(e) = super::quota::unmount_under(&pool_mount) {
                    tracing::warn!(error = %e, "cannot detach a pooled image's mount point");
                }
                let _ = std::fs::remove_dir(&pool_mount);
            });
        }
        if taken.bytes > 0 {
            self.refill(taken.bytes);
        }
    }

    /// Mounts images of `bytes` in the background until `depth` are ready, unless that
    /// is under way already or the pool is closed.
    pub fn refill(&self, bytes: u64) {
        if self.depth == 0 || tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        {
            let mut st = self.state.lock().expect("pool lock");
            let have = st.ready.get(&bytes).map_or(0, Vec::len);
            if st.closed || have >= self.depth || !st.filling.insert(bytes) {
                return;
            }
        }
        let (quota, dir, tools, depth, state) = (
            self.quota.clone(),
            self.dir.clone(),
            self.tools.clone(),
            self.depth,
            self.state.clone(),
        );
        self.tasks.spawn(async move {
            loop {
                let wanted = {
                    let st = state.lock().expect("pool lock");
                    !st.closed && st.ready.get(&bytes).map_or(0, Vec::len) < depth
                };
                if !wanted {
                    break;
                }
                match prepare(&quota, &dir, &tools, bytes).await {
                    Ok(ready) => {
                        let mut st = state.lock().expect("pool lock");
                        if st.closed {
                            drop(st);
                            take_down(&ready);
                            break;
                        }
                        st.ready.entry(bytes).or_default().push(ready);
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, bytes, "cannot prepare a workspace image ahead of time; sandboxes mount theirs when they start");
                        break;
                    }
                }
            }
            state.lock().expect("pool lock").filling.remove(&bytes);
        });
    }

    /// Takes the pool down: nothing more is made, images being made are waited for,
    /// and every image the pool holds is unmounted (its loop device goes with it) and
    /// removed, with the pool's directory.
    pub async fn close(&self) {
        self.state.lock().expect("pool lock").closed = true;
        self.tasks.close();
        self.tasks.wait().await;
        let ready: Vec<Ready> = std::mem::take(&mut self.state.lock().expect("pool lock").ready)
            .into_values()
            .flatten()
            .collect();
        let dir = self.dir.clone();
        let _ = tokio::task::spawn_blocking(move || {
            for r in &ready {
                take_down(r);
            }
            remove_pool_dir(&dir);
        })
        .await;
    }

    /// How many images of `bytes` are ready now.
    pub fn ready(&self, bytes: u64) -> usize {
        self.state
            .lock()
            .expect("pool lock")
            .ready
            .get(&bytes)
            .map_or(0, Vec::len)
    }
}

/// Mounts one fresh image of `bytes` in the pool directory `dir`.
async fn prepare(
    quota: &WorkspaceQuota,
    dir: &Path,
    tools: &Path,
    bytes: u64,
) -> Result<Ready, SandboxError> {
    // 0700: nothing in the pool is any other user's business.
    super::private_dir(dir)?;
    let id = uuid::Uuid::new_v4().simple().to_string();
    let mountpoint = dir.join(&id);
    std::fs::create_dir(&mountpoint)?;
    let image = dir.join(format!("{id}.img"));
    match quota.mount_image(tools, &image, &mountpoint, bytes).await {
        Ok(()) => Ok(Ready { image, mountpoint }),
        Err(e) => {
            let _ = super::quota::unmount_under(&mountpoint);
            let _ = std::fs::remove_dir(&mountpoint);
            let _ = std::fs::remove_file(&image);
            Err(e)
        }
    }
}

/// Makes the pool's mounted image `ready` the filesystem at `workspace` in sandbox
/// directory `dir`: a bind mount of it there (which keeps `nosuid`, `nodev` and
/// `noatime`) and the image file moved into `dir`. Returns the pool's own mount point,
/// for the caller to detach (then the workspace's mount is the filesystem's only one).
fn hand_over(ready: &Ready, dir: &Path, workspace: &Path) -> std::io::Result<PathBuf> {
    use nix::mount::{MsFlags, mount};
    std::fs::create_dir_all(workspace)?;
    let bound = mount(
        Some(&ready.mountpoint),
        workspace,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    );
    if let Err(e) = bound {
        take_down(ready);
        return Err(std::io::Error::other(format!("bind mount: {e}")));
    }
    if let Err(e) = std::fs::rename(&ready.image, dir.join("workspace.img")) {
        // The sandbox's stop unmounts the workspace; the image goes with the pool.
        take_down(ready);
        return Err(e);
    }
    Ok(ready.mountpoint.clone())
}

/// Unmounts a pool image (its loop device is released with the last mount) and removes
/// it.
fn take_down(ready: &Ready) {
    if let Err(e) = super::quota::unmount_under(&ready.mountpoint) {
        tracing::warn!(error = %e, "cannot unmount a pooled workspace image");
    }
    let _ = std::fs::remove_dir(&ready.mountpoint);
    let _ = std::fs::remove_file(&ready.image);
}

/// Unmounts everything under a pool directory and removes it.
fn remove_pool_dir(dir: &Path) {
    if let Err(e) = super::quota::unmount_under(dir) {
        tracing::warn!(dir = %dir.display(), error = %e, "cannot unmount the workspace pool");
        return;
    }
    match std::fs::remove_dir_all(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot remove the workspace pool")
        }
    }
}

/// Removes the pool directories under `root` whose process is gone (a crashed worker's).
fn remove_dead_pools(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some((pid, start)) = name
            .strip_prefix(POOL_PREFIX)
            .and_then(|rest| rest.split_once('-'))
        else {
            continue;
        };
        let (Ok(pid), Ok(start)) = (pid.parse::<i32>(), start.parse::<u64>()) else {
            continue;
        };
        if super::label::process_start(pid) != Some(start) {
            tracing::info!(dir = %e.path().display(), "removing the workspace pool of a process that is gone");
            remove_pool_dir(&e.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Mount points at or below `under`, from this process's mountinfo, with their
    /// per-mount options.
    fn mounts_under(under: &Path) -> Vec<(PathBuf, String)> {
        std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                Some((PathBuf::from(f.get(4)?), f.get(5)?.to_string()))
            })
            .filter(|(p, _)| p.starts_with(under))
            .collect()
    }

    /// Loop devices whose backing file is below `under`.
    fn loops_under(under: &Path) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir("/sys/block") else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|e| std::fs::read_to_string(e.path().join("loop/backing_file")).ok())
            .filter(|b| Path::new(b.trim()).starts_with(under))
            .collect()
    }

    /// Root with loop devices only: a pooled image becomes the workspace with the flags
    /// a directly mounted one has, and once the pool is closed and the sandbox stopped,
    /// no mount, loop device or file of either is left.
    #[tokio::test]
    async fn a_pooled_image_is_the_workspace_and_nothing_outlives_the_pool() {
        let quota = WorkspaceQuota::probe();
        if !quota.enforced() {
            crate::prerequisite::missing(
                "sandbox::pool::a_pooled_image_is_the_workspace_and_nothing_outlives_the_pool",
                "this worker cannot mount workspace images (it needs root and loop devices)",
            );
            return;
        }
        let root = tempfile::tempdir().unwrap();
        let root = root.path();
        let pool = WorkspacePool::new(quota, root, 2);
        let bytes = 64 << 20;
        pool.refill(bytes);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while pool.ready(bytes) < 2 {
            assert!(
                std::time::Instant::now() < deadline,
                "the pool never filled"
            );
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let dir = root.join("sb");
        let ws = dir.join("workspace");
        std::fs::create_dir_all(&ws).unwrap();
        let taken = pool.mount(&dir, &ws, bytes).await.unwrap();
        let here = mounts_under(&dir);
        assert_eq!(here.len(), 1, "{here:?}");
        assert_eq!(here[0].0, ws);
        for flag in ["nosuid", "nodev", "noatime"] {
            assert!(here[0].1.split(',').any(|f| f == flag), "{here:?}");
        }
        assert!(dir.join("workspace.img").is_file());
        assert!(!ws.join("lost+found").exists());
        std::fs::write(ws.join("a"), "x").unwrap();
        pool.settle(taken);
        pool.close().await;
        assert_eq!(mounts_under(root).len(), 1, "{:?}", mounts_under(root));
        assert!(
            !std::fs::read_dir(root)
                .unwrap()
                .flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with(POOL_PREFIX))
        );
        // The sandbox's stop, as `Runtimes::stop` does it.
        crate::quota::unmount_under(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(mounts_under(root).is_empty());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !loops_under(root).is_empty() {
            assert!(
                std::time::Instant::now() < deadline,
                "{:?}",
                loops_under(root)
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn a_pool_without_the_means_holds_nothing_and_mounts_nothing() {
        let root = tempfile::tempdir().unwrap();
        let pool = WorkspacePool::new(
            WorkspaceQuota::Unavailable { why: "test".into() },
            root.path(),
            2,
        );
        let dir = root.path().join("sb");
        let ws = dir.join("workspace");
        std::fs::create_dir_all(&ws).unwrap();
        let taken = pool.mount(&dir, &ws, 1 << 30).await.unwrap();
        pool.settle(taken);
        assert_eq!(pool.ready(1 << 30), 0);
        pool.close().await;
        assert!(!root.path().join(format!("{POOL_PREFIX}x")).exists());
    }
}
