//! The fixtures every test target of the workspace shares, taken as a dev-dependency
//! (never a normal one: `tests/layers.rs` checks it).
//!
//! Two costs used to be paid by every test: a nats-server of its own, and, on Postgres,
//! a new database migrated from nothing. Here each is paid once:
//!
//! - [`nats`]: one nats-server per test process (or the one `ROLLOUT_TEST_NATS_URL`
//!   names, which the test command starts once for the whole run), each test keeping
//!   to a stream prefix of its own;
//! - [`database`]: a fresh database per test, copied from a template migrated once:
//!   `CREATE DATABASE … TEMPLATE` on Postgres, a copied file on SQLite.
//!
//! And the small things the suites have in common: [`bench`] (the benchmarks' helpers), [`eventually`] (the one way to wait
//! for something in the background), [`prerequisite`] (fail under `CI=true`, else say
//! what was skipped), [`host`] (free ports, installed programs), [`leftovers`] (what a
//! test left running or mounted), [`nats_cluster`] (a JetStream cluster on this
//! machine), [`rack`] (nodes in network namespaces) and [`reference`] (a real
//! implementation's script run on the same cases, for differential tests).

#![forbid(unsafe_code)]

pub mod bench;
pub mod database;
pub mod eventually;
pub mod host;
pub mod leftovers;
pub mod nats;
pub mod nats_cluster;
pub mod prerequisite;
pub mod rack;
pub mod reference;
