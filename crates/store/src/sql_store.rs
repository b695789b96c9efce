//! [`SqlStore`]: the one [`Store`](super::Store) over either database, holding every
//! method body once (in the modules of each concern) and the task that coalesces job
//! ends.
//!
//! Apart from the dialect it is generic over, so that the write path (`write`), which
//! needs the dialect, does not also depend on the store built over it.

use std::sync::Arc;

use futures::future::BoxFuture;

use super::StoreResult;
use super::dialect::Dialect;
use super::write::coalesce::Coalescer;
use super::write::ends::Ends;

/// The [`Store`](super::Store) over a database of dialect `D`.
#[derive(Debug, Clone)]
pub(crate) struct SqlStore<D: Dialect> {
    pub(super) db: Arc<D>,
    /// Job ends, coalesced (see [`ends`](super::write::ends)).
    pub(super) ends: Coalescer<Ends<D>>,
}

impl<D: Dialect> SqlStore<D> {
    /// A store over `db`; starts the task that coalesces job ends, so it must be called
    /// inside a Tokio runtime.
    pub(crate) fn new(db: D) -> Self {
        let db = Arc::new(db);
        let ends = Coalescer::start(Ends(db.clone()));
        Self { db, ends }
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
