//! `/v1/results`: every job's result, in a stable order, by long-poll or Server-Sent Events.
//!
//! Results are ordered by `seq`, which the store hands out in commit order, so a reader
//! that remembers the last `seq` it saw and asks for `after=<seq>` gets every later
//! result exactly once, across any number of calls and reconnects. New results wake
//! waiting readers through a subscription to `rollout.done.>`; readers also re-check the
//! database every half second, so a missed wake-up costs at most that.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::Stream;
use serde::Deserialize;
use utoipa::IntoParams;

use super::AppState;
use super::error::{ApiError, ApiErrorBody};
use super::params::{ApiQuery, CheckQuery, check_opt_text, check_range, last_event_id};
use crate::api::results::ResultPage;
use crate::domain::JobResult;

/// Query of `GET /v1/results`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ResultsQuery {
    /// Only results of this batch.
    #[param(pattern = "^[^\\u0000]{1,256}$")]
    pub batch: Option<String>,
    /// Return results with `seq` greater than this (default 0: from the start).
    #[param(minimum = 0)]
    pub after: Option<i64>,
    /// If nothing is available yet, wait up to this long for a result (ms, default 0; at
    /// most `gateway.max_wait_ms`, which the served document states as the maximum).
    #[param(minimum = 0, maximum = 60000)]
    pub wait_ms: Option<i64>,
    /// Page size (default 100, at most 1000). A page also ends before it would exceed
    /// `gateway.max_page_bytes` (16 MiB by default), but holds at least one result.
    #[param(minimum = 0, maximum = 1000)]
    pub limit: Option<i64>,
}

impl CheckQuery for ResultsQuery {
    /// `wait_ms`'s bounds depend on a setting, so the handler checks it.
    fn check(&self) -> Result<(), ApiError> {
        check_opt_text("batch", self.batch.as_deref())?;
        check_range("after", self.after, i64::MAX)?;
        check_range("limit", self.limit, 1000)
    }
}

/// Query of `GET /v1/results/stream`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct StreamQuery {
    /// Only results of this batch.
    #[param(pattern = "^[^\\u0000]{1,256}$")]
    pub batch: Option<String>,
    /// Start after this `seq`; the `Last-Event-ID` header, sent by reconnecting
    /// EventSource clients, wins over it.
    #[param(minimum = 0)]
    pub after: Option<i64>,
}

impl CheckQuery for StreamQuery {
    fn check(&self) -> Result<(), ApiError> {
        check_opt_text("batch", self.batch.as_deref())?;
        check_range("after", self.after, i64::MAX)
    }
}

const RECHECK: Duration = Duration::from_millis(500);

/// The byte budget of one read of results or jobs (`gateway.max_page_bytes`).
pub(super) fn page_bytes(state: &AppState) -> i64 {
    i64::try_from(state.settings.gateway.max_page_bytes).unwrap_or(i64::MAX)
}

/// A reader's own view of the result signal. Each request holds one, marks the signal
/// seen before each database read, and so sleeps until a result newer than that read is
/// published (a shared receiver would report the same change for ever and spin).
pub(super) struct Wakeup {
    rx: tokio::sync::watch::Receiver<u64>,
}

impl Wakeup {
    pub(super) fn new(state: &AppState) -> Self {
        Self {
            rx: state.results_signal.clone(),
        }
    }

    /// Call right before reading the database.
    pub(super) fn mark_seen(&mut self) {
        self.rx.borrow_and_update();
    }

    /// Waits until a result may have arrived since the last `mark_seen`, at most
    /// `RECHECK` (or until `deadline`).
    pub(super) async fn wait(&mut self, state: &AppState, deadline: tokio::time::Instant) {
        let until = deadline.min(tokio::time::Instant::now() + RECHECK);
        tokio::select! {
            _ = self.rx.changed() => {}
            _ = tokio::time::sleep_until(until) => {}
            _ = state.shutdown.cancelled() => {}
        }
    }
}

/// Results after a cursor, waiting up to `wait_ms` when none are ready.
#[utoipa::path(
    get,
    path = "/v1/results",
    tag = "results",
    params(ResultsQuery),
    responses(
        (status = 200, body = ResultPage),
        (status = 400, body = ApiErrorBody),
    )
)]
pub async fn results(
    State(state): State<AppState>,
    ApiQuery(q): ApiQuery<ResultsQuery>,
) -> Result<Json<ResultPage>, ApiError> {
    let max_wait_ms = i64::try_from(state.settings.gateway.max_wait_ms).unwrap_or(i64::MAX);
    check_range("wait_ms", q.wait_ms, max_wait_ms)?;
    let (batch, after) = (q.batch, q.after.unwrap_or(0));
    let wait_ms = q.wait_ms.unwrap_or(0);
    let limit = q.limit.unwrap_or(100).max(1);
    // `wait_ms` was checked to be in 0..=max_wait_ms above.
    let wait = Duration::from_millis(u64::try_from(wait_ms).unwrap_or(0));
    let deadline = tokio::time::Instant::now() + wait;
    let mut wakeup = Wakeup::new(&state);
    loop {
        wakeup.mark_seen();
        let results = state
            .store
            .results_after(batch.as_deref(), after, limit, page_bytes(&state))
            .await?;
        if !results.is_empty()
            || tokio::time::Instant::now() >= deadline
            || state.shutdown.is_cancelled()
        {
            let next_cursor = results.last().map_or(after, |r| r.seq);
            return Ok(Json(ResultPage {
                results,
                next_cursor,
            }));
        }
        wakeup.wait(&state, deadline).await;
    }
}

/// The same results as a Server-Sent Events stream: one `result` event per result, with
/// the result's `seq` as the event id, so a reconnecting client resumes where it left off.
#[utoipa::path(
    get,
    path = "/v1/results/stream",
    tag = "results",
    params(StreamQuery),
    responses(
        (status = 200, description = "text/event-stream of `result` events whose data is a JobResult"),
        (status = 400, body = ApiErrorBody),
    )
)]
pub async fn results_stream(
    State(state): State<AppState>,
    headers: HeaderMap,
    ApiQuery(q): ApiQuery<StreamQuery>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let batch = q.batch;
    let after = last_event_id(&headers, "a result seq")?.unwrap_or(q.after.unwrap_or(0));
    struct Cursor {
        state: AppState,
        wakeup: Wakeup,
        batch: Option<String>,
        after: i64,
        buffer: VecDeque<JobResult>,
    }
    let init = Cursor {
        wakeup: Wakeup::new(&state),
        state,
        batch,
        after,
        buffer: VecDeque::new(),
    };
    let stream = futures::stream::unfold(init, |mut c| async move {
        loop {
            if let Some(r) = c.buffer.pop_front() {
                c.after = r.seq;
                let event = Event::default()
                    .event("result")
                    .id(r.seq.to_string())
                    .json_data(&r)
                    .expect("result serialises");
                return Some((Ok(event), c));
            }
            if c.state.shutdown.is_cancelled() {
                return None;
            }
            c.wakeup.mark_seen();
            match c
                .state
                .store
                .results_after(c.batch.as_deref(), c.after, 100, page_bytes(&c.state))
                .await
            {
                Ok(rows) if !rows.is_empty() => c.buffer.extend(rows),
                Ok(_) => {
                    let deadline = tokio::time::Instant::now() + RECHECK;
                    let Cursor { wakeup, state, .. } = &mut c;
                    wakeup.wait(state, deadline).await;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "result stream cannot read the database; retrying");
                    tokio::time::sleep(RECHECK).await;
                }
            }
        }
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}
