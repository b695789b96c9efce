//! Postgres's [`Dialect`], for deployments with workers on many machines.
//!
//! Each write runs in a transaction of its own on a pooled connection, and Postgres's
//! own concurrency does the rest — except a job's end. Result sequence numbers are
//! identity values, handed out at insert but visible at commit, so two ends committing
//! out of order would let a reader polling `seq > 10` see 11 and skip 10 for ever. Ends
//! therefore take turns under a transaction-scoped advisory lock held until commit, and
//! the results trigger also updates the batch's counter row, locked until commit too.
//! One end per transaction would make one commit (one WAL flush) per job the whole
//! service's ceiling, whatever the number of nodes; so each process hands its ends to
//! a [`GroupWriter`] that takes the lock once for whatever has queued up and commits
//! the lot together. Under load, a group grows while the previous one holds the lock.

use std::time::Duration;

use futures::future::BoxFuture;
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnection, PgPoolOptions};
use sqlx::{PgPool, Postgres, Transaction};

use super::dialect::Dialect;
use super::group::{GroupWriter, Txn};
use super::query::query;
use super::{StoreResult, sql};
use crate::domain::EpochMs;

/// Advisory-lock key serialising result inserts (see the module's documentation).
const RESULTS_LOCK: i64 = 0x0072_6f6c_6c6f_7574; // "rollout" in ASCII

/// Advisory-lock key serialising backend assignments (see [`PostgresDb::lock_pool`]).
const POOL_LOCK: i64 = 0x0072_6f6c_6c70_6f6f; // "rollpoo"

/// A Postgres database behind a connection pool.
#[derive(Debug, Clone)]
pub(crate) struct PostgresDb {
    pool: PgPool,
    /// Job ends, committed in groups under the result-ordering lock.
    results: GroupWriter<PgConnection>,
}

impl PostgresDb {
    const MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("migrations/postgres");

    /// Connects to the database at `url`.
    pub(crate) async fn connect(url: &str, max_connections: u32) -> StoreResult<Self> {
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(30))
            .connect(url)
            .await?;
        let results = GroupWriter::start(ResultsTxn::new(pool.clone()), "Postgres job ends");
        Ok(Self { pool, results })
    }
}

impl Dialect for PostgresDb {
    type Conn = PgConnection;
    type Reader = PoolConnection<Postgres>;

    const FINISH: &'static str = sql::FINISH_POSTGRES;
    const FINISH_BARE: &'static str = sql::FINISH_BARE_POSTGRES;

    async fn migrate(&self) -> StoreResult<()> {
        Self::MIGRATOR.run(&self.pool).await?;
        Ok(())
    }

    async fn reader(&self) -> StoreResult<PoolConnection<Postgres>> {
        Ok(self.pool.acquire().await?)
    }

    /// Runs `op` in a transaction of its own (a transaction is atomic however many
    /// statements it runs).
    async fn write<T, F>(&self, _atomic: bool, op: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: for<'c> FnOnce(&'c mut PgConnection) -> BoxFuture<'c, StoreResult<T>> + Send + 'static,
    {
        let mut tx = self.pool.begin().await?;
        let out = op(&mut tx).await?;
        tx.commit().await?;
        Ok(out)
    }

    /// Through the process's group writer, under the result-ordering lock (see the
    /// module's documentation).
    async fn write_result<T, F>(&self, op: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: for<'c> FnOnce(&'c mut PgConnection) -> BoxFuture<'c, StoreResult<T>> + Send + 'static,
    {
        self.results.write(true, op).await
    }

    /// Assignments read the counts and then write one: two RUN workers assigning at once
    /// must not both see the same counts. A transaction-scoped advisory lock makes them
    /// take turns (an assignment is a few small statements, once per job).
    async fn lock_pool(conn: &mut PgConnection) -> StoreResult<()> {
        query(sql::ADVISORY_XACT_LOCK)
            .bind(POOL_LOCK)
            .execute(conn)
            .await?;
        Ok(())
    }

    async fn lock_batch(conn: &mut PgConnection, batch_id: &str) -> StoreResult<()> {
        query(sql::LOCK_BATCH_POSTGRES)
            .bind(batch_id)
            .execute(conn)
            .await?;
        Ok(())
    }

    /// Marks at once, in one statement (the list binds as a Postgres array, which the
    /// shared statement API does not carry).
    async fn mark_published(&self, seqs: &[i64], now: EpochMs) -> StoreResult<()> {
        sqlx::query(sql::MARK_PUBLISHED_POSTGRES)
            .bind(now.as_millis())
            .bind(seqs)
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}

/// The job-ends writer's transactions: each on a pooled connection (so a connection cut
/// by a server restart is replaced), holding the result-ordering lock from its start.
pub(super) struct ResultsTxn {
    pool: PgPool,
    open: Option<Transaction<'static, Postgres>>,
}

impl ResultsTxn {
    /// Transactions on `pool`.
    pub(super) fn new(pool: PgPool) -> Self {
        Self { pool, open: None }
    }
}

impl Txn for ResultsTxn {
    type Conn = PgConnection;
    const SAVEPOINT_EVERY_WRITE: bool = true;

    async fn begin(&mut self) -> Result<(), String> {
        let mut tx = self.pool.begin().await.map_err(|e| e.to_string())?;
        query(sql::ADVISORY_XACT_LOCK)
            .bind(RESULTS_LOCK)
            .execute(&mut *tx)
            .await
            .map_err(|e| e.to_string())?;
        self.open = Some(tx);
        Ok(())
    }

    fn conn(&mut self) -> &mut PgConnection {
        self.open
            .as_deref_mut()
            .expect("the group writer asks for the connection only inside a transaction")
    }

    async fn commit(&mut self) -> Result<(), String> {
        match self.open.take() {
            Some(tx) => tx.commit().await.map_err(|e| e.to_string()),
            None => Err("no transaction is open".into()),
        }
    }

    async fn rollback(&mut self) {
        if let Some(tx) = self.open.take() {
            let _ = tx.rollback().await;
        }
    }
}
