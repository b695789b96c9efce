//! Starting the pieces in one process: the gateway, workers, and `rollout up`.
//!
//! The binaries are thin: they load settings, call [`connect`], and start a gateway
//! ([`run_gateway`]) or workers ([`run_workers`]). `rollout up` ([`start_up`]) does all of
//! it on one machine — starting a private `nats-server` when none answers at the
//! configured URL — which is the quickest way to try the service and what the README's
//! first command runs; the CLI says what runs, and submits and follows a batch, as any
//! other client of the gateway would.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::config::Settings;
use crate::domain::Stage;
use crate::gateway::{self, AppState};
use crate::natsd::{NatsServer, NatsdError};
use crate::queue::{Queue, QueueError};
use crate::stage::Registry;
use crate::store::{self, StoreError};
use crate::supervise::{Essential, TaskFailed, spawn_essential};
use crate::worker::{Worker, WorkerError, WorkerSettings};

/// A failure to start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The settings.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// The database.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// NATS.
    #[error(transparent)]
    Queue(#[from] QueueError),
    /// The local nats-server.
    #[error(transparent)]
    Natsd(#[from] NatsdError),
    /// A worker.
    #[error(transparent)]
    Worker(#[from] WorkerError),
    /// The node's sandboxes cannot work as configured (their root).
    #[error(transparent)]
    Sandbox(#[from] crate::sandbox::SandboxError),
    /// A background task (reconciler, prober, reaper, a watcher) stopped early.
    #[error(transparent)]
    Task(#[from] TaskFailed),
    /// Binding the listen address, or another I/O problem.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The error.
        source: std::io::Error,
    },
}

/// What a connected process holds: the database, the queue, the task kinds and the
/// node's sandboxes, with the settings they were made from. Cheap to clone. The gateway
/// and the workers each take the parts they use.
#[derive(Clone)]
pub struct Services {
    /// Job state.
    pub store: Arc<dyn crate::store::Store>,
    /// The queue.
    pub queue: Queue,
    /// Known task kinds.
    pub kinds: Registry,
    /// This node's sandboxes (for the reaper and the gateway's report; the kinds hold
    /// their own handle).
    pub sandboxes: Arc<crate::sandbox::NodeSandboxes>,
    /// Settings.
    pub settings: Arc<Settings>,
    /// The current policy version, which the agent kind tags model tokens with; the
    /// RUN workers keep it current ([`run_workers`]).
    pub policy: crate::policy::PolicyWatch,
}

/// How often a RUN process re-reads the current policy version, in case it missed the
/// announcement's broadcast.
const POLICY_REFRESH: std::time::Duration = std::time::Duration::from_secs(5);

/// Connects to the database (migrating it) and NATS (provisioning streams).
pub async fn connect(
    settings: Arc<Settings>,
    name: &str,
    wait_for_nats: bool,
) -> Result<Services, StartError> {
    let url = settings.database_url();
    tracing::info!(
        database = %crate::config::redact_url(&url),
        nats = %crate::config::redact_url(&settings.nats.url),
        "connecting"
    );
    let store = store::connect(&url, settings.database.max_connections).await?;
    crate::backends::pool::register_configured(store.as_ref(), &settings.backends).await?;
    let queue = Queue::connect(&settings, name, wait_for_nats).await?;
    let server_bin = settings.sandbox_server_bin();
    if !server_bin.is_file() {
        // Jobs without a sandbox still run; each sandbox start will fail until it is there.
        tracing::warn!(
            path = %server_bin.display(),
            "the sandbox server binary is not there: build it beside this one (`cargo build \
             --bins` at the workspace's top, or `cargo build -p rollout-sandbox`) or set \
             sandbox.server_bin"
        );
    }
    let sandboxes = Arc::new(crate::sandbox::NodeSandboxes::new(
        &settings.sandbox,
        &settings.node.name,
        settings.sandbox_root(),
        server_bin,
        store.clone(),
        store.clone(),
    ));
    sandboxes.log_report();
    let policy = crate::policy::PolicyWatch::new(store.policy_state().await?);
    let kinds = crate::kinds::builtin(
        sandboxes.clone(),
        store.clone(),
        settings.clone(),
        policy.clone(),
    );
    Ok(Services {
        store,
        queue,
        kinds,
        sandboxes,
        settings,
        policy,
    })
}

/// Runs the gateway (and, if enabled, the reconciler) on `listener` until `shutdown`.
pub async fn run_gateway(
    deps: Services,
    listener: tokio::net::TcpListener,
    shutdown: CancellationToken,
) -> Result<(), StartError> {
    let (tx, rx) = tokio::sync::watch::channel(0u64);
    let mut essentials = vec![spawn_essential(
        "result watcher",
        &shutdown,
        gateway::watch_results(deps.queue.clone(), tx, shutdown.clone()),
    )];
    if deps.settings.reconciler.enabled {
        essentials.push(spawn_essential(
            "backend health prober",
            &shutdown,
            crate::backends::pool::run_health_prober(
                deps.store.clone(),
                deps.settings.pool.clone(),
                shutdown.clone(),
            ),
        ));
        essentials.push(spawn_essential(
            "reconciler",
            &shutdown,
            crate::reconciler::run(
                deps.store.clone(),
                deps.queue.clone(),
                crate::reconciler::SweepSettings::from_settings(&deps.settings),
                shutdown.clone(),
            ),
        ));
    }
    let state = AppState {
        sandbox: deps.sandboxes.report(),
        store: deps.store,
        queue: deps.queue,
        kinds: deps.kinds,
        settings: deps.settings,
        results_signal: rx,
        shutdown: shutdown.clone(),
        metrics: crate::metrics::install(),
    };
    // Subscribed before the gateway listens: once it answers HTTP, it answers NATS.
    for endpoint in [
        gateway::nats::Endpoint::Jobs,
        gateway::nats::Endpoint::Batches,
        gateway::nats::Endpoint::Policy,
        gateway::nats::Endpoint::PolicyResume,
    ] {
        let sub = endpoint.subscribe(&state.queue).await?;
        essentials.push(spawn_essential(
            endpoint.listener(),
            &shutdown,
            gateway::nats::serve_submits(state.clone(), endpoint, sub, shutdown.clone()),
        ));
    }
    let wakes = state.queue.subscribe_wakes().await?;
    essentials.push(spawn_essential(
        "sampling batch driver",
        &shutdown,
        crate::sampling::Driver::new(
            state.store.clone(),
            state.store.clone(),
            state.store.clone(),
            state.queue.clone(),
        )
        .serve_wakes(Some(wakes), shutdown.clone()),
    ));
    let addr = listener.local_addr().ok();
    tracing::info!(?addr, "gateway listening");
    let served = gateway::serve(listener, gateway::router(state), shutdown.clone()).await;
    shutdown.cancel();
    served.map_err(|source| StartError::Io {
        context: "gateway failed".into(),
        source,
    })?;
    finish_all(essentials).await
}

/// Waits for every essential task (they end at shutdown); the first that stopped early
/// is the error.
async fn finish_all(essentials: Vec<Essential>) -> Result<(), StartError> {
    let mut first = Ok(());
    for task in essentials {
        if let Err(e) = task.finish().await
            && first.is_ok()
        {
            first = Err(StartError::Task(e));
        }
    }
    first
}

/// Binds the gateway's listen address with an error that says what to do.
pub async fn bind(addr: &str) -> Result<tokio::net::TcpListener, StartError> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Io {
            context: format!(
                "cannot listen on {addr} (is another gateway running? set ROLLOUT__GATEWAY__LISTEN)"
            ),
            source,
        })
}

/// Runs `count` workers of `stage` in this process until `shutdown`, then drains them.
pub async fn run_workers(
    deps: Services,
    stage: Stage,
    count: usize,
    shutdown: CancellationToken,
) -> Result<(), StartError> {
    let mut set = JoinSet::new();
    let settings = WorkerSettings::from_settings(&deps.settings);
    // RUN tags model tokens with the current policy version: kept current until the
    // last stage has ended (past `shutdown`, through the grace period).
    let following = CancellationToken::new();
    let follower = (stage == Stage::Run).then(|| {
        spawn_essential(
            "policy version follower",
            &shutdown,
            deps.policy.clone().follow(
                deps.store.clone(),
                deps.queue.clone(),
                POLICY_REFRESH,
                following.clone(),
            ),
        )
    });
    for _ in 0..count {
        let worker = Worker::new(
            stage,
            deps.store.clone(),
            deps.store.clone(),
            deps.store.clone(),
            Arc::new(deps.queue.clone()),
            deps.kinds.clone(),
            settings.clone(),
        );
        set.spawn(worker.run(shutdown.clone()));
    }
    let mut panicked = None;
    while let Some(r) = set.join_next().await {
        match r {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e.into()),
            Err(e) => {
                // The others drain and stop too: a process with a dead worker would
                // look alive while taking less work than it was sized for.
                tracing::error!(error = %e, "worker task panicked; shutting the process down");
                shutdown.cancel();
                panicked.get_or_insert(TaskFailed {
                    task: "worker",
                    how: format!("panicked: {e}"),
                });
            }
        }
    }
    following.cancel();
    if let Some(follower) = follower {
        follower.finish().await?;
    }
    panicked.map_or(Ok(()), |e| Err(e.into()))
}

/// Starts a private nats-server under the state directory if nothing answers at the
/// configured URL (a single local one: a list of URLs names a cluster, which is used
/// as it is), returning it (keep it alive) and updating `settings.nats`: its URL,
/// and a fresh random token the server requires, so processes on the machine that are
/// not part of this one (sandboxed agent code among them) cannot reach the queue. A
/// server that already answers is used with the configured credentials.
pub fn ensure_nats(settings: &mut Settings) -> Result<Option<NatsServer>, StartError> {
    // Several URLs name a cluster run by someone else: never stand in for it with a
    // private single server.
    let urls = settings.nats.urls();
    let [url] = urls.as_slice() else {
        return Ok(None);
    };
    let Some(addr) = crate::natsd::local_addr_of(url) else {
        return Ok(None);
    };
    if crate::natsd::answers(addr) {
        tracing::info!(url = %settings.nats.url, "using the NATS server already running");
        return Ok(None);
    }
    let dir = settings.state_dir.join("nats");
    let token = uuid::Uuid::new_v4().simple().to_string();
    let server = NatsServer::start_with_token(&dir, addr, &token)?;
    tracing::info!(url = %server.url(), pid = server.pid(), dir = %dir.display(), "started nats-server (token required)");
    settings.nats.url = server.url();
    settings.nats.user.clear();
    settings.nats.password.clear();
    settings.nats.creds_file = std::path::PathBuf::new();
    settings.nats.token = token;
    Ok(Some(server))
}

/// Everything of `rollout up`, running: NATS (started if needed), the database, the
/// gateway and workers of every stage in one process. What to say about it and what to
/// submit to it are the caller's (the CLI's `up`); this only starts and stops it.
pub struct Up {
    /// Where the gateway listens.
    pub addr: SocketAddr,
    /// The settings it runs with (the started nats-server's URL and token included).
    pub settings: Arc<Settings>,
    deps: Services,
    tasks: JoinSet<Result<(), StartError>>,
    reaper: Essential,
    shutdown: CancellationToken,
    /// Kept alive while `up` runs; dropped (stopped) last.
    _nats: Option<NatsServer>,
}

/// Starts `rollout up` with `workers` workers per stage; it runs until `shutdown` (or
/// one of its parts fails, which cancels `shutdown` so the rest stop too), and
/// [`Up::finish`] then waits for it to stop.
pub async fn start_up(
    mut settings: Settings,
    workers: usize,
    shutdown: CancellationToken,
) -> Result<Up, StartError> {
    std::fs::create_dir_all(&settings.state_dir).map_err(|source| StartError::Io {
        context: format!(
            "cannot create state directory {}",
            settings.state_dir.display()
        ),
        source,
    })?;
    let nats = ensure_nats(&mut settings)?;
    crate::sandbox::root::settle(&mut settings)?;
    let settings = Arc::new(settings);
    let deps = connect(settings.clone(), "rollout-up", false).await?;
    // Nothing but this process uses its sandboxes: they end with it, however it ends.
    deps.sandboxes.end_with_this_process();
    let listener = bind(&settings.gateway.listen).await?;
    let addr: SocketAddr = listener.local_addr().map_err(|source| StartError::Io {
        context: "listener address".into(),
        source,
    })?;
    let mut tasks = JoinSet::new();
    tasks.spawn(run_gateway(deps.clone(), listener, shutdown.clone()));
    let reaper = spawn_essential(
        "sandbox reaper",
        &shutdown,
        deps.sandboxes.clone().run_reaper(shutdown.clone()),
    );
    for stage in Stage::ALL {
        tasks.spawn(run_workers(deps.clone(), stage, workers, shutdown.clone()));
    }
    Ok(Up {
        addr,
        settings,
        deps,
        tasks,
        reaper,
        shutdown,
        _nats: nats,
    })
}

impl Up {
    /// Waits until everything has stopped (after `shutdown`, or after a part failed),
    /// then removes this process's sandboxes; returns the first part's error. Nothing of
    /// this process's outlives it: every worker has handed its work back before the
    /// sandboxes go, with their mounts and loop devices, and the nats-server child goes
    /// when this returns.
    pub async fn finish(self) -> Result<(), StartError> {
        let failed = join_all(self.tasks, &self.shutdown).await;
        let reaped = self.reaper.finish().await;
        self.deps.sandboxes.remove_all().await;
        if let Some(e) = failed {
            return Err(e);
        }
        reaped?;
        Ok(())
    }
}

/// Waits for every task of `rollout up` (the gateway, the workers), cancelling
/// `shutdown` when one fails or panics so the others stop too; returns the first error.
/// Never returns early: what runs must have stopped before the sandboxes are removed.
async fn join_all(
    mut tasks: JoinSet<Result<(), StartError>>,
    shutdown: &CancellationToken,
) -> Option<StartError> {
    let mut failed = None;
    while let Some(r) = tasks.join_next().await {
        match r {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                shutdown.cancel();
                failed.get_or_insert(e);
            }
            Err(e) => {
                tracing::error!(error = %e, "task panicked");
                shutdown.cancel();
            }
        }
    }
    failed
}

/// Command line of the three worker binaries.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    version,
    about = "Runs one stage (the one in the binary's name) of the rollout service's jobs; \
             stop with SIGTERM or Ctrl-C",
    long_about = None
)]
pub struct WorkerArgs {
    /// Settings file (TOML); `ROLLOUT__…` environment variables override it.
    #[arg(long, env = "ROLLOUT_CONFIG")]
    pub config: Option<std::path::PathBuf>,
    /// Serve this process's Prometheus metrics at http://ADDR/metrics.
    #[arg(long)]
    pub metrics_listen: Option<String>,
    /// Log lines as `text` or `json` (default: the `log.json` setting).
    #[arg(long, value_enum)]
    pub log_format: Option<crate::telemetry::LogFormat>,
}

/// The whole life of a worker process: settings, connections, work until `shutdown`
/// (the process's SIGTERM/SIGINT), drain. A worker binary runs its one stage; `rollout
/// node` runs several (a node's INIT and RUN workers must share its sandboxes: one
/// process for them is one signal to hand back, one reaper, one set of connections).
/// Job concurrency comes from `stages.<stage>.concurrency`.
pub async fn worker_process(
    stages: &[Stage],
    args: WorkerArgs,
    shutdown: CancellationToken,
) -> Result<(), StartError> {
    let mut settings = Settings::load(args.config.as_deref())?;
    if let Some(f) = args.log_format {
        f.apply(&mut settings.log);
    }
    crate::telemetry::init(&settings.log);
    // Before anything connects: a sandbox root whose sockets cannot fit is found now,
    // not at the first sandboxed job.
    crate::sandbox::root::settle(&mut settings)?;
    let handle = crate::metrics::install();
    let mut essentials = Vec::new();
    if let Some(addr) = &args.metrics_listen {
        let listener = bind(addr).await?;
        let app = axum::Router::new().route(
            "/metrics",
            axum::routing::get(move || {
                let h = handle.clone();
                async move { h.render() }
            }),
        );
        let stop = shutdown.clone();
        essentials.push(spawn_essential("metrics server", &shutdown, async move {
            if let Err(e) = axum::serve(listener, app)
                .with_graceful_shutdown(stop.cancelled_owned())
                .await
            {
                tracing::error!(error = %e, "the metrics server failed");
            }
        }));
    }
    let names: Vec<&str> = stages.iter().map(|s| s.as_str()).collect();
    let name = format!("rollout-{}-worker", names.join("+"));
    let deps = connect(Arc::new(settings), &name, true).await?;
    // A process running the node's INIT and RUN owns its RUN sandboxes: nothing else
    // uses them, so they end with it however it ends (a restarted node sends their jobs
    // back to INIT), and at a stop it removes them (below).
    let owns_sandboxes = stages.contains(&Stage::Init) && stages.contains(&Stage::Run);
    if owns_sandboxes {
        deps.sandboxes.end_with_this_process();
    }
    // Every worker looks after the sandboxes of its node (EVAL's fresh ones included).
    essentials.push(spawn_essential(
        "sandbox reaper",
        &shutdown,
        deps.sandboxes.clone().run_reaper(shutdown.clone()),
    ));
    // Each stage's workers until shutdown; one that fails stops the others (they drain).
    let runs = stages.iter().map(|&stage| {
        let (deps, shutdown) = (deps.clone(), shutdown.clone());
        async move {
            let r = run_workers(deps, stage, 1, shutdown.clone()).await;
            if r.is_err() {
                shutdown.cancel();
            }
            r
        }
    });
    let worked = futures::future::join_all(runs)
        .await
        .into_iter()
        .find(Result::is_err)
        .unwrap_or(Ok(()));
    shutdown.cancel();
    let finished = finish_all(essentials).await;
    // Stopped, the owner of the node's sandboxes leaves none behind, nor their mounts
    // and loop devices.
    if owns_sandboxes {
        deps.sandboxes.remove_all().await;
    }
    if let Err(e) = deps.queue.client().drain().await {
        tracing::warn!(error = %e, "NATS drain failed");
    }
    worked?;
    finished
}
