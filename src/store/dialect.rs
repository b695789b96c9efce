//! What differs between the two databases, and the one store built over either.
//!
//! [`SqlStore`] holds every method body once; a [`Dialect`] supplies the handful of
//! things that differ: how a write runs (SQLite queues it for its single group-commit
//! writer; Postgres gives it a pooled transaction of its own), how a job's end is
//! written so that result sequence numbers become visible in commit order, how backend
//! assignments take turns, how a list of results is marked published, and the two
//! statements whose SQL differs.

use std::future::Future;
use std::ops::DerefMut;

use futures::future::BoxFuture;

use super::query::{Conn, query};
use super::rows::JobRow;
use super::{StoreResult, sql};
use crate::domain::{EpochMs, Stage};

/// A claim of a job's stage entry (see `sql::CLAIM`): the hottest write with the hand-off,
/// one per stage of every job.
#[derive(Debug, Clone)]
pub(crate) struct StageClaim {
    pub(crate) job_id: String,
    pub(crate) stage: Stage,
    pub(crate) epoch: i64,
    pub(crate) node: String,
    pub(crate) lease_until: EpochMs,
    pub(crate) now: EpochMs,
}

/// A claimed stage handing its job to the next stage (see `sql::ADVANCE`).
#[derive(Debug, Clone)]
pub(crate) struct StageAdvance {
    pub(crate) job_id: String,
    pub(crate) stage: Stage,
    pub(crate) epoch: i64,
    pub(crate) next: Stage,
    pub(crate) now: EpochMs,
    pub(crate) route: Option<String>,
    /// The stage's output, as JSON text.
    pub(crate) output: String,
    /// The claim's token (`attempts` at the claim).
    pub(crate) attempt: i64,
}

/// One database's side of the store. Every method is safe to call from many tasks.
pub(crate) trait Dialect: Send + Sync + 'static {
    /// The connection statements run on.
    type Conn: Conn;
    /// A pooled connection for reads.
    type Reader: DerefMut<Target = Self::Conn> + Send;

    /// Ends a job by inserting its result (see `sql::FINISH_SQLITE`).
    const FINISH: &'static str;
    /// Ends a job as failed without its output (see `sql::finish_bare!`).
    const FINISH_BARE: &'static str;

    /// Applies pending migrations.
    fn migrate(&self) -> impl Future<Output = StoreResult<()>> + Send;

    /// A connection for reads (never inside a write's transaction).
    fn reader(&self) -> impl Future<Output = StoreResult<Self::Reader>> + Send;

    /// Runs `op` and returns once what it wrote is committed. `atomic` says `op` runs
    /// several writing statements that must apply all or nothing, so they need one
    /// transaction; otherwise `op` writes with one statement (it may read after it),
    /// which is atomic by itself, and a dialect may commit it without a transaction.
    fn write<T, F>(&self, atomic: bool, op: F) -> impl Future<Output = StoreResult<T>> + Send
    where
        T: Send + 'static,
        F: for<'c> FnOnce(&'c mut Self::Conn) -> BoxFuture<'c, StoreResult<T>> + Send + 'static;

    /// Runs `op`, a write of several statements (all or nothing) that inserts a result,
    /// and returns once it is committed. Result sequence numbers must become visible in
    /// the order they are handed out, so a reader paging by `seq` never skips one; and
    /// every job's end goes through here, so this is the service's hottest write.
    fn write_result<T, F>(&self, op: F) -> impl Future<Output = StoreResult<T>> + Send
    where
        T: Send + 'static,
        F: for<'c> FnOnce(&'c mut Self::Conn) -> BoxFuture<'c, StoreResult<T>> + Send + 'static;

    /// Called inside a write before it reads the backends' load and assigns one: two
    /// assignments must not both see the same counts.
    fn lock_pool(conn: &mut Self::Conn) -> impl Future<Output = StoreResult<()>> + Send;

    /// Called first in a sampling batch's launch: holds the batch's row until commit
    /// where rows are locked (Postgres), so a launch takes its rows in the order a job's
    /// end does. SQLite's single writer needs nothing.
    fn lock_batch(
        conn: &mut Self::Conn,
        batch_id: &str,
    ) -> impl Future<Output = StoreResult<()>> + Send;

    /// Claims a stage entry; returns the job's row if the claim applied. One statement
    /// (see [`write`](Dialect::write)) unless a dialect does better.
    fn claim(&self, c: StageClaim) -> impl Future<Output = StoreResult<Option<JobRow>>> + Send {
        self.write(false, move |conn: &mut Self::Conn| {
            Box::pin(async move { claim_one(conn, &c).await })
        })
    }

    /// Hands a claimed stage to the next; returns the new stage entry's epoch if it
    /// applied. One statement unless a dialect does better.
    fn advance(&self, a: StageAdvance) -> impl Future<Output = StoreResult<Option<i64>>> + Send {
        self.write(false, move |conn: &mut Self::Conn| {
            Box::pin(async move { advance_one(conn, &a).await })
        })
    }

    /// Marks results (never an empty list) as published; may apply shortly after it
    /// returns (see [`ResultStore::mark_published`](super::ResultStore::mark_published)).
    fn mark_published(
        &self,
        seqs: &[i64],
        now: EpochMs,
    ) -> impl Future<Output = StoreResult<()>> + Send;
}

/// Runs one claim as its own statement.
pub(super) async fn claim_one<C: Conn>(
    conn: &mut C,
    c: &StageClaim,
) -> StoreResult<Option<JobRow>> {
    Ok(query(sql::CLAIM)
        .bind(&c.job_id)
        .bind(c.stage.as_str())
        .bind(c.epoch)
        .bind(&c.node)
        .bind(c.lease_until)
        .bind(c.now)
        .fetch_optional(conn)
        .await?)
}

/// Runs one hand-off as its own statement.
pub(super) async fn advance_one<C: Conn>(
    conn: &mut C,
    a: &StageAdvance,
) -> StoreResult<Option<i64>> {
    let row: Option<(i64,)> = query(sql::ADVANCE)
        .bind(&a.job_id)
        .bind(a.stage.as_str())
        .bind(a.epoch)
        .bind(a.next.as_str())
        .bind(a.now)
        .bind(&a.route)
        .bind(&a.output)
        .bind(a.attempt)
        .fetch_optional(conn)
        .await?;
    Ok(row.map(|(epoch,)| epoch))
}

/// The [`Store`](super::Store) over a database of dialect `D`.
#[derive(Debug, Clone)]
pub(crate) struct SqlStore<D> {
    pub(super) db: D,
}

impl<D: Dialect> SqlStore<D> {
    /// A store over `db`.
    pub(crate) fn new(db: D) -> Self {
        Self { db }
    }

    /// Runs a single-statement write `op`; returns once it is committed.
    pub(super) async fn write<T, F>(&self, op: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: for<'c> FnOnce(&'c mut D::Conn) -> BoxFuture<'c, StoreResult<T>> + Send + 'static,
    {
        self.db.write(false, op).await
    }

    /// Runs a write `op` of several statements, all or nothing; returns once it is
    /// committed.
    pub(super) async fn write_atomic<T, F>(&self, op: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: for<'c> FnOnce(&'c mut D::Conn) -> BoxFuture<'c, StoreResult<T>> + Send + 'static,
    {
        self.db.write(true, op).await
    }

    /// A connection for reads.
    pub(super) async fn reader(&self) -> StoreResult<D::Reader> {
        self.db.reader().await
    }
}
