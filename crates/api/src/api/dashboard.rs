//! `/v1/dashboard`: what the status page shows, read from the dashboard views.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::views::{
    BackendLoad, BatchProgress, FailureReason, SamplingProgress, SandboxCount, StageQueue,
    ThroughputMinute,
};

/// p50, p90 and p99 of a set of durations (ms); absent when the set is empty.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Percentiles {
    /// How many durations.
    pub count: u64,
    /// Median.
    pub p50: Option<f64>,
    /// 90th percentile.
    pub p90: Option<f64>,
    /// 99th percentile.
    pub p99: Option<f64>,
}

impl Percentiles {
    /// The percentiles of `values` (linear interpolation between the closest ranks, as
    /// Postgres's `percentile_cont`).
    pub fn of(mut values: Vec<f64>) -> Self {
        values.sort_by(f64::total_cmp);
        let at = |q: f64| -> Option<f64> {
            let last = values.len().checked_sub(1)?;
            #[allow(clippy::cast_precision_loss)] // counts far below 2^52
            let rank = q * last as f64;
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // 0..=last
            let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
            #[allow(clippy::cast_precision_loss)]
            let frac = rank - lo as f64;
            Some(values[lo] + (values[hi] - values[lo]) * frac)
        };
        Percentiles {
            count: values.len() as u64,
            p50: at(0.5),
            p90: at(0.9),
            p99: at(0.99),
        }
    }
}

/// One stage: its queue now and its times over the window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct StageView {
    /// The `stage_queue` row.
    pub queue: StageQueue,
    /// Queued → started, of the stages that finished in the window, of jobs that have
    /// ended (ms).
    pub wait_ms: Percentiles,
    /// Started → finished, of the same (ms).
    pub work_ms: Percentiles,
}

/// Results over the window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Throughput {
    /// Results per minute and status (`throughput_per_minute` rows).
    pub per_minute: Vec<ThroughputMinute>,
    /// Results in the window, whatever their status.
    pub jobs: i64,
    /// Results per second over the last full minute and the current one so far.
    pub recent_jobs_per_s: f64,
}

/// Response of `GET /v1/dashboard`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Dashboard {
    /// When it was read (epoch ms).
    pub generated_at: i64,
    /// The window of `throughput`, the stages' times and `failures` (ms).
    pub window_ms: i64,
    /// The latest batches (`batch_progress`).
    pub batches: Vec<BatchProgress>,
    /// The three stages, in pipeline order.
    pub stages: Vec<StageView>,
    /// Results over the window.
    pub throughput: Throughput,
    /// Inference backends with health and load (`backend_load`).
    pub backends: Vec<BackendLoad>,
    /// Failure reasons over the window, as `failures_by_reason` groups them, most
    /// recent first (grouped from the window's latest 2,000 failures).
    pub failures: Vec<FailureReason>,
    /// Live RUN sandboxes per node (`sandbox_counts`).
    pub sandboxes: Vec<SandboxCount>,
    /// The latest dynamic-sampling batches (`sampling_progress`).
    pub sampling: Vec<SamplingProgress>,
    /// The current policy version and the weight update in progress.
    #[serde(default)]
    pub policy: rollout_core::domain::policy::PolicyState,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate_like_percentile_cont() {
        let p = Percentiles::of((1..=10).map(f64::from).collect());
        assert_eq!(p.count, 10);
        assert_eq!(p.p50, Some(5.5));
        assert!((p.p90.unwrap() - 9.1).abs() < 1e-9);
        assert!((p.p99.unwrap() - 9.91).abs() < 1e-9);
        let one = Percentiles::of(vec![7.0]);
        assert_eq!((one.p50, one.p99), (Some(7.0), Some(7.0)));
        assert_eq!(Percentiles::of(Vec::new()), Percentiles::default());
    }
}
