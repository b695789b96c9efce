//! Postgres's [`Dialect`], for deployments with workers on many machines.
//!
//! Each write op runs in a transaction of its own on a pooled connection; Postgres's own
//! concurrency does the rest.

use std::time::Duration;

use futures::future::BoxFuture;
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnection, PgPoolOptions};
use sqlx::{PgPool, Postgres};

use super::dialect::Dialect;
use super::query::query;
use super::{StoreResult, sql};
use crate::domain::EpochMs;

/// Advisory-lock key serialising result inserts (see [`PostgresDb::order_results`]).
const RESULTS_LOCK: i64 = 0x0072_6f6c_6c6f_7574; // "rollout" in ASCII

/// Advisory-lock key serialising backend assignments (see [`PostgresDb::lock_pool`]).
const POOL_LOCK: i64 = 0x0072_6f6c_6c70_6f6f; // "rollpoo"

/// A Postgres database behind a connection pool.
#[derive(Debug, Clone)]
pub(crate) struct PostgresDb {
    pool: PgPool,
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
        Ok(Self { pool })
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

    /// Identity values are handed out at insert time but become visible at commit, so two
    /// concurrent writers could commit `seq` 11 before 10 and a reader polling `seq > 10`
    /// would skip 10 for ever. Holding a transaction-scoped advisory lock from before the
    /// insert until commit makes sequence order equal visibility order; the critical
    /// section is only the result insert and two counter updates.
    async fn order_results(conn: &mut PgConnection) -> StoreResult<()> {
        query(sql::ADVISORY_XACT_LOCK)
            .bind(RESULTS_LOCK)
            .execute(conn)
            .await?;
        Ok(())
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
