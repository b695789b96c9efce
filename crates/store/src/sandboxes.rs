//! Sandboxes: which node holds each job's sandbox, under a lease the node renews, so a
//! node's reaper can remove what belongs to ended jobs and the reconciler can tell when
//! a node is gone.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::dialect::Dialect;
use super::query::query;
use super::sql_store::SqlStore;
use super::{StoreResult, sql};
use rollout_core::domain::EpochMs;

/// A live sandbox as the database knows it: which node holds it and where.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, sqlx::FromRow)]
pub struct SandboxRecord {
    /// The job it belongs to (one sandbox per job at a time).
    pub job_id: String,
    /// The node it runs on.
    pub node: String,
    /// The sandbox runtime: `local`, `bwrap` or `apptainer` (the column keeps its
    /// first name, `backend`).
    #[sqlx(rename = "backend")]
    pub runtime: String,
    /// Its directory on that node.
    pub dir: String,
    /// Its socket on that node.
    pub socket: String,
    /// Until when the node vouches for it; renewed by the node's reaper.
    #[sqlx(try_from = "i64")]
    pub lease_until: EpochMs,
    /// When it was recorded.
    #[sqlx(try_from = "i64")]
    pub created_at: EpochMs,
}

/// Recording, finding, renewing and forgetting sandboxes.
#[async_trait]
pub trait SandboxStore: Send + Sync {
    /// Records (or replaces) a job's sandbox.
    async fn put_sandbox(&self, sandbox: &SandboxRecord) -> StoreResult<()>;
    /// A job's sandbox, if one is recorded.
    async fn sandbox(&self, job_id: &str) -> StoreResult<Option<SandboxRecord>>;
    /// Forgets a job's sandbox (after it was stopped).
    async fn delete_sandbox(&self, job_id: &str) -> StoreResult<()>;
    /// A node's sandboxes whose job ended (or is unknown). Lapsed leases are not a reason
    /// here: the node's own reaper renews every lease first, and the reconciler handles
    /// the sandboxes of nodes that stopped renewing.
    async fn sandboxes_to_reap(&self, node: &str) -> StoreResult<Vec<SandboxRecord>>;
    /// All of a node's recorded sandboxes.
    async fn sandboxes_of_node(&self, node: &str) -> StoreResult<Vec<SandboxRecord>>;
    /// Renews until `lease_until` the leases of all of a node's sandboxes; returns how
    /// many were renewed.
    async fn renew_sandboxes(&self, node: &str, lease_until: EpochMs) -> StoreResult<u64>;
}

#[async_trait]
impl<D: Dialect> SandboxStore for SqlStore<D> {
    async fn put_sandbox(&self, sandbox: &SandboxRecord) -> StoreResult<()> {
        let s = sandbox.clone();
        self.write(move |conn: &mut D::Conn| {
            Box::pin(async move {
                query(sql::PUT_SANDBOX)
                    .bind(&s.job_id)
                    .bind(&s.node)
                    .bind(&s.runtime)
                    .bind(&s.dir)
                    .bind(&s.socket)
                    .bind(s.lease_until)
                    .bind(s.created_at)
                    .execute(conn)
                    .await?;
                Ok(())
            })
        })
        .await
    }

    async fn sandbox(&self, job_id: &str) -> StoreResult<Option<SandboxRecord>> {
        let mut conn = self.reader().await?;
        Ok(query(sql::SELECT_SANDBOX)
            .bind(job_id)
            .fetch_optional(&mut *conn)
            .await?)
    }

    async fn delete_sandbox(&self, job_id: &str) -> StoreResult<()> {
        let job_id = job_id.to_string();
        self.write(move |conn: &mut D::Conn| {
            Box::pin(async move {
                query(sql::DELETE_SANDBOX)
                    .bind(&job_id)
                    .execute(conn)
                    .await?;
                Ok(())
            })
        })
        .await
    }

    async fn sandboxes_to_reap(&self, node: &str) -> StoreResult<Vec<SandboxRecord>> {
        let mut conn = self.reader().await?;
        Ok(query(sql::SANDBOXES_TO_REAP)
            .bind(node)
            .fetch_all(&mut *conn)
            .await?)
    }

    async fn sandboxes_of_node(&self, node: &str) -> StoreResult<Vec<SandboxRecord>> {
        let mut conn = self.reader().await?;
        Ok(query(sql::SANDBOXES_OF_NODE)
            .bind(node)
            .fetch_all(&mut *conn)
            .await?)
    }

    async fn renew_sandboxes(&self, node: &str, lease_until: EpochMs) -> StoreResult<u64> {
        let node = node.to_string();
        self.write(move |conn: &mut D::Conn| {
            Box::pin(async move {
                Ok(query(sql::RENEW_SANDBOXES)
                    .bind(&node)
                    .bind(lease_until)
                    .execute(conn)
                    .await?)
            })
        })
        .await
    }
}
