//! Durable job state: one [`Store`], made of one trait per concern, over SQLite or
//! Postgres.
//!
//! The database is the source of truth for every job; the queue only carries hand-offs.
//! Every stage transition is a compare-and-set on the job row (`WHERE id = $1 AND stage
//! = $2 AND epoch = $3 …`), so a redelivered or duplicated message can never apply a
//! transition twice, and every terminal transition writes the job's single result and
//! updates its batch and group counters in the same transaction.
//!
//! - [`JobStore`] (`jobs`): submit, read, claim, advance, release, restart and end jobs.
//! - [`RecoveryStore`] (`recovery`): what the reconciler looks for and how it recovers it.
//! - [`ResultStore`] (`results`): results in `seq` order, and their publication marks.
//! - [`SandboxStore`] (`sandboxes`): which node holds which job's sandbox.
//! - [`BackendStore`] (`backends`): inference backends, their health and assignments.
//! - [`SamplingStore`] (`sampling`): dynamic-sampling batches, their launches and the
//!   verdicts their groups' last results decide.
//! - [`DashboardStore`] (`dashboard`): the status page's reads of the dashboard views.
//! - [`PolicyStore`] (`policy`): the policy versions the trainer announced.
//!
//! One generic implementation (`sql_store::SqlStore`) serves both databases: its SQL
//! (`sql`) is written in the dialect both accept (`$N` parameters, `RETURNING`, `ON
//! CONFLICT`), its statements run through one small API over either connection
//! (`query`), and each database (`sqlite`: WAL, one group-commit writer; `postgres`:
//! a pooled transaction per write) supplies only what differs (`dialect`). The write
//! path the hot transitions take (coalescing, group commit, job ends) is its own
//! module (`write`), and so is what a job's end does to its sampling batch
//! (`verdict`): both sit below the queries that use them, so imports point one way.
//!
//! The migrations and the views (the workspace's top-level `migrations/`) are compiled
//! into this crate (see `migrations`).
//! No `unsafe` but in `nodelay`, which borrows the driver's sockets by descriptor until
//! sqlx sets `TCP_NODELAY` again; the lint denies it everywhere else.

#![deny(unsafe_code)]

use std::sync::Arc;

use async_trait::async_trait;

mod backends;
mod dashboard;
mod dialect;
mod jobs;
mod migrations;
#[allow(unsafe_code)]
pub mod nodelay;
mod policy;
mod postgres;
mod query;
mod recovery;
mod results;
mod rows;
mod sampling;
mod sandboxes;
#[cfg(test)]
mod schema_check;
mod sql;
mod sql_store;
mod sqlite;
mod verdict;
mod write;

pub use backends::BackendStore;
pub use dashboard::{
    BackendLoad, BatchProgress, DashboardStore, FailureReason, ResultStats, SamplingProgress,
    SandboxCount, StageQueue, StageTiming, ThroughputMinute,
};
use dialect::Dialect;
pub use jobs::{
    Claim, FinishIf, JobEvent, JobQuery, JobStore, JobsPage, NewJob, StatusCount, Submitted,
};
pub use policy::{Announced, Pausing, PolicyStore, Resumed};
use query::query;
pub use recovery::{AbandonedRun, RecoveryStore, StaleJob};
pub use results::ResultStore;
pub use sampling::{Created, GroupVerdict, NewSampling, SamplingStore};
pub use sandboxes::{SandboxRecord, SandboxStore};
use sql_store::SqlStore;
pub use verdict::{Decided, Ended};

/// A database failure. Callers treat these as transient (retry or nak) unless stated.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The database could not be reached or rejected a statement.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// Applying migrations failed (a migration was edited after it was applied, or the
    /// database is newer than this binary).
    #[error("database migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// The dashboard views could not be made from `migrations/views.sql` after the
    /// migrations (a view reads a column the migrations no longer make, or uses SQL one
    /// of the databases does not take).
    #[error("the dashboard views (migrations/views.sql) could not be made: {0}")]
    Views(sqlx::Error),
    /// A stored value could not be decoded; the row was written by an incompatible version.
    #[error("corrupt row in the database: {0}")]
    Corrupt(String),
    /// The group of writes this one was committed with (see the group-commit writer)
    /// failed before this write was applied, or could not be committed; nothing of it
    /// was applied, and it may be tried again.
    #[error("database write failed: {0}")]
    GroupWrite(String),
    /// The store's writer has stopped (the process is shutting down).
    #[error("database writer stopped")]
    Closed,
    /// The database URL is not one this build supports.
    #[error("unsupported database URL `{0}`: use sqlite://PATH or postgres://USER@HOST/DB")]
    UnsupportedUrl(String),
}

impl StoreError {
    /// Whether the database refused the statement itself (a value it cannot store, a
    /// constraint), as opposed to not being reachable: the same statement will be
    /// refused again, so retrying it is pointless.
    ///
    /// A database error that says the server, not the statement, is the trouble (a
    /// deadlock or serialization failure, a connection cut by a restart, too many
    /// connections, a lock or disk problem) is not a rejection: the caller retries it.
    pub fn is_rejected(&self) -> bool {
        match self {
            StoreError::Database(sqlx::Error::Database(e)) => !transient_database_error(&**e),
            StoreError::Corrupt(_) => true,
            _ => false,
        }
    }

    /// Whether the database aborted the transaction because it collided with another
    /// (Postgres's deadlock or serialization failure): the same transaction may
    /// succeed when run again.
    pub fn is_conflict(&self) -> bool {
        match self {
            StoreError::Database(sqlx::Error::Database(e)) => {
                matches!(e.code().as_deref(), Some("40P01") | Some("40001"))
            }
            _ => false,
        }
    }
}

/// Whether the database's error is about its state rather than the statement, so that
/// the same statement may succeed later: Postgres SQLSTATE classes 08 (connection), 40
/// (transaction rollback: deadlock, serialization), 53 (insufficient resources), 55
/// (object not in prerequisite state: lock not available), 57 (operator intervention:
/// shutdown, restart) and 58 (system error); SQLite's BUSY, LOCKED, IOERR, FULL and
/// CANTOPEN (primary codes 5, 6, 10, 13, 14).
fn transient_database_error(e: &dyn sqlx::error::DatabaseError) -> bool {
    let Some(code) = e.code() else {
        return false;
    };
    if e.try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
        .is_some()
    {
        return matches!(code.get(..2), Some("08" | "40" | "53" | "55" | "57" | "58"));
    }
    if e.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
        return code
            .parse::<i32>()
            .is_ok_and(|c| matches!(c & 0xff, 5 | 6 | 10 | 13 | 14));
    }
    false
}

/// Shorthand for store results.
pub type StoreResult<T> = Result<T, StoreError>;

/// Durable job state: every concern's trait, plus what a process does with the database
/// as a whole. Implemented for SQLite and Postgres; all methods are safe to call from
/// many processes at once.
#[async_trait]
pub trait Store:
    JobStore
    + RecoveryStore
    + ResultStore
    + SandboxStore
    + BackendStore
    + SamplingStore
    + DashboardStore
    + PolicyStore
    + 'static
{
    /// Applies pending migrations.
    async fn migrate(&self) -> StoreResult<()>;
    /// Checks the database answers.
    async fn ping(&self) -> StoreResult<()>;
}

#[async_trait]
impl<D: Dialect> Store for SqlStore<D> {
    async fn migrate(&self) -> StoreResult<()> {
        self.db.migrate().await
    }

    async fn ping(&self) -> StoreResult<()> {
        let mut conn = self.reader().await?;
        query("SELECT 1").execute(&mut *conn).await?;
        Ok(())
    }
}

/// Opens the database named by `url` (`sqlite:…` or `postgres://…`) and applies
/// migrations.
pub async fn connect(url: &str, max_connections: u32) -> StoreResult<Arc<dyn Store>> {
    let store: Arc<dyn Store> = if url.starts_with("sqlite:") {
        Arc::new(SqlStore::new(
            sqlite::SqliteDb::connect(url, max_connections).await?,
        ))
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Arc::new(SqlStore::new(
            postgres::PostgresDb::connect(url, max_connections).await?,
        ))
    } else {
        return Err(StoreError::UnsupportedUrl(
            rollout_core::config::redact_url(url),
        ));
    };
    store.migrate().await?;
    Ok(store)
}
