//! The Postgres backend, for deployments with workers on many machines.
//!
//! Each write op runs in a transaction of its own on a pooled connection; Postgres's own
//! concurrency does the rest.

use std::time::Duration;

use futures::future::BoxFuture;
use sqlx::PgPool;
use sqlx::postgres::{PgConnection, PgPoolOptions};

use super::{StoreResult, impl_store};

/// Advisory-lock key serialising result inserts (see [`PostgresStore::order_results`]).
const RESULTS_LOCK: i64 = 0x0072_6f6c_6c6f_7574; // "rollout" in ASCII

/// Advisory-lock key serialising backend assignments (see [`PostgresStore::lock_pool`]).
const POOL_LOCK: i64 = 0x0072_6f6c_6c70_6f6f; // "rollpoo"

/// A [`Store`](super::Store) over a Postgres database.
#[derive(Debug, Clone)]
pub struct PostgresStore {
    pool: PgPool,
}

impl PostgresStore {
    const MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("migrations/postgres");

    /// Ends a live job (`$2`/`$3` restrict it to one stage entry, `$9` to one claim of it,
    /// `$10` to an entry nobody holds a lease on at that time; NULL means no restriction)
    /// by inserting its result; a trigger applies the terminal status and the counters.
    /// `FOR UPDATE` makes a concurrent end of the same job wait and then re-check the
    /// job's state, so exactly one end applies.
    const FINISH: &'static str = "INSERT INTO results (job_id, batch_id, group_id, client_id, \
         status, reward, error, output, created_at) \
         SELECT id, batch_id, group_id, client_id, $4, $7, $5, \
         json_build_object('init', init_output::json, 'run', COALESCE($11::text, run_output)::json, 'eval', $8::json, \
                           'metadata', task::json -> 'metadata')::text, $6 \
         FROM jobs WHERE id = $1 AND status IN ('queued', 'running') \
         AND ($2::text IS NULL OR (stage = $2 AND epoch = $3)) \
         AND ($9::bigint IS NULL OR attempts = $9) \
         AND ($10::bigint IS NULL OR status = 'queued' OR lease_until < $10) \
         FOR UPDATE \
         ON CONFLICT (job_id) DO NOTHING \
         RETURNING seq, job_id, batch_id, group_id, client_id, status, reward, error, output, created_at";

    /// [`Self::FINISH`]'s last resort, for an end the database refused: the job fails with
    /// `$4` as its error and an empty output, reading nothing of the job's own data.
    const FINISH_BARE: &'static str = "INSERT INTO results (job_id, batch_id, group_id, client_id, \
         status, reward, error, output, created_at) \
         SELECT id, batch_id, group_id, client_id, 'failed', NULL, $4, \
         '{\"init\":null,\"run\":null,\"eval\":null,\"metadata\":null}', $5 \
         FROM jobs WHERE id = $1 AND status IN ('queued', 'running') \
         AND ($2::text IS NULL OR (stage = $2 AND epoch = $3)) \
         AND ($6::bigint IS NULL OR attempts = $6) \
         AND ($7::bigint IS NULL OR status = 'queued' OR lease_until < $7) \
         FOR UPDATE \
         ON CONFLICT (job_id) DO NOTHING \
         RETURNING seq, job_id, batch_id, group_id, client_id, status, reward, error, output, created_at";

    /// Connects to the database at `url`.
    pub async fn connect(url: &str, max_connections: u32) -> StoreResult<Self> {
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(30))
            .connect(url)
            .await?;
        Ok(Self { pool })
    }

    async fn run_migrations(&self) -> StoreResult<()> {
        Self::MIGRATOR.run(&self.pool).await?;
        Ok(())
    }

    /// Runs `op` in a transaction of its own.
    async fn write<T, F>(&self, op: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: for<'c> FnOnce(&'c mut PgConnection) -> BoxFuture<'c, StoreResult<T>> + Send + 'static,
    {
        let mut tx = self.pool.begin().await?;
        let out = op(&mut tx).await?;
        tx.commit().await?;
        Ok(out)
    }

    /// Runs a multi-statement `op` atomically: the same as [`Self::write`] here.
    async fn write_atomic<T, F>(&self, op: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: for<'c> FnOnce(&'c mut PgConnection) -> BoxFuture<'c, StoreResult<T>> + Send + 'static,
    {
        self.write(op).await
    }

    async fn mark_published_seqs(&self, seqs: &[i64], now: i64) -> StoreResult<()> {
        sqlx::query(
            "UPDATE results SET published_at = $1 WHERE seq = ANY($2) AND published_at IS NULL",
        )
        .bind(now)
        .bind(seqs)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Identity values are handed out at insert time but become visible at commit, so two
    /// concurrent writers could commit `seq` 11 before 10 and a reader polling `seq > 10`
    /// would skip 10 for ever. Holding a transaction-scoped advisory lock from before the
    /// insert until commit makes sequence order equal visibility order; the critical
    /// section is only the result insert and two counter updates.
    async fn order_results(conn: &mut PgConnection) -> StoreResult<()> {
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(RESULTS_LOCK)
            .execute(&mut *conn)
            .await?;
        Ok(())
    }

    /// Assignments read the counts and then write one: two RUN workers assigning at once
    /// must not both see the same counts. A transaction-scoped advisory lock makes them
    /// take turns (an assignment is a few small statements, once per job).
    async fn lock_pool(conn: &mut PgConnection) -> StoreResult<()> {
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(POOL_LOCK)
            .execute(&mut *conn)
            .await?;
        Ok(())
    }
}

impl_store!(PostgresStore, PgConnection);
