//! The bottom of the rollout service: the words every part shares and the settings they
//! are built from, with nothing of the database, the queue or a sandbox in them.
//!
//! - [`domain`]: jobs, stages, statuses, tasks, results, backend and sandbox
//!   descriptions, placement;
//! - [`config`]: the typed settings tree (file, then `ROLLOUT__SECTION__KEY`
//!   environment), plain data; it uses only [`domain`];
//! - [`nul`]: the NUL character, refused in input and replaced in output, so SQLite and
//!   Postgres deployments store the same things;
//! - [`metrics`]: Prometheus metric names; [`retry`]: every retry schedule, one policy
//!   per concern; [`supervise`]: background tasks that never die silently;
//!   [`shutdown`]: SIGINT and SIGTERM as a cancellation token;
//! - [`child`]: children that die with their parent (the one module with `unsafe`);
//!   [`natsd`]: starting a local `nats-server` child, for `rollout up` and the tests.
//!
//! Every other crate of the workspace builds on this one, so it is kept small and free
//! of heavy dependencies: a change here rebuilds everything.

#![deny(unsafe_code)]

#[allow(unsafe_code)]
pub mod child;
pub mod config;
pub mod domain;
pub mod metrics;
pub mod natsd;
pub mod nul;
pub mod retry;
pub mod shutdown;
pub mod supervise;
