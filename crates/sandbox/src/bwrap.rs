//! The `bwrap` backend: bubblewrap, rootless, the default on Linux.
//!
//! The sandbox gets new user, PID, IPC, UTS, cgroup and (unless the task allows network)
//! network namespaces; no capabilities; no further user namespaces. The host's system
//! directories (`/usr` and its `/bin`, `/lib`… links) and a short list of `/etc` entries
//! programs need (the node's prepared copy of them, see [`super::etc_view`]) are bound
//! read-only; the workspace (`/workspace`) is the only writable
//! bind, beside size-limited private tmpfs mounts (`/tmp`, `/dev/shm`, the server's own
//! directory). `/dev` holds the usual device nodes and is read-only, so it cannot hold
//! files. The server's listening socket is passed in as a descriptor, and bwrap
//! starts with an empty environment, so nothing of the worker's is readable inside.
//! Memory and processes are limited per sandbox by a cgroup where the worker may make
//! one (see [`super::cgroup`]); process, memory, file-size and CPU rlimits are set on
//! `bwrap` before it starts and inherited by everything inside. bwrap's process is a
//! launcher the worker made ahead of time ([`super::launcher`]), already in the cgroup
//! the sandbox gets, which sets those rlimits, becomes the sandbox's user and then execs
//! bwrap; with no launcher pool, bwrap is spawned at the start and moved into its cgroup
//! while it waits ([`super::Hold`]).
//!
//! The process limit (RLIMIT_NPROC) is counted by the kernel per *host* user, across
//! user namespaces, and real root is exempt from it. So when the worker runs as root,
//! each sandbox runs as a host user id of its own, picked from a configured range and
//! recorded in its label (mapped to root inside); its files are owned by that id on the
//! host. Its binds are then passed to bwrap as descriptors the worker opened, so that
//! user needs no permission on the directories above them. When the worker is not root, the sandbox shares the worker's user, and the limit
//! is set to what that user runs already plus `limits.processes`: a cap on the fork
//! bomb, though not a separate budget per sandbox.

use super::{Label, RuntimeKind, Sandbox, SandboxError, SandboxRuntime, StartRequest};
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

/// Where the server binary appears inside the sandbox.
pub const SERVER_PATH: &str = "/run/rollout-sandbox";
/// The workspace inside the sandbox.
pub const WORKSPACE: &str = "/workspace";
/// The persistent shell's program inside the sandbox (see [`shell_copy`]).
pub const SHELL_PATH: &str = "/run/rollout-bash";
/// The server's private directory inside the sandbox (a small tmpfs of its own, so an
/// agent filling `/tmp` does not break the tools).
pub const CTL_DIR: &str = "/run/rollout-ctl";
/// Size of the server's private directory (command files, an index copy for exports).
const CTL_BYTES: u64 = 64 << 20;

/// See the module documentation.
#[derive(Debug, Clone)]
pub struct BwrapRuntime {
    /// The bubblewrap executable.
    pub program: PathBuf,
    /// When the worker is root: the first host user id for sandboxes, and how many.
    pub uid_range: (u32, u32),
    /// When the worker is root: the group sandboxes run as.
    pub gid: u32,
    /// How `network: true` sandboxes get their own network.
    pub net: super::net::NetSettings,
    /// Whether (and where) sandboxes get cgroups of their own.
    pub cgroups: super::cgroup::Cgroups,
    /// Host user ids found unused ahead of time (see [`BwrapRuntime::pick_uid`]).
    pub uids: std::sync::Arc<std::sync::Mutex<UidPool>>,
    /// Launchers made ahead of time, already in a cgroup of their own (see
    /// [`super::launcher`]); depth 0 spawns bwrap at each start instead.
    pub launchers: super::launcher::LauncherPool,
    /// Whether sandboxes get the node's prepared `/etc` in one mount (see
    /// [`super::etc_view`]) rather than its entries bound one by one; on by default,
    /// off only to measure what it saves.
    pub etc_view: bool,
}

/// Host user ids for root workers' sandboxes, found unused off the start path.
///
/// An id must be no running process's (a sandbox left by a crash, another worker's
/// sandbox under another root): only a scan of every process tells, and on a busy node
/// that scan was the largest single step of a start. So a scan vets many ids at once,
/// in the background once the pool runs low, and a start takes one. Ids are taken only
/// while their scan is recent ([`UID_VETTED_FOR`]): a process can only come to run as
/// an id of the range by a launcher picking it, and every launcher under this root
/// records its pick in a label, which a start still reads. Ids handed out stay out of
/// later scans' picks until their sandboxes show in the process table.
#[derive(Debug, Default)]
pub struct UidPool {
    /// Ids no process used when the scan that found them began.
    free: Vec<u32>,
    /// When that scan began.
    scanned: Option<std::time::Instant>,
    /// Ids this process handed out lately, with when.
    handed: std::collections::VecDeque<(std::time::Instant, u32)>,
    /// A background scan is under way.
    refilling: bool,
}

/// How long a scan's findings are trusted.
const UID_VETTED_FOR: std::time::Duration = std::time::Duration::from_secs(30);
/// How long an id handed out stays out of later picks (its sandbox's processes are in
/// the process table long before).
const UID_HANDED_FOR: std::time::Duration = std::time::Duration::from_secs(120);
/// Ids one scan vets.
const UID_BATCH: usize = 32;
/// Below this many vetted ids, a start asks for a background scan.
const UID_LOW: usize = 8;

/// Where the descriptors bwrap is passed are found, numbered from
/// [`super::FIRST_PASSED_FD`] in this order: bwrap's report (`--info-fd`), the server's
/// listening socket, then (a root worker) the workspace, server binary and shell to bind,
/// then (with a prepared one) the `/etc` to bind, then (network) the sync descriptor, then (cgroups) the go-ahead, then (a sandbox that
/// ends with its worker) the lifeline. One plan, so the arguments and the descriptors
/// handed over cannot disagree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Descriptors {
    /// The workspace, server binary and shell are bound from descriptors (a root worker:
    /// the sandbox's own user could not open their paths).
    pub by_fd: bool,
    /// The node's prepared `/etc`, bound whole (see [`super::etc_view`]); without it,
    /// the entries are bound one by one.
    pub etc: Option<i32>,
    /// bwrap's `--sync-fd` (a `network: true` sandbox; see [`super::net`]).
    pub sync: Option<i32>,
    /// bwrap's `--block-fd`, the go-ahead of a held sandbox (see [`super::Hold`]).
    pub block: Option<i32>,
    /// The server's `--lifeline-fd` (see [`super::lifeline`]).
    pub lifeline: Option<i32>,
}

impl Descriptors {
    /// The plan for a sandbox started by a root worker (`by_fd`), with a prepared
    /// `/etc`, its own network, held for its cgroups, and ending with its worker, as
    /// given.
    pub fn plan(by_fd: bool, etc: bool, network: bool, held: bool, lifeline: bool) -> Self {
        let mut next = super::FIRST_PASSED_FD + 2 + if by_fd { 3 } else { 0 };
        let mut take = |wanted: bool| {
            wanted.then(|| {
                next += 1;
                next - 1
            })
        };
        Descriptors {
            by_fd,
            etc: take(etc),
            sync: take(network),
            block: take(held),
            lifeline: take(lifeline),
        }
    }
}

/// How many threads user `uid` runs: a non-root worker's sandboxes share its user's
/// process limit, so a sandbox's budget is added on top of what already runs.
fn threads_of(uid: u32) -> u64 {
    super::label::process_table()
        .iter()
        .filter(|r| r.uid == uid)
        .map(|r| r.threads)
        .sum()
}

impl BwrapRuntime {
    /// For a root worker: picks the sandbox's own user, gives it the sandbox's directory
    /// and workspace, and opens the workspace, server binary and shell to bind by
    /// descriptor (appended to `pass`).
    fn give_to_own_user(
        &self,
        req: &StartRequest,
        shell: &Path,
        label: &mut Label,
        pass: &mut Vec<std::os::fd::OwnedFd>,
        profile: &mut super::StartProfile,
    ) -> Result<(), SandboxError> {
        let root = req.dir.parent().unwrap_or(Path::new("/"));
        let uid = self.pick_uid(root);
        label.uid = Some(uid);
        profile.mark("user id picked");
        // The sandbox's directory becomes its user's (still 0700), so bwrap, running as
        // that user, can pass through it to the workspace; no other user can.
        std::os::unix::fs::lchown(&req.dir, Some(uid), Some(self.gid))?;
        chown_tree(&req.workspace(), uid, self.gid)?;
        profile.mark("workspace chowned");
        for p in [req.workspace(), req.server_bin.clone(), shell.to_path_buf()] {
            pass.push(open_path(&p)?);
        }
        Ok(())
    }

    /// The node's prepared `/etc` under `root`, opened for binding, or `None` to bind
    /// its entries one by one: when the view is off or cannot be made, and when the task
    /// binds something under `/etc` (a read-only `/etc` has no room for another mount
    /// point in it).
    fn etc_for(&self, req: &StartRequest, root: &Path) -> Option<std::os::fd::OwnedFd> {
        if !self.etc_view || req.ro_binds.iter().any(|p| p.starts_with("/etc")) {
            return None;
        }
        let view = super::etc_view::view(root, Path::new("/etc"))?;
        open_path(&view).ok()
    }

    /// For a `network: true` sandbox: checks the network can be set up (refused at
    /// once, with the reason, rather than after starting bwrap; never a fall back to the
    /// host's network), writes its `resolv.conf`, and makes the pipe whose ends are the
    /// helper's exit signal and bwrap's `--sync-fd` (read, write).
    fn prepare_network(
        &self,
        req: &StartRequest,
    ) -> Result<(std::os::fd::OwnedFd, std::os::fd::OwnedFd), SandboxError> {
        super::net::probe(&self.net).map_err(|message| SandboxError::Start {
            backend: "bwrap",
            message,
        })?;
        std::fs::write(req.dir.join("resolv.conf"), super::net::resolv_conf())?;
        Ok(nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(std::io::Error::from)?)
    }
}

/// The number the next descriptor passed gets when `passed` are already in the list
/// (for the checks that the list follows the [`Descriptors`] plan).
fn number_of_next(passed: usize) -> i32 {
    super::FIRST_PASSED_FD + i32::try_from(passed).unwrap_or(-1)
}

impl Default for BwrapRuntime {
    fn default() -> Self {
        BwrapRuntime {
            program: PathBuf::from("bwrap"),
            uid_range: (1_000_000_000, 1_000_000),
            gid: 65534,
            net: super::net::NetSettings::default(),
            cgroups: super::cgroup::Cgroups::probe(None),
            uids: Default::default(),
            launchers: Default::default(),
            etc_view: true,
        }
    }
}

impl BwrapRuntime {
    /// A host user id for a new sandbox under `root`: random in the range, and not one
    /// that a sandbox there (by its label) or a running process uses. The processes are
    /// scanned ahead of time (see [`UidPool`]); only when no recent scan has an id left
    /// does this start scan them itself.
    fn pick_uid(&self, root: &Path) -> u32 {
        use std::time::Instant;
        let labelled: std::collections::HashSet<u32> = Label::dirs(root)
            .iter()
            .filter_map(|d| Label::read(d).ok().flatten()?.uid)
            .collect();
        let now = Instant::now();
        let mut pool = self.uids.lock().expect("uid pool lock");
        pool.handed
            .retain(|(at, _)| now.duration_since(*at) < UID_HANDED_FOR);
        if pool
            .scanned
            .is_none_or(|at| now.duration_since(at) >= UID_VETTED_FOR)
        {
            pool.free.clear();
        }
        let mut picked = None;
        while let Some(uid) = pool.free.pop() {
            if !labelled.contains(&uid) && !pool.handed.iter().any(|(_, h)| *h == uid) {
                picked = Some(uid);
                break;
            }
        }
        let uid = match picked {
            Some(uid) => uid,
            None => {
                // Nothing vetted: scan now, and keep the rest of what the scan vets.
                let scanned = Instant::now();
                let mut used = super::label::process_uids();
                used.extend(&labelled);
                used.extend(pool.handed.iter().map(|(_, h)| *h));
                let mut vetted = self.vet(&used, UID_BATCH + 1);
                let uid = vetted.pop().expect("vet returns what it was asked for");
                pool.free = vetted;
                pool.scanned = Some(scanned);
                uid
            }
        };
        pool.handed.push_back((now, uid));
        if pool.free.len() < UID_LOW && !pool.refilling {
            self.refill_uids(&mut pool);
        }
        uid
    }

    /// Makes the sandbox's cgroup (recorded in `label`) and the pipe bwrap waits on
    /// until it has joined (its read end appended to `pass`, numbered `block_fd`); `None`
    /// where this node has no cgroups.
    fn cgroup_hold(
        &self,
        name: &str,
        req: &StartRequest,
        label: &mut Label,
        pass: &mut Vec<std::os::fd::OwnedFd>,
        block_fd: Option<i32>,
    ) -> Result<Option<super::Hold>, SandboxError> {
        let Some(cg) = self.cgroups.create(name, &req.limits)? else {
            return Ok(None);
        };
        label.cgroups = cg.dirs.clone();
        let (block_read, release) = match nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC) {
            Ok(p) => p,
            Err(e) => {
                cg.remove();
                return Err(std::io::Error::from(e).into());
            }
        };
        debug_assert_eq!(block_fd, Some(number_of_next(pass.len())));
        pass.push(block_read);
        Ok(Some(super::Hold {
            cgroup: cg,
            release,
        }))
    }

    /// How the sandbox's root process comes to be: from `launcher` (its cgroups become
    /// the sandbox's, given the sandbox's limits now), or spawned at the start and held
    /// for its cgroups (see [`BwrapRuntime::cgroup_hold`]).
    fn root_process(
        &self,
        launcher: Option<super::launcher::Launcher>,
        args: Vec<OsString>,
        (name, req): (&str, &StartRequest),
        label: &mut Label,
        pass: &mut Vec<std::os::fd::OwnedFd>,
        fds: &Descriptors,
    ) -> Result<(Option<super::Hold>, super::Root), SandboxError> {
        let Some(launcher) = launcher else {
            let hold = self.cgroup_hold(name, req, label, pass, fds.block)?;
            let mut cmd = tokio::process::Command::new(&self.program);
            // bwrap's own process (the namespace's pid 1 among them) keeps the
            // environment it was started with, readable inside; start it with nothing of
            // the worker's.
            cmd.env_clear().args(args);
            return Ok((hold, cmd.into()));
        };
        if let Some(cg) = launcher.cgroup() {
            // The launcher's cgroup becomes this sandbox's: its limits now (plain writes;
            // the launcher is its only process yet).
            self.cgroups.limit(&cg, &req.limits)?;
            label.cgroups = cg.dirs;
        }
        let program =
            super::launcher::resolve_program(&self.program).ok_or_else(|| SandboxError::Start {
                backend: "bwrap",
                message: format!("{} is not on the PATH", self.program.display()),
            })?;
        Ok((
            None,
            super::Root::Launcher {
                launcher,
                program,
                args,
            },
        ))
    }

    /// `n` random ids of the range, none in `used`.
    fn vet(&self, used: &std::collections::HashSet<u32>, n: usize) -> Vec<u32> {
        let (base, count) = self.uid_range;
        let mut out: Vec<u32> = Vec::with_capacity(n);
        // A range mostly in use would make this loop long; give up on the batch then
        // (a start scans again when it finds none).
        for _ in 0..n.saturating_mul(64).max(1024) {
            if out.len() == n {
                break;
            }
            let offset = uuid::Uuid::new_v4().as_u128() % u128::from(count);
            let uid = base + u32::try_from(offset).expect("a remainder of a u32 count fits a u32");
            if !used.contains(&uid) && !out.contains(&uid) {
                out.push(uid);
            }
        }
        while out.is_empty() {
            let offset = uuid::Uuid::new_v4().as_u128() % u128::from(count);
            let uid = base + u32::try_from(offset).expect("a remainder of a u32 count fits a u32");
            if !used.contains(&uid) {
                out.push(uid);
            }
        }
        out
    }

    /// Scans the processes in the background and refills the pool with ids none uses.
    fn refill_uids(&self, pool: &mut UidPool) {
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        pool.refilling = true;
        let me = self.clone();
        tokio::task::spawn_blocking(move || {
            let scanned = std::time::Instant::now();
            let mut used = super::label::process_uids();
            let mut pool = me.uids.lock().expect("uid pool lock");
            used.extend(pool.handed.iter().map(|(_, h)| *h));
            // This scan vouches for what is left of the earlier one's ids too.
            pool.free.retain(|u| !used.contains(u));
            used.extend(pool.free.iter().copied());
            let vetted = me.vet(&used, UID_BATCH);
            pool.free.extend(vetted);
            pool.scanned = Some(scanned);
            pool.refilling = false;
        });
    }

    /// The full `bwrap` argument list for `req`, with the descriptors bwrap is passed
    /// where `fds` puts them. With [`Descriptors::by_fd`], the workspace, server binary
    /// and shell are bound from descriptors 5, 6 and 7 rather than by `paths` (fd 3 is
    /// always bwrap's `--info-fd`, fd 4 the server's listening socket).
    ///
    /// A `network: true` sandbox keeps its own network namespace (slirp4netns connects it,
    /// see [`super::net`]); [`Descriptors::sync`] is then the descriptor bwrap holds for
    /// as long as the sandbox lives, and `<dir>/resolv.conf` replaces the host's. With
    /// [`Descriptors::block`], the sandbox waits on that descriptor before it starts the
    /// server (see [`super::Hold`]); with [`Descriptors::lifeline`], the server stops
    /// when the worker's lifeline there breaks (see [`super::lifeline`]).
    pub fn args(&self, req: &StartRequest, shell: &Path, fds: &Descriptors) -> Vec<OsString> {
        let mut a: Vec<OsString> = Vec::new();
        system_args(&mut a, req, fds.etc);
        writable_args(&mut a, req, fds.by_fd, shell);
        environment_args(&mut a, req);
        if let Some(fd) = fds.sync {
            a.extend(["--sync-fd".into(), fd.to_string().into()]);
        }
        if req.die_with_parent {
            // bwrap itself gets SIGKILL with the worker (see `launch`); this has the
            // namespace's init, and with it everything inside, end with bwrap.
            a.push("--die-with-parent".into());
        }
        if let Some(fd) = fds.block {
            a.extend(["--block-fd".into(), fd.to_string().into()]);
        }
        // bwrap reports the namespace init's host pid on fd 3 (see `launch`).
        a.extend(["--info-fd".into(), "3".into()]);
        a.push(SERVER_PATH.into());
        a.extend(super::serve_args(
            super::ServeOn::Fd(4),
            Path::new(WORKSPACE),
            Path::new(CTL_DIR),
            fds.lifeline,
        ));
        a.extend(["--shell".into(), SHELL_PATH.into()]);
        // bwrap's PID namespace holds the sandbox's processes and nothing else.
        a.push("--own-pid-namespace".into());
        a
    }
}

/// Appends `items` to the argument list `a`.
fn push_args(a: &mut Vec<OsString>, items: &[&OsStr]) {
    a.extend(items.iter().map(|s| s.to_os_string()));
}

/// `bwrap` arguments, part 1: fresh namespaces without capabilities, and the host's
/// system directories and the `/etc` files programs need, read-only.
fn system_args(a: &mut Vec<OsString>, req: &StartRequest, etc_fd: Option<i32>) {
    push_args(a, &["--unshare-all".as_ref(), "--unshare-user".as_ref()]);
    push_args(
        a,
        &[
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
        ],
    );
    for top in ["bin", "sbin", "lib", "lib32", "lib64", "libx32"] {
        let host = Path::new("/").join(top);
        match std::fs::read_link(&host) {
            Ok(target) => push_args(
                a,
                &["--symlink".as_ref(), target.as_os_str(), host.as_os_str()],
            ),
            Err(_) if host.is_dir() => push_args(
                a,
                &["--ro-bind".as_ref(), host.as_os_str(), host.as_os_str()],
            ),
            Err(_) => {}
        }
    }
    match etc_fd {
        // One mount for all of them (see `super::etc_view`).
        Some(fd) => push_args(
            a,
            &[
                "--ro-bind-fd".as_ref(),
                fd.to_string().as_ref(),
                "/etc".as_ref(),
            ],
        ),
        None => {
            for name in super::etc_view::ETC {
                let p = Path::new("/etc").join(name);
                push_args(a, &["--ro-bind-try".as_ref(), p.as_os_str(), p.as_os_str()]);
            }
        }
    }
    if req.network {
        let resolv = req.dir.join("resolv.conf");
        push_args(
            a,
            &[
                "--ro-bind".as_ref(),
                resolv.as_os_str(),
                "/etc/resolv.conf".as_ref(),
            ],
        );
    }
    for p in &req.ro_binds {
        push_args(a, &["--ro-bind-try".as_ref(), p.as_os_str(), p.as_os_str()]);
    }
    push_args(
        a,
        &[
            "--proc".as_ref(),
            "/proc".as_ref(),
            "--dev".as_ref(),
            "/dev".as_ref(),
        ],
    );
}

/// `bwrap` arguments, part 2: what the sandbox may write (size-capped tmpfs mounts and
/// the workspace), with the server binary and the shell beside it, read-only; bound
/// from descriptors with `by_fd` (see [`BwrapRuntime::args`]).
fn writable_args(a: &mut Vec<OsString>, req: &StartRequest, by_fd: bool, shell: &Path) {
    // Every writable tmpfs has a size: unbounded, each would take up to half the
    // machine's memory.
    for (size, path) in [
        (req.limits.shm_bytes, "/dev/shm"),
        (req.limits.tmp_bytes, "/tmp"),
        (CTL_BYTES, CTL_DIR),
    ] {
        let size = size.to_string();
        if size != "0" {
            push_args(a, &["--size".as_ref(), size.as_ref()]);
        }
        push_args(a, &["--tmpfs".as_ref(), path.as_ref()]);
    }
    // `/dev` is a tmpfs bwrap made for the device nodes; writable, it would hold files
    // of any size in the host's memory, counted by no limit. Read-only, it keeps its
    // devices (binds of the host's nodes, writable as ever) and the mounts below it
    // (`/dev/shm`, `/dev/pts`); the remount is not recursive.
    push_args(a, &["--remount-ro".as_ref(), "/dev".as_ref()]);
    if by_fd {
        // Descriptors the worker opened (see `start`): the sandbox's own user needs no
        // permission on the directories above them.
        push_args(
            a,
            &[
                "--bind-fd".as_ref(),
                "5".as_ref(),
                WORKSPACE.as_ref(),
                "--ro-bind-fd".as_ref(),
                "6".as_ref(),
                SERVER_PATH.as_ref(),
                "--ro-bind-fd".as_ref(),
                "7".as_ref(),
                SHELL_PATH.as_ref(),
            ],
        );
    } else {
        push_args(
            a,
            &[
                "--bind".as_ref(),
                req.workspace().as_os_str(),
                WORKSPACE.as_ref(),
                "--ro-bind".as_ref(),
                req.server_bin.as_os_str(),
                SERVER_PATH.as_ref(),
                "--ro-bind".as_ref(),
                shell.as_os_str(),
                SHELL_PATH.as_ref(),
            ],
        );
    }
}

/// `bwrap` arguments, part 3: the root made read-only, the working directory, and a
/// clean environment with the request's variables.
fn environment_args(a: &mut Vec<OsString>, req: &StartRequest) {
    push_args(
        a,
        &[
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
        ],
    );
    for (k, v) in &req.env {
        push_args(a, &["--setenv".as_ref(), k.as_ref(), v.as_ref()]);
    }
}

/// The node's copy of bash for the sandboxes' persistent shells: execute-only (mode
/// 0111), so inside a sandbox it can be run but not read. The kernel marks a process
/// whose program it may not read as undumpable, so the agent's processes can neither
/// ptrace the shell nor read its memory. (Code the shell runs itself, a `DEBUG` trap
/// say, sees the marker's command line and so its token: the status a `bash` call
/// reports is the shell's word, which is why nothing scored depends on it.)
pub fn shell_copy(root: &Path) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let source = ["/usr/bin/bash", "/bin/bash"]
        .iter()
        .map(Path::new)
        .find(|p| p.is_file())
        .ok_or_else(|| std::io::Error::other("bash is not installed in /usr/bin or /bin"))?;
    let tools = root.join(".tools");
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o711)
        .create(&tools)?;
    let copy = tools.join("bash");
    let want = std::fs::metadata(source)?.len();
    if let Ok(m) = std::fs::symlink_metadata(&copy)
        && m.is_file()
        && m.len() == want
        && m.permissions().mode() & 0o7777 == 0o111
    {
        return Ok(copy);
    }
    let tmp = tools.join(format!("bash.{}", uuid::Uuid::new_v4().simple()));
    std::fs::copy(source, &tmp)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o111))?;
    std::fs::rename(&tmp, &copy)?;
    Ok(copy)
}

/// Tops the launcher pool up when dropped: at the end of a start, however it ends.
struct RefillAfter<'a>(&'a BwrapRuntime, &'a Path);

impl Drop for RefillAfter<'_> {
    fn drop(&mut self) {
        self.0.launchers.refill(self.1, &self.0.cgroups);
    }
}

impl BwrapRuntime {
    /// [`SandboxRuntime::start`] without the launcher pool's top-up.
    async fn start_sandbox(&self, req: &StartRequest) -> Result<Sandbox, SandboxError> {
        let mut profile = super::StartProfile::begin();
        std::fs::create_dir_all(req.workspace())?;
        super::private_dir(&req.dir)?;
        profile.mark("directories");
        let root = req.dir.parent().unwrap_or(Path::new("/"));
        let shell = shell_copy(root).map_err(|e| SandboxError::Start {
            backend: "bwrap",
            message: format!("cannot prepare the shell: {e}"),
        })?;
        profile.mark("shell copy checked");
        // A launcher made ahead of time, already in a cgroup of its own, when the pool
        // is on: neither the spawn nor the cgroup join is then on this start's path.
        let launcher = (self.launchers.take(&req.server_bin, &self.cgroups).await).transpose()?;
        profile.mark("launcher taken");
        let mut label = req.label.clone();
        let mut limits = req.limits;
        let (info_read, info_write) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(std::io::Error::from)?;
        let mut pass = vec![info_write, super::bind_socket(&req.socket())?];
        profile.mark("socket bound");
        let me = nix::unistd::geteuid().as_raw();
        // bwrap's own death signal reaches the namespace's init only once the sandbox
        // is built; the lifeline ends a sandbox whose worker died before that. A
        // launcher's sandbox is in its cgroups from its first process: no hold.
        let etc = self.etc_for(req, root);
        profile.mark("/etc view");
        let fds = Descriptors::plan(
            me == 0,
            etc.is_some(),
            req.network,
            self.cgroups.enforced() && launcher.is_none(),
            req.die_with_parent,
        );
        let net = if req.network {
            Some(self.prepare_network(req)?)
        } else {
            None
        };
        if me == 0 {
            self.give_to_own_user(req, &shell, &mut label, &mut pass, &mut profile)?;
        }
        if let Some(fd) = etc {
            debug_assert_eq!(fds.etc, Some(number_of_next(pass.len())));
            pass.push(fd);
        }
        let args = self.args(req, &shell, &fds);
        let net = net.map(|(exit_read, exit_write)| {
            pass.push(exit_write);
            super::NetPlan {
                settings: self.net.clone(),
                exit_read,
            }
        });
        let name = req
            .dir
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        profile.mark("arguments");
        // Taken before the cgroups, whose hold must not be dropped by an early return.
        let lifeline = fds
            .lifeline
            .map(|_| super::lifeline::reader())
            .transpose()?;
        let (hold, cmd) =
            self.root_process(launcher, args, (&name, req), &mut label, &mut pass, &fds)?;
        profile.mark("cgroup created");
        if let Some(read) = lifeline {
            debug_assert_eq!(fds.lifeline, Some(number_of_next(pass.len())));
            pass.push(read);
        }
        if !label.cgroups.is_empty() {
            // The cgroup holds the sandbox's memory as a whole; a per-process address
            // space limit on top only breaks runtimes that reserve address space.
            limits.memory_bytes = 0;
        }
        if me != 0 && limits.processes > 0 {
            limits.processes += threads_of(me);
            profile.mark("process budget counted");
        }
        let become_user = label.uid.map(|u| (u, self.gid));
        super::launch(
            req,
            super::Launch {
                backend: "bwrap",
                cmd,
                label,
                rlimits: Some(limits),
                pass_fds: pass,
                info_read: Some(info_read),
                net,
                // Joined from outside while bwrap waits (see `super::Hold`), or by the
                // launcher ahead of time.
                cgroup_procs: Vec::new(),
                hold,
                become_user,
                die_with_parent: req.die_with_parent,
                profile,
            },
        )
        .await
    }
}

#[async_trait::async_trait]
impl SandboxRuntime for BwrapRuntime {
    fn kind(&self) -> RuntimeKind {
        RuntimeKind::Bwrap
    }

    async fn start(&self, req: &StartRequest) -> Result<Sandbox, SandboxError> {
        // The launcher pool is topped up once the start is done (or dropped, when its
        // job is cancelled), so that making the next launcher (a spawn, a cgroup and the
        // move into it) does not compete with this start for the cores and the
        // kernel's locks.
        let _refill = RefillAfter(self, &req.server_bin);
        self.start_sandbox(req).await
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
