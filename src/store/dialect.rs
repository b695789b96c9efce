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

use super::StoreResult;
use super::query::Conn;
use crate::domain::EpochMs;

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

    /// Runs `op` inside a transaction and returns once that transaction is committed.
    /// `atomic` says `op` runs several writing statements that must apply all or
    /// nothing (one statement is atomic by itself).
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

    /// Marks results (never an empty list) as published; may apply shortly after it
    /// returns (see [`ResultStore::mark_published`](super::ResultStore::mark_published)).
    fn mark_published(
        &self,
        seqs: &[i64],
        now: EpochMs,
    ) -> impl Future<Output = StoreResult<()>> + Send;
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
