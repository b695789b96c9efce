//! The load-time checks: every value in range and consistent with the others, with an
//! error that names the key, so a typo fails at start-up rather than as a stuck job.

use super::{ConfigError, MIN_GATEWAY_TOKEN_LEN, Settings};
use crate::domain::{Stage, is_subject_token};

/// The most copies JetStream keeps of a stream.
const MAX_NATS_REPLICAS: usize = 5;

/// The error for `key`, which has `problem`.
fn bad(key: &str, problem: &str) -> Result<(), ConfigError> {
    Err(ConfigError::Invalid {
        key: key.into(),
        problem: problem.into(),
    })
}

impl Settings {
    /// Checks every section; the first problem found is the error.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        self.validate_connections()?;
        self.validate_gateway()?;
        self.validate_node()?;
        self.validate_sandbox()?;
        self.validate_inference()
    }

    /// The NATS and database connections: URLs, the subject prefix, the pool size, and
    /// at most one NATS authentication method, complete.
    fn validate_connections(&self) -> Result<(), ConfigError> {
        let urls = self.nats.urls();
        let is_nats_url = |u: &&str| {
            ["nats://", "tls://", "ws://", "wss://"]
                .iter()
                .any(|scheme| u.starts_with(scheme))
        };
        if urls.is_empty() || !urls.iter().all(is_nats_url) {
            return bad(
                "nats.url",
                "must be a NATS URL such as nats://127.0.0.1:4222, or a cluster's URLs \
                 separated by commas (nats://n1:4222,nats://n2:4222,nats://n3:4222)",
            );
        }
        if !(1..=MAX_NATS_REPLICAS).contains(&self.nats.replicas) {
            return bad(
                "nats.replicas",
                &format!(
                    "must be 1 to {MAX_NATS_REPLICAS} (JetStream's limit): 1 for a single \
                     nats-server, 3 for a three-server cluster"
                ),
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
        Ok(())
    }

    /// The gateway: its listen address, and a token that is long enough, sendable in a
    /// header, and present whenever it listens beyond loopback.
    fn validate_gateway(&self) -> Result<(), ConfigError> {
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
        Ok(())
    }

    /// The node's name (a subject token), the queue's redelivery settings, and each
    /// stage's concurrency and timeout.
    fn validate_node(&self) -> Result<(), ConfigError> {
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
        Ok(())
    }

    /// The sandbox section: runtime, denied networks, leases and the reaper, the
    /// unprivileged uid range, restarts.
    fn validate_sandbox(&self) -> Result<(), ConfigError> {
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
        let (limits, max) = (&self.sandbox.limits, &self.sandbox.max_limits);
        for ((name, value), (_, ceiling)) in limits.named().into_iter().zip(max.named()) {
            if let Some(problem) = crate::domain::sandbox::limit_problem(name, value, ceiling) {
                return bad(&format!("sandbox.limits.{name}"), &problem);
            }
        }
        if self.sandbox.max_restarts < 0 {
            return bad("sandbox.max_restarts", "must be 0 or more");
        }
        Ok(())
    }

    /// Inference: each configured backend (with unique ids), the pool's timings and
    /// affinity, and the agent's limits and parser.
    fn validate_inference(&self) -> Result<(), ConfigError> {
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
        if !crate::domain::parser::Parser::is_name(&a.parser) {
            return bad("agent.parser", &crate::domain::parser::Parser::expected());
        }
        Ok(())
    }
}
