//! The rollout service's HTTP API as a library of its own: [`api`], the wire types the
//! gateway takes and returns (its OpenAPI document is derived from them), and
//! [`client`], a Rust client of the gateway that sends and reads them.
//!
//! The crate sits below the service and beside its database: it depends on
//! `rollout-core` (jobs, tasks, results and the other words every part shares, which
//! are wire types already) and on no database, queue or sandbox. Two things follow. A
//! trainer (or any program) can talk to a running service by linking this crate alone,
//! without building the service. And the database's rows are not the API: where the
//! API shows what a store row holds, it has its own type here, with the same fields,
//! which the gateway fills from the row, so renaming a column changes a query and a
//! mapping, never the public API (the reviewed OpenAPI snapshot would say so).
//!
//! The service re-exports both modules under the same names (`rollout::api`,
//! `rollout::client`); `tests/layers.rs` keeps `api` below `client`.

#![forbid(unsafe_code)]

pub mod api;
pub mod client;
