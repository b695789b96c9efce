//! Policy versions: the trainer's announcements of new weights, the current one, and the
//! weight update in progress.
//!
//! One row holds the current version and the update in progress; every change is a
//! compare-and-set on it (a version only replaces an older one, an update only starts
//! when none is in progress), so announcements from several trainers or gateways at once
//! get one order, and every version that became current is kept in `policy_versions`.
//! The row's `seq` counts its changes, so processes that hear of them out of order keep
//! the latest.

use async_trait::async_trait;

use super::dialect::Dialect;
use super::query::{Conn, query};
use super::sql_store::SqlStore;
use super::{StoreError, StoreResult, sql};
use rollout_core::domain::EpochMs;
use rollout_core::domain::policy::{PolicyPause, PolicyState, PolicyVersion, UpdateMode};

/// What an announcement did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Announced {
    /// The version is now the current one.
    New(PolicyVersion),
    /// It was the current one already (the announcement was repeated).
    Repeated(PolicyVersion),
    /// A newer version is current; the announcement changed nothing.
    Outdated(PolicyVersion),
    /// A weight update is in progress; it must be resumed (or its lease run out) first.
    Busy(PolicyPause),
}

/// What a request to start a weight update did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pausing {
    /// The update started.
    Started(PolicyState),
    /// This update (same version and mode) was in progress already; its lease now runs
    /// to the new end.
    Repeated(PolicyState),
    /// The version is not newer than the current one.
    Outdated(PolicyVersion),
    /// Another update is in progress.
    Busy(PolicyPause),
}

/// What a resume did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resumed {
    /// The update ended; its version is current.
    Done(PolicyState),
    /// No update to that version is in progress, and it is current: resumed already.
    Repeated(PolicyState),
    /// No update to that version is in progress, and it is not current.
    NotPaused(PolicyState),
}

/// Policy versions.
#[async_trait]
pub trait PolicyStore: Send + Sync {
    /// Makes `version` the current policy version if it is newer than the current one
    /// and no weight update is in progress.
    async fn announce_policy(&self, version: i64, now: EpochMs) -> StoreResult<Announced>;
    /// Starts a weight update to `version` in `mode`, held until `until` at most.
    async fn begin_pause(
        &self,
        version: i64,
        mode: UpdateMode,
        now: EpochMs,
        until: EpochMs,
    ) -> StoreResult<Pausing>;
    /// Ends the weight update to `version`: the version becomes current.
    async fn end_pause(&self, version: i64, now: EpochMs) -> StoreResult<Resumed>;
    /// Clears the weight update whose lease ran out before `now`, without making its
    /// version current; returns it, for the caller to resume the backends.
    async fn expire_pause(&self, now: EpochMs) -> StoreResult<Option<PolicyPause>>;
    /// The current version and the update in progress.
    async fn policy_state(&self) -> StoreResult<PolicyState>;
    /// The `limit` newest versions that became current, newest first, each with when.
    async fn recent_policies(&self, limit: i64) -> StoreResult<Vec<PolicyVersion>>;

    /// The current policy version, if one was ever announced.
    async fn current_policy(&self) -> StoreResult<Option<PolicyVersion>> {
        Ok(self.policy_state().await?.current)
    }
}

/// A `(version, announced_at)` row.
fn from_row((version, announced_at): (i64, i64)) -> PolicyVersion {
    PolicyVersion {
        version,
        announced_at,
    }
}

/// The policy row's columns, as [`sql::POLICY_STATE`] reads them.
type StateRow = (
    i64,
    Option<i64>,
    Option<i64>,
    Option<i64>,
    Option<String>,
    Option<i64>,
    Option<i64>,
);

/// The policy row as a [`PolicyState`].
fn state_of(row: Option<StateRow>) -> StoreResult<PolicyState> {
    let Some((seq, version, announced_at, p_version, p_mode, p_since, p_until)) = row else {
        return Err(StoreError::Corrupt("the policy row is missing".into()));
    };
    let current = match (version, announced_at) {
        (Some(v), Some(a)) => Some(from_row((v, a))),
        _ => None,
    };
    let pause = match (p_version, p_mode, p_since, p_until) {
        (Some(version), Some(mode), Some(since), Some(until)) => Some(PolicyPause {
            version,
            mode: UpdateMode::parse(&mode).ok_or_else(|| {
                StoreError::Corrupt(format!("unknown policy update mode `{mode}`"))
            })?,
            since,
            until,
        }),
        _ => None,
    };
    Ok(PolicyState {
        seq,
        current,
        pause,
    })
}

async fn read_state<C: Conn>(conn: &mut C) -> StoreResult<PolicyState> {
    state_of(query(sql::POLICY_STATE).fetch_optional(conn).await?)
}

/// Keeps a version that became current in the record.
async fn record<C: Conn>(conn: &mut C, v: PolicyVersion) -> StoreResult<()> {
    query(sql::RECORD_POLICY_VERSION)
        .bind(v.version)
        .bind(v.announced_at)
        .execute(conn)
        .await?;
    Ok(())
}

/// A state with no current version where one must be: the row refused a version as
/// outdated but holds none.
fn no_current() -> StoreError {
    StoreError::Corrupt("the policy row refused a version as outdated but holds none".into())
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
                    record(conn, new).await?;
                    return Ok(Announced::New(new));
                }
                let state = read_state(conn).await?;
                if let Some(p) = state.pause {
                    return Ok(Announced::Busy(p));
                }
                let current = state.current.ok_or_else(no_current)?;
                Ok(if current.version == version {
                    Announced::Repeated(current)
                } else {
                    Announced::Outdated(current)
                })
            })
        })
        .await
    }

    async fn begin_pause(
        &self,
        version: i64,
        mode: UpdateMode,
        now: EpochMs,
        until: EpochMs,
    ) -> StoreResult<Pausing> {
        self.write_atomic(move |conn: &mut D::Conn| {
            Box::pin(async move {
                let started = query(sql::BEGIN_POLICY_PAUSE)
                    .bind(version)
                    .bind(mode.as_str())
                    .bind(now)
                    .bind(until)
                    .execute(conn)
                    .await?;
                if started == 1 {
                    return Ok(Pausing::Started(read_state(conn).await?));
                }
                let renewed = query(sql::RENEW_POLICY_PAUSE)
                    .bind(version)
                    .bind(mode.as_str())
                    .bind(until)
                    .execute(conn)
                    .await?;
                let state = read_state(conn).await?;
                if renewed == 1 {
                    return Ok(Pausing::Repeated(state));
                }
                if let Some(p) = state.pause {
                    return Ok(Pausing::Busy(p));
                }
                Ok(Pausing::Outdated(state.current.ok_or_else(no_current)?))
            })
        })
        .await
    }

    async fn end_pause(&self, version: i64, now: EpochMs) -> StoreResult<Resumed> {
        self.write_atomic(move |conn: &mut D::Conn| {
            Box::pin(async move {
                let ended = query(sql::END_POLICY_PAUSE)
                    .bind(version)
                    .bind(now)
                    .execute(conn)
                    .await?;
                let state = read_state(conn).await?;
                if ended == 1 {
                    record(conn, state.current.ok_or_else(no_current)?).await?;
                    return Ok(Resumed::Done(state));
                }
                Ok(if state.version() == Some(version) {
                    Resumed::Repeated(state)
                } else {
                    Resumed::NotPaused(state)
                })
            })
        })
        .await
    }

    async fn expire_pause(&self, now: EpochMs) -> StoreResult<Option<PolicyPause>> {
        self.write_atomic(move |conn: &mut D::Conn| {
            Box::pin(async move {
                let Some(pause) = read_state(conn).await?.pause else {
                    return Ok(None);
                };
                if pause.until > now.0 {
                    return Ok(None);
                }
                let cleared = query(sql::EXPIRE_POLICY_PAUSE)
                    .bind(pause.version)
                    .bind(now)
                    .execute(conn)
                    .await?;
                Ok((cleared == 1).then_some(pause))
            })
        })
        .await
    }

    async fn policy_state(&self) -> StoreResult<PolicyState> {
        let mut conn = self.reader().await?;
        read_state(&mut *conn).await
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
