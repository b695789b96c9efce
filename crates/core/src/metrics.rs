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

/// Generation requests sent to inference backends (attempts, retries included), by
/// `backend`.
pub const BACKEND_REQUESTS: &str = "rollout_backend_requests_total";
/// Generation attempts that failed with a connection error, a timeout or a 5xx, by
/// `backend`.
pub const BACKEND_ERRORS: &str = "rollout_backend_errors_total";
/// Seconds a generation request took, answer included, by `backend`.
pub const BACKEND_LATENCY: &str = "rollout_backend_latency_seconds";
/// Whether the last health probe of a backend succeeded (1) or not (0), by `backend`.
pub const BACKEND_HEALTHY: &str = "rollout_backend_healthy";
/// Jobs assigned to a backend (in RUN), by `backend`, as of the last probe.
pub const BACKEND_ACTIVE: &str = "rollout_backend_active_jobs";
/// Jobs moved off a failed backend mid-episode, by the backend left (`from`).
pub const BACKEND_SWITCHES: &str = "rollout_backend_switches_total";
/// Seconds of the RUN loop's own work per turn (everything but waiting for the backend
/// and the tools).
pub const TURN_OVERHEAD: &str = "rollout_agent_turn_overhead_seconds";
/// Agent episodes by how they ended (`finish_reason`).
pub const EPISODES: &str = "rollout_agent_episodes_total";
/// Drift checks by `model` and verdict (`drift` = `true`/`false`, or `error` when the
/// check could not be made, e.g. the template refused to re-render the conversation):
/// the drift rate of a model is its `drift="true"` count over all of its checks.
pub const DRIFT_CHECKS: &str = "rollout_agent_drift_checks_total";

/// The policy version a process tags tokens with (RUN workers; absent before the first
/// announcement).
pub const POLICY_VERSION: &str = "rollout_policy_version";
/// Seconds a turn waited for a weight update to end before its generation was sent.
pub const TURN_HELD: &str = "rollout_agent_turn_held_seconds";
/// Generations the server aborted that the turn went on from (partial rollouts).
pub const GENERATIONS_CONTINUED: &str = "rollout_agent_generations_continued_total";

const BUCKETS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
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
