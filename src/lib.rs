//! `rollout`: a rollout service for reinforcement-learning training of multi-turn LLM agents.
//!
//! Trainers submit tasks over HTTP; each task becomes a *job* that flows through three
//! stages — INIT (prepare a sandbox), RUN (drive the policy through an episode) and EVAL
//! (score the outcome) — carried between stateless workers by NATS JetStream, with every
//! state change recorded in SQLite or Postgres. The crate is a library with thin binaries:
//! the `rollout` CLI (gateway, admin commands, the all-in-one `up`) and one worker binary
//! per stage.
//!
//! The modules form layers; each uses only the layers below it (`tests/layers.rs`
//! checks every `crate::` path), from the top:
//!
//! - [`wiring`]: building the processes from settings: the all-in-one `rollout up`, the
//!   gateway, the workers.
//! - [`client`]: an HTTP client of the gateway API (CLI, tests, benchmarks).
//! - [`worker`]: the stage worker loop shared by the three worker binaries;
//!   [`reconciler`]: repairs hand-offs lost between the database and the queue;
//!   [`gateway`]: the HTTP API (axum) with its OpenAPI document and metrics.
//! - [`kinds`]: the task-kind interface (a hook per stage) and the `synthetic`, `shell`
//!   and `agent` kinds; [`scripted`]: the stand-in inference server (a script, not a
//!   model) for tests, benchmarks and the demo.
//! - [`agent`]: the multi-turn agent loop: chat templates, tokenizers, tool-call
//!   parsers, observations, trajectories; [`batches`]: dynamic-sampling batches;
//!   [`graders`]: turning a finished episode into a reward (math answers, code, patches).
//! - [`ending`]: dead-lettering a job and publishing results, for every component;
//!   [`sandbox`]: sandboxes (local, bubblewrap, Apptainer) and the tool server inside
//!   them; [`backends`]: inference servers: wire formats, the pooled client, the pool.
//! - [`store`]: durable job state, one trait per concern (jobs, recovery, results,
//!   sandboxes, backends) over one generic SQLite/Postgres implementation;
//!   [`queue`]: JetStream streams, consumers, subjects and publishing; [`telemetry`]:
//!   logging.
//! - [`config`]: the typed settings tree (file, then `ROLLOUT__SECTION__KEY`
//!   environment), plain data.
//! - [`domain`]: the words everything shares: jobs, stages, statuses, tasks, results,
//!   backend and sandbox descriptions, placement; [`nul`]: the NUL character, refused in
//!   input and replaced in output, so SQLite and Postgres deployments store the same
//!   things; [`natsd`]: starting a local `nats-server` child; [`metrics`]: Prometheus
//!   metric names; [`shutdown`]: signals; [`retry`]: every retry schedule, one
//!   policy per concern; [`supervise`]: background tasks that never die silently.

#![warn(missing_docs)]

pub mod agent;
pub mod backends;
pub mod batches;
pub mod client;
pub mod config;
pub mod domain;
pub mod ending;
pub mod gateway;
pub mod graders;
pub mod kinds;
pub mod metrics;
pub mod natsd;
pub mod nul;
/// What a unit test does when something it needs is missing: fails under `CI=true`,
/// else says it skipped (the integration tests' own helper, shared).
#[cfg(test)]
#[path = "../tests/common/prerequisite.rs"]
pub(crate) mod prerequisite;
pub mod queue;
pub mod reconciler;
pub mod retry;
pub mod sandbox;
pub mod scripted;
pub mod shutdown;
pub mod store;
pub mod supervise;
pub mod telemetry;
pub mod wiring;
pub mod worker;
