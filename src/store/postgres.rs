//! The Postgres backend, for deployments with workers on many machines.

use std::time::Duration;

use sqlx::postgres::PgPoolOptions;
use sqlx::{PgPool, Postgres, Transaction};

use super::{StoreResult, impl_store};

/// Advisory-lock key serialising result inserts (see [`PostgresStore::order_results`]).
const RESULTS_LOCK: i64 = 0x0072_6f6c_6c6f_7574; // "rollout" in ASCII

/// A [`Store`](super::Store) over a Postgres database.
#[derive(Debug, Clone)]
pub struct PostgresStore {
    pool: PgPool,
}

impl PostgresStore {
    const MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("migrations/postgres");

    /// Connects to the database at `url`.
    pub async fn connect(url: &str, max_connections: u32) -> StoreResult<Self> {
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(30))
            .connect(url)
            .await?;
        Ok(Self { pool })
    }

    fn writer(&self) -> &PgPool {
        &self.pool
    }

    async fn write_tx(&self) -> StoreResult<Transaction<'static, Postgres>> {
        Ok(self.pool.begin().await?)
    }

    /// Identity values are handed out at insert time but become visible at commit, so two
    /// concurrent writers could commit `seq` 11 before 10 and a reader polling `seq > 10`
    /// would skip 10 for ever. Holding a transaction-scoped advisory lock from before the
    /// insert until commit makes sequence order equal visibility order; the critical
    /// section is only the result insert and two counter updates.
    async fn order_results(tx: &mut Transaction<'static, Postgres>) -> StoreResult<()> {
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(RESULTS_LOCK)
            .execute(&mut **tx)
            .await?;
        Ok(())
    }
}

impl_store!(PostgresStore, Postgres);
