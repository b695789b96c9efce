//! Policy versions: the trainer's announcements of new weights, and the current one.
//!
//! One row holds the current version; an announcement replaces it only with a newer one
//! (a compare-and-set), so announcements from several trainers or gateways at once get
//! one order, and every version announced is kept in `policy_versions`.

use async_trait::async_trait;

use super::dialect::Dialect;
use super::query::query;
use super::sql_store::SqlStore;
use super::{StoreResult, sql};
use rollout_core::domain::EpochMs;
use rollout_core::domain::policy::PolicyVersion;

/// What an announcement did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Announced {
    /// The version is now the current one.
    New(PolicyVersion),
    /// It was the current one already (the announcement was repeated).
    Repeated(PolicyVersion),
    /// A newer version is current; the announcement changed nothing.
    Outdated(PolicyVersion),
}

/// Policy versions.
#[async_trait]
pub trait PolicyStore: Send + Sync {
    /// Makes `version` the current policy version if it is newer than the current one.
    async fn announce_policy(&self, version: i64, now: EpochMs) -> StoreResult<Announced>;
    /// The current policy version, if one was ever announced.
    async fn current_policy(&self) -> StoreResult<Option<PolicyVersion>>;
    /// The `limit` newest versions announced, newest first, each with when it was.
    async fn recent_policies(&self, limit: i64) -> StoreResult<Vec<PolicyVersion>>;
}

/// A `(version, announced_at)` row.
fn from_row((version, announced_at): (i64, i64)) -> PolicyVersion {
    PolicyVersion {
        version,
        announced_at,
    }
}

/// The `policy` row's version, if one was ever announced.
fn version_of(row: Option<(Option<i64>, Option<i64>)>) -> Option<PolicyVersion> {
    match row {
        Some((Some(version), Some(announced_at))) => Some(from_row((version, announced_at))),
        _ => None,
    }
}

#[async_trait]
impl<D: Dialect> PolicyStore for SqlStore<D> {
    async fn announce_policy(&self, version: i64, now: EpochMs) -> StoreResult<Announced> {
        self.write_atomic(move |conn: &mut D::Conn| {
            Box::pin(async move {
                let set: Option<(i64, i64)> = query(sql::ANNOUNCE_POLICY)
                    .bind(version)
                    .bind(now)
                    .fetch_optional(conn)
                    .await?;
                if let Some(row) = set {
                    let new = from_row(row);
                    query(sql::RECORD_POLICY_VERSION)
                        .bind(new.version)
                        .bind(new.announced_at)
                        .execute(conn)
                        .await?;
                    return Ok(Announced::New(new));
                }
                let current = version_of(query(sql::CURRENT_POLICY).fetch_optional(conn).await?)
                    .ok_or_else(|| {
                        crate::StoreError::Corrupt(
                            "the policy row refused a version but holds none".into(),
                        )
                    })?;
                Ok(if current.version == version {
                    Announced::Repeated(current)
                } else {
                    Announced::Outdated(current)
                })
            })
        })
        .await
    }

    async fn current_policy(&self) -> StoreResult<Option<PolicyVersion>> {
        let mut conn = self.reader().await?;
        let row = query(sql::CURRENT_POLICY)
            .fetch_optional(&mut *conn)
            .await?;
        Ok(version_of(row))
    }

    async fn recent_policies(&self, limit: i64) -> StoreResult<Vec<PolicyVersion>> {
        let mut conn = self.reader().await?;
        let rows: Vec<(i64, i64)> = query(sql::RECENT_POLICY_VERSIONS)
            .bind(limit)
            .fetch_all(&mut *conn)
            .await?;
        Ok(rows.into_iter().map(from_row).collect())
    }
}
