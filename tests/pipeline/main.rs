//! Integration tests of the backbone against a real nats-server and a real database
//! (SQLite, or Postgres when `ROLLOUT_TEST_DATABASE_URL` is set). One binary with a
//! module per area links once and runs the tests in parallel; each test has its own
//! NATS subject prefix and database.

#[path = "../common/eventually.rs"]
mod eventually;
#[path = "../common/fresh_postgres.rs"]
mod fresh_postgres;
#[path = "../common/host.rs"]
mod host;
#[path = "../common/leftovers.rs"]
#[allow(dead_code)] // the nodes' test checks what is left; it starts no `Service`
mod leftovers;
#[path = "../common/nats_cluster.rs"]
mod nats_cluster;
#[path = "../common/prerequisite.rs"]
mod prerequisite;
#[path = "../common/rack.rs"]
mod rack;

mod abandoned;
mod agent;
mod api;
mod auth;
mod backends;
mod cli;
mod cluster;
mod examples;
mod faults;
mod flow;
mod forgeries;
mod graders;
mod helpers;
mod hostile;
mod nats_submit;
mod nodes;
mod openapi;
mod poison;
mod program;
mod replay;
mod results;
mod sampling;
mod shadows;
mod shell;
mod slurm;
mod store;
mod swe;
mod training;
mod views;
mod weight_update;
