//! Results: the one row each job ends with, read in `seq` order by trainers and by the
//! reconciler that re-publishes those not yet on the results stream.

use async_trait::async_trait;

use super::dialect::Dialect;
use super::query::query;
use super::rows::ResultRow;
use super::sql_store::SqlStore;
use super::{StoreResult, sql};
use rollout_core::domain::EpochMs;
use rollout_core::domain::JobResult;

/// Reading results and recording that they were published.
#[async_trait]
pub trait ResultStore: Send + Sync {
    /// Results with `seq > after`, in `seq` order: at most `limit`, and no more than fit
    /// in `max_bytes` of stored output and error (but at least one, however large).
    async fn results_after(
        &self,
        batch: Option<&str>,
        after: i64,
        limit: i64,
        max_bytes: i64,
    ) -> StoreResult<Vec<JobResult>>;
    /// The result of one job.
    async fn result(&self, job_id: &str) -> StoreResult<Option<JobResult>>;
    /// Marks results as published on the results stream. This is bookkeeping for the
    /// reconciler, which re-publishes unmarked results (deduplicated by the server), so a
    /// database may apply it shortly after returning (SQLite coalesces marks).
    async fn mark_published(&self, seqs: &[i64], now: EpochMs) -> StoreResult<()>;
    /// Results not yet marked published that were written before `before`.
    async fn unpublished_results(&self, before: EpochMs, limit: i64)
    -> StoreResult<Vec<JobResult>>;
}

#[async_trait]
impl<D: Dialect> ResultStore for SqlStore<D> {
    async fn results_after(
        &self,
        batch: Option<&str>,
        after: i64,
        limit: i64,
        max_bytes: i64,
    ) -> StoreResult<Vec<JobResult>> {
        let page = match batch {
            Some(b) => query(sql::RESULTS_AFTER_IN_BATCH)
                .bind(after)
                .bind(limit)
                .bind(max_bytes)
                .bind(b),
            None => query(sql::RESULTS_AFTER)
                .bind(after)
                .bind(limit)
                .bind(max_bytes),
        };
        let mut conn = self.reader().await?;
        let rows: Vec<ResultRow> = page.fetch_all(&mut *conn).await?;
        rows.into_iter().map(ResultRow::into_result).collect()
    }

    async fn result(&self, job_id: &str) -> StoreResult<Option<JobResult>> {
        let mut conn = self.reader().await?;
        let row: Option<ResultRow> = query(sql::RESULT_OF_JOB)
            .bind(job_id)
            .fetch_optional(&mut *conn)
            .await?;
        row.map(ResultRow::into_result).transpose()
    }

    async fn mark_published(&self, seqs: &[i64], now: EpochMs) -> StoreResult<()> {
        if seqs.is_empty() {
            return Ok(());
        }
        self.db.mark_published(seqs, now).await
    }

    async fn unpublished_results(
        &self,
        before: EpochMs,
        limit: i64,
    ) -> StoreResult<Vec<JobResult>> {
        let mut conn = self.reader().await?;
        let rows: Vec<ResultRow> = query(sql::UNPUBLISHED)
            .bind(before)
            .bind(limit)
            .fetch_all(&mut *conn)
            .await?;
        rows.into_iter().map(ResultRow::into_result).collect()
    }
}
