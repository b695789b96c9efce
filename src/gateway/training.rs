//! `GET /v1/training`: the training view, computed from the results' summary columns
//! (written with each result, see the `result_stats` migration) and the dashboard
//! views. Each batch's distributions come from its latest `max_results` results, read
//! through the `(batch_id, seq)` index, so the cost follows what is asked, not the
//! history.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::State;
use serde::Deserialize;

use super::AppState;
use super::error::{ApiError, ApiErrorBody};
use super::params::{self, ApiQuery, CheckQuery};
use crate::api::dashboard::Percentiles;
use crate::api::training::{
    BatchTraining, Count, MinuteTraining, StageMinute, Training, VersionReward,
};
use crate::domain::EpochMs;
use crate::store::{BatchProgress, DashboardStore, ResultStats, StoreResult};

/// The default window of the per-minute series: an hour.
const DEFAULT_WINDOW_MS: i64 = 3_600_000;
/// The longest window: a day.
const MAX_WINDOW_MS: i64 = 24 * 3_600_000;
/// Batches shown by default.
const DEFAULT_BATCHES: i64 = 20;
/// The most batches a request may ask for.
const MAX_BATCHES: i64 = 200;
/// Results read per batch by default.
const DEFAULT_RESULTS: i64 = 10_000;
/// The most results per batch a request may ask for.
const MAX_RESULTS: i64 = 100_000;
/// The latest stage timings the latency series is computed from.
const MAX_TIMINGS: i64 = 50_000;
const MINUTE: i64 = 60_000;

/// Query of `GET /v1/training`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainingQuery {
    /// How many of the latest batches.
    batches: Option<i64>,
    /// Window of the per-minute series (ms).
    window_ms: Option<i64>,
    /// Results read per batch for its distributions.
    max_results: Option<i64>,
}

impl CheckQuery for TrainingQuery {
    fn check(&self) -> Result<(), ApiError> {
        params::check_range("batches", self.batches, MAX_BATCHES)?;
        params::check_range("window_ms", self.window_ms, MAX_WINDOW_MS)?;
        params::check_range("max_results", self.max_results, MAX_RESULTS)
    }
}

/// What a training run follows: reward by batch, by policy version and per minute;
/// per batch the finish reasons, turns, response lengths and tool-error rate; results
/// and stage latency per minute.
#[utoipa::path(
    get,
    path = "/v1/training",
    tag = "service",
    params(
        ("batches" = Option<i64>, Query, description = "How many of the latest batches (default 20)", minimum = 0, maximum = 200),
        ("window_ms" = Option<i64>, Query, description = "Window of the per-minute series (ms, default an hour)", minimum = 0, maximum = 86_400_000),
        ("max_results" = Option<i64>, Query, description = "Results read per batch for its distributions, its latest (default 10000)", minimum = 0, maximum = 100_000),
    ),
    responses(
        (status = 200, body = Training),
        (status = 400, description = "Invalid input; `field` names the problem", body = ApiErrorBody),
        (status = 503, description = "Database unavailable; retry", body = ApiErrorBody),
    )
)]
pub async fn training(
    State(state): State<AppState>,
    ApiQuery(q): ApiQuery<TrainingQuery>,
) -> Result<Json<Training>, ApiError> {
    let now = EpochMs::now().as_millis();
    let t = read(
        &*state.store,
        now,
        q.window_ms.unwrap_or(DEFAULT_WINDOW_MS),
        q.batches.unwrap_or(DEFAULT_BATCHES),
        q.max_results.unwrap_or(DEFAULT_RESULTS),
    )
    .await?;
    Ok(Json(t))
}

/// The training view as of `now` (epoch ms): the latest `batches` batches with up to
/// `max_results` results each, and the per-minute series over `window_ms`.
pub async fn read(
    store: &dyn DashboardStore,
    now: i64,
    window_ms: i64,
    batches: i64,
    max_results: i64,
) -> StoreResult<Training> {
    let since = now - window_ms;
    let mut progress = store.batch_progress(batches).await?;
    progress.reverse();
    let mut all = Vec::new();
    let mut out = Vec::with_capacity(progress.len());
    for b in &progress {
        let rows = store.result_stats(&b.batch_id, max_results).await?;
        out.push(batch_training(b, &rows));
        all.extend(rows);
    }
    let first_minute = since - since.rem_euclid(MINUTE);
    let minutes = minutes(store.throughput(first_minute).await?);
    let timings = store.stage_timings(since, MAX_TIMINGS).await?;
    Ok(Training {
        generated_at: now,
        window_ms,
        batches: out,
        policy_versions: policy_versions(&all),
        minutes,
        stage_latency: stage_latency(&timings),
    })
}

/// One batch's summary from its results' rows.
fn batch_training(b: &BatchProgress, rows: &[ResultStats]) -> BatchTraining {
    let rewards: Vec<f64> = rows
        .iter()
        .filter(|r| r.status == "done")
        .filter_map(|r| r.reward)
        .collect();
    let (reward_mean, reward_std) = mean_std(&rewards);
    let mut reasons: BTreeMap<String, i64> = BTreeMap::new();
    let mut turns: BTreeMap<i64, i64> = BTreeMap::new();
    let mut lengths = Vec::new();
    let (mut calls, mut errors) = (0, 0);
    for r in rows {
        let reason = r
            .finish_reason
            .clone()
            .unwrap_or_else(|| format!("({})", r.status));
        *reasons.entry(reason).or_default() += 1;
        if let Some(t) = r.turns {
            *turns.entry(t).or_default() += 1;
        }
        if let Some(n) = r.response_tokens {
            lengths.push(n);
        }
        calls += r.tool_calls.unwrap_or(0);
        errors += r.tool_errors.unwrap_or(0);
    }
    let mut finish_reasons: Vec<Count> = reasons
        .into_iter()
        .map(|(value, jobs)| Count { value, jobs })
        .collect();
    finish_reasons.sort_by(|a, b| b.jobs.cmp(&a.jobs).then_with(|| a.value.cmp(&b.value)));
    let turn_count: i64 = turns.values().sum();
    let turn_sum: i64 = turns.iter().map(|(t, n)| t * n).sum();
    #[allow(clippy::cast_precision_loss)] // counts far below 2^52
    BatchTraining {
        batch_id: b.batch_id.clone(),
        created_at: b.created_at,
        results: b.finished,
        read: count(rows.len()),
        done: count(rows.iter().filter(|r| r.status == "done").count()),
        reward_mean,
        reward_std,
        finish_reasons,
        turns: turns
            .into_iter()
            .map(|(t, jobs)| Count {
                value: t.to_string(),
                jobs,
            })
            .collect(),
        turns_mean: (turn_count > 0).then(|| turn_sum as f64 / turn_count as f64),
        response_tokens: Percentiles::of(lengths.iter().map(|&n| n as f64).collect()),
        response_tokens_max: lengths.iter().copied().max(),
        response_tokens_histogram: histogram(&lengths),
        tool_calls: calls,
        tool_errors: errors,
        tool_error_rate: (calls > 0).then(|| errors as f64 / calls as f64),
    }
}

/// A count as the API's integer.
fn count(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Mean and population standard deviation, absent for no values.
fn mean_std(values: &[f64]) -> (Option<f64>, Option<f64>) {
    if values.is_empty() {
        return (None, None);
    }
    #[allow(clippy::cast_precision_loss)]
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
    (Some(mean), Some(var.sqrt()))
}

/// Lengths in power-of-two buckets, in order: `0`, `1`, `2` (2–3), `4` (4–7), …
fn histogram(lengths: &[i64]) -> Vec<Count> {
    let mut buckets: BTreeMap<i64, i64> = BTreeMap::new();
    for &n in lengths {
        let low = if n <= 0 {
            0
        } else {
            1_i64 << (63 - n.leading_zeros())
        };
        *buckets.entry(low).or_default() += 1;
    }
    buckets
        .into_iter()
        .map(|(low, jobs)| Count {
            value: low.to_string(),
            jobs,
        })
        .collect()
}

/// Results and mean reward per policy version, in version order.
fn policy_versions(rows: &[ResultStats]) -> Vec<VersionReward> {
    let mut by: BTreeMap<i64, (i64, Vec<f64>)> = BTreeMap::new();
    for r in rows {
        let Some(v) = r.policy_version else { continue };
        let e = by.entry(v).or_default();
        e.0 += 1;
        if r.status == "done"
            && let Some(reward) = r.reward
        {
            e.1.push(reward);
        }
    }
    by.into_iter()
        .map(|(policy_version, (results, rewards))| VersionReward {
            policy_version,
            results,
            done: count(rewards.len()),
            reward_mean: mean_std(&rewards).0,
        })
        .collect()
}

/// The per-minute series from `throughput_per_minute`'s rows (minute × status).
fn minutes(rows: Vec<crate::store::ThroughputMinute>) -> Vec<MinuteTraining> {
    let mut by: BTreeMap<i64, MinuteTraining> = BTreeMap::new();
    for r in rows {
        let m = by.entry(r.minute).or_insert(MinuteTraining {
            minute: r.minute,
            results: 0,
            done: 0,
            reward_mean: None,
        });
        m.results += r.jobs;
        if r.status == "done" {
            m.done = r.jobs;
            m.reward_mean = r.reward_mean;
        }
    }
    by.into_values().collect()
}

/// Stage latency percentiles per stage and minute finished, in minute order.
fn stage_latency(timings: &[crate::store::StageTiming]) -> Vec<StageMinute> {
    type Times = (Vec<f64>, Vec<f64>);
    let mut by: BTreeMap<(i64, usize, &str), Times> = BTreeMap::new();
    let position = |s: &str| match s {
        "init" => 0,
        "run" => 1,
        _ => 2,
    };
    for t in timings {
        let minute = t.finished_at - t.finished_at.rem_euclid(MINUTE);
        let e = by
            .entry((minute, position(&t.stage), t.stage.as_str()))
            .or_default();
        #[allow(clippy::cast_precision_loss)] // durations in ms
        {
            e.0.extend(t.wait_ms.map(|v| v as f64));
            e.1.extend(t.work_ms.map(|v| v as f64));
        }
    }
    by.into_iter()
        .map(|((minute, _, stage), (wait, work))| StageMinute {
            stage: stage.to_string(),
            minute,
            wait_ms: Percentiles::of(wait),
            work_ms: Percentiles::of(work),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(
        status: &str,
        reward: Option<f64>,
        reason: Option<&str>,
        turns: i64,
        len: i64,
    ) -> ResultStats {
        ResultStats {
            batch_id: "b".into(),
            status: status.into(),
            reward,
            finish_reason: reason.map(str::to_string),
            turns: Some(turns),
            response_tokens: Some(len),
            tool_calls: Some(turns),
            tool_errors: Some(i64::from(status != "done")),
            policy_version: Some(turns % 2),
            created_at: 0,
        }
    }

    #[test]
    fn a_batch_is_summarised_from_its_rows() {
        let b = BatchProgress {
            batch_id: "b".into(),
            created_at: 5,
            submitted: 4,
            finished: 4,
            in_flight: 0,
            done: 3,
            failed: 1,
            cancelled: 0,
            timed_out: 0,
            stale: 0,
            rewarded: 3,
            reward_mean: None,
            last_result_at: None,
        };
        let rows = vec![
            row("done", Some(1.0), Some("answered"), 2, 10),
            row("done", Some(0.0), Some("answered"), 3, 0),
            row("done", Some(1.0), Some("max_turns"), 3, 17),
            ResultStats {
                finish_reason: None,
                turns: None,
                response_tokens: None,
                ..row("failed", None, None, 0, 0)
            },
        ];
        let t = batch_training(&b, &rows);
        assert_eq!((t.results, t.read, t.done), (4, 4, 3));
        assert!((t.reward_mean.unwrap() - 2.0 / 3.0).abs() < 1e-12);
        assert!((t.reward_std.unwrap() - (2.0f64 / 9.0).sqrt()).abs() < 1e-12);
        let reasons: Vec<(&str, i64)> = t
            .finish_reasons
            .iter()
            .map(|c| (c.value.as_str(), c.jobs))
            .collect();
        assert_eq!(
            reasons,
            [("answered", 2), ("(failed)", 1), ("max_turns", 1)]
        );
        let turns: Vec<(&str, i64)> = t.turns.iter().map(|c| (c.value.as_str(), c.jobs)).collect();
        assert_eq!(turns, [("2", 1), ("3", 2)]);
        assert!((t.turns_mean.unwrap() - 8.0 / 3.0).abs() < 1e-12);
        let hist: Vec<(&str, i64)> = t
            .response_tokens_histogram
            .iter()
            .map(|c| (c.value.as_str(), c.jobs))
            .collect();
        assert_eq!(hist, [("0", 1), ("8", 1), ("16", 1)]);
        assert_eq!(t.response_tokens_max, Some(17));
        assert_eq!((t.tool_calls, t.tool_errors), (8, 1));
        assert!((t.tool_error_rate.unwrap() - 0.125).abs() < 1e-12);
        let versions = policy_versions(&rows);
        assert_eq!(versions.len(), 2);
        assert_eq!(
            (
                versions[0].policy_version,
                versions[0].results,
                versions[0].done
            ),
            (0, 2, 1)
        );
        assert_eq!(versions[1].reward_mean, Some(0.5));
    }

    #[test]
    fn stage_latency_is_per_minute_and_stage_in_pipeline_order() {
        let t = |stage: &str, at: i64, work: i64| crate::store::StageTiming {
            stage: stage.into(),
            wait_ms: Some(1),
            work_ms: Some(work),
            finished_at: at,
        };
        let s = stage_latency(&[
            t("run", 61_000, 10),
            t("init", 119_000, 4),
            t("run", 70_000, 30),
            t("eval", 5, 2),
        ]);
        let keys: Vec<(i64, &str, u64)> = s
            .iter()
            .map(|m| (m.minute, m.stage.as_str(), m.work_ms.count))
            .collect();
        assert_eq!(
            keys,
            [(0, "eval", 1), (60_000, "init", 1), (60_000, "run", 2)]
        );
        assert_eq!(s[2].work_ms.p50, Some(20.0));
    }
}
