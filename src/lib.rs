//! `rollout`: a rollout service for reinforcement-learning training of multi-turn LLM agents.
//!
//! Trainers submit tasks over HTTP; each task becomes a *job* that flows through three
//! stages — INIT (prepare a sandbox), RUN (drive the policy through an episode) and EVAL
//! (score the outcome) — carried between stateless workers by NATS JetStream, with every
//! state change recorded in SQLite or Postgres. The crate is a library with thin binaries:
//! the `rollout` CLI (gateway, admin commands, the all-in-one `up`) and one worker binary
//! per stage.
//!
//! Module map:
//! - [`agent`]: the multi-turn agent loop: chat templates, tokenizers, tool-call
//!   parsers, observations, trajectories.
//! - [`backends`]: inference servers: wire formats, the pooled client, the backend pool.
//! - [`scripted`]: the stand-in inference server (a script, not a model) for tests,
//!   benchmarks and the demo.
//! - [`config`]: the typed settings tree (file, then `ROLLOUT__SECTION__KEY` environment).
//! - [`model`]: jobs, stages, statuses, tasks and results — the domain types.
//! - [`nul`]: the NUL character, refused in input and replaced in output, so SQLite and
//!   Postgres deployments store the same things.
//! - [`store`]: durable job state behind one trait, with SQLite and Postgres backends.
//! - [`queue`]: JetStream streams, consumers, subjects and publishing.
//! - [`kinds`]: the task-kind interface (a hook per stage) and the `synthetic`, `shell`
//!   and `agent` kinds.
//! - [`worker`]: the stage worker loop shared by the three worker binaries.
//! - [`reconciler`]: repairs hand-offs lost between the database and the queue.
//! - [`sandbox`]: sandboxes (local, bubblewrap, Apptainer) and the tool server inside them.
//! - [`gateway`]: the HTTP API (axum) with its OpenAPI document and metrics.
//! - [`client`]: an HTTP client of the gateway API (CLI, tests, benchmarks).
//! - [`natsd`]: starting a local `nats-server` child for `rollout up` and tests.
//! - [`local`]: the all-in-one `rollout up` runtime.
//! - [`telemetry`], [`metrics`], [`shutdown`]: logging, Prometheus metrics and signals.

#![warn(missing_docs)]

pub mod agent;
pub mod backends;
pub mod client;
pub mod config;
pub mod gateway;
pub mod kinds;
pub mod local;
pub mod metrics;
pub mod model;
pub mod natsd;
pub mod nul;
pub mod queue;
pub mod reconciler;
pub mod sandbox;
pub mod scripted;
pub mod shutdown;
pub mod store;
pub mod telemetry;
pub mod worker;

/// Current wall-clock time in milliseconds since the Unix epoch.
///
/// All timestamps in the database are epoch milliseconds computed here rather than by the
/// database, so SQLite and Postgres rows are directly comparable and tests can reason
/// about them without dialect-specific time functions.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
