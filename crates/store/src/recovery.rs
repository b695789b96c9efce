//! What the reconciler asks of the store: jobs whose hand-off may be lost, leases that
//! lapsed, and RUN jobs whose node is gone, with the transitions that recover them.

use async_trait::async_trait;

use super::dialect::Dialect;
use super::query::query;
use super::rows::StaleRow;
use super::sql_store::SqlStore;
use super::{StoreResult, sql};
use rollout_core::domain::EpochMs;
use rollout_core::domain::{Stage, Status, WorkMessage};

/// A job whose hand-off may have been lost, for the reconciler to re-publish.
#[derive(Debug, Clone)]
pub struct StaleJob {
    /// The message to re-publish.
    pub msg: WorkMessage,
    /// Where RUN goes (`any` or a node), for RUN messages.
    pub route: Option<String>,
    /// `queued` (its message may be lost) or `running` (its lease lapsed and no
    /// redelivery took it over: its message is lost or out of deliveries).
    pub status: Status,
    /// Stage starts so far.
    pub attempts: i64,
}

/// A job waiting for RUN on a node that stopped renewing its sandbox's lease.
#[derive(Debug, Clone)]
pub struct AbandonedRun {
    /// The job's RUN stage entry.
    pub msg: WorkMessage,
    /// Times it was sent back to INIT already.
    pub restarts: i64,
    /// The node that held its sandbox.
    pub node: String,
}

/// The reconciler's queries and recovering transitions.
#[async_trait]
pub trait RecoveryStore: Send + Sync {
    /// Live jobs with no change since `before` (queued) or whose lease ended before it
    /// (running), oldest first.
    async fn stale_jobs(&self, before: EpochMs, limit: i64) -> StoreResult<Vec<StaleJob>>;
    /// Queued jobs handed off between `since` and `before` and not touched since, oldest
    /// first: hand-offs whose message may have been lost with the process that wrote
    /// them (see the reconciler), each listed once.
    async fn overdue_handoffs(
        &self,
        before: EpochMs,
        since: EpochMs,
        limit: i64,
    ) -> StoreResult<Vec<StaleJob>>;
    /// Marks a queued job as just re-published, so the next sweep skips it.
    async fn touch(&self, msg: &WorkMessage, now: EpochMs) -> StoreResult<bool>;
    /// Puts a running job whose lease lapsed back in the queue under a new stage entry
    /// (so its new message gets a new id and fresh deliveries); `None` if it moved on.
    async fn requeue(&self, msg: &WorkMessage, now: EpochMs) -> StoreResult<Option<WorkMessage>>;
    /// Jobs queued for RUN whose sandbox's lease ended before `before` (their node is
    /// gone), oldest lease first.
    async fn abandoned_runs(&self, before: EpochMs, limit: i64) -> StoreResult<Vec<AbandonedRun>>;
    /// Sends a job still queued for RUN in the stage entry `msg` back to INIT, unless it
    /// was sent back `max_restarts` times already; `None` if it moved on or ran out.
    async fn restart_queued(
        &self,
        msg: &WorkMessage,
        max_restarts: i64,
        now: EpochMs,
    ) -> StoreResult<Option<WorkMessage>>;
}

#[async_trait]
impl<D: Dialect> RecoveryStore for SqlStore<D> {
    async fn stale_jobs(&self, before: EpochMs, limit: i64) -> StoreResult<Vec<StaleJob>> {
        let mut conn = self.reader().await?;
        let rows: Vec<StaleRow> = query(sql::SELECT_STALE)
            .bind(before)
            .bind(limit)
            .fetch_all(&mut *conn)
            .await?;
        rows.into_iter().map(StaleRow::into_stale).collect()
    }

    async fn overdue_handoffs(
        &self,
        before: EpochMs,
        since: EpochMs,
        limit: i64,
    ) -> StoreResult<Vec<StaleJob>> {
        let mut conn = self.reader().await?;
        let rows: Vec<StaleRow> = query(sql::SELECT_OVERDUE)
            .bind(before)
            .bind(since)
            .bind(limit)
            .fetch_all(&mut *conn)
            .await?;
        rows.into_iter().map(StaleRow::into_stale).collect()
    }

    async fn touch(&self, msg: &WorkMessage, now: EpochMs) -> StoreResult<bool> {
        let msg = msg.clone();
        self.write(move |conn: &mut D::Conn| {
            Box::pin(async move {
                let n = query(sql::TOUCH)
                    .bind(&msg.job_id)
                    .bind(msg.epoch)
                    .bind(now)
                    .execute(conn)
                    .await?;
                Ok(n == 1)
            })
        })
        .await
    }

    async fn requeue(&self, msg: &WorkMessage, now: EpochMs) -> StoreResult<Option<WorkMessage>> {
        let msg = msg.clone();
        self.write(move |conn: &mut D::Conn| {
            Box::pin(async move {
                let row: Option<(i64,)> = query(sql::REQUEUE)
                    .bind(&msg.job_id)
                    .bind(msg.epoch)
                    .bind(now)
                    .fetch_optional(conn)
                    .await?;
                Ok(row.map(|(epoch,)| WorkMessage { epoch, ..msg }))
            })
        })
        .await
    }

    async fn abandoned_runs(&self, before: EpochMs, limit: i64) -> StoreResult<Vec<AbandonedRun>> {
        let mut conn = self.reader().await?;
        let rows: Vec<(String, i64, i64, String)> = query(sql::ABANDONED_RUNS)
            .bind(before)
            .bind(limit)
            .fetch_all(&mut *conn)
            .await?;
        Ok(rows
            .into_iter()
            .map(|(job_id, epoch, restarts, node)| AbandonedRun {
                msg: WorkMessage {
                    job_id,
                    stage: Stage::Run,
                    epoch,
                },
                restarts,
                node,
            })
            .collect())
    }

    async fn restart_queued(
        &self,
        msg: &WorkMessage,
        max_restarts: i64,
        now: EpochMs,
    ) -> StoreResult<Option<WorkMessage>> {
        let job_id = msg.job_id.clone();
        let epoch = msg.epoch;
        self.write(move |conn: &mut D::Conn| {
            Box::pin(async move {
                let row: Option<(i64,)> = query(sql::RESTART_QUEUED)
                    .bind(&job_id)
                    .bind(epoch)
                    .bind(now)
                    .bind(max_restarts)
                    .fetch_optional(conn)
                    .await?;
                Ok(row.map(|(epoch,)| WorkMessage {
                    job_id,
                    stage: Stage::Init,
                    epoch,
                }))
            })
        })
        .await
    }
}
