//! The sections of the settings tree, each with its defaults: plain data, checked by
//! [`super::Settings::load_from`] once at load time.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::redact_url;
use crate::domain::Stage;

/// NATS settings.
///
/// At most one way of authenticating may be set: `user` with `password`, `token`, or
/// `creds_file`. All empty means no credentials, which only a server without
/// authorization accepts. `Debug` hides the password and the token so settings can be
/// logged.
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NatsSettings {
    /// Server URL, e.g. `nats://127.0.0.1:4222`, or the URLs of a cluster's servers
    /// separated by commas (`nats://n1:4222,nats://n2:4222,nats://n3:4222`): the client
    /// connects to any one of them and, when that server goes away, reconnects to
    /// another, so one server's failure does not stop the service. One string rather
    /// than a list so that `ROLLOUT__NATS__URL` can carry it.
    pub url: String,
    /// Copies the JetStream cluster keeps of every stream the service creates (and of
    /// their consumers, which follow their stream): 1 for a single server, 3 for a
    /// three-server cluster, which survives the loss of any one server with nothing
    /// lost. At most 5, and never more than the cluster has servers. Applied at every
    /// start: an existing stream with fewer copies is scaled up to this many; one with
    /// more keeps them (reducing is for the operator, `nats stream edit --replicas`), so
    /// a process left at the default cannot take a cluster's redundancy away. Set it
    /// alike in every process all the same.
    pub replicas: usize,
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
            replicas: 1,
            prefix: "rollout".into(),
            user: String::new(),
            password: String::new(),
            token: String::new(),
            creds_file: PathBuf::new(),
        }
    }
}

impl NatsSettings {
    /// The server URLs of `url`, in order, without surrounding blanks or empty entries.
    pub fn urls(&self) -> Vec<&str> {
        self.url
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .collect()
    }
}

impl std::fmt::Debug for NatsSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsSettings")
            .field("url", &redact_url(&self.url))
            .field("replicas", &self.replicas)
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
    /// Largest page of results or jobs in bytes (stored output and error; for jobs also
    /// the task and stage outputs): a page of `GET /v1/results` or `GET /v1/jobs` ends
    /// before the entry that would take it over this, whatever `limit` asked for, but
    /// always holds at least one. Bounds the gateway's memory and the response.
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
    /// Most jobs each of the sweep's reads lists (stale jobs, lapsed leases, abandoned
    /// runs, unpublished results: at most this many of each per sweep). Overdue
    /// hand-offs (`republish_after_ms`) are read in pages of this size until none is
    /// left, so a crash that orphaned any number of them is repaired in one sweep.
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
    /// Where sandbox directories live. Empty: `<state_dir>/sb`, or, when that is too long
    /// for the sockets inside (they must stay under 100 bytes), a short directory of the
    /// worker's user under `/tmp` chosen at start. Set, it is used as it is, and one too
    /// long stops the worker at start.
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
    /// Default resource limits; a task may lower or raise them, up to `max_limits`.
    pub limits: crate::domain::sandbox::SandboxLimits,
    /// The most a task may ask for, limit by limit: a task above one gets a 400 naming
    /// the limit and the maximum at submit. A task may ask for 0 (no limit) only where
    /// the maximum is 0 too, which lifts the ceiling. The defaults in `limits` must keep
    /// within these.
    pub max_limits: crate::domain::sandbox::SandboxLimits,
    /// How long a sandbox may take to answer its first ping (ms).
    pub ready_timeout_ms: u64,
    /// When the worker enforces `limits.workspace_bytes` (root, loop devices): how many
    /// workspace filesystems of each size asked for it keeps mounted ahead of time, so a
    /// sandbox's start does not wait for one. 0 (the default): each is mounted as its
    /// sandbox starts. Pooled images hold a loop device each for the worker's life, a
    /// finite resource on a shared machine, so the pool is the operator's choice.
    pub workspace_pool: usize,
    /// How many launchers for `bwrap` sandboxes the worker keeps ready: small processes
    /// spawned ahead of time and already moved into a fresh cgroup of their own, which a
    /// start hands bwrap's arguments and descriptors and which then become bwrap. They
    /// take the worker's fork and the move into the sandbox's cgroups (on cgroup v1 a
    /// wait for the kernel of 10 ms or more) off a sandbox's start. Unused ones end with
    /// the worker. 0: each start spawns bwrap itself.
    pub launcher_pool: usize,
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
            max_limits: crate::domain::sandbox::SandboxLimits::default_maximums(),
            ready_timeout_ms: 30_000,
            workspace_pool: 0,
            launcher_pool: 2,
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
    /// How tool calls are read: `auto` (the default: the parser that reads the calls
    /// the model's own chat template writes), or a parser's name (`hermes`,
    /// `bash_block`, `deepseek_r1`, `qwen3_coder`, `glm45`, `llama3_json`, `pythonic`,
    /// `mistral`, `kimi_k2`, `gpt_oss`).
    pub parser: String,
    /// Whether a turn without a tool call ends the episode (otherwise the model is told
    /// to use a tool).
    pub stop_without_tool_call: bool,
    /// The longest observation shown to the model (bytes; head and tail are kept).
    pub max_observation_bytes: usize,
    /// Whether tool output is tokenized as plain text (the default): text a program in
    /// the sandbox prints that spells a special token (`<|im_end|>`) becomes the tokens
    /// of those characters, so it cannot end the tool's turn and forge the model's.
    /// Off, observations are tokenized as the template writes them, as transformers
    /// does by default. A task's `observations_as_text` overrides it.
    pub observations_as_text: bool,
}

impl Default for AgentSettings {
    fn default() -> Self {
        Self {
            max_turns: 16,
            max_tokens: 32_768,
            max_new_tokens: 4_096,
            timeout_ms: 1_800_000,
            tool_timeout_ms: 120_000,
            parser: "auto".into(),
            stop_without_tool_call: true,
            max_observation_bytes: 16_384,
            observations_as_text: true,
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
