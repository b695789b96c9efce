//! A node's sandboxes: starting them for jobs, finding them again, and the reaper.
//!
//! A job's RUN sandbox lives in `<root>/<job id>/` and is recorded in the database
//! *before* it starts, so that after any crash either the row or the directory's label
//! names it. EVAL's fresh sandboxes live in `<root>/<job id>-eval-<generation>/` and are
//! not recorded: they exist only while an EVAL stage holds them. The generation (the
//! claim's token) is in the name so that a stale EVAL attempt, whose lease lapsed while
//! it went on working, and the attempt that took over never share a workspace: the
//! newer one's start must neither stop the older one's sandbox under it nor be started
//! into the directory the older one is still filling (which once applied an agent's
//! patch twice and scored the episode 0).
//!
//! The reaper, run by every worker, first renews the leases of the node's sandboxes
//! (which is how the node tells the cluster it still looks after them), then removes the
//! sandboxes whose job has ended (or is unknown), and directories whose label points at a
//! process that is gone. A lease only runs out when its node stops renewing it; the
//! reconciler then sends the waiting job back to INIT.

use super::spec::SandboxSpec;
use super::{
    Death, Label, RuntimeKind, Runtimes, Sandbox, SandboxClient, SandboxError, StartRequest,
};
use crate::config::SandboxSettings;
use crate::domain::EpochMs;
use crate::store::{JobStore, SandboxRecord, SandboxStore};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// What separates the job id from the claim's generation in an EVAL sandbox's name.
pub(crate) const EVAL_INFIX: &str = "-eval-";

/// Whether `dir` is named as an EVAL sandbox: `<job id>-eval-<generation>`.
fn is_eval_dir(dir: &Path) -> bool {
    dir.file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.rsplit_once(EVAL_INFIX))
        .is_some_and(|(_, g)| !g.is_empty() && g.bytes().all(|b| b.is_ascii_digit()))
}

/// Which stage a sandbox serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// The agent's sandbox: started by INIT, used and stopped by RUN.
    Run,
    /// A fresh sandbox in which EVAL checks the agent's changes.
    Eval,
}

/// What one reaper pass removed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Reaped {
    /// Job ids whose sandboxes were removed.
    pub removed: Vec<String>,
    /// Leases renewed.
    pub renewed: u64,
}

/// One limit of a node's sandboxes: held or not, and how or why not.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct LimitReport {
    /// Whether it holds.
    pub enforced: bool,
    /// How it is held, or why it cannot be here and what it falls back to.
    pub detail: String,
}

/// What a node's sandboxes are held to, for the start-up log and `GET /healthz`: an
/// operator must be able to see a limit that this machine cannot enforce.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct SandboxReport {
    /// The node's default backend.
    pub backend: String,
    /// Outbound-only networking for `network: true` sandboxes.
    pub network: LimitReport,
    /// Memory per sandbox.
    pub memory: LimitReport,
    /// Processes per sandbox.
    pub processes: LimitReport,
    /// Disk used by a sandbox's workspace.
    pub workspace_disk: LimitReport,
    /// Whether the unsandboxed `local` backend is refused.
    pub local_backend: LimitReport,
}

/// The sandboxes of this node.
pub struct NodeSandboxes {
    runtimes: Runtimes,
    default_runtime: RuntimeKind,
    settings: SandboxSettings,
    root: PathBuf,
    server_bin: PathBuf,
    /// Where the node's RUN sandboxes are recorded and leased.
    records: Arc<dyn SandboxStore>,
    /// Whether an EVAL sandbox's job has ended (the reaper's one question of the jobs).
    jobs: Arc<dyn JobStore>,
    node: String,
    quota: super::quota::WorkspaceQuota,
    /// Workspace filesystems mounted ahead of time (see [`super::pool`]).
    pool: super::pool::WorkspacePool,
    /// Set when this process starts shutting down: a sandbox that dies from then on may
    /// have died with the node (a scheduler signals every process of its job).
    stopping: std::sync::atomic::AtomicBool,
    /// Set by [`NodeSandboxes::end_with_this_process`].
    die_with_process: std::sync::atomic::AtomicBool,
}

/// How long a stage waits after its sandbox died before asking why: a signal that
/// stops the whole node reaches the sandbox and this process at about the same time,
/// and this process must have seen it before the death is put down to the workload.
const DEATH_SETTLE: Duration = Duration::from_secs(1);

impl NodeSandboxes {
    /// The sandboxes of node `node`, configured by `s`: started from `server_bin` (the
    /// in-sandbox server), each in its own directory under `root`, recorded in `records`;
    /// the reaper asks `jobs` whether an EVAL sandbox's job has ended.
    pub fn new(
        s: &SandboxSettings,
        node: &str,
        root: PathBuf,
        server_bin: PathBuf,
        records: Arc<dyn SandboxStore>,
        jobs: Arc<dyn JobStore>,
    ) -> Self {
        let runtimes = Runtimes {
            local: super::local::LocalRuntime,
            bwrap: super::bwrap::BwrapRuntime {
                program: s.bwrap.clone(),
                uid_range: (s.unprivileged_uid_base, s.unprivileged_uid_count),
                gid: s.unprivileged_gid,
                net: super::net::NetSettings {
                    slirp4netns: s.slirp4netns.clone(),
                    deny: s
                        .network_deny
                        .iter()
                        .filter_map(|n| crate::domain::sandbox::Ipv4Net::parse(n))
                        .collect(),
                    ..Default::default()
                },
                cgroups: super::cgroup::Cgroups::probe(s.cgroup_parent.as_deref()),
                uids: Default::default(),
                launchers: super::launcher::LauncherPool::new(s.launcher_pool),
                etc_view: true,
            },
            apptainer: super::apptainer::ApptainerRuntime {
                program: s.apptainer.clone(),
                host_network: s.apptainer_host_network,
            },
        };
        let quota = super::quota::WorkspaceQuota::probe();
        let pool = super::pool::WorkspacePool::new(quota.clone(), &root, s.workspace_pool);
        // The node's default size, ready before the first job asks for it.
        pool.refill(s.limits.workspace_bytes);
        NodeSandboxes {
            runtimes,
            default_runtime: RuntimeKind::parse(&s.backend).unwrap_or(RuntimeKind::Bwrap),
            settings: s.clone(),
            root,
            server_bin,
            records,
            jobs,
            node: node.to_string(),
            quota,
            pool,
            stopping: std::sync::atomic::AtomicBool::new(false),
            die_with_process: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Makes every sandbox started from now on end with this process, however it ends
    /// (SIGKILL included; see [`super::StartRequest::die_with_parent`]). For a process
    /// that owns its sandboxes (`rollout up`, a `rollout node` running INIT and RUN):
    /// no other process uses them, and one that outlived its owner would run on with
    /// nobody to remove it (its state directory perhaps deleted). A node made of
    /// separate stage processes does not: there one process's sandbox is another's work,
    /// and the reaper of the survivors removes what a dead one left.
    pub fn end_with_this_process(&self) {
        self.die_with_process
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Removes every sandbox of this node under its root (processes, workspace mounts
    /// and their loop devices, cgroups, directories) and lets the leases of their
    /// records lapse at once, so the reconciler sends their waiting jobs back to INIT
    /// (elsewhere, or here when the node is back) without waiting out the lease. What a
    /// process that owns the node's sandboxes (`rollout up`, a `rollout node` running
    /// INIT and RUN) does once its workers have handed their work back at shutdown: a
    /// stopped node must leave no mount or loop device behind, those being a finite
    /// resource of the machine. Returns how many sandboxes it removed.
    pub async fn remove_all(&self) -> usize {
        self.set_stopping();
        // No sandbox starts from here on: the launchers kept ready go first.
        self.runtimes.bwrap.launchers.close();
        let mut removed = 0;
        for dir in Label::dirs(&self.root) {
            match Label::read(&dir) {
                Ok(Some(label)) if label.node != self.node => continue,
                _ => {}
            }
            if let Err(e) = self.runtimes.stop(&dir).await {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot remove the sandbox at shutdown");
                continue;
            }
            removed += 1;
        }
        if let Err(e) = self
            .records
            .renew_sandboxes(&self.node, EpochMs::now())
            .await
        {
            tracing::warn!(error = %e, "cannot end the leases of the removed sandboxes; they lapse on their own");
        }
        if removed > 0 {
            tracing::info!(removed, "removed the node's sandboxes at shutdown");
        }
        removed
    }

    /// Marks this process as shutting down (see [`NodeSandboxes::cause_of_death`]).
    pub fn set_stopping(&self) {
        self.stopping
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Why the job's sandbox of `purpose` and `generation` died while a stage was using
    /// it: the node shutting down, the host's OOM killer (with the sandbox inside its own
    /// memory limit) or the sandbox being removed under the stage are the
    /// infrastructure's; anything else is the workload's (an episode that killed its
    /// own processes or ran into its own limits), and is never run again for free.
    pub async fn cause_of_death(&self, job_id: &str, purpose: Purpose, generation: i64) -> Death {
        tokio::time::sleep(DEATH_SETTLE).await;
        if self.stopping.load(std::sync::atomic::Ordering::SeqCst) {
            return Death::Infrastructure("the node is shutting down".into());
        }
        match Label::read(&self.dir(job_id, purpose, generation)) {
            Ok(Some(label)) if label.generation == Some(generation) => label.death(),
            _ => Death::Infrastructure("the sandbox was removed while the stage ran".into()),
        }
    }

    /// This node's name.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// The sandbox runtimes, as configured.
    pub fn runtimes(&self) -> &Runtimes {
        &self.runtimes
    }

    /// The directory of a job's sandbox: one per job for RUN (found again by later
    /// stages), one per EVAL claim (`generation`, ignored for RUN).
    pub fn dir(&self, job_id: &str, purpose: Purpose, generation: i64) -> PathBuf {
        match purpose {
            Purpose::Run => self.root.join(job_id),
            Purpose::Eval => self.root.join(format!("{job_id}{EVAL_INFIX}{generation}")),
        }
    }

    /// What this node's sandboxes are held to, and what it cannot enforce here (see
    /// [`SandboxReport`]).
    pub fn report(&self) -> SandboxReport {
        let root = nix::unistd::geteuid().is_root();
        let bw = &self.runtimes.bwrap;
        let net = super::net::probe(&bw.net);
        let cg = &bw.cgroups;
        let how = match cg {
            super::cgroup::Cgroups::V2 { parent } => {
                format!("cgroup v2 under {}", parent.display())
            }
            super::cgroup::Cgroups::V1 { .. } => "cgroup v1 (memory, pids)".into(),
            super::cgroup::Cgroups::Unavailable { why } => why.clone(),
        };
        let limit = |enforced: bool, detail: String| LimitReport { enforced, detail };
        SandboxReport {
            backend: self.default_runtime.as_str().to_string(),
            network: limit(
                net.is_ok(),
                net.err().unwrap_or_else(|| {
                    "network: true sandboxes get a namespace of their own (slirp4netns), outbound only".into()
                }),
            ),
            memory: limit(
                cg.enforced(),
                if cg.enforced() {
                    format!("limits.memory_bytes holds for each sandbox as a whole ({how})")
                } else {
                    format!("not per sandbox: limits.memory_bytes is an address-space limit per process ({how})")
                },
            ),
            processes: limit(
                cg.enforced() || root,
                if cg.enforced() {
                    format!("limits.processes holds for each sandbox ({how})")
                } else if root {
                    "limits.processes holds for each sandbox (a host user per sandbox)".into()
                } else {
                    format!("not per sandbox: the worker's sandboxes share one process budget ({how})")
                },
            ),
            workspace_disk: match &self.quota {
                _ if self.settings.limits.workspace_bytes == 0 => limit(
                    false,
                    "not enforced: limits.workspace_bytes is 0; single files are capped by limits.file_size_bytes, /tmp and /dev/shm by their tmpfs sizes".into(),
                ),
                super::quota::WorkspaceQuota::Loop { .. } => limit(
                    true,
                    "limits.workspace_bytes holds for each workspace (a loop-mounted ext4 image, nosuid, nodev)".into(),
                ),
                super::quota::WorkspaceQuota::Unavailable { why } => limit(
                    false,
                    format!("not enforced: {why}; the workspace is a directory on the node's filesystem, single files are capped by limits.file_size_bytes, /tmp and /dev/shm by their tmpfs sizes"),
                ),
            },
            local_backend: limit(
                !self.settings.allow_local,
                if self.settings.allow_local {
                    "allowed (sandbox.allow_local): tasks may run unsandboxed on the host".into()
                } else {
                    "refused".into()
                },
            ),
        }
    }

    /// Logs [`NodeSandboxes::report`], a warning for each limit not enforced.
    pub fn log_report(&self) {
        let r = self.report();
        for (name, l) in [
            ("network", &r.network),
            ("memory", &r.memory),
            ("processes", &r.processes),
            ("workspace_disk", &r.workspace_disk),
            ("local_backend", &r.local_backend),
        ] {
            if l.enforced {
                tracing::info!(limit = name, detail = %l.detail, "sandbox limit");
            } else {
                tracing::warn!(limit = name, detail = %l.detail, "sandbox limit NOT enforced on this node");
            }
        }
    }

    /// Whether tasks may use the `local` backend (no isolation) on this node.
    pub fn allow_local(&self) -> bool {
        self.settings.allow_local
    }

    /// This node's sandbox settings, which a task's sandbox spec is checked against at
    /// submit (see [`SandboxSpec::validate`]).
    pub fn settings(&self) -> &SandboxSettings {
        &self.settings
    }

    /// Starts a sandbox for `job_id` from `spec`, replacing any earlier one of the same
    /// purpose, runs the spec's setup commands, and makes the state they leave the
    /// baseline of later exports (what setup made is the task's, not the agent's).
    /// `generation` (the claim attempt of the stage that starts it) goes into the label,
    /// so that a stale attempt of a stage can only ever remove its own sandbox.
    pub async fn start(
        &self,
        job_id: &str,
        spec: &SandboxSpec,
        purpose: Purpose,
        generation: i64,
    ) -> Result<Sandbox, SandboxError> {
        let dir = self.dir(job_id, purpose, generation);
        refuse_if_superseded(job_id, purpose, generation, &dir)?;
        self.discard(job_id, purpose, &dir).await;
        let backend = spec.backend_or(self.default_runtime);
        if backend == RuntimeKind::Local && !self.settings.allow_local {
            return Err(SandboxError::Config(
                "the local sandbox backend runs the agent's commands unsandboxed on the host; this node refuses it (set sandbox.allow_local = true to allow it)".into(),
            ));
        }
        // Checked at submit too; a job stored before (or by a gateway with other
        // settings) fails here for good rather than at every retry of INIT.
        spec.limits
            .check("sandbox", &self.settings.max_limits)
            .map_err(|e| SandboxError::Config(e.to_string()))?;
        let workspace = dir.join("workspace");
        super::sandboxes_root(&self.root)?;
        super::private_dir(&dir)?;
        std::fs::create_dir_all(&workspace)?;
        // Label and record first, so however long preparing takes (a large clone), the
        // reaper knows the directory is wanted.
        let mut label = Label::new(job_id, &self.node, backend, &dir);
        label.generation = Some(generation);
        label.write()?;
        if purpose == Purpose::Run {
            self.record(job_id, backend, &dir, &label).await?;
        }
        let mine = Some(generation);
        let limits = spec.limits.apply(self.settings.limits);
        let taken = match self
            .pool
            .mount(&dir, &workspace, limits.workspace_bytes)
            .await
        {
            Ok(taken) => taken,
            Err(e) => {
                self.remove(job_id, purpose, mine).await;
                return Err(e);
            }
        };
        if let Err(message) = spec.prepare(&workspace).await {
            self.pool.settle(taken);
            self.remove(job_id, purpose, mine).await;
            return Err(SandboxError::Config(format!(
                "cannot prepare the workspace: {message}"
            )));
        }
        let mut ro_binds = self.settings.ro_binds.clone();
        ro_binds.dedup();
        let req = StartRequest {
            label,
            dir: dir.clone(),
            server_bin: self.server_bin.clone(),
            network: spec.network,
            env: spec.env.clone(),
            limits,
            image: spec.image.clone(),
            fakeroot: spec.fakeroot,
            ro_binds,
            ready_timeout: Duration::from_millis(self.settings.ready_timeout_ms),
            die_with_parent: self
                .die_with_process
                .load(std::sync::atomic::Ordering::SeqCst),
        };
        let started = self.runtimes.get(backend).start(&req).await;
        // The pool's chores wait until now, so they do not compete with this start.
        self.pool.settle(taken);
        let sandbox = match started {
            Ok(s) => s,
            Err(e) => {
                metrics::counter!(crate::metrics::SANDBOX_START_FAILURES, "backend" => backend.as_str())
                    .increment(1);
                self.remove(job_id, purpose, mine).await;
                return Err(e);
            }
        };
        metrics::histogram!(crate::metrics::SANDBOX_READY, "backend" => backend.as_str())
            .record(sandbox.ready_after.as_secs_f64());
        tracing::info!(
            backend = backend.as_str(),
            ready_ms = sandbox.ready_after.as_secs_f64() * 1000.0,
            "sandbox ready"
        );
        if let Err(end) = run_setup(&sandbox, spec).await {
            let e = match end {
                SetupEnd::Failed(e) => e,
                SetupEnd::SandboxFailed { which, error } => {
                    self.setup_death(job_id, purpose, generation, &sandbox, which, error)
                        .await
                }
            };
            self.remove(job_id, purpose, mine).await;
            return Err(e);
        }
        if let Err(e) = sandbox.client.baseline().await {
            self.remove(job_id, purpose, mine).await;
            return Err(e);
        }
        Ok(sandbox)
    }

    /// What to report when the sandbox failed under setup command `which`: a sandbox
    /// that died of what ran inside it (the task's own setup ended it, `kill -9 -1`,
    /// or ran into its limits) is the task's fault, [`SandboxError::Setup`], and
    /// starting it again would end the same way; one the infrastructure ended (the node
    /// shutting down, the host out of memory) or that still answers is worth another
    /// try.
    async fn setup_death(
        &self,
        job_id: &str,
        purpose: Purpose,
        generation: i64,
        sandbox: &Sandbox,
        which: String,
        error: SandboxError,
    ) -> SandboxError {
        if sandbox.client.ping().await.is_ok() {
            return error;
        }
        match self.cause_of_death(job_id, purpose, generation).await {
            Death::Workload => {
                tracing::warn!(job_id, which, "the task's setup ended its own sandbox");
                SandboxError::Setup(format!(
                    "{which} ended its own sandbox ({error}); a setup command must leave the sandbox running"
                ))
            }
            Death::Infrastructure(cause) => {
                SandboxError::Unavailable(format!("{which} did not finish: {error}: {cause}"))
            }
        }
    }

    /// Records a RUN sandbox in the store, leased to this node, so a later stage can
    /// find it and the reaper of another node leaves it alone while the lease holds.
    async fn record(
        &self,
        job_id: &str,
        backend: RuntimeKind,
        dir: &Path,
        label: &Label,
    ) -> Result<(), SandboxError> {
        let now = EpochMs::now();
        self.records
            .put_sandbox(&SandboxRecord {
                job_id: job_id.to_string(),
                node: self.node.clone(),
                runtime: backend.as_str().to_string(),
                dir: dir.display().to_string(),
                socket: label.socket.display().to_string(),
                lease_until: now.after(Duration::from_millis(self.settings.lease_ms)),
                created_at: now,
            })
            .await
            .map_err(|e| SandboxError::Unavailable(format!("cannot record the sandbox: {e}")))?;
        Ok(())
    }

    /// Connects to the job's RUN sandbox of `generation`. [`SandboxError::Unavailable`]
    /// means the database could not be asked; any other error, that the sandbox is gone
    /// (or is not the one this stage entry's INIT made).
    pub async fn connect(
        &self,
        job_id: &str,
        generation: i64,
    ) -> Result<SandboxClient, SandboxError> {
        let socket = match self.records.sandbox(job_id).await {
            Ok(Some(rec)) if rec.node == self.node => PathBuf::from(rec.socket),
            Ok(Some(rec)) => {
                return Err(SandboxError::Config(format!(
                    "the sandbox of job {job_id} lives on node {}, not {}",
                    rec.node, self.node
                )));
            }
            Ok(None) => return Err(SandboxError::Closed),
            Err(e) => {
                return Err(SandboxError::Unavailable(format!(
                    "cannot look the sandbox up: {e}"
                )));
            }
        };
        let label = Label::read(&self.dir(job_id, Purpose::Run, generation))?;
        if label.as_ref().and_then(|l| l.generation) != Some(generation) {
            return Err(SandboxError::Config(format!(
                "the sandbox of job {job_id} is not the one its INIT made (generation {generation})"
            )));
        }
        let mut client = SandboxClient::connect(&socket).await?;
        client.watch(label.as_ref().and_then(Label::server));
        client.ping().await?;
        Ok(client)
    }

    /// Stops and forgets a job's sandbox of `purpose`; quiet if there is none. With a
    /// `generation`, only a sandbox of that generation is touched; without one, the
    /// job's RUN sandbox whatever its generation (an EVAL sandbox is always named by its
    /// claim's generation: without one there is none to find, and the reaper removes
    /// those a crash left behind).
    pub async fn remove(&self, job_id: &str, purpose: Purpose, generation: Option<i64>) {
        let dir = match (purpose, generation) {
            (_, Some(g)) => {
                let dir = self.dir(job_id, purpose, g);
                match Label::read(&dir) {
                    Ok(Some(l)) if l.generation == Some(g) => dir,
                    // Someone else's (a newer attempt's), or nothing there.
                    _ => return,
                }
            }
            (Purpose::Run, None) => self.dir(job_id, purpose, 0),
            (Purpose::Eval, None) => return,
        };
        self.discard(job_id, purpose, &dir).await;
    }

    /// Stops the sandbox in `dir` and removes the directory; a RUN sandbox's record goes
    /// too.
    async fn discard(&self, job_id: &str, purpose: Purpose, dir: &Path) {
        if let Err(e) = self.runtimes.stop(dir).await {
            tracing::warn!(job_id, dir = %dir.display(), error = %e, "cannot stop the sandbox");
        }
        if purpose == Purpose::Run
            && let Err(e) = self.records.delete_sandbox(job_id).await
        {
            tracing::warn!(job_id, error = %e, "cannot forget the sandbox");
        }
    }

    /// One reaper pass. With `at_start` (a worker starting after a crash, say) it also
    /// removes sandboxes whose root process is gone.
    pub async fn reap(&self, at_start: bool) -> Result<Reaped, crate::store::StoreError> {
        let now = EpochMs::now();
        // Renew first: this node is alive and looks after its sandboxes, so none of them
        // is removed for a lease that lapsed while the database was unreachable.
        let mut reaped = Reaped {
            renewed: self
                .records
                .renew_sandboxes(
                    &self.node,
                    now.after(Duration::from_millis(self.settings.lease_ms)),
                )
                .await?,
            ..Reaped::default()
        };
        for rec in self.records.sandboxes_to_reap(&self.node).await? {
            let reason = "job ended";
            tracing::info!(job_id = %rec.job_id, reason, "reaping sandbox");
            metrics::counter!(crate::metrics::SANDBOXES_REAPED, "reason" => reason).increment(1);
            self.remove(&rec.job_id, Purpose::Run, None).await;
            reaped.removed.push(rec.job_id);
        }
        let recorded: std::collections::HashSet<String> = self
            .records
            .sandboxes_of_node(&self.node)
            .await?
            .into_iter()
            .map(|r| r.job_id)
            .collect();
        for dir in Label::dirs(&self.root) {
            if let Some(reason) = self.orphan_reason(&dir, &recorded, at_start).await? {
                let name = dir
                    .file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into_owned();
                tracing::info!(sandbox = %name, reason, "reaping sandbox");
                metrics::counter!(crate::metrics::SANDBOXES_REAPED, "reason" => reason)
                    .increment(1);
                if let Err(e) = self.runtimes.stop(&dir).await {
                    tracing::warn!(dir = %dir.display(), error = %e, "cannot stop the sandbox");
                }
                if recorded.contains(&name) {
                    let _ = self.records.delete_sandbox(&name).await;
                }
                reaped.removed.push(name);
            }
        }
        Ok(reaped)
    }

    /// Why a sandbox directory must go, if it must.
    async fn orphan_reason(
        &self,
        dir: &Path,
        recorded: &std::collections::HashSet<String>,
        at_start: bool,
    ) -> Result<Option<&'static str>, crate::store::StoreError> {
        let label = match Label::read(dir) {
            Ok(Some(l)) => l,
            // No label yet: being created right now, or left by a crash before the start.
            Ok(None) | Err(_) => {
                let age = std::fs::metadata(dir)
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| t.elapsed().ok())
                    .unwrap_or_default();
                return Ok((age > Duration::from_secs(120)).then_some("no label"));
            }
        };
        if label.node != self.node {
            return Ok(None);
        }
        let is_eval = is_eval_dir(dir);
        // A label without a process is a sandbox still being prepared.
        let started = label.pid.is_some();
        let alive = label.live_pid().is_some() || label.live_ns_init().is_some();
        if at_start && started && !alive {
            return Ok(Some("its processes are gone"));
        }
        let young = EpochMs(label.created_ms).until(EpochMs::now()) < Duration::from_secs(10);
        if !is_eval
            && !recorded.contains(&label.job_id)
            && !young
            // Recorded since this pass listed the records?
            && self.records.sandbox(&label.job_id).await?.is_none()
        {
            return Ok(Some("not recorded in the database"));
        }
        if is_eval {
            let ended = match self.jobs.job(&label.job_id).await? {
                None => true,
                Some(job) => job.status.is_terminal(),
            };
            if ended {
                return Ok(Some("job ended"));
            }
        }
        Ok(None)
    }

    /// Runs the reaper until `shutdown`: one pass at once (with `at_start`), then one
    /// every `sandbox.reaper_interval_ms`.
    pub async fn run_reaper(self: Arc<Self>, shutdown: CancellationToken) {
        let every = Duration::from_millis(self.settings.reaper_interval_ms);
        let mut at_start = true;
        loop {
            match self.reap(at_start).await {
                Ok(r) if !r.removed.is_empty() => {
                    tracing::info!(removed = r.removed.len(), "reaper removed sandboxes")
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "sandbox reaper pass failed"),
            }
            at_start = false;
            tokio::select! {
                _ = shutdown.cancelled() => {
                    self.set_stopping();
                    // No mount, loop device or image of the pool outlives the node.
                    self.pool.close().await;
                    return;
                }
                _ = tokio::time::sleep(every) => {}
            }
        }
    }
}

/// How the setup commands ended, when not all of them succeeded.
enum SetupEnd {
    /// A command failed (its error names it and has its output), or the sandbox could
    /// not be asked to run one.
    Failed(SandboxError),
    /// The sandbox itself failed while command `which` ran (it may have ended it).
    SandboxFailed {
        /// "setup command N (`...`)".
        which: String,
        /// What the call said.
        error: SandboxError,
    },
}

/// Runs the spec's setup commands in order in the new sandbox; the first that fails
/// (exits non-zero or times out) is the error, naming the command and its output.
async fn run_setup(sandbox: &Sandbox, spec: &SandboxSpec) -> Result<(), SetupEnd> {
    for (i, command) in spec.setup.iter().enumerate() {
        let r = sandbox
            .client
            .bash(command, Some(Duration::from_millis(spec.setup_timeout_ms)))
            .await;
        match r {
            Ok(r) if r.exit_code == Some(0) && !r.timed_out => {}
            Ok(r) => {
                return Err(SetupEnd::Failed(SandboxError::Setup(format!(
                    "setup command {} (`{command}`) failed with exit code {}{}:\n{}",
                    i + 1,
                    r.exit_code
                        .map(|c| c.to_string())
                        .unwrap_or_else(|| "none".into()),
                    if r.timed_out { " after timing out" } else { "" },
                    r.output
                ))));
            }
            // The sandbox itself failed (not the command): the caller asks why.
            Err(error) => {
                return Err(SetupEnd::SandboxFailed {
                    which: format!("setup command {} (`{command}`)", i + 1),
                    error,
                });
            }
        }
    }
    Ok(())
}

/// A job's RUN sandbox has one directory whatever the attempt. A stale attempt (its lease
/// lapsed, and a newer attempt took the stage over and made its own sandbox) must not
/// replace the newer one's: the job's RUN would find its sandbox gone. `Err` when `dir`
/// holds a sandbox of a newer generation than `generation`.
fn refuse_if_superseded(
    job_id: &str,
    purpose: Purpose,
    generation: i64,
    dir: &Path,
) -> Result<(), SandboxError> {
    if purpose == Purpose::Run
        && let Ok(Some(there)) = Label::read(dir)
        && let Some(newer) = there.generation.filter(|g| *g > generation)
    {
        return Err(SandboxError::Unavailable(format!(
            "job {job_id}'s sandbox belongs to a newer attempt (generation {newer}) than this one ({generation}): this attempt is stale and leaves it"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_names_ending_in_a_generation_are_eval_sandboxes() {
        for (name, eval) in [
            ("0193-ab-eval-7", true),
            ("0193-ab-eval-12", true),
            ("0193-ab", false),
            ("0193-ab-eval", false),
            ("0193-ab-eval-", false),
            ("0193-ab-eval-x1", false),
        ] {
            assert_eq!(
                is_eval_dir(Path::new("/r").join(name).as_path()),
                eval,
                "{name}"
            );
        }
    }
}
