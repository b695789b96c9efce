//! `rollout`: a rollout service for reinforcement-learning training of multi-turn LLM agents.
//!
//! Trainers submit tasks over HTTP; each task becomes a *job* that flows through three
//! stages — INIT (prepare a sandbox), RUN (drive the policy through an episode) and EVAL
//! (score the outcome) — carried between stateless workers by NATS JetStream, with every
//! state change recorded in SQLite or Postgres. This crate is the service, a library with
//! thin binaries: the `rollout` CLI (gateway, admin commands, the all-in-one `up`), one
//! worker binary per stage, the in-sandbox server and the stand-in inference server. It
//! is built on the workspace's crates (`crates/`), re-exported under their layers'
//! names: `rollout-core` ([`domain`], [`config`], [`nul`], [`metrics`], [`retry`],
//! [`supervise`], [`natsd`]), `rollout-store` ([`store`]), `rollout-sandbox` (most of [`sandbox`])
//! and `rollout-graders` ([`graders`]).
//! `rollout-api` holds the HTTP API's wire types ([`api`]) and its client ([`client`]), so
//! that a program can talk to the service without building it.
//!
//! The modules form layers; each uses only the layers below it (`tests/layers.rs`
//! checks every `crate::` path, and Cargo the crates' boundaries), from the top:
//!
//! - [`wiring`]: building the processes from settings: the all-in-one `rollout up`, the
//!   gateway, the workers.
//! - [`worker`]: the stage worker loop shared by the three worker binaries;
//!   [`reconciler`]: repairs hand-offs lost between the database and the queue;
//!   [`gateway`]: the HTTP API (axum) with its OpenAPI document and metrics.
//! - [`kinds`]: the `synthetic`, `shell`, `agent` and `agent_program` kinds, and the
//!   registry of every kind this build ships; [`scripted`]: the stand-in inference
//!   server (a script, not a model) for tests, benchmarks and the demo (crate
//!   `rollout-scripted-llm`).
//! - [`grading`]: what a kind's EVAL runs: the task's grader (a command, a math answer,
//!   code, SWE-bench tests), in a fresh sandbox where it needs one, guarded and sealed
//!   against the graded code.
//! - [`agent`]: the multi-turn agent loop: chat templates and tokenizers (crate
//!   `rollout-model`, re-exported there), tool-call
//!   parsers, observations, trajectories; [`sampling`]: the driver of dynamic-sampling
//!   batches;
//!   [`graders`]: turning a finished episode into a reward (math answers, code,
//!   patches); [`stage`]: the task-kind interface (a hook per stage, what each hands
//!   back) and the sandbox steps the sandboxed kinds share; [`natsd`]: starting a local
//!   `nats-server` child.
//! - [`publish`]: the queue side of what the store records (a submitted job handed to
//!   INIT, a result once durable, a dead letter), for every component;
//!   [`sandbox`]: sandboxes (local, bubblewrap, Apptainer), the tool server inside
//!   them, and a node's sandboxes tied to its jobs; [`backends`]: inference servers:
//!   wire formats, the pooled client, the pool; [`client`]: an HTTP client of the
//!   gateway API (CLI, tests, benchmarks, a trainer's own program).
//! - [`store`]: durable job state, one trait per concern (jobs, recovery, results,
//!   sandboxes, backends, sampling, dashboard) over one generic SQLite/Postgres
//!   implementation; each component holds only the concerns it uses;
//!   [`queue`]: JetStream streams, consumers, subjects and publishing; [`telemetry`]:
//!   logging; [`api`]: the HTTP API's wire types, shared by the gateway and the client,
//!   beside the store and not above it: the gateway copies store rows into them.
//! - [`config`]: the typed settings tree (file, then `ROLLOUT__SECTION__KEY`
//!   environment), plain data.
//! - [`domain`]: the words everything shares: jobs, stages, statuses, tasks, results,
//!   backend and sandbox descriptions, placement; [`nul`]: the NUL character, refused in
//!   input and replaced in output, so SQLite and Postgres deployments store the same
//!   things; [`metrics`]: Prometheus metric names; [`shutdown`]: signals; [`retry`]:
//!   every retry schedule, one policy per concern; [`supervise`]: background tasks that
//!   never die silently.

#![forbid(unsafe_code)]

// The crates of the workspace, under the names of the layers they are: the paths
// `crate::domain::…`, `crate::store::…` read the same as when they were modules.
pub use rollout_core::{config, domain, metrics, natsd, nul, retry, shutdown, supervise};
pub use rollout_graders as graders;
pub use rollout_scripted_llm as scripted;
pub use rollout_store as store;
// The wire types sit beside the store and the client above them, but both are in one
// crate, which a trainer links without the service.
pub use rollout_api::{api, client};

pub mod agent;
pub mod backends;
pub mod gateway;
pub mod grading;
pub mod kinds;
pub mod policy;
pub mod publish;
#[cfg(test)]
pub(crate) use rollout_test_support::prerequisite;
pub mod queue;
pub mod reconciler;
pub mod sampling;
pub mod sandbox;
pub mod stage;
pub mod telemetry;
pub mod wiring;
pub mod worker;
