//! Test fixtures: the test binary's shared NATS server (or the one
//! `ROLLOUT_TEST_NATS_URL` names) with a subject prefix of the test's own, a fresh
//! database per test copied from a migrated template (SQLite in a temp dir, or Postgres
//! on the server `ROLLOUT_TEST_DATABASE_URL` names; see `rollout_test_support`), an
//! in-process gateway, and workers in-process or as real processes.

use crate::eventually::{eventually, holds};
pub use rollout_test_support::database::TestDb;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use rollout::client::Client;
use rollout::config::Settings;
use rollout::domain::{Job, JobResult, Stage, Status, Task};
use rollout::natsd::NatsServer;
use rollout::wiring::Services;
use tokio_util::sync::CancellationToken;

/// Everything one test needs. Dropping it stops the in-process services, kills spawned
/// worker processes and the private NATS server, and drops a Postgres test database.
pub struct TestEnv {
    pub deps: Services,
    pub client: Client,
    pub base: String,
    pub shutdown: CancellationToken,
    /// Stops the current gateway only (see [`TestEnv::restart_gateway`]).
    gateway_stop: CancellationToken,
    pub dir: tempfile::TempDir,
    config_path: std::path::PathBuf,
    children: Vec<Child>,
    /// Dropped after the processes that use it are gone (fields drop after `drop`).
    _db: TestDb,
    _nats: Option<NatsServer>,
}

pub fn init_logging() {
    if std::env::var_os("TEST_LOG").is_some() {
        rollout::telemetry::init(&rollout::config::LogSettings {
            level: "info".into(),
            json: false,
        });
    }
}

impl TestEnv {
    /// Starts NATS (unless given), the database and the gateway. `tweak` adjusts the
    /// settings first (timeouts, limits); workers are started separately.
    pub async fn start(tweak: impl FnOnce(&mut Settings)) -> TestEnv {
        Self::start_with_nats(None, tweak).await
    }

    /// [`TestEnv::start`] with a private nats-server listening on `nats_listen`: for
    /// tests whose workers reach NATS from other network namespaces. Without it, the
    /// shared server (`rollout_test_support::nats`).
    pub async fn start_with_nats(
        nats_listen: Option<std::net::SocketAddr>,
        tweak: impl FnOnce(&mut Settings),
    ) -> TestEnv {
        init_logging();
        let dir = tempfile::tempdir().expect("temp dir");
        let (nats, nats_url) = match nats_listen {
            None => (None, rollout_test_support::nats::shared_url()),
            Some(listen) => {
                let server = NatsServer::start(&dir.path().join("nats"), listen)
                    .expect("start nats-server (is it installed? see README)");
                let url = server.url();
                (Some(server), url)
            }
        };
        Self::start_inner(dir, nats, nats_url, false, tweak).await
    }

    /// [`TestEnv::start`] against NATS servers the test runs itself (a cluster):
    /// `nats_url` may list several. Connecting waits until the servers accept the
    /// streams (a young cluster has no JetStream leader yet).
    pub async fn start_on_nats(nats_url: String, tweak: impl FnOnce(&mut Settings)) -> TestEnv {
        init_logging();
        let dir = tempfile::tempdir().expect("temp dir");
        Self::start_inner(dir, None, nats_url, true, tweak).await
    }

    async fn start_inner(
        dir: tempfile::TempDir,
        nats: Option<NatsServer>,
        nats_url: String,
        wait_for_nats: bool,
        tweak: impl FnOnce(&mut Settings),
    ) -> TestEnv {
        let db = TestDb::new(dir.path()).await;
        let db_url = db.url.clone();
        let mut settings = Settings::default();
        settings.nats.url = nats_url;
        settings.nats.prefix = rollout_test_support::nats::unique_prefix();
        settings.database.url = db_url;
        settings.state_dir = dir.path().join("state");
        settings.node.name = "test-node".into();
        settings.gateway.listen = "127.0.0.1:0".into();
        settings.queue.ack_wait_ms = 2_000;
        settings.queue.nak_delay_ms = 50;
        settings.queue.nak_delay_max_ms = 500;
        settings.stages.grace_ms = 2_000;
        settings.reconciler.interval_ms = 500;
        settings.reconciler.stale_after_ms = 5_000;
        for s in [
            &mut settings.stages.init,
            &mut settings.stages.run,
            &mut settings.stages.eval,
        ] {
            s.timeout_ms = 60_000;
            s.concurrency = 32;
        }
        tweak(&mut settings);
        let config_path = dir.path().join("rollout.toml");
        std::fs::write(
            &config_path,
            toml::to_string(&settings).expect("settings to TOML"),
        )
        .expect("write config");
        let deps = rollout::wiring::connect(Arc::new(settings.clone()), "test", wait_for_nats)
            .await
            .expect("connect");
        // The test's process is its node, as `rollout up`'s is: the sandboxes its
        // in-process workers start end with it however it ends, so one a worker was
        // still starting when the teardown swept the node cannot outlive the test.
        deps.sandboxes.end_with_this_process();
        let shutdown = CancellationToken::new();
        let (base, gateway_stop) = spawn_gateway(&deps, &shutdown).await;
        TestEnv {
            client: Client::new(&base).with_token(Some(settings.gateway.token.clone())),
            base,
            gateway_stop,

            deps,
            shutdown,
            dir,
            config_path,
            children: Vec::new(),
            _db: db,
            _nats: nats,
        }
    }

    /// Stops the gateway (its HTTP server, NATS listeners, batch driver and
    /// reconciler) and starts a fresh one on a new port, as a restarted gateway process
    /// would come back: everything it knows is in the database.
    pub async fn restart_gateway(&mut self) {
        self.gateway_stop.cancel();
        let (base, stop) = spawn_gateway(&self.deps, &self.shutdown).await;
        self.client = Client::new(&base).with_token(Some(self.deps.settings.gateway.token.clone()));
        self.base = base;
        self.gateway_stop = stop;
    }

    /// Starts another gateway beside the first (a second gateway process); returns its
    /// base URL. It stops with the environment.
    pub async fn extra_gateway(&self) -> String {
        spawn_gateway(&self.deps, &self.shutdown).await.0
    }

    /// Starts `count` in-process workers of each stage.
    pub fn workers_in_process(&self, count: usize) {
        for stage in Stage::ALL {
            self.stage_workers_in_process(stage, count);
        }
    }

    /// Starts `count` in-process workers of one stage, stopped by `stop`.
    pub fn stage_workers_with(&self, stage: Stage, count: usize, stop: CancellationToken) {
        tokio::spawn(rollout::wiring::run_workers(
            self.deps.clone(),
            stage,
            count,
            stop,
        ));
    }

    /// Starts `count` in-process workers of one stage.
    pub fn stage_workers_in_process(&self, stage: Stage, count: usize) {
        self.stage_workers_with(stage, count, self.shutdown.clone());
    }

    /// Starts a worker binary for `stage` as a child process; returns its index.
    pub fn spawn_worker_process(&mut self, stage: Stage) -> usize {
        let exe = match stage {
            Stage::Init => env!("CARGO_BIN_EXE_rollout-init-worker"),
            Stage::Run => env!("CARGO_BIN_EXE_rollout-run-worker"),
            Stage::Eval => env!("CARGO_BIN_EXE_rollout-eval-worker"),
        };
        let log = std::fs::File::create(
            self.dir
                .path()
                .join(format!("{stage}-{}.log", self.children.len())),
        )
        .unwrap();
        let child = Command::new(exe)
            .arg("--config")
            .arg(&self.config_path)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn worker");
        self.children.push(child);
        self.children.len() - 1
    }

    /// Sends `signal` to a spawned worker.
    pub fn signal_worker(&self, index: usize, signal: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.children[index].id()).unwrap());
        nix::sys::signal::kill(pid, signal).expect("signal worker");
    }

    /// Waits for a spawned worker to exit and returns its exit code.
    pub async fn wait_worker(&mut self, index: usize) -> Option<i32> {
        let child = &mut self.children[index];
        let what = format!("worker {index} exited");
        eventually(&what, Duration::from_secs(30), || {
            std::future::ready(match child.try_wait().unwrap() {
                Some(st) => Ok(st.code()),
                None => Err("still running"),
            })
        })
        .await
    }

    /// A worker process's log so far.
    pub fn worker_log(&self, stage: Stage, index: usize) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("{stage}-{index}.log")))
            .unwrap_or_default()
    }

    /// Submits tasks (panics on an API error).
    pub async fn submit(&self, tasks: &[Task], batch: &str) -> Vec<String> {
        self.client
            .submit(tasks, Some(batch))
            .await
            .expect("submit")
            .jobs
            .into_iter()
            .map(|j| j.id)
            .collect()
    }

    /// Collects results of `batch` with the long-poll API until `n` arrived (panics after
    /// `limit`).
    pub async fn wait_results(&self, batch: &str, n: usize, limit: Duration) -> Vec<JobResult> {
        match tokio::time::timeout(limit, self.client.collect_results(batch, n)).await {
            Ok(results) => results.expect("read results"),
            Err(_) => {
                let got = self.client.results(Some(batch), 0, 0).await.unwrap();
                panic!("only {} of {n} results after {limit:?}", got.results.len());
            }
        }
    }

    /// Polls a job until `pred` holds (panics after 30 s with the job as last seen).
    pub async fn wait_job(&self, id: &str, what: &str, pred: impl Fn(&Job) -> bool) -> Job {
        let what = format!("job {id} became {what}");
        let pred = &pred;
        eventually(&what, Duration::from_secs(30), || async move {
            let view = self.client.job(id).await.unwrap();
            if pred(&view.job) {
                Ok(view.job)
            } else {
                Err(format!(
                    "{:?} {:?} attempts {}; events: {:?}",
                    view.job.status, view.job.stage, view.job.attempts, view.events
                ))
            }
        })
        .await
    }

    /// Messages currently in one of the deployment's streams.
    pub async fn stream_len(&self, suffix: &str) -> u64 {
        self.deps.queue.stream_messages(suffix).await.unwrap()
    }

    /// Waits until the work stream is empty (every stage message acked).
    pub async fn wait_work_drained(&self) {
        eventually(
            "the work stream emptied",
            Duration::from_secs(30),
            || async {
                let n = self.stream_len("WORK").await;
                holds(n == 0, format!("{n} messages"))
            },
        )
        .await;
    }
}

impl Drop for TestEnv {
    /// Stops the environment as an operator stops a deployment: the in-process services
    /// are cancelled, worker processes get SIGTERM and are waited for (SIGKILL only when
    /// one outstays its grace), and then the sandboxes the test's node still has (the
    /// node being the test's own processes) are removed with their workspace mounts and
    /// loop devices, which would otherwise outlive the test's deleted directory.
    fn drop(&mut self) {
        self.shutdown.cancel();
        for c in &mut self.children {
            if let Ok(None) = c.try_wait()
                && let Ok(pid) = i32::try_from(c.id())
            {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGTERM,
                );
            }
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        for c in &mut self.children {
            while matches!(c.try_wait(), Ok(None)) && std::time::Instant::now() < deadline {
                #[allow(clippy::disallowed_methods, reason = "a test's teardown")]
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        remove_sandboxes(&self.deps.settings.sandbox_root());
    }
}

/// Ends every sandbox under `root` (its processes and cgroups, through its label) and
/// detaches what is mounted there, as a stopped node's workers do.
pub fn remove_sandboxes(root: &std::path::Path) {
    for dir in rollout::sandbox::Label::dirs(root) {
        if let Ok(Some(label)) = rollout::sandbox::Label::read(&dir) {
            label.kill();
        }
    }
    if let Err(e) = rollout::sandbox::quota::unmount_under(root) {
        eprintln!("cannot unmount what is left under {}: {e}", root.display());
    }
}

/// Sends `req` and returns the status and the JSON body (panics, naming `what`, when
/// the body is not JSON: the API answers JSON to everything, errors included).
pub async fn json_answer(req: reqwest::RequestBuilder, what: &str) -> (u16, serde_json::Value) {
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    let json = serde_json::from_str(&text)
        .unwrap_or_else(|_| panic!("{what}: the answer is not JSON ({status}): {text}"));
    (status, json)
}

/// Runs a gateway on a fresh port until `shutdown` or its own stop token fires.
async fn spawn_gateway(
    deps: &Services,
    shutdown: &CancellationToken,
) -> (String, CancellationToken) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let stop = shutdown.child_token();
    tokio::spawn(rollout::wiring::run_gateway(
        deps.clone(),
        listener,
        stop.clone(),
    ));
    (base, stop)
}

/// Runs one SQL statement on the test's own database, whichever it is.
pub async fn sql(env: &TestEnv, statement: &str) {
    use sqlx::Connection;
    let url = &env.deps.settings.database.url;
    let statement = sqlx::AssertSqlSafe(statement.to_string());
    if url.starts_with("postgres") {
        let mut c = sqlx::PgConnection::connect(url).await.unwrap();
        sqlx::query(statement).execute(&mut c).await.unwrap();
    } else {
        let mut c = sqlx::SqliteConnection::connect(url).await.unwrap();
        sqlx::query(statement).execute(&mut c).await.unwrap();
    }
}

/// A synthetic task from its spec.
/// Submits a `kind` task with each spec and checks it is refused with a 400 naming its
/// field (or saying its words).
pub async fn assert_specs_refused(env: &TestEnv, kind: &str, bad: &[(serde_json::Value, &str)]) {
    for (spec, field) in bad {
        let err = env
            .client
            .submit(&[Task::new(kind, spec.clone())], Some("bad"))
            .await
            .expect_err("refused");
        let text = err.to_string();
        assert!(text.contains("400") || text.contains("invalid"), "{text}");
        assert!(text.contains(field), "{spec}: {text}");
    }
}

pub fn synthetic(spec: serde_json::Value) -> Task {
    Task::new("synthetic", spec)
}

/// A synthetic job to write with the store directly, so that it is never published: a
/// hand-off lost as one would be by a process that died between commit and publish.
pub fn unpublished_synthetic(client_id: Option<String>) -> rollout::store::NewJob {
    rollout::store::NewJob {
        id: uuid::Uuid::now_v7().to_string(),
        kind: "synthetic".into(),
        client_id,
        group_id: None,
        task: serde_json::to_value(synthetic(serde_json::json!({}))).unwrap(),
    }
}

/// Asserts every result's status.
pub fn count_status(results: &[JobResult], status: Status) -> usize {
    results.iter().filter(|r| r.status == status).count()
}

/// Waits until `dir` (a job's sandbox directory) no longer exists; panics after
/// `within`, naming it.
pub async fn wait_gone(dir: &std::path::Path, within: Duration) {
    eventually("the directory was removed", within, || async move {
        holds(!dir.exists(), dir.display().to_string())
    })
    .await;
}

/// A `shell` task (`client_id` = `name`) whose RUN is two bash steps of `secs` seconds
/// each, then a check that passes: a job a worker holds long enough to be cancelled,
/// killed or handed back under it.
pub fn slow_shell_job(name: String, secs: u32) -> Task {
    let mut t = Task::new(
        "shell",
        serde_json::json!({
            "steps": [
                {"tool": "bash", "args": {"command": format!("sleep {secs}; echo step one")}},
                {"tool": "bash", "args": {"command": format!("sleep {secs}; echo step two")}},
            ],
            "check": {"command": "true"},
        }),
    );
    t.client_id = Some(name);
    t
}

/// How many processes of this machine have `needle` in their command line.
pub fn processes_running(needle: &str) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .filter(|c| {
            String::from_utf8_lossy(c)
                .replace('\0', " ")
                .contains(needle)
        })
        .count()
}

/// A JSON array of token IDs (a trajectory's `prompt_ids`, a server's `token_ids`).
pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list of token IDs: {v}"))
        .iter()
        .map(|x| u32::try_from(x.as_u64().unwrap()).unwrap())
        .collect()
}
