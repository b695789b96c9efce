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
//! When the worker runs as root, the sandbox runs as an unprivileged user instead
//! (`nobody` by default, mapped to root inside): the kernel exempts real root from the
//! process limit, so only an unprivileged sandbox makes that limit hold, and the
//! sandbox's files are then owned by that user on the host.

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
    /// User and group to run the sandbox as when the worker is root.
    pub root_maps_to: (u32, u32),
}

impl Default for BwrapBackend {
    fn default() -> Self {
        BwrapBackend {
            program: PathBuf::from("bwrap"),
            root_maps_to: (65534, 65534),
        }
    }
}

impl BwrapBackend {
    /// The user and group the sandbox runs as on the host, if different from ours.
    fn drop_to(&self) -> Option<(u32, u32)> {
        nix::unistd::geteuid()
            .is_root()
            .then_some(self.root_maps_to)
    }

    /// The full `bwrap` argument list for `req` (public so tests can check it).
    pub fn args(&self, req: &StartRequest) -> Vec<OsString> {
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
            "--bind".as_ref(),
            req.workspace().as_os_str(),
            WORKSPACE.as_ref(),
            "--bind".as_ref(),
            req.run_dir().as_os_str(),
            RUN_DIR.as_ref(),
            "--ro-bind".as_ref(),
            req.server_bin.as_os_str(),
            SERVER_PATH.as_ref(),
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
        cmd.args(self.args(req));
        if let Some((uid, gid)) = self.drop_to() {
            // The unprivileged user must be able to reach the binds.
            for dir in [Some(req.dir.as_path()), req.dir.parent()]
                .into_iter()
                .flatten()
            {
                allow_traverse(dir)?;
            }
            allow_traverse(req.server_bin.parent().unwrap_or(Path::new("/")))?;
            chown_tree(&req.workspace(), uid, gid)?;
            chown_tree(&req.run_dir(), uid, gid)?;
            cmd.uid(uid).gid(gid);
        }
        let (info_read, info_write) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(std::io::Error::from)?;
        super::launch(
            "bwrap",
            cmd,
            req,
            req.label.clone(),
            Some(req.limits),
            Some((info_read, info_write)),
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

/// Adds search (`x`, not read) permission for others to `dir` and those of its ancestors
/// we own, so the unprivileged sandbox user can reach the bind sources. Directories of
/// other owners are left alone; if one blocks the way, bwrap says so when it starts.
fn allow_traverse(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let me = nix::unistd::geteuid().as_raw();
    for d in dir.ancestors() {
        let Ok(meta) = std::fs::metadata(d) else {
            continue;
        };
        let mode = meta.permissions().mode();
        if meta.uid() == me && mode & 0o001 == 0 {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(mode | 0o001))?;
        }
    }
    Ok(())
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
