//! `rollout-run-worker`: runs the RUN stage of jobs, as many at once as
//! `stages.run.concurrency` allows. Stateless: start as many as you like, on any machine
//! that reaches NATS and the database. SIGTERM stops it taking work and hands in-flight
//! stages back after `stages.grace_ms`; no job is lost.

#![forbid(unsafe_code)]

use clap::Parser;
use rollout::domain::Stage;
use rollout::wiring::{WorkerArgs, worker_process};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // A second SIGINT ends the process at once, without draining (a repeated SIGTERM
    // does not: see `rollout::shutdown`).
    let shutdown = rollout::shutdown::on_signals(|| std::process::exit(130));
    worker_process(&[Stage::Run], WorkerArgs::parse(), shutdown).await?;
    Ok(())
}
