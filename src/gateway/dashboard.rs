//! `GET /v1/dashboard`: everything the status page shows, in one answer, read from the
//! dashboard views (so the page agrees with Grafana and with a user's own SQL).
//!
//! Stage latency percentiles are computed here over the stages that finished within
//! the window, of jobs that have ended (the views keep each row; percentiles are the
//! reader's choice), from at most [`MAX_TIMINGS`] of the latest; failure reasons are
//! grouped here from at most [`MAX_FAILURES`] of the window's latest failures. Every
//! read goes through an index to what it answers for (batch counters, unfinished jobs,
//! the window's results and ended jobs), so the page's cost does not grow with history
//! (BENCHMARKS.md, "Dashboard reads at a million jobs").

use axum::Json;
use axum::extract::State;
use serde::Deserialize;

use super::AppState;
use super::error::{ApiError, ApiErrorBody};
use super::params::{self, ApiQuery, CheckQuery};
use super::wire;
use crate::api::dashboard::{Dashboard, Percentiles, StageView, Throughput};
use crate::domain::EpochMs;
use crate::store::{DashboardStore, StageQueue, StageTiming, StoreResult, ThroughputMinute};

/// The latest stage timings the percentiles are computed from.
pub const MAX_TIMINGS: i64 = 20_000;
/// The latest failures the list of failure reasons is grouped from.
pub const MAX_FAILURES: i64 = 2_000;
/// The default window of throughput and latencies: 15 minutes.
const DEFAULT_WINDOW_MS: i64 = 15 * 60_000;
/// The longest window: a day.
const MAX_WINDOW_MS: i64 = 24 * 3_600_000;
/// Rows of the lists that can grow without bound (batches, failures, sampling batches).
const DEFAULT_LIMIT: i64 = 20;
/// The most rows those lists may ask for.
const MAX_LIMIT: i64 = 500;

/// Query of `GET /v1/dashboard`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DashboardQuery {
    /// Window of throughput and latency percentiles (ms).
    window_ms: Option<i64>,
    /// How many of the latest batches, failure reasons and sampling batches.
    limit: Option<i64>,
}

impl CheckQuery for DashboardQuery {
    fn check(&self) -> Result<(), ApiError> {
        params::check_range("window_ms", self.window_ms, MAX_WINDOW_MS)?;
        params::check_range("limit", self.limit, MAX_LIMIT)
    }
}

/// Everything the status page shows: batches, stage queues and latency percentiles,
/// throughput, backends, failures, sandboxes, sampling batches, and the policy version
/// with the weight update in progress.
#[utoipa::path(
    get,
    path = "/v1/dashboard",
    tag = "service",
    params(
        ("window_ms" = Option<i64>, Query, description = "Window of throughput, latencies and failures (ms, default 15 minutes)", minimum = 0, maximum = 86_400_000),
        ("limit" = Option<i64>, Query, description = "How many of the latest batches, failure reasons and sampling batches (default 20)", minimum = 0, maximum = 500),
    ),
    responses(
        (status = 200, body = Dashboard),
        (status = 400, description = "Invalid input; `field` names the problem", body = ApiErrorBody),
        (status = 503, description = "Database unavailable; retry", body = ApiErrorBody),
    )
)]
pub async fn dashboard(
    State(state): State<AppState>,
    ApiQuery(q): ApiQuery<DashboardQuery>,
) -> Result<Json<Dashboard>, ApiError> {
    let now = EpochMs::now().as_millis();
    let window_ms = q.window_ms.unwrap_or(DEFAULT_WINDOW_MS);
    let limit = q.limit.unwrap_or(DEFAULT_LIMIT);
    let mut d = read(&*state.store, now, window_ms, limit).await?;
    d.policy = state.store.policy_state().await?;
    Ok(Json(d))
}

/// The dashboard as of `now` (epoch ms) over `window_ms`, with `limit` rows of the
/// lists that can grow: what `GET /v1/dashboard` answers, apart from HTTP (the
/// benchmark of its cost at a long history reads it here, at a fixed `now`).
pub async fn read(
    store: &dyn DashboardStore,
    now: i64,
    window_ms: i64,
    limit: i64,
) -> StoreResult<Dashboard> {
    let since = now - window_ms;
    let timings = store.stage_timings(since, MAX_TIMINGS).await?;
    let stages = store
        .stage_queues()
        .await?
        .into_iter()
        .map(|queue| stage_view(queue, &timings))
        .collect();
    let per_minute = store.throughput(since - since.rem_euclid(60_000)).await?;
    let throughput = throughput(per_minute, since, now);
    Ok(Dashboard {
        generated_at: now,
        window_ms,
        batches: rows(store.batch_progress(limit).await?, wire::batch_progress),
        stages,
        throughput,
        backends: rows(store.backend_load().await?, wire::backend_load),
        failures: rows(
            store.failures(since, MAX_FAILURES, limit).await?,
            wire::failure_reason,
        ),
        sandboxes: rows(store.sandbox_counts().await?, wire::sandbox_count),
        sampling: rows(
            store.sampling_progress(limit).await?,
            wire::sampling_progress,
        ),
        policy: Default::default(),
    })
}

/// The store's rows of a view as the API shows them (see [`wire`]).
fn rows<R, W>(list: Vec<R>, copy: fn(R) -> W) -> Vec<W> {
    list.into_iter().map(copy).collect()
}

/// A stage's queue with the percentiles of its timings.
fn stage_view(queue: StageQueue, timings: &[StageTiming]) -> StageView {
    let of = |pick: fn(&StageTiming) -> Option<i64>| {
        #[allow(clippy::cast_precision_loss)] // durations in ms, far below 2^52
        let values = timings
            .iter()
            .filter(|t| t.stage == queue.stage)
            .filter_map(pick)
            .map(|v| v as f64)
            .collect();
        Percentiles::of(values)
    };
    StageView {
        wait_ms: of(|t| t.wait_ms),
        work_ms: of(|t| t.work_ms),
        queue: wire::stage_queue(queue),
    }
}

/// The window's totals from its minutes: every minute that began at or after the
/// window's first full minute counts, and the recent rate is the last full minute plus
/// the current one, over the time they span.
fn throughput(per_minute: Vec<ThroughputMinute>, since: i64, now: i64) -> Throughput {
    let current = now - now.rem_euclid(60_000);
    let recent_from = current - 60_000;
    let jobs = per_minute
        .iter()
        .filter(|m| m.minute + 60_000 > since)
        .map(|m| m.jobs)
        .sum();
    let recent: i64 = per_minute
        .iter()
        .filter(|m| m.minute >= recent_from)
        .map(|m| m.jobs)
        .sum();
    #[allow(clippy::cast_precision_loss)] // counts and a span of at most two minutes
    let recent_jobs_per_s = recent as f64 / ((now - recent_from).max(1) as f64 / 1000.0);
    Throughput {
        per_minute: rows(per_minute, wire::throughput_minute),
        jobs,
        recent_jobs_per_s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recent_throughput_counts_the_last_full_minute_and_this_one() {
        let m = |minute: i64, jobs: i64| ThroughputMinute {
            minute,
            status: "done".into(),
            jobs,
            reward_mean: None,
        };
        // Now is 30 s into minute 10; the window began in minute 2.
        let now = 10 * 60_000 + 30_000;
        let t = throughput(
            vec![m(2 * 60_000, 5), m(9 * 60_000, 60), m(10 * 60_000, 30)],
            2 * 60_000 + 10_000,
            now,
        );
        assert_eq!(t.jobs, 95);
        assert!((t.recent_jobs_per_s - 1.0).abs() < 1e-9, "{t:?}");
    }
}
