//! Prometheus metrics: names, buckets and the process-wide recorder.
//!
//! Each process (gateway, worker, or `rollout up` holding all of them) exports what it
//! observes: workers record stage durations and queue waits, the gateway adds job counts
//! by status read from the database at scrape time. Histograms get explicit buckets, so
//! they render as Prometheus histograms that can be summed across worker replicas.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Seconds a stage ran, by `stage` and `outcome`.
pub const STAGE_DURATION: &str = "rollout_stage_duration_seconds";
/// Seconds a stage message waited in its queue before a worker claimed it, by `stage`.
pub const QUEUE_WAIT: &str = "rollout_queue_wait_seconds";
/// Jobs that reached a terminal status, by `status` (counted by the process that ended them).
pub const JOBS_FINISHED: &str = "rollout_jobs_finished_total";
/// Jobs in the database by `status` (gateway, at scrape time).
pub const JOBS_BY_STATUS: &str = "rollout_jobs";
/// Tasks accepted by the gateway.
pub const JOBS_SUBMITTED: &str = "rollout_jobs_submitted_total";

/// Seconds from a sandbox start call to its tools answering, by `backend`.
pub const SANDBOX_READY: &str = "rollout_sandbox_ready_seconds";
/// Sandbox starts that failed, by `backend`.
pub const SANDBOX_START_FAILURES: &str = "rollout_sandbox_start_failures_total";
/// Sandboxes removed by the reaper, by `reason`.
pub const SANDBOXES_REAPED: &str = "rollout_sandboxes_reaped_total";

const BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0, 600.0, 1800.0, 3600.0,
];

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the global recorder once and returns its handle (later calls return the same
/// handle, so tests and `rollout up` can call it freely).
pub fn install() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), BUCKETS)
                .expect("bucket list is non-empty");
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            // Another recorder may already be installed (an embedding application's);
            // then ours still renders what is recorded through it directly.
            let _ = metrics::set_global_recorder(recorder);
            let upkeep = handle.clone();
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    let mut tick = tokio::time::interval(std::time::Duration::from_secs(5));
                    loop {
                        tick.tick().await;
                        upkeep.run_upkeep();
                    }
                });
            }
            handle
        })
        .clone()
}
