//! The `bwrap` backend: bubblewrap, rootless, the default on Linux.
//!
//! The sandbox gets new user, PID, IPC, UTS, cgroup and (unless the task allows network)
//! network namespaces; no capabilities; no further user namespaces. The host's system
//! directories (`/usr` and its `/bin`, `/lib`… links) and a short list of `/etc` files
//! programs need are bound read-only; the workspace (`/workspace`) and the socket
//! directory (`/run/rollout`) are the only writable binds, beside a size-limited private
//! tmpfs `/tmp`. Process, memory, file-size and CPU limits are rlimits set on `bwrap`
//! before it starts and inherited by everything inside.
//!
//! The process limit (RLIMIT_NPROC) is counted by the kernel per *host* user, across
//! user namespaces, and real root is exempt from it. So when the worker runs as root,
//! each sandbox runs as a host user id of its own, picked from a configured range and
//! recorded in its label (mapped to root inside); its files are owned by that id on the
//! host. Its binds are then passed to bwrap as descriptors the worker opened, so that
//! user needs no permission on the directories above them. When the worker is not root, the sandbox shares the worker's user, and the limit
//! is set to what that user runs already plus `limits.processes`: a cap on the fork
//! bomb, though not a separate budget per sandbox.

use super::{BackendKind, Label, Sandbox, SandboxBackend, SandboxError, StartRequest};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// Where the server binary appears inside the sandbox.
pub const SERVER_PATH: &str = "/run/rollout-sandbox";
/// The workspace inside the sandbox.
pub const WORKSPACE: &str = "/workspace";
/// The socket directory inside the sandbox.
pub const RUN_DIR: &str = "/run/rollout";
/// The server's private directory inside the sandbox (a small tmpfs of its own, so an
/// agent filling `/tmp` does not break the tools).
pub const CTL_DIR: &str = "/run/rollout-ctl";

/// `/etc` entries programs commonly need; secrets such as `shadow` are not among them.
const ETC: &[&str] = &[
    "passwd",
    "group",
    "hosts",
    "resolv.conf",
    "nsswitch.conf",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "alternatives",
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "mime.types",
    "protocols",
    "services",
    "gitconfig",
    "bash.bashrc",
    "profile",
    "inputrc",
    "python3",
    "python3.11",
    "pip.conf",
];

/// See the module documentation.
#[derive(Debug, Clone)]
pub struct BwrapBackend {
    /// The bubblewrap executable.
    pub program: PathBuf,
    /// When the worker is root: the first host user id for sandboxes, and how many.
    pub uid_range: (u32, u32),
    /// When the worker is root: the group sandboxes run as.
    pub gid: u32,
}

impl Default for BwrapBackend {
    fn default() -> Self {
        BwrapBackend {
            program: PathBuf::from("bwrap"),
            uid_range: (1_000_000_000, 1_000_000),
            gid: 65534,
        }
    }
}

impl BwrapBackend {
    /// A host user id for a new sandbox under `root`: random in the range, and not one
    /// that a sandbox there (by its label) or a running process uses.
    fn pick_uid(&self, root: &Path) -> u32 {
        let mut used: std::collections::HashSet<u32> = Label::dirs(root)
            .iter()
            .filter_map(|d| Label::read(d).ok().flatten()?.uid)
            .collect();
        used.extend(super::label::process_table().iter().map(|r| r.uid));
        let (base, count) = self.uid_range;
        loop {
            let uid = base + (uuid::Uuid::new_v4().as_u128() % u128::from(count)) as u32;
            if !used.contains(&uid) {
                return uid;
            }
        }
    }

    /// The full `bwrap` argument list for `req`. With `by_fd`, the workspace, socket
    /// directory and server binary are bound from descriptors 4, 5 and 6 rather than by
    /// path (fd 3 is always bwrap's `--info-fd`).
    pub fn args(&self, req: &StartRequest, by_fd: bool) -> Vec<OsString> {
        let mut a: Vec<OsString> = Vec::new();
        let mut push =
            |items: &[&std::ffi::OsStr]| a.extend(items.iter().map(|s| s.to_os_string()));
        push(&["--unshare-all".as_ref(), "--unshare-user".as_ref()]);
        if req.network {
            push(&["--share-net".as_ref()]);
        }
        push(&[
            "--disable-userns".as_ref(),
            "--cap-drop".as_ref(),
            "ALL".as_ref(),
            "--new-session".as_ref(),
            "--uid".as_ref(),
            "0".as_ref(),
            "--gid".as_ref(),
            "0".as_ref(),
            "--hostname".as_ref(),
            "sandbox".as_ref(),
            "--ro-bind".as_ref(),
            "/usr".as_ref(),
            "/usr".as_ref(),
        ]);
        for top in ["bin", "sbin", "lib", "lib32", "lib64", "libx32"] {
            let host = Path::new("/").join(top);
            match std::fs::read_link(&host) {
                Ok(target) => push(&["--symlink".as_ref(), target.as_os_str(), host.as_os_str()]),
                Err(_) if host.is_dir() => {
                    push(&["--ro-bind".as_ref(), host.as_os_str(), host.as_os_str()])
                }
                Err(_) => {}
            }
        }
        for name in ETC {
            let p = Path::new("/etc").join(name);
            push(&["--ro-bind-try".as_ref(), p.as_os_str(), p.as_os_str()]);
        }
        for p in &req.ro_binds {
            push(&["--ro-bind-try".as_ref(), p.as_os_str(), p.as_os_str()]);
        }
        let tmp_size = req.limits.tmp_bytes.to_string();
        push(&[
            "--proc".as_ref(),
            "/proc".as_ref(),
            "--dev".as_ref(),
            "/dev".as_ref(),
        ]);
        if req.limits.tmp_bytes > 0 {
            push(&["--size".as_ref(), tmp_size.as_ref()]);
        }
        push(&[
            "--tmpfs".as_ref(),
            "/tmp".as_ref(),
            "--size".as_ref(),
            "67108864".as_ref(),
            "--tmpfs".as_ref(),
            CTL_DIR.as_ref(),
        ]);
        if by_fd {
            // Descriptors the worker opened (see `start`): the sandbox's own user needs no
            // permission on the directories above them.
            push(&[
                "--bind-fd".as_ref(),
                "4".as_ref(),
                WORKSPACE.as_ref(),
                "--bind-fd".as_ref(),
                "5".as_ref(),
                RUN_DIR.as_ref(),
                "--ro-bind-fd".as_ref(),
                "6".as_ref(),
                SERVER_PATH.as_ref(),
            ]);
        } else {
            push(&[
                "--bind".as_ref(),
                req.workspace().as_os_str(),
                WORKSPACE.as_ref(),
                "--bind".as_ref(),
                req.run_dir().as_os_str(),
                RUN_DIR.as_ref(),
                "--ro-bind".as_ref(),
                req.server_bin.as_os_str(),
                SERVER_PATH.as_ref(),
            ]);
        }
        push(&[
            // The root itself is a tmpfs bwrap made; read-only, so nothing but the
            // binds above can be written.
            "--remount-ro".as_ref(),
            "/".as_ref(),
            "--chdir".as_ref(),
            WORKSPACE.as_ref(),
            "--clearenv".as_ref(),
            "--setenv".as_ref(),
            "PATH".as_ref(),
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".as_ref(),
            "--setenv".as_ref(),
            "HOME".as_ref(),
            "/tmp".as_ref(),
            "--setenv".as_ref(),
            "LANG".as_ref(),
            "C.UTF-8".as_ref(),
            "--setenv".as_ref(),
            "USER".as_ref(),
            "root".as_ref(),
        ]);
        for (k, v) in &req.env {
            push(&["--setenv".as_ref(), k.as_ref(), v.as_ref()]);
        }
        // bwrap reports the namespace init's host pid on fd 3 (see `launch`).
        a.extend(["--info-fd".into(), "3".into()]);
        a.push(SERVER_PATH.into());
        a.extend(super::serve_args(
            Path::new(RUN_DIR).join("sock").as_path(),
            Path::new(WORKSPACE),
            Path::new(CTL_DIR),
        ));
        a
    }
}

#[async_trait::async_trait]
impl SandboxBackend for BwrapBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Bwrap
    }

    async fn start(&self, req: &StartRequest) -> Result<Sandbox, SandboxError> {
        std::fs::create_dir_all(req.workspace())?;
        std::fs::create_dir_all(req.run_dir())?;
        let mut cmd = tokio::process::Command::new(&self.program);
        let mut label = req.label.clone();
        let mut limits = req.limits;
        let (info_read, info_write) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(std::io::Error::from)?;
        let mut pass = vec![info_write];
        let me = nix::unistd::geteuid().as_raw();
        if me == 0 {
            let uid = self.pick_uid(req.dir.parent().unwrap_or(Path::new("/")));
            label.uid = Some(uid);
            chown_tree(&req.workspace(), uid, self.gid)?;
            chown_tree(&req.run_dir(), uid, self.gid)?;
            for p in [req.workspace(), req.run_dir(), req.server_bin.clone()] {
                pass.push(open_path(&p)?);
            }
            cmd.args(self.args(req, true)).uid(uid).gid(self.gid);
        } else {
            cmd.args(self.args(req, false));
        }
        if me != 0 && limits.processes > 0 {
            let running: u64 = super::label::process_table()
                .iter()
                .filter(|r| r.uid == me)
                .map(|r| r.threads)
                .sum();
            limits.processes += running;
        }
        super::launch(
            "bwrap",
            cmd,
            req,
            label,
            Some(limits),
            pass,
            Some(info_read),
        )
        .await
    }

    async fn stop(&self, label: &Label) -> Result<(), SandboxError> {
        // Killing bwrap and its child, the PID namespace's init, makes the kernel kill
        // every process in the namespace.
        label.kill();
        Ok(())
    }
}

/// Opens `path` for binding only (`O_PATH`): no read permission is needed or granted.
fn open_path(path: &Path) -> std::io::Result<std::os::fd::OwnedFd> {
    use nix::fcntl::{OFlag, open};
    open(
        path,
        OFlag::O_PATH | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|e| {
        std::io::Error::new(
            std::io::Error::from(e).kind(),
            format!("cannot open {}: {e}", path.display()),
        )
    })
}

/// Gives `path` and everything under it to `uid:gid` (without following symlinks).
fn chown_tree(path: &Path, uid: u32, gid: u32) -> std::io::Result<()> {
    use std::os::unix::fs::lchown;
    lchown(path, Some(uid), Some(gid))?;
    if path.is_dir() && !path.is_symlink() {
        for e in std::fs::read_dir(path)? {
            chown_tree(&e?.path(), uid, gid)?;
        }
    }
    Ok(())
}
