//! The typed settings tree, loaded with the `config` crate.
//!
//! Sources, later ones winning: built-in defaults, then a TOML file (`--config PATH` or
//! the `ROLLOUT_CONFIG` variable), then environment variables `ROLLOUT__SECTION__KEY`
//! (double underscores separate the levels, so snake_case keys survive, e.g.
//! `ROLLOUT__QUEUE__DELIVERY_LIMIT=5`). Every value is checked once at load time, and an
//! error names the key and what was expected, so a typo fails at start-up rather than as
//! a stuck job.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::domain::{Stage, is_subject_token};

/// A configuration problem a user can fix: names the key and what was expected.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file or environment could not be read or did not have the expected shape.
    #[error("configuration error: {0} (see rollout.example.toml for every key and its type)")]
    Load(#[from] config::ConfigError),
    /// A value parsed but is out of range or inconsistent.
    #[error("configuration error: `{key}` {problem}")]
    Invalid {
        /// The dotted key, e.g. `queue.delivery_limit`.
        key: String,
        /// What is wrong and what is expected.
        problem: String,
    },
}

/// All settings of every binary. Each binary reads the sections it needs.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    /// NATS connection and naming.
    pub nats: NatsSettings,
    /// Database connection.
    pub database: DatabaseSettings,
    /// HTTP gateway.
    pub gateway: GatewaySettings,
    /// This machine's identity.
    pub node: NodeSettings,
    /// Delivery and retry policy of the work queue.
    pub queue: QueueSettings,
    /// Per-stage worker settings.
    pub stages: StagesSettings,
    /// The hand-off repair loop.
    pub reconciler: ReconcilerSettings,
    /// Sandboxes on this node.
    pub sandbox: SandboxSettings,
    /// Inference backends registered from this file (`[[backends]]`); more can be added
    /// through the API.
    pub backends: Vec<crate::domain::backend::BackendSpec>,
    /// How jobs use the backend pool.
    pub pool: PoolSettings,
    /// Defaults of the `agent` task kind.
    pub agent: AgentSettings,
    /// Where `rollout up` keeps its SQLite file and NATS data.
    pub state_dir: PathBuf,
    /// Logging.
    pub log: LogSettings,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            nats: NatsSettings::default(),
            database: DatabaseSettings::default(),
            gateway: GatewaySettings::default(),
            node: NodeSettings::default(),
            queue: QueueSettings::default(),
            stages: StagesSettings::default(),
            reconciler: ReconcilerSettings::default(),
            sandbox: SandboxSettings::default(),
            backends: Vec::new(),
            pool: PoolSettings::default(),
            agent: AgentSettings::default(),
            state_dir: PathBuf::from(".rollout"),
            log: LogSettings::default(),
        }
    }
}

/// NATS settings.
///
/// At most one way of authenticating may be set: `user` with `password`, `token`, or
/// `creds_file`. All empty means no credentials, which only a server without
/// authorization accepts. `Debug` hides the password and the token so settings can be
/// logged.
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NatsSettings {
    /// Server URL, e.g. `nats://127.0.0.1:4222`.
    pub url: String,
    /// Prefix of every subject (`<prefix>.init`, …) and stream name. Two deployments (or
    /// two test runs) with different prefixes share a NATS server without interfering.
    pub prefix: String,
    /// User name for a server with user/password authorization; needs `password`.
    pub user: String,
    /// Password of `user`.
    pub password: String,
    /// Token for a server with token authorization (`nats-server --auth TOKEN`).
    pub token: String,
    /// A `.creds` file (user JWT and NKey seed) for a server with decentralized
    /// authorization; empty: none. Checked to exist at load time, so a wrong path fails
    /// at start-up rather than at the first reconnect.
    pub creds_file: PathBuf,
}

impl Default for NatsSettings {
    fn default() -> Self {
        Self {
            url: "nats://127.0.0.1:4222".into(),
            prefix: "rollout".into(),
            user: String::new(),
            password: String::new(),
            token: String::new(),
            creds_file: PathBuf::new(),
        }
    }
}

impl std::fmt::Debug for NatsSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsSettings")
            .field("url", &redact_url(&self.url))
            .field("prefix", &self.prefix)
            .field("user", &self.user)
            .field("password", &Redacted(&self.password))
            .field("token", &Redacted(&self.token))
            .field("creds_file", &self.creds_file)
            .finish()
    }
}

/// Shows a secret as `""` when unset and `<redacted>` otherwise, so `Debug` output
/// tells whether it is set without revealing it.
struct Redacted<'a>(&'a str);

impl std::fmt::Debug for Redacted<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0.is_empty() {
            f.write_str("\"\"")
        } else {
            f.write_str("<redacted>")
        }
    }
}

/// Database settings. `Debug` hides the password of a `postgres://` URL.
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DatabaseSettings {
    /// `sqlite://PATH` (the default is a file under the state directory) or
    /// `postgres://…`. Empty means the default SQLite file.
    pub url: String,
    /// Pool size.
    pub max_connections: u32,
}

impl Default for DatabaseSettings {
    fn default() -> Self {
        Self {
            url: String::new(),
            max_connections: 8,
        }
    }
}

impl std::fmt::Debug for DatabaseSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatabaseSettings")
            .field("url", &redact_url(&self.url))
            .field("max_connections", &self.max_connections)
            .finish()
    }
}

/// HTTP gateway settings. `Debug` hides the token.
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GatewaySettings {
    /// Listen address.
    pub listen: String,
    /// Bearer token every request but `GET /healthz` and `GET /openapi.json` must carry
    /// (`Authorization: Bearer <token>`); empty: no authentication. Required when
    /// `listen` is not a loopback address, since anything that can reach the port could
    /// otherwise submit and cancel jobs and change the backend pool. The CLI sends it
    /// too.
    pub token: String,
    /// Largest accepted request body in bytes; larger bodies get 413.
    pub max_body_bytes: usize,
    /// Most tasks accepted in one `POST /v1/jobs`.
    pub max_tasks_per_request: usize,
    /// Longest `wait_ms` a long-poll may ask for.
    pub max_wait_ms: u64,
    /// Largest page of results in bytes (their stored output and error): a page ends
    /// before the result that would take it over this, whatever `limit` asked for, but
    /// always holds at least one result. Bounds the gateway's memory and the response.
    pub max_page_bytes: u64,
}

impl Default for GatewaySettings {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:7878".into(),
            token: String::new(),
            max_body_bytes: 16 * 1024 * 1024,
            max_tasks_per_request: 10_000,
            max_wait_ms: 60_000,
            max_page_bytes: 16 * 1024 * 1024,
        }
    }
}

impl std::fmt::Debug for GatewaySettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewaySettings")
            .field("listen", &self.listen)
            .field("token", &Redacted(&self.token))
            .field("max_body_bytes", &self.max_body_bytes)
            .field("max_tasks_per_request", &self.max_tasks_per_request)
            .field("max_wait_ms", &self.max_wait_ms)
            .field("max_page_bytes", &self.max_page_bytes)
            .finish()
    }
}

/// The shortest accepted `gateway.token`: a shorter one is guessable.
pub const MIN_GATEWAY_TOKEN_LEN: usize = 16;

/// This machine's identity.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NodeSettings {
    /// Node name: jobs whose RUN must happen where their sandbox lives are routed to
    /// `<prefix>.run.<name>`. Letters, digits, `-` and `_` only. Defaults to the host name.
    pub name: String,
}

impl Default for NodeSettings {
    fn default() -> Self {
        let host = nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .unwrap_or_else(|| "localhost".into());
        Self {
            name: sanitize_node_name(&host),
        }
    }
}

/// Turns a host name into a valid subject token (`node1.cluster` → `node1-cluster`).
pub fn sanitize_node_name(host: &str) -> String {
    let s: String = host
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .collect();
    if s.is_empty() || s == "any" {
        "node".into()
    } else {
        s
    }
}

/// Delivery and retry policy.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QueueSettings {
    /// How many times a stage may be started (crashes and transient faults included;
    /// graceful hand-backs not) before the job is failed and its message kept on
    /// `<prefix>.dead`.
    pub delivery_limit: i64,
    /// How long a worker may hold a message without acknowledging progress before
    /// JetStream redelivers it (ms). Workers send progress every third of this.
    pub ack_wait_ms: u64,
    /// First delay of a nak after a transient fault (ms); doubles per delivery.
    pub nak_delay_ms: u64,
    /// Longest nak delay (ms).
    pub nak_delay_max_ms: u64,
    /// JetStream duplicate window (ms): re-publishes inside it are dropped.
    pub duplicate_window_ms: u64,
    /// Results larger than this many bytes are published as a reference to
    /// `GET /v1/jobs/{id}` instead of inline.
    pub max_result_bytes: usize,
}

impl Default for QueueSettings {
    fn default() -> Self {
        Self {
            delivery_limit: 5,
            ack_wait_ms: 30_000,
            nak_delay_ms: 500,
            nak_delay_max_ms: 30_000,
            duplicate_window_ms: 120_000,
            max_result_bytes: 512 * 1024,
        }
    }
}

/// Per-stage worker settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StagesSettings {
    /// INIT workers.
    pub init: StageSettings,
    /// RUN workers.
    pub run: StageSettings,
    /// EVAL workers.
    pub eval: StageSettings,
    /// After SIGTERM, how long in-flight stages may keep running before they are handed
    /// back to the queue (ms). Slurm's default grace before SIGKILL is 30 s.
    pub grace_ms: u64,
}

impl Default for StagesSettings {
    fn default() -> Self {
        Self {
            init: StageSettings::with_timeout(600_000),
            run: StageSettings::with_timeout(3_600_000),
            eval: StageSettings::with_timeout(1_800_000),
            grace_ms: 20_000,
        }
    }
}

impl StagesSettings {
    /// The settings of one stage.
    pub fn get(&self, stage: Stage) -> &StageSettings {
        match stage {
            Stage::Init => &self.init,
            Stage::Run => &self.run,
            Stage::Eval => &self.eval,
        }
    }
}

/// Settings of one stage's workers.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StageSettings {
    /// Jobs one worker process runs at once in this stage.
    pub concurrency: usize,
    /// Longest a stage may run once started (ms); queue wait does not count.
    pub timeout_ms: u64,
}

impl StageSettings {
    fn with_timeout(timeout_ms: u64) -> Self {
        Self {
            concurrency: 64,
            timeout_ms,
        }
    }
}

impl Default for StageSettings {
    fn default() -> Self {
        Self::with_timeout(600_000)
    }
}

/// The reconciler, which repairs hand-offs lost between the database and the queue.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReconcilerSettings {
    /// Run the reconciler in this process (the gateway and `up` do by default).
    pub enabled: bool,
    /// How often it sweeps (ms).
    pub interval_ms: u64,
    /// A queued job with no change for this long has its stage message re-published (ms).
    /// Re-publishing is harmless: duplicates are dropped on pickup.
    pub stale_after_ms: u64,
    /// A queued job's hand-off this old (ms) whose job has not changed since is published
    /// again, once: it may have been lost with the process that wrote the job (a gateway
    /// that died between commit and publish). Harmless when it was not lost: the server
    /// drops the copy as a duplicate, since this is well inside
    /// `queue.duplicate_window_ms` (hand-offs older than half of it are left to
    /// `stale_after_ms`). 0 turns this check off.
    pub republish_after_ms: u64,
    /// Most jobs re-published per sweep.
    pub batch_limit: i64,
}

impl Default for ReconcilerSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            interval_ms: 5_000,
            stale_after_ms: 300_000,
            republish_after_ms: 10_000,
            batch_limit: 1000,
        }
    }
}

/// Sandboxes: which backend, where they live, their limits and their upkeep.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SandboxSettings {
    /// `bwrap` (bubblewrap; isolated, the default), `apptainer` (instances from a `.sif`
    /// image, set per task) or `local` (no isolation: development only). A task may name
    /// its own.
    pub backend: String,
    /// Where sandbox directories live. Empty: `<state_dir>/sb`. Keep it short: socket
    /// paths inside it must stay under 100 bytes.
    pub root: PathBuf,
    /// The `rollout-sandbox` server binary. Empty: the one beside this executable.
    pub server_bin: PathBuf,
    /// The bubblewrap executable.
    pub bwrap: PathBuf,
    /// The `apptainer` (or `singularity`) executable.
    pub apptainer: PathBuf,
    /// Whether `network: true` tasks may run on the `apptainer` backend, where they share
    /// the host's network (its loopback services included). Off, they are refused.
    pub apptainer_host_network: bool,
    /// The `slirp4netns` executable that connects `network: true` sandboxes to the
    /// outside (they keep a network namespace of their own; see `network_deny`).
    pub slirp4netns: PathBuf,
    /// IPv4 networks (`a.b.c.d/n`) `network: true` sandboxes may not reach, beyond the
    /// built-in private, link-local and reserved ranges and the host's own networks,
    /// which are always denied: e.g. a cluster's services on public addresses.
    pub network_deny: Vec<String>,
    /// cgroup v2 only: the cgroup (a directory under /sys/fs/cgroup) in which each
    /// sandbox gets a cgroup of its own, e.g. a subtree delegated to the worker's user.
    /// Empty: the worker's own cgroup. Without cgroups, memory and process limits are
    /// per process and per user only, which the worker reports at start.
    pub cgroup_parent: Option<PathBuf>,
    /// Whether the `local` backend (no isolation: the agent's commands run as the
    /// worker's user on the host) may be used, as this node's default or by a task that
    /// asks for it. Off, such tasks are refused at submit and at start.
    pub allow_local: bool,
    /// When the worker runs as root, each `bwrap` sandbox runs as a user id of its own,
    /// picked from `unprivileged_uid_base` .. `+ unprivileged_uid_count`: the kernel
    /// exempts root from the process limit and counts that limit per host user, so only
    /// a user per sandbox makes `limits.processes` a per-sandbox limit.
    pub unprivileged_uid_base: u32,
    /// See `unprivileged_uid_base`.
    pub unprivileged_uid_count: u32,
    /// The group id those sandboxes run as.
    pub unprivileged_gid: u32,
    /// Host paths bound read-only at the same place in every sandbox (a Python
    /// environment outside /usr, a dataset).
    pub ro_binds: Vec<PathBuf>,
    /// Default resource limits; a task may lower or raise them.
    pub limits: crate::domain::sandbox::SandboxLimits,
    /// How long a sandbox may take to answer its first ping (ms).
    pub ready_timeout_ms: u64,
    /// How long a node vouches for its sandboxes between renewals (ms); the reaper
    /// renews every `reaper_interval_ms`.
    pub lease_ms: u64,
    /// How often the node's reaper looks for sandboxes to remove (ms). A cancelled job's
    /// sandbox that no stage holds goes within this interval.
    pub reaper_interval_ms: u64,
    /// How many times a job goes back to INIT because its sandbox was lost.
    pub max_restarts: i64,
}

impl Default for SandboxSettings {
    fn default() -> Self {
        Self {
            backend: "bwrap".into(),
            root: PathBuf::new(),
            server_bin: PathBuf::new(),
            bwrap: PathBuf::from("bwrap"),
            apptainer: PathBuf::from("apptainer"),
            apptainer_host_network: false,
            slirp4netns: PathBuf::from("slirp4netns"),
            network_deny: Vec::new(),
            cgroup_parent: None,
            allow_local: false,
            unprivileged_uid_base: 1_000_000_000,
            unprivileged_uid_count: 1_000_000,
            unprivileged_gid: 65534,
            ro_binds: Vec::new(),
            limits: crate::domain::sandbox::SandboxLimits::default(),
            ready_timeout_ms: 30_000,
            lease_ms: 60_000,
            reaper_interval_ms: 500,
            max_restarts: 2,
        }
    }
}

/// The inference backend pool: health probes, group affinity, the HTTP client.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PoolSettings {
    /// How often every backend's `GET /health` is probed (ms).
    pub health_interval_ms: u64,
    /// How long a probe may take before the backend counts as down (ms).
    pub health_timeout_ms: u64,
    /// How far above its fair share of running jobs (a fraction of it) a backend may go
    /// to keep a prompt group's samples together.
    pub affinity_slack: f64,
    /// Jobs a backend may run above its fair share regardless of `affinity_slack`, so
    /// the first groups of a batch stay together; about one group's size.
    pub affinity_margin: f64,
    /// How long connecting to a backend may take (ms).
    pub connect_timeout_ms: u64,
    /// How long one generation request may take, answer included (ms).
    pub request_timeout_ms: u64,
    /// Retries of a generation after connection errors, timeouts and 5xx answers; then
    /// the job moves to another backend.
    pub retries: u32,
    /// The first retry's delay (ms); it doubles with each retry.
    pub backoff_ms: u64,
    /// How long a backend may pause (abort generations or answer 503, as a server does
    /// while its weights are updated) before the job moves to another backend (ms). A
    /// pause is waited out without using up `retries`.
    pub max_pause_ms: u64,
}

impl Default for PoolSettings {
    fn default() -> Self {
        Self {
            health_interval_ms: 5_000,
            health_timeout_ms: 2_000,
            affinity_slack: 0.25,
            affinity_margin: 8.0,
            connect_timeout_ms: 5_000,
            request_timeout_ms: 600_000,
            retries: 3,
            backoff_ms: 200,
            max_pause_ms: 300_000,
        }
    }
}

impl PoolSettings {
    /// The group-affinity policy.
    pub fn policy(&self) -> crate::domain::placement::AffinityPolicy {
        crate::domain::placement::AffinityPolicy {
            slack: self.affinity_slack,
            margin: self.affinity_margin,
        }
    }
}

/// Defaults of the `agent` task kind; a task's `limits` override them one by one.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentSettings {
    /// Model turns at most.
    pub max_turns: usize,
    /// Prompt and response tokens at most (the context length).
    pub max_tokens: usize,
    /// Tokens at most in one model turn.
    pub max_new_tokens: usize,
    /// The episode's wall-clock limit (ms); kept inside `stages.run.timeout_ms`.
    pub timeout_ms: u64,
    /// One tool call's limit (ms).
    pub tool_timeout_ms: u64,
    /// `hermes` (`<tool_call>` blocks) or `bash_block` (one fenced bash block per turn).
    pub parser: String,
    /// Whether a turn without a tool call ends the episode (otherwise the model is told
    /// to use a tool).
    pub stop_without_tool_call: bool,
    /// The longest observation shown to the model (bytes; head and tail are kept).
    pub max_observation_bytes: usize,
}

impl Default for AgentSettings {
    fn default() -> Self {
        Self {
            max_turns: 16,
            max_tokens: 32_768,
            max_new_tokens: 4_096,
            timeout_ms: 1_800_000,
            tool_timeout_ms: 120_000,
            parser: "hermes".into(),
            stop_without_tool_call: true,
            max_observation_bytes: 16_384,
        }
    }
}

/// Logging settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogSettings {
    /// `tracing` filter, e.g. `info` or `rollout=debug`; `RUST_LOG` overrides it.
    pub level: String,
    /// Emit JSON lines instead of human-readable text.
    pub json: bool,
}

impl Default for LogSettings {
    fn default() -> Self {
        Self {
            level: "info".into(),
            json: false,
        }
    }
}

impl Settings {
    /// Loads settings from defaults, the optional file and the environment.
    ///
    /// `path` wins over `ROLLOUT_CONFIG`. A named file that does not exist is an error.
    pub fn load(path: Option<&Path>) -> Result<Settings, ConfigError> {
        let env_path = std::env::var_os("ROLLOUT_CONFIG").map(PathBuf::from);
        let file = path.map(Path::to_path_buf).or(env_path);
        Self::load_from(file.as_deref(), std::env::vars())
    }

    /// Loads from an explicit file and set of environment variables (testable core of
    /// [`Settings::load`]).
    pub fn load_from(
        file: Option<&Path>,
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Settings, ConfigError> {
        let defaults = config::Config::try_from(&Settings::default())?;
        let mut builder = config::Config::builder().add_source(defaults);
        if let Some(file) = file {
            if !file.exists() {
                return Err(ConfigError::Invalid {
                    key: "--config / ROLLOUT_CONFIG".into(),
                    problem: format!("names `{}`, which does not exist", file.display()),
                });
            }
            builder = builder.add_source(
                config::File::from(file.to_path_buf()).format(config::FileFormat::Toml),
            );
        }
        let env: config::Map<String, String> = vars
            .into_iter()
            .filter(|(k, _)| k.starts_with("ROLLOUT__"))
            .collect();
        builder = builder.add_source(
            config::Environment::with_prefix("ROLLOUT")
                .prefix_separator("__")
                .separator("__")
                .try_parsing(true)
                .source(Some(env)),
        );
        let settings: Settings = builder.build()?.try_deserialize()?;
        settings.validate()?;
        Ok(settings)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let bad = |key: &str, problem: &str| {
            Err(ConfigError::Invalid {
                key: key.into(),
                problem: problem.into(),
            })
        };
        if !(self.nats.url.starts_with("nats://")
            || self.nats.url.starts_with("tls://")
            || self.nats.url.starts_with("ws://")
            || self.nats.url.starts_with("wss://"))
        {
            return bad(
                "nats.url",
                "must be a NATS URL such as nats://127.0.0.1:4222",
            );
        }
        if !is_subject_token(&self.nats.prefix) {
            return bad(
                "nats.prefix",
                "must be 1-128 letters, digits, `-` or `_` (it becomes a subject token)",
            );
        }
        let db = &self.database.url;
        if !(db.is_empty()
            || db.starts_with("sqlite:")
            || db.starts_with("postgres://")
            || db.starts_with("postgresql://"))
        {
            return bad(
                "database.url",
                "must start with sqlite:, postgres:// or postgresql:// (empty = SQLite under state_dir)",
            );
        }
        if self.database.max_connections == 0 {
            return bad("database.max_connections", "must be at least 1");
        }
        let n = &self.nats;
        if n.user.is_empty() != n.password.is_empty() {
            let key = if n.user.is_empty() {
                "nats.user"
            } else {
                "nats.password"
            };
            return bad(
                key,
                "must be set together with the other of nats.user and nats.password (or \
                 leave both empty)",
            );
        }
        let methods = [
            !n.user.is_empty(),
            !n.token.is_empty(),
            !n.creds_file.as_os_str().is_empty(),
        ];
        if methods.iter().filter(|set| **set).count() > 1 {
            return bad(
                "nats.token",
                "and nats.user/nats.password and nats.creds_file are different ways to \
                 authenticate: set only the one the NATS server expects",
            );
        }
        if !n.creds_file.as_os_str().is_empty() && !n.creds_file.is_file() {
            return bad(
                "nats.creds_file",
                &format!(
                    "names `{}`, which is not a readable file: give the path of the .creds \
                     file the NATS operator issued (or leave it empty)",
                    n.creds_file.display()
                ),
            );
        }
        let Ok(listen) = self.gateway.listen.parse::<std::net::SocketAddr>() else {
            return bad(
                "gateway.listen",
                "must be an address with a port, e.g. 127.0.0.1:7878",
            );
        };
        let token = &self.gateway.token;
        if token.is_empty() && !listen.ip().is_loopback() {
            return bad(
                "gateway.token",
                &format!(
                    "is required when listening on a non-loopback address (gateway.listen is \
                     {listen}): set it to a random string of at least \
                     {MIN_GATEWAY_TOKEN_LEN} characters (e.g. from `openssl rand -hex 32`), \
                     or listen on 127.0.0.1"
                ),
            );
        }
        if !token.is_empty() && token.chars().count() < MIN_GATEWAY_TOKEN_LEN {
            return bad(
                "gateway.token",
                &format!(
                    "is too short: use at least {MIN_GATEWAY_TOKEN_LEN} characters (e.g. \
                     from `openssl rand -hex 32`)"
                ),
            );
        }
        if !token.chars().all(|c| c.is_ascii_graphic()) {
            return bad(
                "gateway.token",
                "must be printable ASCII without spaces or control characters (it is sent \
                 in an HTTP header): use e.g. `openssl rand -hex 32`",
            );
        }
        if !is_subject_token(&self.node.name) || self.node.name == "any" {
            return bad(
                "node.name",
                "must be letters, digits, `-` or `_`, and not `any`",
            );
        }
        if self.queue.delivery_limit < 1 {
            return bad("queue.delivery_limit", "must be at least 1");
        }
        if self.queue.ack_wait_ms < 300 {
            return bad("queue.ack_wait_ms", "must be at least 300");
        }
        for stage in Stage::ALL {
            let s = self.stages.get(stage);
            if s.concurrency == 0 {
                return bad(&format!("stages.{stage}.concurrency"), "must be at least 1");
            }
            if s.timeout_ms == 0 {
                return bad(&format!("stages.{stage}.timeout_ms"), "must be at least 1");
            }
        }
        if crate::domain::sandbox::RuntimeKind::parse(&self.sandbox.backend).is_none() {
            return bad("sandbox.backend", "must be bwrap, apptainer or local");
        }
        for (i, n) in self.sandbox.network_deny.iter().enumerate() {
            if crate::domain::sandbox::Ipv4Net::parse(n).is_none() {
                return bad(
                    &format!("sandbox.network_deny[{i}]"),
                    "must be an IPv4 network such as 203.0.113.0/24",
                );
            }
        }
        if self.sandbox.backend == "local" && !self.sandbox.allow_local {
            return bad(
                "sandbox.backend",
                "is `local`, which runs agents unsandboxed on the host; set sandbox.allow_local = true to mean it",
            );
        }
        for (key, v) in [
            ("sandbox.ready_timeout_ms", self.sandbox.ready_timeout_ms),
            ("sandbox.lease_ms", self.sandbox.lease_ms),
            (
                "sandbox.reaper_interval_ms",
                self.sandbox.reaper_interval_ms,
            ),
        ] {
            if v == 0 {
                return bad(key, "must be at least 1");
            }
        }
        if self.sandbox.lease_ms <= 2 * self.sandbox.reaper_interval_ms {
            return bad(
                "sandbox.lease_ms",
                "must be more than twice sandbox.reaper_interval_ms (the reaper renews leases)",
            );
        }
        if self.sandbox.unprivileged_uid_count == 0
            || self
                .sandbox
                .unprivileged_uid_base
                .checked_add(self.sandbox.unprivileged_uid_count)
                .is_none()
        {
            return bad(
                "sandbox.unprivileged_uid_count",
                "must be at least 1, and base + count must fit in 32 bits",
            );
        }
        if self.sandbox.max_restarts < 0 {
            return bad("sandbox.max_restarts", "must be 0 or more");
        }
        let mut ids = std::collections::HashSet::new();
        for (i, b) in self.backends.iter().enumerate() {
            if let Err((field, problem)) = b.validate() {
                return bad(&format!("backends[{i}].{field}"), &problem);
            }
            if !ids.insert(b.id.as_str()) {
                return bad(&format!("backends[{i}].id"), "is used by another backend");
            }
        }
        let p = &self.pool;
        for (key, v) in [
            ("pool.health_interval_ms", p.health_interval_ms),
            ("pool.health_timeout_ms", p.health_timeout_ms),
            ("pool.connect_timeout_ms", p.connect_timeout_ms),
            ("pool.request_timeout_ms", p.request_timeout_ms),
        ] {
            if v == 0 {
                return bad(key, "must be at least 1");
            }
        }
        if !(p.affinity_slack.is_finite() && p.affinity_slack >= 0.0) {
            return bad("pool.affinity_slack", "must be a number, 0 or more");
        }
        if !(p.affinity_margin.is_finite() && p.affinity_margin >= 0.0) {
            return bad("pool.affinity_margin", "must be a number, 0 or more");
        }
        let a = &self.agent;
        for (key, v) in [
            ("agent.max_turns", a.max_turns as u64),
            ("agent.max_tokens", a.max_tokens as u64),
            ("agent.max_new_tokens", a.max_new_tokens as u64),
            ("agent.timeout_ms", a.timeout_ms),
            ("agent.tool_timeout_ms", a.tool_timeout_ms),
            (
                "agent.max_observation_bytes",
                a.max_observation_bytes as u64,
            ),
        ] {
            if v == 0 {
                return bad(key, "must be at least 1");
            }
        }
        if crate::domain::parser::Parser::from_name(&a.parser).is_none() {
            return bad("agent.parser", "must be hermes or bash_block");
        }
        Ok(())
    }

    /// Where sandbox directories live, resolved to an absolute path.
    pub fn sandbox_root(&self) -> PathBuf {
        let root = if self.sandbox.root.as_os_str().is_empty() {
            self.state_dir.join("sb")
        } else {
            self.sandbox.root.clone()
        };
        std::path::absolute(&root).unwrap_or(root)
    }

    /// The sandbox server binary, resolved: the configured one, or `rollout-sandbox`
    /// beside the running executable.
    pub fn sandbox_server_bin(&self) -> PathBuf {
        if !self.sandbox.server_bin.as_os_str().is_empty() {
            return std::path::absolute(&self.sandbox.server_bin)
                .unwrap_or_else(|_| self.sandbox.server_bin.clone());
        }
        let exe = std::env::current_exe().unwrap_or_default();
        let dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
        // Test and bench executables live one level down, in `deps/`.
        for d in [
            dir.clone(),
            dir.parent().map(Path::to_path_buf).unwrap_or_default(),
        ] {
            let candidate = d.join("rollout-sandbox");
            if candidate.is_file() {
                return candidate;
            }
        }
        dir.join("rollout-sandbox")
    }

    /// The database URL, with the empty default resolved to a SQLite file under the
    /// state directory.
    pub fn database_url(&self) -> String {
        if self.database.url.is_empty() {
            format!("sqlite://{}", self.state_dir.join("rollout.db").display())
        } else {
            self.database.url.clone()
        }
    }

    /// The ack-wait as a [`Duration`].
    pub fn ack_wait(&self) -> Duration {
        Duration::from_millis(self.queue.ack_wait_ms)
    }
}

/// Hides the password of a URL (a database's, NATS's) for logs and errors.
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let creds = &url[s + 3..at];
            match creds.find(':') {
                Some(c) => format!("{}://{}:***{}", &url[..s], &creds[..c], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_passwords() {
        assert_eq!(
            redact_url("postgres://u:secret@h/db"),
            "postgres://u:***@h/db"
        );
        assert_eq!(redact_url("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact_url("sqlite://x.db"), "sqlite://x.db");
    }

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_are_valid() {
        let s = Settings::load_from(None, env(&[])).unwrap();
        assert_eq!(s.nats.url, "nats://127.0.0.1:4222");
        assert_eq!(s.gateway.listen, "127.0.0.1:7878");
        assert!(s.database_url().starts_with("sqlite://"));
    }

    #[test]
    fn environment_overrides_nested_snake_case_keys() {
        let s = Settings::load_from(
            None,
            env(&[
                ("ROLLOUT__NATS__URL", "nats://10.0.0.1:4222"),
                ("ROLLOUT__QUEUE__DELIVERY_LIMIT", "9"),
                ("ROLLOUT__STAGES__RUN__CONCURRENCY", "3"),
                ("ROLLOUT__NODE__NAME", "gpu-7"),
                ("UNRELATED", "x"),
            ]),
        )
        .unwrap();
        assert_eq!(s.nats.url, "nats://10.0.0.1:4222");
        assert_eq!(s.queue.delivery_limit, 9);
        assert_eq!(s.stages.run.concurrency, 3);
        assert_eq!(s.node.name, "gpu-7");
    }

    #[test]
    fn file_then_environment() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(
            &path,
            "[gateway]\nlisten = \"0.0.0.0:9000\"\n[stages.eval]\ntimeout_ms = 5\n",
        )
        .unwrap();
        let s = Settings::load_from(
            Some(&path),
            env(&[("ROLLOUT__GATEWAY__LISTEN", "127.0.0.1:1")]),
        )
        .unwrap();
        assert_eq!(s.gateway.listen, "127.0.0.1:1");
        assert_eq!(s.stages.eval.timeout_ms, 5);
    }

    #[test]
    fn bad_values_name_their_key() {
        let e = Settings::load_from(None, env(&[("ROLLOUT__QUEUE__DELIVERY_LIMIT", "lots")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("delivery_limit"), "{e}");
        let e = Settings::load_from(None, env(&[("ROLLOUT__GATEWAY__LISTEN", "nowhere")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("gateway.listen"), "{e}");
        let e = Settings::load_from(None, env(&[("ROLLOUT__DATABASE__URL", "mysql://x")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("database.url"), "{e}");
        let e = Settings::load_from(Some(Path::new("/nonexistent/rollout.toml")), env(&[]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("does not exist"), "{e}");
    }

    #[test]
    fn unknown_file_keys_are_rejected() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "[gateway]\nlisten_addr = \"x\"\n").unwrap();
        let e = Settings::load_from(Some(&path), env(&[]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("listen_addr"), "{e}");
    }

    #[test]
    fn backends_load_from_the_file_and_bad_ones_name_their_field() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        let one = "[[backends]]\nid = \"gpu0\"\nurl = \"http://h:8000\"\nkind = \"sglang\"\nmodel = \"m\"\ntokenizer = \"/m\"\n";
        std::fs::write(&path, one).unwrap();
        let s = Settings::load_from(Some(&path), env(&[])).unwrap();
        assert_eq!(s.backends.len(), 1);
        assert_eq!(s.backends[0].kind, crate::domain::backend::WireKind::Sglang);
        assert_eq!(s.backends[0].weight, 1.0);
        std::fs::write(&path, format!("{one}{}", one.replace("h:8000", "h:8001"))).unwrap();
        let e = Settings::load_from(Some(&path), env(&[]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("backends[1].id"), "{e}");
        std::fs::write(&path, one.replace("http://", "tcp://")).unwrap();
        let e = Settings::load_from(Some(&path), env(&[]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("backends[0].url"), "{e}");
        let e = Settings::load_from(None, env(&[("ROLLOUT__AGENT__PARSER", "xml")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("agent.parser"), "{e}");
    }

    #[test]
    fn gateway_token_is_required_off_loopback() {
        let token = "0123456789abcdef0123";
        for listen in ["0.0.0.0:7878", "[::]:7878", "10.1.2.3:7878"] {
            let e = Settings::load_from(None, env(&[("ROLLOUT__GATEWAY__LISTEN", listen)]))
                .unwrap_err()
                .to_string();
            assert!(e.contains("`gateway.token`"), "{listen}: {e}");
            assert!(e.contains("non-loopback"), "{listen}: {e}");
            let s = Settings::load_from(
                None,
                env(&[
                    ("ROLLOUT__GATEWAY__LISTEN", listen),
                    ("ROLLOUT__GATEWAY__TOKEN", token),
                ]),
            )
            .unwrap();
            assert_eq!(s.gateway.token, token);
        }
        for listen in ["127.0.0.1:7878", "127.0.0.2:0", "[::1]:7878"] {
            Settings::load_from(None, env(&[("ROLLOUT__GATEWAY__LISTEN", listen)]))
                .unwrap_or_else(|e| panic!("{listen}: {e}"));
        }
    }

    #[test]
    fn gateway_token_must_be_long_and_printable() {
        for (bad, why) in [
            ("short-token", "too short"),
            ("0123456789 abcdef0123", "printable"),
            ("0123456789\tabcdef0123", "printable"),
            ("0123456789\u{7}abcdef0123", "printable"),
            ("0123456789ébcdef0123", "printable"),
        ] {
            let e = Settings::load_from(None, env(&[("ROLLOUT__GATEWAY__TOKEN", bad)]))
                .unwrap_err()
                .to_string();
            assert!(e.contains("`gateway.token`"), "{bad:?}: {e}");
            assert!(e.contains(why), "{bad:?}: {e}");
        }
    }

    #[test]
    fn nats_credentials_are_one_complete_method() {
        let dir = tempfile::tempdir().unwrap();
        let creds = dir.path().join("user.creds");
        std::fs::write(&creds, "not checked at load time").unwrap();
        let creds = creds.to_str().unwrap();
        let missing = dir.path().join("missing.creds");
        let missing = missing.to_str().unwrap();
        let rejected: [(&[(&str, &str)], &str); 6] = [
            (&[("ROLLOUT__NATS__USER", "u")], "`nats.password`"),
            (&[("ROLLOUT__NATS__PASSWORD", "p")], "`nats.user`"),
            (
                &[
                    ("ROLLOUT__NATS__USER", "u"),
                    ("ROLLOUT__NATS__PASSWORD", "p"),
                    ("ROLLOUT__NATS__TOKEN", "t"),
                ],
                "`nats.token`",
            ),
            (
                &[
                    ("ROLLOUT__NATS__TOKEN", "t"),
                    ("ROLLOUT__NATS__CREDS_FILE", creds),
                ],
                "`nats.token`",
            ),
            (
                &[
                    ("ROLLOUT__NATS__USER", "u"),
                    ("ROLLOUT__NATS__PASSWORD", "p"),
                    ("ROLLOUT__NATS__CREDS_FILE", creds),
                ],
                "`nats.token`",
            ),
            (
                &[("ROLLOUT__NATS__CREDS_FILE", missing)],
                "`nats.creds_file`",
            ),
        ];
        for (vars, key) in rejected {
            let e = Settings::load_from(None, env(vars))
                .unwrap_err()
                .to_string();
            assert!(e.contains(key), "{vars:?}: {e}");
        }
        let accepted: [&[(&str, &str)]; 3] = [
            &[
                ("ROLLOUT__NATS__USER", "u"),
                ("ROLLOUT__NATS__PASSWORD", "p"),
            ],
            &[("ROLLOUT__NATS__TOKEN", "t")],
            &[("ROLLOUT__NATS__CREDS_FILE", creds)],
        ];
        for vars in accepted {
            Settings::load_from(None, env(vars)).unwrap_or_else(|e| panic!("{vars:?}: {e}"));
        }
    }

    #[test]
    fn debug_output_hides_secrets() {
        let s = Settings::load_from(
            None,
            env(&[
                ("ROLLOUT__GATEWAY__TOKEN", "gateway-secret-0123456789"),
                ("ROLLOUT__NATS__USER", "worker"),
                ("ROLLOUT__NATS__PASSWORD", "nats-password-secret"),
            ]),
        )
        .unwrap();
        let shown = format!("{s:?}");
        assert!(!shown.contains("gateway-secret"), "{shown}");
        assert!(!shown.contains("nats-password-secret"), "{shown}");
        assert!(shown.contains("worker"), "{shown}");
        assert!(shown.contains("<redacted>"), "{shown}");
        let mut s = Settings::default();
        s.nats.token = "nats-token-secret".into();
        s.nats.url = "nats://u:url-secret@h:4222".into();
        s.database.url = "postgres://rollout:db-secret@h/rollout".into();
        let shown = format!("{s:?}");
        assert!(!shown.contains("nats-token-secret"), "{shown}");
        assert!(!shown.contains("url-secret"), "{shown}");
        assert!(!shown.contains("db-secret"), "{shown}");
    }

    #[test]
    fn node_names_become_subject_tokens() {
        assert_eq!(sanitize_node_name("n1.cluster.local"), "n1-cluster-local");
        assert_eq!(sanitize_node_name("any"), "node");
    }
}

#[cfg(test)]
mod example_file {
    use super::*;

    /// The commented example file in the repository loads and matches the defaults, so it
    /// cannot drift from the code.
    #[test]
    fn example_toml_loads_and_matches_defaults() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("rollout.example.toml");
        let s = Settings::load_from(Some(&path), Vec::new()).unwrap();
        let d = Settings::default();
        assert_eq!(
            toml::to_string(&s).unwrap(),
            toml::to_string(&d).unwrap(),
            "rollout.example.toml disagrees with Settings::default()"
        );
    }
}
