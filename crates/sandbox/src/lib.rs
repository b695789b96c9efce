//! Sandboxes: where an agent's tools run, and the server that runs them.
//!
//! A sandbox is a directory on the node (`<root>/<id>/`, mode 0700, holding the writable
//! `workspace/`, the server's socket `sock` and a `label.json`) plus a process tree
//! started by a [`SandboxRuntime`] whose first process is the sandbox server
//! (`rollout-sandbox serve`, see [`server`]). Workers talk to it with a [`SandboxClient`]
//! over that Unix socket; the wire format is [`protocol`]. The launcher binds the socket
//! and hands the server the listening descriptor, so the socket file sits where nothing
//! inside the sandbox can replace it.
//!
//! Runtimes: [`local`] (a plain child process, no isolation, for development),
//! [`bwrap`] (bubblewrap: rootless namespaces, the default on Linux) and [`apptainer`]
//! (Apptainer/Singularity instances from `.sif` images, for HPC clusters). Every sandbox is
//! found again through its label — the job id, node, backend and process identity written
//! at start — never by process name, which is how [`Runtimes::stop`] and the reaper remove
//! one after a worker crash.
//!
//! This crate holds the sandbox on one machine and the `rollout-sandbox` command
//! ([`cli`]); it knows nothing of the database or the queue, so the binary every sandbox
//! runs links neither. What ties sandboxes to jobs across a cluster (the records, the
//! reaper) is the service's `sandbox::node`. It is the one crate of the workspace that
//! may use `unsafe`: starting a sandbox means code between `fork` and `exec`, raw
//! descriptors handed between processes, and mount and namespace calls; each block says
//! why it is sound beside it.

pub mod apptainer;
pub mod bwrap;
pub mod cgroup;
pub mod cli;
pub mod client;
pub mod etc_view;
pub mod label;
pub mod launcher;
pub mod lifeline;
pub mod local;
pub mod net;
pub mod pool;
pub mod profile;
pub mod protocol;
pub mod quota;
pub mod server;
pub mod spec;

pub use client::SandboxClient;
pub use label::{Death, Label};
pub use profile::StartProfile;
pub use spec::SandboxSpec;

#[cfg(test)]
pub(crate) use rollout_test_support::prerequisite;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub use rollout_core::domain::sandbox::{RuntimeKind, SandboxLimits};

/// Everything needed to start one sandbox.
#[derive(Debug, Clone)]
pub struct StartRequest {
    /// The label: job id, node and backend.
    pub label: Label,
    /// The sandbox directory; `workspace/` in it must already hold the task's files.
    pub dir: PathBuf,
    /// The `rollout-sandbox` executable on the host.
    pub server_bin: PathBuf,
    /// Whether the sandbox may reach the network.
    pub network: bool,
    /// Extra environment for the shell and the interpreter.
    pub env: BTreeMap<String, String>,
    /// Resource limits.
    pub limits: SandboxLimits,
    /// Apptainer image (`.sif` file or URI).
    pub image: Option<String>,
    /// Apptainer `--fakeroot`.
    pub fakeroot: bool,
    /// Host paths bound read-only at the same path inside (bwrap, apptainer), e.g. a
    /// Python environment outside `/usr`.
    pub ro_binds: Vec<PathBuf>,
    /// How long the server may take to answer its first ping.
    pub ready_timeout: Duration,
    /// Whether the sandbox ends with the process that starts it, however that ends
    /// (SIGKILL included): for `rollout up`, whose sandboxes no other process uses, and
    /// where one that outlived it would run on unowned (see
    /// [`NodeSandboxes::end_with_this_process`]). The `local` and `bwrap` backends hold
    /// to it; Apptainer's instances are daemons of their own and do not.
    pub die_with_parent: bool,
}

impl StartRequest {
    /// The workspace on the host.
    pub fn workspace(&self) -> PathBuf {
        self.dir.join("workspace")
    }

    /// The socket directory on the host, for backends whose server binds its own socket
    /// (Apptainer).
    pub fn run_dir(&self) -> PathBuf {
        self.dir.join("run")
    }

    /// The socket on the host.
    pub fn socket(&self) -> PathBuf {
        self.label.socket.clone()
    }
}

/// A started sandbox: its label (already written) and a connected client.
pub struct Sandbox {
    /// The label as written to disk.
    pub label: Label,
    /// A client connected to the server, which answered a ping.
    pub client: SandboxClient,
    /// Time from the start call to the first answered ping.
    pub ready_after: Duration,
    /// Where that time went, step by step.
    pub profile: StartProfile,
}

/// Sandbox failures: starting, talking, stopping.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SandboxError {
    /// The backend's program is missing or failed to start the sandbox.
    #[error("cannot start the {backend} sandbox: {message}")]
    Start {
        /// Which backend.
        backend: &'static str,
        /// What went wrong, with the backend's own words where there are any.
        message: String,
    },
    /// Connecting to the socket failed.
    #[error("cannot connect to the sandbox socket {}: {source}", path.display())]
    Connect {
        /// The socket path.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// I/O on the connection or the sandbox directory failed.
    #[error("sandbox I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// The server said something that does not follow the protocol.
    #[error("sandbox protocol error: {0}")]
    Protocol(String),
    /// The server closed the connection (the sandbox is gone).
    #[error("the sandbox server closed the connection (the sandbox is gone)")]
    Closed,
    /// The server did not answer within the call's timeout plus its escalation grace.
    #[error("the sandbox server did not answer within {0:?}")]
    NoAnswer(Duration),
    /// The server's process was stopped (SIGSTOP, from inside the sandbox: nothing
    /// outside stops a sandbox), so it will never answer.
    #[error("the sandbox server (process {0}) was stopped (SIGSTOP) and will never answer")]
    Stopped(i32),
    /// The tool refused the call.
    #[error("{}: {}", .0.code_str(), .0.message)]
    Tool(protocol::ToolError),
    /// A service the sandbox needs (the database) did not answer; worth retrying.
    #[error("{0}")]
    Unavailable(String),
    /// A setup command of the task failed; the message has its output.
    #[error("{0}")]
    Setup(String),
    /// A configuration problem (path too long, backend unavailable).
    #[error("{0}")]
    Config(String),
}

impl protocol::ToolError {
    /// The error code as it appears on the wire.
    pub fn code_str(&self) -> String {
        serde_json::to_value(self.code)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default()
    }
}

/// A way of running sandboxes.
#[async_trait::async_trait]
pub trait SandboxRuntime: Send + Sync {
    /// Which backend this is.
    fn kind(&self) -> RuntimeKind;

    /// Starts the sandbox described by `req`, writes its label and waits until the
    /// server answers a ping.
    async fn start(&self, req: &StartRequest) -> Result<Sandbox, SandboxError>;

    /// Stops the sandbox with this label and everything in it. Stopping one that is
    /// already gone is not an error.
    async fn stop(&self, label: &Label) -> Result<(), SandboxError>;
}

/// One configured instance of each runtime: what a worker uses to start sandboxes and
/// what the reaper uses to stop them, whichever runtime a label names.
#[derive(Default)]
pub struct Runtimes {
    /// The `local` runtime.
    pub local: local::LocalRuntime,
    /// The `bwrap` runtime.
    pub bwrap: bwrap::BwrapRuntime,
    /// The `apptainer` runtime.
    pub apptainer: apptainer::ApptainerRuntime,
}

impl Runtimes {
    /// The runtime for `kind`.
    pub fn get(&self, kind: RuntimeKind) -> &dyn SandboxRuntime {
        match kind {
            RuntimeKind::Local => &self.local,
            RuntimeKind::Bwrap => &self.bwrap,
            RuntimeKind::Apptainer => &self.apptainer,
        }
    }

    /// Stops the sandbox in `dir` through its label, with whichever backend started it,
    /// waits until its processes (the network helper too) are gone, unmounts its
    /// workspace and removes the directory.
    pub async fn stop(&self, dir: &Path) -> Result<(), SandboxError> {
        if let Some(label) = Label::read(dir)? {
            self.get(label.backend).stop(&label).await?;
            label.wait_gone(Duration::from_secs(5)).await;
        }
        // A mounted workspace (the disk quota) must be detached first, or removing the
        // directory would stop at it. Both are blocking file-system work (a repository
        // checkout is thousands of files): off the async threads, where it would hold up
        // every task on them, lease renewals included.
        let dir = dir.to_path_buf();
        tokio::task::spawn_blocking(move || {
            quota::unmount_under(&dir)?;
            match std::fs::remove_dir_all(&dir) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(SandboxError::Io(e)),
            }
        })
        .await
        .map_err(|e| SandboxError::Io(std::io::Error::other(e)))?
    }
}

/// The longest sandbox socket path accepted, in bytes: Linux limits a Unix socket's
/// path to 107 bytes (and a NUL); a margin below that.
pub const SOCKET_PATH_LIMIT: usize = 100;

/// Refuses a socket path over [`SOCKET_PATH_LIMIT`], saying so before `bind` fails
/// obscurely.
pub fn check_socket_path(socket: &Path) -> Result<(), SandboxError> {
    let len = socket.as_os_str().len();
    if len > SOCKET_PATH_LIMIT {
        return Err(SandboxError::Config(format!(
            "the sandbox socket path {} is {len} bytes long, over the {SOCKET_PATH_LIMIT}-byte limit of Unix sockets; set a shorter `sandbox.root`",
            socket.display()
        )));
    }
    Ok(())
}

/// Creates `dir` (and its parents) and makes it private to its owner (0700): a
/// sandbox's files, setuid ones made inside included, are then out of reach of every
/// other user of the host.
pub fn private_dir(dir: &Path) -> std::io::Result<()> {
    dir_with_mode(dir, 0o700)
}

fn dir_with_mode(dir: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
}

/// Creates the directory that holds a node's sandboxes. Private (0700) to the worker;
/// when the worker is root, sandboxes run as users of their own, who must pass through
/// it to reach their own directories (each 0700 and theirs), so it is 0711: enterable,
/// not listable.
pub fn sandboxes_root(root: &Path) -> std::io::Result<()> {
    let mode = if nix::unistd::geteuid().is_root() {
        0o711
    } else {
        0o700
    };
    dir_with_mode(root, mode)
}

/// Makes `dir` (whose parent must exist) a directory of this user's to hold sandbox
/// roots, or checks that the one already there is: a real directory (not a symbolic
/// link) owned by this user, then given the mode of [`sandboxes_root`]. For a directory
/// of a fixed name in a place every user may write (`/tmp`), where someone else could
/// have made it first to see into, or redirect, what this user puts there.
pub fn owned_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = std::fs::symlink_metadata(dir)?;
    if !meta.file_type().is_dir() {
        return Err(std::io::Error::other(format!(
            "{} exists and is not a directory (a symbolic link or a file)",
            dir.display()
        )));
    }
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me {
        return Err(std::io::Error::other(format!(
            "{} belongs to user id {}, not to this user ({me})",
            dir.display(),
            meta.uid()
        )));
    }
    sandboxes_root(dir)
}

/// Binds the sandbox's socket at `path` (replacing a stale one) for the server to serve
/// on: the launcher passes the listening descriptor into the sandbox, and the file stays
/// in the sandbox directory, which nothing inside can write.
pub fn bind_socket(path: &Path) -> Result<std::os::fd::OwnedFd, SandboxError> {
    check_socket_path(path)?;
    let _ = std::fs::remove_file(path);
    let listener = std::os::unix::net::UnixListener::bind(path)?;
    Ok(listener.into())
}

/// Connects to a freshly started server and waits for its first ping; if `alive` says
/// the sandbox process has died meanwhile, gives up at once with its words.
pub(crate) async fn await_ready(
    backend: &'static str,
    socket: &Path,
    started: Instant,
    timeout: Duration,
    mut alive: impl FnMut() -> Result<(), String>,
) -> Result<(SandboxClient, Duration, protocol::PingResult), SandboxError> {
    let deadline = started + timeout;
    let mut waits = rollout_core::retry::sandbox_socket();
    loop {
        if let Ok(client) = SandboxClient::connect(socket).await {
            let ping = client.ping().await?;
            return Ok((client, started.elapsed(), ping));
        }
        if let Err(message) = alive() {
            return Err(SandboxError::Start { backend, message });
        }
        if Instant::now() >= deadline {
            return Err(SandboxError::Start {
                backend,
                message: format!("the sandbox server did not open its socket within {timeout:?}"),
            });
        }
        tokio::time::sleep(waits.next().unwrap_or(Duration::from_millis(10))).await;
    }
}

/// Applies `limits` to the calling process; runs between fork and exec (or in a
/// launcher before its exec), so the limits are inherited by everything the sandbox
/// starts.
pub(crate) fn apply_rlimits(limits: &SandboxLimits) -> std::io::Result<()> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    // Never above the hard limit the worker itself runs under: raising it needs
    // privileges, and the tighter limit is the one that holds anyway.
    let set = |r: Resource, v: u64| {
        if v > 0 {
            let (_, hard) = getrlimit(r).map_err(std::io::Error::from)?;
            let v = v.min(hard);
            setrlimit(r, v, v).map_err(std::io::Error::from)
        } else {
            Ok(())
        }
    };
    set(Resource::RLIMIT_NPROC, limits.processes)?;
    set(Resource::RLIMIT_AS, limits.memory_bytes)?;
    set(Resource::RLIMIT_FSIZE, limits.file_size_bytes)?;
    set(Resource::RLIMIT_CPU, limits.cpu_seconds)?;
    set(Resource::RLIMIT_CORE, 0)?;
    Ok(())
}

/// The descriptor number a launched process finds the first of `pass_fds` at; the
/// others follow in order.
pub(crate) const FIRST_PASSED_FD: i32 = 3;
/// At most this many descriptors are passed.
const MAX_PASS_FDS: usize = 8;

/// What `launch` needs to give a sandbox its own network (see [`net`]).
pub(crate) struct NetPlan {
    /// The node's network settings.
    pub settings: net::NetSettings,
    /// The read end of the pipe the sandbox holds the write end of.
    pub exit_read: std::os::fd::OwnedFd,
}

/// How a backend wants its sandbox's root process started (see [`launch`]).
pub(crate) struct Launch {
    /// The backend's name, for messages.
    pub backend: &'static str,
    /// The root process.
    pub cmd: Root,
    /// The label to complete (process identity) and write.
    pub label: Label,
    /// Resource limits set on the process before it starts.
    pub rlimits: Option<SandboxLimits>,
    /// Descriptors the process finds at [`FIRST_PASSED_FD`] onwards.
    pub pass_fds: Vec<std::os::fd::OwnedFd>,
    /// The read end of bwrap's `--info-fd`.
    pub info_read: Option<std::os::fd::OwnedFd>,
    /// The network to connect, for `network: true` bwrap sandboxes.
    pub net: Option<NetPlan>,
    /// The start's profile so far (the backend's own preparation).
    pub profile: StartProfile,
    /// `cgroup.procs` files the process joins before it execs.
    pub cgroup_procs: Vec<std::ffi::CString>,
    /// For bwrap: cgroups joined from outside while the sandbox waits (see [`Hold`]).
    pub hold: Option<Hold>,
    /// The user and group the process becomes after joining its cgroups (a root worker's
    /// per-sandbox user); set here rather than with `Command::uid`, which would switch
    /// before the join, when the cgroup is no longer writable.
    pub become_user: Option<(u32, u32)>,
    /// Whether the process gets SIGKILL when the worker thread that starts it ends
    /// ([`StartRequest::die_with_parent`]).
    pub die_with_parent: bool,
}

/// How the sandbox's root process comes to be.
pub(crate) enum Root {
    /// Spawned now, from this process, with the steps of [`Launch`] between fork and
    /// exec.
    Spawn(tokio::process::Command),
    /// A launcher made ahead of time, already in the sandbox's cgroups, told to exec
    /// `program` with `args` (see [`launcher`]).
    Launcher {
        /// The launcher.
        launcher: launcher::Launcher,
        /// The program, an absolute path.
        program: PathBuf,
        /// Its arguments.
        args: Vec<std::ffi::OsString>,
    },
}

impl From<tokio::process::Command> for Root {
    fn from(cmd: tokio::process::Command) -> Self {
        Root::Spawn(cmd)
    }
}

/// A bwrap sandbox held before its first process of its own: bwrap builds the sandbox,
/// then its namespace's init waits on `--block-fd` (after every mount, with its
/// privileges dropped, before it starts the server) until [`launch`] has moved bwrap and
/// that init into the sandbox's cgroups and writes to `release`. Everything the sandbox
/// runs descends from the init, so all of it is counted, as when bwrap joined the
/// cgroups before its exec; the slow part of joining now runs while bwrap works.
pub(crate) struct Hold {
    /// The sandbox's cgroups.
    pub cgroup: cgroup::SandboxCgroup,
    /// The write end of bwrap's `--block-fd`.
    pub release: std::os::fd::OwnedFd,
}

/// Starts `cmd` as the sandbox's root process in a session of its own (so a signal to
/// the worker's process group does not reach it, and it outlives a crashed worker until
/// the reaper removes it), writes the label, and waits for the server's first ping.
async fn launch(req: &StartRequest, launch: Launch) -> Result<Sandbox, SandboxError> {
    let Launch {
        backend,
        cmd,
        mut label,
        rlimits,
        pass_fds,
        info_read,
        net,
        cgroup_procs,
        hold,
        become_user,
        die_with_parent,
        mut profile,
    } = launch;
    let started = Instant::now();
    // From here until the server answers, whatever this start made (the cgroups, then
    // the process tree) goes if the start does not finish: an error, or this future
    // dropped because the job was cancelled or the worker is stopping.
    let mut unfinished = Unfinished::new(&label);
    // The guard ends the processes before it closes a held sandbox's go-ahead.
    let held_cgroup = hold.map(|Hold { cgroup, release }| {
        unfinished.release = Some(release);
        cgroup
    });
    if pass_fds.len() > MAX_PASS_FDS {
        return Err(SandboxError::Config("too many descriptors to pass".into()));
    }
    check_socket_path(&req.socket())?;
    let log = std::fs::File::create(req.dir.join("server.log"))?;
    let child = start_root(
        cmd,
        log,
        &pass_fds,
        (&mut label, &mut unfinished),
        (cgroup_procs, rlimits, become_user, die_with_parent),
        backend,
    )?;
    profile.mark("root process spawned");
    label.set_process(server::child_pid(&child));
    unfinished.update(&label);
    // On disk before anything is awaited, so a stop or the reaper that reads the label
    // after this start was abandoned finds the process (and the cgroups) to end.
    label.write()?;
    drop(pass_fds);
    profile.mark("label written");
    if let Some(read) = info_read {
        // bwrap reports the host pid of the namespace's init, which must die with it.
        if let Some(pid) = read_child_pid(read, started + req.ready_timeout).await {
            label.ns_init = Some(pid);
            label.ns_init_start = label::process_start(pid);
            unfinished.update(&label);
        }
        profile.mark("bwrap reported its namespace");
    }
    // Joined while bwrap builds the filesystem and the network is attached.
    let joining = held_cgroup.map(|cgroup| start_joining(cgroup, &label));
    if let Some(plan) = net {
        let attached = attach_network(&mut label, plan, backend, started + req.ready_timeout).await;
        unfinished.update(&label);
        attached?;
        profile.mark("network attached");
    }
    label.write()?;
    profile.mark("label rewritten");
    if let Some(join) = joining {
        finish_joining(join, &mut unfinished, backend).await?;
        profile.mark("cgroups joined");
    }
    let (mut client, ready_after, ping) = reaped_until_ready(req, backend, started, child).await?;
    client.watch(label.server());
    unfinished.finish();
    profile.mark("first ping answered");
    if let Some(s) = &ping.startup {
        profile.add_server(s);
    }
    Ok(Sandbox {
        label,
        client,
        ready_after,
        profile,
    })
}

/// What is done to a sandbox's root process before it runs (see [`Launch`]): the
/// `cgroup.procs` files it joins, its rlimits, the user it becomes, and whether it dies
/// with its worker.
type ChildSteps = (
    Vec<std::ffi::CString>,
    Option<SandboxLimits>,
    Option<(u32, u32)>,
    bool,
);

/// Starts the sandbox's root process as `root` says, with `log` as its standard output
/// and error and `pass_fds` from [`FIRST_PASSED_FD`] on; the steps of
/// [`set_up_child`] (a spawned process) or of the launcher's order. A launcher's
/// process is named in `label` (and `unfinished`) before it is told to go, so a start
/// dropped from then on ends it.
fn start_root(
    root: Root,
    log: std::fs::File,
    pass_fds: &[std::os::fd::OwnedFd],
    (label, unfinished): (&mut Label, &mut Unfinished),
    (cgroup_procs, rlimits, become_user, die_with_parent): ChildSteps,
    backend: &'static str,
) -> Result<tokio::process::Child, SandboxError> {
    match root {
        Root::Spawn(mut cmd) => {
            cmd.stdin(std::process::Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log);
            set_up_child(
                &mut cmd,
                pass_fds,
                cgroup_procs,
                rlimits,
                (become_user, die_with_parent),
            );
            cmd.spawn().map_err(|e| SandboxError::Start {
                backend,
                message: format!("cannot run {:?}: {e}", cmd.as_std().get_program()),
            })
        }
        Root::Launcher {
            launcher,
            program,
            args,
        } => {
            label.set_process(launcher.pid());
            unfinished.update(label);
            let order = launcher::Order {
                program,
                args,
                // None sets none (the launcher's own are the worker's).
                rlimits: rlimits.unwrap_or(SandboxLimits {
                    processes: 0,
                    memory_bytes: 0,
                    file_size_bytes: 0,
                    cpu_seconds: 0,
                    ..SandboxLimits::default()
                }),
                become_user,
                die_with_parent,
            };
            launcher.exec(&order, &std::os::fd::OwnedFd::from(log), pass_fds)
        }
    }
}

/// Reaps the sandbox's root process `child` whenever it ends (so it never lingers as a
/// zombie) and waits for the server's first ping; an exit before it is the error, with
/// what the server logged.
async fn reaped_until_ready(
    req: &StartRequest,
    backend: &'static str,
    started: Instant,
    mut child: tokio::process::Child,
) -> Result<(SandboxClient, Duration, protocol::PingResult), SandboxError> {
    let exited = std::sync::Arc::new(std::sync::Mutex::new(None));
    let status = exited.clone();
    tokio::spawn(async move {
        let st = child.wait().await;
        *status.lock().expect("status lock") = Some(st);
    });
    let log_path = req.dir.join("server.log");
    await_ready(
        backend,
        &req.socket(),
        started,
        req.ready_timeout,
        || match &*exited.lock().expect("status lock") {
            None => Ok(()),
            Some(st) => {
                let said = std::fs::read_to_string(&log_path).unwrap_or_default();
                Err(format!(
                    "it exited ({}) before its server answered: {}",
                    st.as_ref()
                        .map(|s| s.to_string())
                        .unwrap_or_else(|e| e.to_string()),
                    said.trim()
                ))
            }
        },
    )
    .await
}

/// Moves bwrap and its namespace's init (both in `label`) into `cgroup` on a blocking
/// thread (see [`Hold`]).
fn start_joining(
    cgroup: cgroup::SandboxCgroup,
    label: &Label,
) -> tokio::task::JoinHandle<std::io::Result<()>> {
    let pids = [label.pid, label.ns_init];
    tokio::task::spawn_blocking(move || match pids {
        [Some(bwrap), Some(init)] => cgroup.join(&[bwrap, init]),
        _ => Err(std::io::Error::other(
            "bwrap did not report its namespace's init, so it cannot be put in its cgroup",
        )),
    })
}

/// Waits for [`start_joining`], then lets the held sandbox go; on failure it stays held
/// (the caller's error drops `unfinished`, which kills it first).
async fn finish_joining(
    join: tokio::task::JoinHandle<std::io::Result<()>>,
    unfinished: &mut Unfinished,
    backend: &'static str,
) -> Result<(), SandboxError> {
    let joined = join.await.map_err(std::io::Error::other).and_then(|r| r);
    if let Err(e) = joined {
        return Err(SandboxError::Start {
            backend,
            message: format!("cannot put the sandbox in its cgroup: {e}"),
        });
    }
    if let Some(release) = unfinished.release.take() {
        nix::unistd::write(&release, b"1").map_err(std::io::Error::from)?;
    }
    Ok(())
}

/// A sandbox whose start has not finished: dropped before [`Unfinished::finish`] (the
/// start failed, or its future was dropped part-way because the job was cancelled or
/// the worker is stopping), it kills every process the label names with their
/// descendants (bwrap's namespace init among them, which takes everything inside with
/// it) and the sandbox's cgroups. The directory, its mounted workspace and the record
/// go with the stop that follows ([`Runtimes::stop`]), which reads the label this start
/// wrote as soon as it had a process.
///
/// It also holds a held bwrap sandbox's go-ahead ([`Hold::release`]) until the sandbox
/// may go: closing it would let bwrap go on too, so it is closed only after the kill.
struct Unfinished {
    label: Option<Label>,
    release: Option<std::os::fd::OwnedFd>,
}

impl Unfinished {
    fn new(label: &Label) -> Self {
        Unfinished {
            label: Some(label.clone()),
            release: None,
        }
    }

    /// The label now names more (a process, the namespace init, the network helper).
    fn update(&mut self, label: &Label) {
        self.label = Some(label.clone());
    }

    /// The start finished: the sandbox is the caller's to stop.
    fn finish(mut self) {
        self.label = None;
    }
}

impl Drop for Unfinished {
    fn drop(&mut self) {
        // The fields (the go-ahead among them) are dropped only after this body.
        if let Some(label) = self.label.take() {
            if label.pid.is_some() {
                tracing::info!(job_id = %label.job_id, pid = ?label.pid, "ending the processes of a sandbox whose start did not finish");
            }
            label.kill();
        }
    }
}

/// Has `cmd`'s child, between fork and exec, start a session of its own, join its
/// cgroups, take its resource limits, find `pass_fds` at [`FIRST_PASSED_FD`] onwards,
/// become its user and, with `die_with_parent`, ask for SIGKILL when its parent ends, in
/// that order (it joins the cgroups while it may still write them; the death signal is
/// asked for last because a change of user clears it).
fn set_up_child(
    cmd: &mut tokio::process::Command,
    pass_fds: &[std::os::fd::OwnedFd],
    cgroup_procs: Vec<std::ffi::CString>,
    rlimits: Option<SandboxLimits>,
    (become_user, die_with_parent): (Option<(u32, u32)>, bool),
) {
    use std::os::fd::AsRawFd;
    let mut raw = [-1i32; MAX_PASS_FDS];
    for (slot, fd) in raw.iter_mut().zip(pass_fds) {
        *slot = fd.as_raw_fd();
    }
    let count = pass_fds.len();
    let parent = nix::unistd::getpid();
    // SAFETY: setsid, open/write/close, setrlimit, fcntl, dup2, the set*id calls, prctl,
    // getppid and _exit are async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            nix::unistd::setsid().map_err(std::io::Error::from)?;
            cgroup::SandboxCgroup::join_from_child(&cgroup_procs)?;
            if let Some(l) = &rlimits {
                apply_rlimits(l)?;
            }
            // Move the descriptors out of the way first, so a source that happens to be
            // numbered like a target is not overwritten before it is copied.
            let mut high = [-1i32; MAX_PASS_FDS];
            for i in 0..count {
                high[i] = libc::fcntl(raw[i], libc::F_DUPFD_CLOEXEC, 64);
                if high[i] < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            for (target, fd) in (FIRST_PASSED_FD..).zip(high.iter().take(count)) {
                if libc::dup2(*fd, target) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            if let Some((uid, gid)) = become_user
                && (libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setresgid(gid, gid, gid) != 0
                    || libc::setresuid(uid, uid, uid) != 0)
            {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have ended before the request took hold.
            if die_with_parent && !lifeline::die_with(parent)? {
                libc::_exit(1);
            }
            Ok(())
        });
    }
}

/// Connects the network namespace bwrap reported to the network `plan` describes and
/// records the helper in `label`; kills the sandbox when that fails, since it cannot
/// run without the network it asked for.
async fn attach_network(
    label: &mut Label,
    plan: NetPlan,
    backend: &'static str,
    deadline: Instant,
) -> Result<(), SandboxError> {
    let attached = match label.ns_init {
        Some(ns) => net::attach(&plan.settings, ns, plan.exit_read, deadline).await,
        None => Err(SandboxError::Start {
            backend,
            message: "bwrap did not report its namespace, so its network cannot be set up".into(),
        }),
    };
    match attached {
        Ok(helper) => {
            label.net_helper = Some(helper.pid);
            label.net_helper_start = label::process_start(helper.pid);
            Ok(())
        }
        Err(e) => {
            label.kill();
            Err(e)
        }
    }
}

/// Reads bwrap's `--info-fd` report (`{"child-pid": N, ...}`) up to its closing brace.
async fn read_child_pid(fd: std::os::fd::OwnedFd, deadline: Instant) -> Option<i32> {
    let fd = server::stream::nonblocking(fd).ok()?;
    let mut text = Vec::new();
    let mut buf = [0u8; 512];
    while !text.contains(&b'}') {
        let n = tokio::time::timeout_at(deadline.into(), server::stream::read(&fd, &mut buf))
            .await
            .ok()?
            .ok()?;
        if n == 0 {
            break;
        }
        text.extend_from_slice(&buf[..n]);
    }
    let v: serde_json::Value = serde_json::from_slice(&text).ok()?;
    v["child-pid"].as_i64().and_then(|p| i32::try_from(p).ok())
}

/// Where `rollout-sandbox serve` takes connections.
enum ServeOn<'a> {
    /// Binds this path itself.
    Socket(&'a Path),
    /// Serves on this inherited listening descriptor.
    Fd(i32),
}

/// The arguments of `rollout-sandbox serve` for a sandbox whose paths are as given;
/// with `lifeline`, the server stops when the worker's lifeline at that descriptor
/// breaks (see [`lifeline`]).
fn serve_args(
    on: ServeOn<'_>,
    workdir: &Path,
    ctl_dir: &Path,
    lifeline: Option<i32>,
) -> Vec<std::ffi::OsString> {
    let mut a: Vec<std::ffi::OsString> = vec!["serve".into()];
    match on {
        ServeOn::Socket(p) => a.extend(["--socket".into(), p.into()]),
        ServeOn::Fd(fd) => a.extend(["--listen-fd".into(), fd.to_string().into()]),
    }
    a.extend([
        "--workdir".into(),
        workdir.into(),
        "--ctl-dir".into(),
        ctl_dir.into(),
    ]);
    if let Some(fd) = lifeline {
        a.extend(["--lifeline-fd".into(), fd.to_string().into()]);
    }
    a
}

/// The environment variables a launcher keeps when it starts a sandbox: nothing of the
/// worker's own (its database URL, tokens, cloud credentials) reaches a sandbox, where
/// any process could read it from `/proc/<pid>/environ`.
pub(crate) fn clean_env(cmd: &mut tokio::process::Command, keep_prefixes: &[&str]) {
    let kept: Vec<(std::ffi::OsString, std::ffi::OsString)> = std::env::vars_os()
        .filter(|(k, _)| {
            let k = k.to_string_lossy();
            ["PATH", "LANG"].contains(&k.as_ref()) || keep_prefixes.iter().any(|p| k.starts_with(p))
        })
        .collect();
    cmd.env_clear().envs(kept);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A root's holder in a shared directory is this user's own directory, or nothing:
    /// a symbolic link or a file in its place is refused, not followed.
    #[test]
    fn an_owned_dir_is_made_private_and_a_link_in_its_place_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("mine");
        owned_dir(&dir).unwrap();
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert!(mode == 0o700 || mode == 0o711, "mode {mode:o}");
        // Again: the directory already there is accepted.
        owned_dir(&dir).unwrap();
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        let e = owned_dir(&link).unwrap_err().to_string();
        assert!(e.contains("not a directory"), "{e}");
        let file = tmp.path().join("file");
        std::fs::write(&file, "").unwrap();
        assert!(owned_dir(&file).is_err());
    }

    /// The longest socket of a sandbox directory is Apptainer's, in `run/`.
    #[test]
    fn the_longest_socket_in_a_sandbox_dir_is_apptainers() {
        let dir = Path::new("/r/job");
        assert_eq!(label::longest_socket_in(dir), dir.join("run/sock"));
        assert!(check_socket_path(&dir.join("x".repeat(SOCKET_PATH_LIMIT))).is_err());
        assert!(check_socket_path(dir).is_ok());
    }
}
